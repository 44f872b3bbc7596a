"""A plain-torch forward of the run's model shape: the CI gate's same-run reference.

`gate.normalize: torch_reference` gates engine tokens/s divided by the tokens/s of this
module, measured in the same process between the engine's repeats.  Both run the same
model shape (layers, heads, hidden and MLP sizes, vocabulary, dtype) on the same batch,
prompt and output lengths, so whatever the machine does to one it does to the other:
CPU speed, thread count, memory bandwidth, a neighbour's load.  What the reference does
not share is the engine's own code (scheduler, block manager, paged KV cache, input
preparation, kernel backend), so a slower engine moves the ratio and a slower machine
does not.

The reference is deliberately naive and self-contained: its own seeded random weights
(the same shapes and bytes as the model's, independent of how a kernel backend stores
or repacks the engine's weights), a dense (B, Hkv, T, D) KV cache per wave, F.linear,
matmul + softmax attention, greedy argmax.  It imports nothing from the engine, the
model code or the kernels, so their changes never move it.  It supports the
Llama-family softmax-attention models (mha, gqa, mqa); other layouts are refused.
`load_state_dict` takes a `Transformer` state dict, which is how the tests check that
it computes the same function as the model.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from infbench.core.config import ModelConfig

SUPPORTED_ATTENTION = ("mha", "gqa", "mqa")


def unsupported_reason(cfg: ModelConfig) -> str | None:
    """Why the reference cannot run `cfg` (None when it can)."""
    if cfg.moe is not None:
        return "mixture-of-experts MLPs"
    if cfg.arch not in ("llama", "mistral"):
        return f"arch {cfg.arch!r}"
    if cfg.attention.kind not in SUPPORTED_ATTENTION:
        return f"attention.kind {cfg.attention.kind!r}"
    return None


@dataclass(frozen=True)
class Wave:
    """`batch` sequences prefilled together to `prompt_len`, then decoded `gen_len` tokens."""

    batch: int
    prompt_len: int
    gen_len: int


@dataclass(frozen=True)
class ReferencePlan:
    """The reference's work for one run: the run's sequences in waves of the engine's batch.

    Every sequence (each of a request's n samples) is its own row; a wave pads its rows
    to its longest prompt and output, so fixed-length workloads (the CI gate) match the
    engine's work exactly and others approximately, the same way on every run.
    """

    waves: tuple[Wave, ...]

    @classmethod
    def for_requests(cls, requests: Sequence[Any], max_num_seqs: int) -> ReferencePlan:
        """Waves of at most `max_num_seqs` sequences in request order (requests: engine
        `Request`s: prompt_ids, sampling.max_tokens, n)."""
        rows = [(len(r.prompt_ids), r.sampling.max_tokens) for r in requests
                for _ in range(r.n)]
        if not rows or max_num_seqs < 1:
            raise ValueError("a reference plan needs at least one request and max_num_seqs >= 1")
        waves = []
        for i in range(0, len(rows), max_num_seqs):
            chunk = rows[i:i + max_num_seqs]
            waves.append(Wave(len(chunk), max(p for p, _ in chunk), max(g for _, g in chunk)))
        return cls(tuple(waves))

    @property
    def num_output_tokens(self) -> int:
        return sum(w.batch * w.gen_len for w in self.waves)

    @property
    def max_len(self) -> int:
        return max(w.prompt_len + w.gen_len for w in self.waves)


@dataclass(frozen=True)
class ReferenceRun:
    """One timed pass over a plan."""

    wall_s: float
    num_output_tokens: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x (B, H, T, D) with cos/sin (T, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, D/2) each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class TorchReference:
    """The model's forward in plain torch over a dense KV cache (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: str | torch.device,
                 seed: int = 0) -> None:
        reason = unsupported_reason(cfg)
        if reason is not None:
            raise ValueError(f"the torch reference does not run {reason}; it runs Llama-family "
                             f"models with attention.kind {', '.join(SUPPORTED_ATTENTION)}")
        self.cfg = cfg
        self.dtype = dtype
        self.device = torch.device(device)
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.kv_heads
        self.head_dim = cfg.dim_head
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.weights = self._random_weights(seed)
        self._rope_len = 0
        self._cos = self._sin = torch.empty(0)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter name -> shape, named as in `Transformer.state_dict()`."""
        c = self.cfg
        h, inter = c.hidden_size, c.intermediate_size
        out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (c.vocab_size, h)}
        for i in range(c.num_layers):
            p = f"layers.{i}."
            out[p + "input_layernorm.weight"] = (h,)
            out[p + "self_attn.qkv_proj.weight"] = (self.q_size + 2 * self.kv_size, h)
            out[p + "self_attn.o_proj.weight"] = (h, self.q_size)
            out[p + "post_attention_layernorm.weight"] = (h,)
            out[p + "mlp.gate_up_proj.weight"] = (2 * inter, h)
            out[p + "mlp.down_proj.weight"] = (h, inter)
        out["norm.weight"] = (h,)
        if not c.tie_word_embeddings:
            out["lm_head.weight"] = (c.vocab_size, h)
        return out

    def _random_weights(self, seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for name, shape in self.shapes().items():
            if len(shape) == 1:  # norm weights
                out[name] = torch.ones(shape, dtype=self.dtype, device=self.device)
                continue
            w = torch.randn(shape, generator=gen) * shape[1] ** -0.5  # (out, in), unit gain
            out[name] = w.to(device=self.device, dtype=self.dtype)
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take the model's weights (a `Transformer.state_dict()`): for the equality tests."""
        for name, shape in self.shapes().items():
            if tuple(state[name].shape) != shape:
                raise ValueError(f"{name}: shape {tuple(state[name].shape)}, expected {shape}")
            self.weights[name] = state[name].to(device=self.device, dtype=self.dtype)

    @property
    def weight_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.weights.values())

    def _rope(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (length, D/2) for positions start..start+length (unscaled frequencies:
        a scaled RoPE changes the values, not the work)."""
        end = start + length
        if end > self._rope_len:
            self._rope_len = max(end, 2 * self._rope_len)
            inv = 1.0 / (self.cfg.rope_theta ** (
                torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
            freqs = torch.outer(torch.arange(self._rope_len, dtype=torch.float32), inv)
            self._cos = freqs.cos().to(device=self.device, dtype=self.dtype)  # (L, D/2)
            self._sin = freqs.sin().to(device=self.device, dtype=self.dtype)
        return self._cos[start:end], self._sin[start:end]

    def forward(self, ids: torch.Tensor, start: int, cache: list[torch.Tensor]) -> torch.Tensor:
        """ids (B, T) at positions start..start+T -> logits of the last position (B, V).

        cache: per layer a (2, B, Hkv, max_len, D) tensor; this call writes its T slots.
        """
        c, w = self.cfg, self.weights
        b, t = ids.shape
        group = self.num_heads // self.num_kv_heads
        x = F.embedding(ids.reshape(-1), w["embed_tokens.weight"])  # (B*T, H)
        cos, sin = self._rope(start, t)
        end = start + t
        mask = None
        if t > 1:  # causal over the new tokens; every earlier slot is visible
            mask = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start)
        for i in range(c.num_layers):
            p = f"layers.{i}."
            h = _rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            qkv = F.linear(h, w[p + "self_attn.qkv_proj.weight"])  # (B*T, Q + 2KV)
            q, k, v = qkv.view(b, t, -1).split([self.q_size, self.kv_size, self.kv_size], -1)
            q = _rotate(q.reshape(b, t, self.num_heads, -1).transpose(1, 2), cos, sin)
            k = _rotate(k.reshape(b, t, self.num_kv_heads, -1).transpose(1, 2), cos, sin)
            cache[i][0, :, :, start:end] = k  # (B, Hkv, T, D)
            cache[i][1, :, :, start:end] = v.reshape(b, t, self.num_kv_heads, -1).transpose(1, 2)
            keys, values = cache[i][0, :, :, :end], cache[i][1, :, :, :end]  # (B, Hkv, S, D)
            # GQA without copying the KV: the query heads of one KV head as extra rows.
            qg = q.reshape(b, self.num_kv_heads, group * t, self.head_dim)  # (B, Hkv, G*T, D)
            scores = (qg @ keys.transpose(-1, -2)).float() * self.head_dim ** -0.5
            if mask is not None:  # (B, Hkv, G, T, S) view to broadcast the (T, S) mask
                scores = scores.view(b, self.num_kv_heads, group, t, end).masked_fill(
                    ~mask, float("-inf")).view(b, self.num_kv_heads, group * t, end)
            attn = scores.softmax(-1).to(self.dtype) @ values  # (B, Hkv, G*T, D)
            attn = attn.view(b, self.num_heads, t, self.head_dim).transpose(1, 2)  # (B,T,Hq,D)
            x = x + F.linear(attn.reshape(b * t, self.q_size), w[p + "self_attn.o_proj.weight"])
            h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate, up = F.linear(h, w[p + "mlp.gate_up_proj.weight"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])  # (B*T, H)
        last = _rms_norm(x.view(b, t, -1)[:, -1], w["norm.weight"], c.rms_norm_eps)  # (B, H)
        head = w.get("lm_head.weight", w["embed_tokens.weight"])
        return F.linear(last, head).float()  # (B, V)

    def generate(self, prompts: torch.Tensor, gen_len: int) -> torch.Tensor:
        """Greedy: prompts (B, P) -> generated ids (B, gen_len)."""
        b, p = prompts.shape
        cache = [torch.empty(2, b, self.num_kv_heads, p + gen_len, self.head_dim,
                             dtype=self.dtype, device=self.device)
                 for _ in range(self.cfg.num_layers)]
        out = torch.empty(b, gen_len, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            token = self.forward(prompts, 0, cache).argmax(-1)  # (B,)
            out[:, 0] = token
            for j in range(1, gen_len):
                token = self.forward(token[:, None], p + j - 1, cache).argmax(-1)
                out[:, j] = token
        return out

    def run(self, plan: ReferencePlan, seed: int = 0) -> ReferenceRun:
        """Time one pass over `plan` (random prompts, drawn outside the timed region)."""
        gen = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(0, self.cfg.vocab_size, (w.batch, w.prompt_len),
                                 generator=gen).to(self.device) for w in plan.waves]
        self._rope(0, plan.max_len)  # the table once, outside the timed region
        self._sync()
        start = time.perf_counter()
        for wave, ids in zip(plan.waves, prompts, strict=True):
            self.generate(ids, wave.gen_len)
        self._sync()
        return ReferenceRun(time.perf_counter() - start, plan.num_output_tokens)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class SameRunReference:
    """A reference and its plan, timed between the engine's repeats (measure/bench.py)."""

    def __init__(self, reference: TorchReference, plan: ReferencePlan, seed: int = 0) -> None:
        self.reference = reference
        self.plan = plan
        self.seed = seed

    def time(self) -> ReferenceRun:
        return self.reference.run(self.plan, self.seed)

    @staticmethod
    def bracket(before: ReferenceRun, after: ReferenceRun) -> dict[str, Any]:
        """`metrics.torch_reference` of the repeat between two passes: their mean time."""
        wall = (before.wall_s + after.wall_s) / 2
        return {"output_tokens_per_s": after.num_output_tokens / wall, "wall_s": wall,
                "num_output_tokens": after.num_output_tokens,
                "num_threads": torch.get_num_threads()}
