"""Accuracy of a model on the offline evaluation text: perplexity and greedy agreement.

Both run the model's own plain forward (`model(ids, positions, ctx)` then
`compute_logits`), not the engine, so they work for every model `load_model` builds,
quantized (`QuantLinear`) or pruned, and they compare like with like: a quantized model
against the unquantized model of the same dtype.

- `perplexity`: exp of the mean next-token negative log-likelihood over the ids, cut into
  windows of `window` tokens (`stride` apart; the default is non-overlapping windows).
  Every token after the first of the whole text is scored once, with the context its
  window gives it; the first token of each non-overlapping window has no context and is
  not scored.
- `greedy_agreement`: free-running greedy continuations of the same prompts (each model
  continues its own output), compared position by position over the first `positions`
  new tokens: the fraction of positions whose tokens are equal.  It is not a
  teacher-forced match rate: once the two continuations part, later positions agree
  only when the texts realign, so it falls quickly with the first changed token.

Both take `kv` (`model.quant.kv`: none | int8 | fp8): every key and value a softmax
attention layer writes then passes through the quantized cache's stored format
(`kernels/kv_quant.py`: one scale per token per head) before any query reads it, so the
model sees exactly the values the engine's quantized cache gives back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from infbench.core.config import LayerSpec
from infbench.core.errors import UserError
from infbench.model.context import AttentionContext, DenseContext, LanguageModel, LayerState
from infbench.model.eval_text import eval_text
from infbench.model.tokenizer import Tokenizer
from kernels._paged_attention import attention_ref
from kernels.kv_quant import KV_QUANT_DTYPES, dequantize_kv_ref, quantize_kv_ref

AGREEMENT_POSITIONS = 32  # new tokens compared per prompt
NUM_PROMPTS = 8
PROMPT_TOKENS = 64
PROMPT_SPACING = 1024  # prompt k starts at test-split token k * PROMPT_SPACING


def token_ids(tokenizer: Tokenizer, split: str, max_tokens: int) -> list[int]:
    """The first `max_tokens` token ids of one split of the evaluation text (no BOS)."""
    if max_tokens < 2:
        raise UserError(f"evaluation needs at least 2 tokens, got {max_tokens}")
    text = eval_text(split)
    # Tokenize a prefix long enough for max_tokens (English BPE: ~4 characters a token).
    ids: list[int] = []
    for num_chars in (max_tokens * 8, len(text)):
        ids = tokenizer.encode(text[:num_chars], add_special_tokens=False)
        if len(ids) > max_tokens or num_chars >= len(text):
            break
    if len(ids) < max_tokens:
        raise UserError(f"the {split} split has {len(ids)} tokens; asked for {max_tokens}")
    return ids[:max_tokens]


def eval_prompts(tokenizer: Tokenizer, num_prompts: int = NUM_PROMPTS,
                 prompt_tokens: int = PROMPT_TOKENS) -> list[list[int]]:
    """The fixed greedy-agreement prompts: `num_prompts` slices of the test split,
    `prompt_tokens` long, starting every PROMPT_SPACING tokens."""
    ids = token_ids(tokenizer, "test", (num_prompts - 1) * PROMPT_SPACING + prompt_tokens)
    return [ids[k * PROMPT_SPACING:k * PROMPT_SPACING + prompt_tokens]
            for k in range(num_prompts)]


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def perplexity(model: LanguageModel, ids: Sequence[int], window: int = 512,
               stride: int | None = None, kv: str = "none") -> float:
    """exp(mean next-token NLL) of `ids` under `model`, window by window.

    stride (default `window`): windows start `stride` tokens apart; with stride < window
    a window rescoring nothing twice gives its later tokens window - stride tokens of
    extra context (the strided evaluation of HF's perplexity guide).
    """
    assert isinstance(model, torch.nn.Module)
    config = getattr(model, "config", None)
    window = min(window, config.max_seq_len) if config is not None else window
    stride = window if stride is None else stride
    if len(ids) < 2 or window < 2 or not 1 <= stride <= window:
        raise UserError(f"perplexity needs >= 2 ids and 1 <= stride <= window, got "
                        f"{len(ids)} ids, window {window}, stride {stride}")
    device = _device(model)
    all_ids = torch.tensor(list(ids), dtype=torch.long, device=device)  # (N,)
    total_nll, num_scored, scored_until = 0.0, 0, 1  # tokens before scored_until are done
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + window, len(ids))
        first = max(scored_until, begin + 1)  # first target index this window scores
        if first >= end:
            continue
        chunk = all_ids[begin:end]  # (L,)
        positions = torch.arange(end - begin, device=device)  # (L,)
        ctx = _with_kv(DenseContext.single(end - begin, config), kv)
        hidden = model(chunk, positions, ctx)  # (L, H)
        # hidden row i predicts token begin + i + 1; score targets first..end-1
        logits = model.compute_logits(hidden[first - begin - 1:end - begin - 1])  # (n, V)
        total_nll += F.cross_entropy(logits.float(), all_ids[first:end], reduction="sum").item()
        num_scored += end - first
        scored_until = end
        if end == len(ids):
            break
    return float(torch.exp(torch.tensor(total_nll / num_scored)).item())


class _QuantizedKV:
    """A context whose softmax-attention K/V pass through the quantized cache format."""

    def __init__(self, inner: AttentionContext, kv: str) -> None:
        self.inner, self.dtype = inner, KV_QUANT_DTYPES[kv]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def num_decode(self) -> int:
        return self.inner.num_decode

    def _round_trip(self, x: torch.Tensor) -> torch.Tensor:
        q, scale = quantize_kv_ref(x, self.dtype)  # (T, Hkv, D), (T, Hkv)
        return dequantize_kv_ref(q, scale).to(x.dtype)

    def attention(self, layer: LayerSpec, q: torch.Tensor, k: torch.Tensor | None,
                  v: torch.Tensor | None, scale: float,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        if k is not None and v is not None:  # a CLA reader gets its owner's stored K/V
            k, v = self._round_trip(k), self._round_trip(v)
        if sinks is None:
            return self.inner.attention(layer, q, k, v, scale)
        return self.inner.attention(layer, q, k, v, scale, sinks=sinks)


def _with_kv(ctx: Any, kv: str) -> Any:
    if kv == "none":
        return ctx
    if kv not in KV_QUANT_DTYPES:
        raise UserError(f"quant.kv={kv!r} is unknown; allowed: none, "
                        f"{', '.join(KV_QUANT_DTYPES)}")
    return _QuantizedKV(ctx, kv)


class _BatchCache:
    """KV cache of B equal-length sequences for greedy decoding through the model's
    `AttentionContext` protocol (softmax attention layers only, CLA included)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # (B, L, Hkv, D) each

    @property
    def num_decode(self) -> int:
        return 0

    def state(self, layer: LayerSpec) -> LayerState:
        raise NotImplementedError("greedy decoding with a cache handles attention layers only")

    def mla_attention(self, layer: LayerSpec, q: torch.Tensor, latent: torch.Tensor,
                      scale: float) -> torch.Tensor:
        raise NotImplementedError("greedy decoding with a cache handles attention layers only")

    def mla_prefill_latents(self, layer: LayerSpec,
                            latent: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        raise NotImplementedError("greedy decoding with a cache handles attention layers only")

    def attention(self, layer: LayerSpec, q: torch.Tensor, k: torch.Tensor | None,
                  v: torch.Tensor | None, scale: float,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        num_new = q.shape[0] // self.batch
        if k is None or v is None:
            keys, values = self.kv[layer.kv_source]  # CLA: the owner stored them this step
        else:
            shape = (self.batch, num_new, k.shape[1], k.shape[2])  # (B, n, Hkv, D)
            keys, values = k.reshape(shape), v.reshape(shape)
            if layer.index in self.kv:
                old_k, old_v = self.kv[layer.index]
                keys, values = torch.cat([old_k, keys], 1), torch.cat([old_v, values], 1)
            self.kv[layer.index] = (keys, values)
        length = keys.shape[1]
        t = torch.arange(length - num_new, length, device=q.device)[:, None]  # (n, 1) query
        p = torch.arange(length, device=q.device)[None, :]  # (1, L) key
        visible = p <= t
        if layer.window is not None:
            visible = visible & (t - p < layer.window)
        if layer.chunk is not None:  # Llama-4: the keys of the query's own chunk
            visible = visible & (p // layer.chunk == t // layer.chunk)
        if sinks is not None:  # gpt-oss: the explicit softmax with a sink column
            q_pos = torch.arange(length - num_new, length, device=q.device)
            return attention_ref(q.reshape(self.batch, num_new, *q.shape[1:]),
                                 keys.transpose(1, 2), values.transpose(1, 2),
                                 q_pos.expand(self.batch, -1), scale, layer.window,
                                 layer.chunk, sinks).reshape(q.shape)  # (B*n, Hq, D)
        qs = q.reshape(self.batch, num_new, q.shape[1], q.shape[2]).transpose(1, 2)
        out = F.scaled_dot_product_attention(  # (B, Hq, n, D)
            qs, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=visible, scale=scale,
            enable_gqa=keys.shape[2] != q.shape[1])
        return out.transpose(1, 2).reshape(q.shape)  # (B*n, Hq, D)


@torch.inference_mode()
def greedy_continuations(model: LanguageModel, prompts: list[list[int]],
                         new_tokens: int = AGREEMENT_POSITIONS,
                         kv: str = "none") -> list[list[int]]:
    """Each prompt continued greedily (argmax) for `new_tokens` tokens, ignoring EOS.

    Prompts of one length whose model has softmax attention only run as one batch with a
    KV cache; any other model recomputes each sequence densely at every step.
    """
    assert isinstance(model, torch.nn.Module)
    if not prompts or any(not p for p in prompts):
        raise UserError("greedy continuations need non-empty prompts")
    config = getattr(model, "config", None)
    specs = getattr(model, "layer_specs", None)
    is_cached = (specs is not None and all(s.mixer == "attention" for s in specs)
                 and len({len(p) for p in prompts}) == 1)
    device = _device(model)
    if is_cached:
        cache = _BatchCache(len(prompts))
        step_ids = torch.tensor(prompts, dtype=torch.long, device=device)  # (B, n)
        start = 0
        outputs: list[list[int]] = [[] for _ in prompts]
        for _ in range(new_tokens):
            num_new = step_ids.shape[1]
            positions = torch.arange(start, start + num_new, device=device).repeat(len(prompts))
            hidden = model(step_ids.reshape(-1), positions, _with_kv(cache, kv))  # (B*n, H)
            last = hidden.view(len(prompts), num_new, -1)[:, -1]  # (B, H)
            next_ids = model.compute_logits(last).argmax(-1)  # (B,)
            for out, token in zip(outputs, next_ids.tolist(), strict=True):
                out.append(int(token))
            start += num_new
            step_ids = next_ids[:, None]  # (B, 1)
        return outputs
    results = []
    for prompt in prompts:
        seq = list(prompt)
        for _ in range(new_tokens):
            ids = torch.tensor(seq, dtype=torch.long, device=device)  # (L,)
            hidden = model(ids, torch.arange(len(seq), device=device),
                           _with_kv(DenseContext.single(len(seq), config), kv))  # (L, H)
            seq.append(int(model.compute_logits(hidden[-1:]).argmax(-1).item()))
        results.append(seq[len(prompt):])
    return results


def greedy_agreement(candidate: list[list[int]], reference: list[list[int]],
                     positions: int = AGREEMENT_POSITIONS) -> float:
    """Fraction of the first `positions` new tokens, over all prompts, where the
    candidate's free-running greedy continuation equals the reference's."""
    if len(candidate) != len(reference) or not reference:
        raise ValueError(f"{len(candidate)} candidate and {len(reference)} reference "
                         "continuations: expected the same non-zero number")
    matches = total = 0
    for cand, ref in zip(candidate, reference, strict=True):
        n = min(positions, len(ref))
        if len(cand) < n:
            raise ValueError(f"candidate continuation has {len(cand)} tokens, expected {n}")
        matches += sum(a == b for a, b in zip(cand[:n], ref[:n], strict=True))
        total += n
    if total == 0:
        raise ValueError("no positions to compare")
    return matches / total
