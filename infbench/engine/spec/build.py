"""The proposer a scenario's `speculative` section asks for, built over a loaded target.

`build_proposer` is the one registry of draft sources (docs/speculative.md):

    ngram   prompt lookup in the sequence's own tokens             (spec/ngram.py)
    draft   a draft model with its own paged KV cache                (spec/draft.py):
              draft_model unset: the target's own weights (shared, not copied);
              draft_layers N: only its first N layers (layer-skipping self-draft);
              draft_quant int8 | int4: a quantized copy (the quantized target as draft);
              draft_model SRC: any preset, HF directory or GGUF with the same vocabulary
    medusa  Medusa heads on the target's hidden states              (spec/heads.py)
    eagle   an EAGLE draft layer on the target's hidden states      (spec/heads.py)
    mtp     DeepSeek-V3's MTP module from the target's checkpoint    (spec/heads.py,
              model/mtp.py), applied recursively past the first draft
"""

from __future__ import annotations

from typing import Any

from infbench.checkpoint.metadata import model_source
from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError, UserError
from infbench.core.speculative import HEAD_METHODS, SPECULATIVE_METHODS, SpeculativeConfig
from infbench.engine.spec.base import Proposer
from infbench.engine.spec.draft import DraftModelProposer
from infbench.engine.spec.ngram import NgramProposer
from infbench.model.layer_skip import first_layers
from infbench.model.loader import LoadedModel, load_model


def speculation_refusal(engine: Any) -> str | None:
    """Why this engine's model cannot verify drafts (rollback needs a paged KV cache)."""
    if engine.states is not None:
        return ("the model has linear-attention or SSM layers, whose recurrent state cannot "
                "be rolled back past rejected drafts")
    if len(engine.kv.group_num_blocks) > 1:
        return "models with several KV groups (windowed and full layers) do not speculate yet"
    return None


def build_proposer(spec: SpeculativeConfig, target: LoadedModel, engine: Any, *,
                   target_source: dict[str, str] | None = None, seed: int = 0) -> Proposer:
    """The proposer of `spec` for `engine` (its KV pool, backend, dtype and device)."""
    if spec.num_tokens < 1:
        raise ConfigError(f"speculative.num_tokens must be >= 1, got {spec.num_tokens}")
    reason = speculation_refusal(engine)
    if reason is not None:
        raise ConfigError(f"speculative.method={spec.method!r}: {reason}")
    if spec.method == "ngram":
        return NgramProposer(spec.ngram_max, spec.ngram_min)
    if spec.method == "draft":
        return _draft_proposer(spec, target, engine, target_source, seed)
    if spec.method == "mtp":
        from infbench.engine.spec.heads import MTPProposer
        from infbench.model.loader import load_mtp_head

        head = load_mtp_head(target)
        for module in (head.layer.self_attn, head.layer.mlp):
            set_ops = getattr(module, "set_ops", None)
            if set_ops is not None:  # the routed experts' kernel on the triton backend
                set_ops(engine.ops)
        return MTPProposer(target.model, head)
    if spec.method in HEAD_METHODS:
        from infbench.engine.spec.heads import load_head_proposer

        if spec.heads is None:
            raise ConfigError(f"speculative.method={spec.method!r} needs speculative.heads")
        proposer = load_head_proposer(spec.method, spec.heads, target.model)
        num_heads = getattr(getattr(proposer, "heads", None), "num_heads", None)
        if spec.method == "medusa" and num_heads is not None and spec.num_tokens > num_heads:
            # Medusa head i proposes token i + 1: past the last head there is nothing to draft
            raise ConfigError(f"speculative.num_tokens {spec.num_tokens} exceeds the "
                              f"{num_heads} Medusa heads of {spec.heads}; allowed: 1 to "
                              f"{num_heads} (or train more heads with `infbench train-draft "
                              "--method medusa --num-heads N`)")
        return proposer  # type: ignore[no-any-return]
    raise ConfigError(f"speculative.method={spec.method!r}; "
                      f"allowed: {', '.join(SPECULATIVE_METHODS)}")


def _draft_proposer(spec: SpeculativeConfig, target: LoadedModel, engine: Any,
                    target_source: dict[str, str] | None, seed: int) -> DraftModelProposer:
    dtype = str(engine.dtype).removeprefix("torch.")
    device = engine.device
    if spec.draft_model is None and spec.draft_quant == "none":
        model: Any = target.model  # the target's own weights, shared
        what = "the target"
    else:
        if spec.draft_model is not None:
            source = model_source(spec.draft_model, "speculative.draft_model")
        elif target_source is not None:
            source = target_source
        else:
            raise ConfigError("speculative.draft_quant needs the target's source (a scenario "
                              "or --model) to load a quantized copy of it")
        quant = None
        if spec.draft_quant != "none":
            # The LM head in int8 too, as llama.cpp stores it: a draft's cost is what
            # matters, and on a 135M model the float head is a third of what it reads.
            quant = QuantConfig(weights=spec.draft_quant, group_size=spec.draft_group_size,
                                head="int8")
        loaded = load_model(source, dtype=dtype, device=str(device), seed=seed, quant=quant)
        if loaded.config.vocab_size != target.config.vocab_size:
            raise UserError(
                f"speculative.draft_model={spec.draft_model!r}: vocabulary of "
                f"{loaded.config.vocab_size} tokens, the target's has "
                f"{target.config.vocab_size}; a draft must share the target's tokenizer")
        if (target.tokenizer is not None and loaded.tokenizer is not None
                and _vocab_fingerprint(loaded.tokenizer) != _vocab_fingerprint(target.tokenizer)):
            raise UserError(f"speculative.draft_model={spec.draft_model!r}: its tokenizer maps "
                            "tokens to other ids than the target's")
        model = loaded.model
        what = spec.draft_model or "the target"
        if device.type == "cpu":
            from infbench.model.linear import use_cpu_linears

            use_cpu_linears(model, engine.ops.name)
        if hasattr(model, "set_ops"):
            model.set_ops(engine.ops)
    if spec.draft_layers is not None:
        layers = len(model.layers)
        if spec.draft_layers > layers:
            raise ConfigError(f"speculative.draft_layers={spec.draft_layers}: {what} has "
                              f"{layers} layers")
        model = first_layers(model, spec.draft_layers)
    cfg = model.config
    layers = cfg.layers()
    if any(s.mixer != "attention" for s in layers) or len({s.kv_span for s in layers}) > 1:
        raise ConfigError(f"speculative.draft_model={spec.draft_model!r}: a draft model needs "
                          "plain attention layers with one window (GQA/MHA/MQA, sliding)")
    return DraftModelProposer(model, cfg, engine.kv.num_blocks, engine.kv.block_size,
                              engine.dtype, device, engine.ops, seed=seed, label=spec.label)


def _vocab_fingerprint(tokenizer: Any) -> int:
    """A hash of the first ids' strings: equal vocabularies give equal hashes."""
    ids = list(range(min(2048, getattr(tokenizer, "vocab_size", 2048) or 2048)))
    try:
        text = tokenizer.decode(ids)
    except Exception:  # a tokenizer that cannot decode arbitrary ids: no check
        return 0
    return hash(text)


