"""Masked-diffusion language models (LLaDA / Dream family): a bidirectional decoder.

The network is the Llama-style `Transformer` of `model/transformer.py` unchanged; what
makes it a diffusion LM is the attention mask (full, not causal: every position sees
every other) and a mask token id, the "noise" that decoding replaces step by step
(`engine/diffusion.py`).  `BidirectionalContext` is the `AttentionContext` that gives
the full mask, for a batch of equal-length sequences, and optionally keeps a prefix's
K/V for block-wise caching (Fast-dLLM's prefix cache).

`load_llada(dir)` reads a LLaDA-format Hugging Face directory: config.json with
model_type "llada" (OLMo-style keys) and safetensors with LLaDA's weight names, mapped
onto the Llama names the shared loader already fuses (`LLADA_NAMES`); the config keys are
read by `checkpoint/llada.py` (no torch, so `predict` can price a LLaDA directory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from infbench.checkpoint.llada import read_llada_config
from infbench.core.config import LayerSpec, ModelConfig
from infbench.core.errors import UserError
from infbench.model.context import LayerState
from infbench.model.dtypes import torch_dtype
from infbench.model.loader import _safetensors_tensors, _WeightSink
from infbench.model.transformer import Transformer


@dataclass
class DiffusionLM:
    """A bidirectional Transformer plus the token id that marks a masked position."""

    model: Transformer
    config: ModelConfig
    mask_token_id: int
    source: str = ""

    def __post_init__(self) -> None:
        check_mask_token(self.config, self.mask_token_id)

    def logits(self, tokens: torch.Tensor, ctx: BidirectionalContext | None = None,
               start: int = 0, logit_range: tuple[int, int] | None = None) -> torch.Tensor:
        """tokens (B, N) at positions start..start+N-1 -> float32 logits (B, n, V).

        logit_range (lo, hi): the LM head runs on those columns of the N only (n = hi - lo);
        None: all N.  ctx defaults to a full bidirectional context without a cache.
        """
        batch, length = tokens.shape
        ctx = ctx or BidirectionalContext(batch, length)
        positions = torch.arange(start, start + length, device=tokens.device)  # (N,)
        hidden = self.model(tokens.reshape(-1), positions.repeat(batch), ctx)  # (B*N, H)
        hidden = hidden.view(batch, length, -1)  # (B, N, H)
        if logit_range is not None:
            hidden = hidden[:, logit_range[0]:logit_range[1]]
        rows = hidden.shape[1]
        return self.model.compute_logits(hidden.reshape(batch * rows, -1)).view(batch, rows, -1)


def check_mask_token(config: ModelConfig, mask_token_id: int | None) -> int:
    """The mask id, checked against the vocabulary; a model without one is a one-line error."""
    if mask_token_id is None:
        raise UserError(f"model {config.name!r} has no mask token: a diffusion model needs one "
                        "(decoding.mask_token_id, or mask_token_id in a LLaDA config.json)")
    if isinstance(mask_token_id, bool) or not 0 <= int(mask_token_id) < config.vocab_size:
        raise UserError(f"mask_token_id must be in 0..{config.vocab_size - 1} (the model's "
                        f"vocabulary), got {mask_token_id!r}")
    return int(mask_token_id)


class BidirectionalContext:
    """Full (non-causal) attention over `batch` sequences of `length` tokens each.

    The step's tokens arrive flattened, sequence after sequence: (batch * length, H, D).
    Prefix caching: `record_prefix=p` keeps each layer's K/V of the first p positions of
    this call; a later context built with `prefix=that dict` prepends them to its own
    keys and values, so its tokens attend to the cached prefix and to each other.
    """

    def __init__(self, batch: int, length: int, *, record_prefix: int = 0,
                 prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        if batch < 1 or length < 1 or not 0 <= record_prefix <= length:
            raise ValueError(f"bad context shape: batch {batch}, length {length}, "
                             f"record_prefix {record_prefix}")
        self.batch, self.length = batch, length
        self.record_prefix = record_prefix
        self.prefix = prefix or {}
        # layer index -> (K, V) of the first record_prefix positions, (B, p, Hkv, D) each
        self.recorded: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # CLA sharing

    @property
    def num_decode(self) -> int:
        return 0

    def attention(self, layer: LayerSpec, q: torch.Tensor, k: torch.Tensor | None,
                  v: torch.Tensor | None, scale: float) -> torch.Tensor:
        b, n = self.batch, self.length
        if q.shape[0] != b * n:
            raise ValueError(f"q has {q.shape[0]} tokens, the context covers {b} x {n}")
        if k is None or v is None:
            k, v = self._kv[layer.kv_source]
        else:
            self._kv[layer.index] = (k, v)
        ks = k.view(b, n, *k.shape[1:])  # (B, N, Hkv, D)
        vs = v.view(b, n, *v.shape[1:])  # (B, N, Hkv, D)
        if self.record_prefix:
            p = self.record_prefix
            self.recorded[layer.index] = (ks[:, :p].clone(), vs[:, :p].clone())
        if layer.index in self.prefix:
            pk, pv = self.prefix[layer.index]  # (B, P, Hkv, D)
            ks, vs = torch.cat([pk, ks], dim=1), torch.cat([pv, vs], dim=1)  # (B, P+N, Hkv, D)
        if layer.window is not None:
            raise UserError(f"layer {layer.index}: sliding-window attention has no "
                            "bidirectional form in infbench's diffusion models")
        qs = q.view(b, n, *q.shape[1:]).transpose(1, 2)  # (B, Hq, N, D)
        out = F.scaled_dot_product_attention(
            qs, ks.transpose(1, 2), vs.transpose(1, 2), scale=scale,
            enable_gqa=ks.shape[2] != qs.shape[1])  # (B, Hq, N, D): no mask, all visible
        return out.transpose(1, 2).reshape(b * n, *q.shape[1:])  # (B*N, Hq, D)

    def state(self, layer: LayerSpec) -> LayerState:
        raise UserError(f"layer {layer.index} ({layer.mixer}): diffusion models here are "
                        "softmax-attention transformers only")

    def mla_attention(self, layer: LayerSpec, q: torch.Tensor, latent: torch.Tensor,
                      scale: float) -> torch.Tensor:
        raise UserError(f"layer {layer.index}: MLA is not supported in diffusion models")

    def mla_prefill_latents(self, layer: LayerSpec,
                            latent: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        raise UserError(f"layer {layer.index}: MLA is not supported in diffusion models")


# ------------------------------------------------------------- LLaDA checkpoints
# LLaDA's modeling_llada.py (LLaDALlamaBlock, OLMo naming) -> the Llama names the shared
# _WeightSink fuses: ff_proj is the SwiGLU gate, up_proj the up input, ff_out the down
# projection inside a block and the LM head at the top.
LLADA_NAMES = {
    "q_proj.weight": "self_attn.q_proj.weight",
    "k_proj.weight": "self_attn.k_proj.weight",
    "v_proj.weight": "self_attn.v_proj.weight",
    "attn_out.weight": "self_attn.o_proj.weight",
    "ff_proj.weight": "mlp.gate_proj.weight",
    "up_proj.weight": "mlp.up_proj.weight",
    "ff_out.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ff_norm.weight": "post_attention_layernorm.weight",
}
LLADA_TOP = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"model\.transformer\.blocks\.(\d+)\.(.+)")


def llada_to_hf_name(name: str, origin: str) -> str:
    """A LLaDA tensor name -> its Llama (HF) name; an unknown name is a one-line error."""
    if name in LLADA_TOP:
        return LLADA_TOP[name]
    match = _BLOCK.fullmatch(name)
    if match and match.group(2) in LLADA_NAMES:
        return f"model.layers.{match.group(1)}.{LLADA_NAMES[match.group(2)]}"
    raise UserError(f"{origin}: unexpected tensor {name!r} for a LLaDA model")


def load_llada(path: str | Path, dtype: str = "float32", device: str = "cpu",
               mask_token_id: int | None = None) -> DiffusionLM:
    """A LLaDA-format HF directory (config.json + *.safetensors) -> DiffusionLM.

    mask_token_id overrides the config's (a checkpoint without one needs it).
    """
    root = Path(path)
    config, file_mask = read_llada_config(root)
    mask = check_mask_token(config, mask_token_id if mask_token_id is not None else file_mask)
    model = Transformer(config, dtype=torch_dtype(dtype), device=device)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise UserError(f"{root}: no *.safetensors weights")
    sink = _WeightSink(model, str(root))
    for file in files:
        for name, tensor in _safetensors_tensors(file):
            sink.put(llada_to_hf_name(name, str(root)), tensor)
    sink.finish()
    model.init_rope_cache()
    return DiffusionLM(model.eval(), config, mask, f"llada {root}")
