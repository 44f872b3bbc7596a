"""FLOPs and bytes of one layer for one batch composition, per operator.

Counting rules (the engine's measured traffic uses the same ones):

- A matmul over T tokens costs 2*T*in*out FLOPs and reads its input and writes its
  output once in the model dtype; its weights are read once per step whatever T is.
- Attention over a sequence with q new tokens and context c attends
  `attended_pairs(c, q, window, chunk)` (query, key) pairs (causal, windowed or
  chunked) and reads the KV of `kv_tokens_read(c, q, window, chunk)` tokens; score
  and value each cost 2*pairs*heads*dim. K goes with the score, V with the value; the
  new tokens' K/V are written to the cache by the QKV projection.  Softmax, RoPE, residual adds and
  biases are assumed fused into neighbouring kernels: their bytes are not counted.
- MLA picks, per sequence, the cheaper form in FLOPs: absorbed (q and output
  projected through W_UK/W_UV, attention over the latent cache, as vLLM decodes) or
  expanded (the cached latents up-projected to per-head K/V, as vLLM prefills).
- Linear attention uses the chunkwise parallel form (causal phi(Q)phi(K)^T within
  the new tokens plus phi(Q)S from the prior state), which is the recurrent form
  when q = 1.  Linear and SSM state is read if the sequence has one and written back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infbench.core.config import LayerSpec, ModelConfig, QuantConfig
from infbench.roofline.ops import SeqWork
from infbench.roofline.shapes import (
    feature_dim,
    has_mlp,
    is_moe_layer,
    layer_state_bytes,
    layer_weights,
    mamba_dims,
    mla_dims,
)

# One operator's running totals: kind, flops, weight, kv read, kv write, state, act bytes.
Totals = dict[str, list[Any]]
FIELDS = ("flops", "weight_bytes", "kv_read_bytes", "kv_write_bytes", "state_bytes", "act_bytes")
Groups = Sequence[tuple[SeqWork, int]]  # distinct SeqWork and how many sequences share it


def add(acc: Totals, name: str, kind: str, flops: float = 0.0, weight: float = 0.0,
        kv_read: float = 0.0, kv_write: float = 0.0, state: float = 0.0,
        act: float = 0.0) -> None:
    row = acc.setdefault(name, [kind, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    row[1] += flops
    row[2] += weight
    row[3] += kv_read
    row[4] += kv_write
    row[5] += state
    row[6] += act


def _prefix_pairs(n: int, window: int | None, chunk: int | None = None) -> int:
    """sum over positions p = 1..n of the keys position p sees: min(p, window), or
    ((p - 1) % chunk) + 1 when chunked (each chunk's queries see only its own keys)."""
    if chunk is not None:
        whole, rest = divmod(n, chunk)
        return whole * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


# The two counts below have the kernels' names and argument order
# (kernels/_paged_attention.py); the kernels package may not be imported here (no torch in
# the analytic model), so tests/roofline/test_costs.py checks that both agree.
def attended_pairs(context_len: int, num_query_tokens: int, window: int | None,
                   chunk: int | None = None) -> int:
    """(query, key) pairs when the last q of c tokens attend causally (within a window, or
    within their chunk)."""
    c, q = context_len, num_query_tokens
    return _prefix_pairs(c, window, chunk) - _prefix_pairs(c - q, window, chunk)


def kv_tokens_read(context_len: int, num_query_tokens: int, window: int | None,
                   chunk: int | None = None) -> int:
    """Distinct keys the last q of c tokens attend to: the KV tokens that must be read
    (chunked: from the first query's chunk start to the end)."""
    c, q = context_len, num_query_tokens
    if chunk is not None:
        return c - (c - q) // chunk * chunk
    return c if window is None else min(c, q - 1 + window)


def _matmul(acc: Totals, name: str, tokens: float, in_f: int, out_f: int, a: int) -> None:
    add(acc, name, "matmul", flops=2.0 * tokens * in_f * out_f, act=tokens * (in_f + out_f) * a)


# Soft-capping (Gemma-2) adds cap * tanh(x / cap) per score or logit: a divide, a tanh and
# a multiply, priced as FLOPs only (it runs on values already on chip).
SOFTCAP_FLOPS = 3.0


def _norm(acc: Totals, tokens: float, width: int, a: int) -> None:
    # RMSNorm: square, sum, scale, weight: about 4 FLOPs per element.
    add(acc, "norm", "elementwise", flops=4.0 * tokens * width, act=2.0 * tokens * width * a)


def _attention(acc: Totals, cfg: ModelConfig, spec: LayerSpec, groups: Groups, t: int,
               a: int, kvb: float, sb: int) -> None:
    d, h, hd, kvh = cfg.hidden_size, cfg.num_heads, cfg.dim_head, cfg.kv_heads
    kv_width = 2 * kvh * hd if spec.owns_kv else 0
    kv_scales = 2 * kvh * sb if spec.owns_kv else 0  # a quantized cache's row scales
    add(acc, "qkv_proj", "matmul", flops=2.0 * t * d * (h * hd + kv_width),
        act=t * (d + h * hd) * a, kv_write=t * (kv_width * kvb + kv_scales))
    if cfg.qkv_bias or cfg.attention_bias:  # Qwen2, gpt-oss: one add per projected value
        add(acc, "qkv_proj", "matmul", flops=t * (h * hd + kv_width))
    if cfg.qk_norm or (cfg.qk_l2_norm and spec.rope):  # Qwen3, Gemma-3, Llama-4 RoPE layers:
        _norm(acc, t * (h + (kvh if spec.owns_kv else 0)), hd, a)  # each head of q and k
    for sw, n in groups:
        pairs = attended_pairs(sw.context_len, sw.query_len, spec.window, spec.chunk)
        keys = kv_tokens_read(sw.context_len, sw.query_len, spec.window, spec.chunk)
        # CLA layers without their own cache read the owner's: the read is still paid.
        kv = n * keys * kvh * (hd * kvb + sb)
        act = n * sw.query_len * h * hd * a
        add(acc, "attn_score", "attention", flops=2.0 * n * pairs * h * hd, kv_read=kv, act=act)
        if spec.softcap is not None:
            add(acc, "attn_score", "attention", flops=SOFTCAP_FLOPS * n * pairs * h)
        add(acc, "attn_value", "attention", flops=2.0 * n * pairs * h * hd, kv_read=kv, act=act)
    _matmul(acc, "o_proj", t, h * hd, d, a)
    if cfg.attention_bias:  # gpt-oss: o_proj's bias
        add(acc, "o_proj", "matmul", flops=t * d)


def mla_absorbed_is_cheaper(cfg: ModelConfig, sw: SeqWork, window: int | None) -> bool:
    """Whether the absorbed MLA form needs no more FLOPs than the expanded one."""
    r, rope, nope, v = mla_dims(cfg)
    q = sw.query_len
    pairs = attended_pairs(sw.context_len, q, window)
    keys = kv_tokens_read(sw.context_len, q, window)
    absorbed = q * r * (nope + v) + pairs * (2 * r + rope)
    expanded = keys * r * (nope + v) + pairs * (nope + rope + v)
    return absorbed <= expanded


def _mla(acc: Totals, cfg: ModelConfig, spec: LayerSpec, groups: Groups, t: int, a: int,
         kvb: float, sb: int) -> None:
    d, h = cfg.hidden_size, cfg.num_heads
    r, rope, nope, v = mla_dims(cfg)
    qlr = cfg.attention.q_lora_rank
    if qlr is None:
        _matmul(acc, "qkv_proj", t, d, h * (nope + rope), a)
    else:
        _matmul(acc, "qkv_proj", t, d, qlr, a)
        _norm(acc, t, qlr, a)
        _matmul(acc, "qkv_proj", t, qlr, h * (nope + rope), a)
    # kv_a: the latent and the shared RoPE key go straight to the cache (kv_a norm fused).
    add(acc, "qkv_proj", "matmul", flops=2.0 * t * d * (r + rope), act=t * d * a,
        kv_write=t * ((r + rope) * kvb + sb) if spec.has_kv_cache else 0.0)
    _norm(acc, t, r, a)
    for sw, n in groups:
        q = sw.query_len
        pairs = attended_pairs(sw.context_len, q, spec.window)
        keys = kv_tokens_read(sw.context_len, q, spec.window)
        latent = n * keys * ((r + rope) * kvb + sb)
        if mla_absorbed_is_cheaper(cfg, sw, spec.window):
            # W_UK folds into the query and W_UV into the output: kv_b runs on q tokens.
            add(acc, "qkv_proj", "matmul", flops=2.0 * n * q * r * h * (nope + v),
                act=n * q * h * (nope + r + r + v) * a)
            # One pass over the latent tiles serves both products (FlashMLA): the score
            # reads r + rope columns of each latent row and the value the same r, so the
            # latent bytes are attributed in that ratio (the step's total is unchanged).
            score_share = (r + rope) / (2 * r + rope)
            add(acc, "attn_score", "attention", flops=2.0 * n * pairs * h * (r + rope),
                kv_read=latent * score_share, act=n * q * h * (r + rope) * a)
            add(acc, "attn_value", "attention", flops=2.0 * n * pairs * h * r,
                kv_read=latent * (1.0 - score_share), act=n * q * h * r * a)
        else:
            add(acc, "qkv_proj", "matmul", flops=2.0 * n * keys * r * h * (nope + v),
                kv_read=latent, act=n * keys * h * (nope + v) * a)
            add(acc, "attn_score", "attention", flops=2.0 * n * pairs * h * (nope + rope),
                act=n * (q * h * (nope + rope) + keys * (h * nope + rope)) * a)
            add(acc, "attn_value", "attention", flops=2.0 * n * pairs * h * v,
                act=n * (keys * h * v + q * h * v) * a)
    _matmul(acc, "o_proj", t, h * v, d, a)


def _linear_attention(acc: Totals, cfg: ModelConfig, spec: LayerSpec, groups: Groups, t: int,
                      a: int) -> None:
    d, h, hd, kvh = cfg.hidden_size, cfg.num_heads, cfg.dim_head, cfg.kv_heads
    f = feature_dim(cfg)
    elementwise = cfg.attention.feature_map in ("elu", "relu") and f == hd
    phi = f if elementwise else 2 * hd * f  # FLOPs of one phi(x)
    _matmul(acc, "qkv_proj", t, d, (h + 2 * kvh) * hd, a)
    state = layer_state_bytes(cfg, spec, a)
    for sw, n in groups:
        q = sw.query_len
        pairs = q * (q + 1) // 2
        has_state = sw.context_len > q  # a state carried over from earlier tokens
        # intra-chunk scores and weighted values, normalizer, state update, division
        per_head = 2 * pairs * (f + hd) + pairs + 2 * q * f * hd + q * f + q * hd
        if has_state:
            per_head += 2 * q * f * (hd + 1)  # phi(q) S_prev and phi(q) z_prev
        flops = n * (h * per_head + q * (h + kvh) * phi)
        add(acc, "linear_attn", "attention", flops=flops,
            state=n * state * (2 if has_state else 1),
            act=n * q * (2 * h + 2 * kvh) * hd * a)
    _matmul(acc, "o_proj", t, h * hd, d, a)


def _ssm(acc: Totals, cfg: ModelConfig, spec: LayerSpec, groups: Groups, t: int, a: int) -> None:
    d = cfg.hidden_size
    di, n_state, dc, rank = mamba_dims(cfg)
    conv_state, ssm_state = di * dc * a, di * n_state * a
    reads = sum(n for sw, n in groups if sw.context_len > sw.query_len)
    seqs = sum(n for _, n in groups)
    _matmul(acc, "ssm_in_proj", t, d, 2 * di, a)
    add(acc, "ssm_conv", "elementwise", flops=2.0 * t * di * dc + 2.0 * t * di,
        state=(seqs + reads) * conv_state, act=2.0 * t * di * a)
    add(acc, "ssm_x_proj", "matmul", flops=2.0 * t * di * (rank + 2 * n_state + rank),
        act=t * (di + rank + 2 * n_state + rank + di) * a)
    # Selective scan: discretize, update and read out the state, about 9 FLOPs per
    # (token, channel, state) as in mamba_ssm's flop count; plus the D skip and z gate.
    add(acc, "ssm_scan", "scan", flops=9.0 * t * di * n_state + 4.0 * t * di,
        state=(seqs + reads) * ssm_state, act=t * (4 * di + 2 * n_state) * a)
    _matmul(acc, "ssm_out_proj", t, di, d, a)


def _swiglu(acc: Totals, name: str, tokens: float, d: int, f: int, a: int) -> None:
    add(acc, name, "matmul", flops=tokens * (6.0 * d * f + 4.0 * f),
        act=tokens * (d + 2 * f + 2 * f + f + f + d) * a)


def _mlp(acc: Totals, cfg: ModelConfig, spec: LayerSpec, t: int, a: int) -> None:
    d = cfg.hidden_size
    if not is_moe_layer(cfg, spec):
        _swiglu(acc, "mlp", t, d, cfg.intermediate_size, a)
        return
    moe = cfg.moe
    assert moe is not None
    _matmul(acc, "moe_router", t, d, moe.num_experts, a)
    if moe.num_shared_experts:
        _swiglu(acc, "moe_shared", t, d, moe.shared_size, a)
        if moe.shared_gate:
            _matmul(acc, "moe_shared", t, d, 1, a)
    _swiglu(acc, "moe_experts", t * moe.num_experts_per_tok, d, moe.moe_intermediate_size, a)
    add(acc, "moe_experts", "matmul", act=t * d * a)  # the weighted combine writes once
    if moe.router_bias:  # gpt-oss: one add per router logit
        add(acc, "moe_router", "matmul", flops=t * moe.num_experts)
    if moe.expert_bias:  # gpt-oss: one add per gate/up and down output of each pair
        pairs = t * moe.num_experts_per_tok
        add(acc, "moe_experts", "matmul", flops=pairs * (2 * moe.moe_intermediate_size + d))


def layer_costs(cfg: ModelConfig, spec: LayerSpec, groups: Groups, a: int, kvb: float,
                quant: QuantConfig) -> Totals:
    """Operator totals of one layer; `a` is the model dtype's bytes, `kvb` the bytes of a
    cached value (a quantized cache adds `quant.kv_scale_bytes` per stored row)."""
    t = sum(sw.query_len * n for sw, n in groups)
    acc: Totals = {}
    _norm(acc, t, cfg.hidden_size, a)
    if spec.mixer == "attention":
        _attention(acc, cfg, spec, groups, t, a, kvb, quant.kv_scale_bytes)
    elif spec.mixer == "mla":
        _mla(acc, cfg, spec, groups, t, a, kvb, quant.kv_scale_bytes)
    elif spec.mixer == "linear":
        _linear_attention(acc, cfg, spec, groups, t, a)
    else:
        _ssm(acc, cfg, spec, groups, t, a)
    if cfg.is_gemma:  # Gemma: the attention output is normed before the residual add
        _norm(acc, t, cfg.hidden_size, a)
    if has_mlp(cfg):
        _norm(acc, t, cfg.hidden_size, a)
        _mlp(acc, cfg, spec, t, a)
        if cfg.is_gemma:  # and so is the MLP output
            _norm(acc, t, cfg.hidden_size, a)
    hit = 1.0
    if cfg.moe is not None:  # fraction of routed experts that at least one token selects
        hit = cfg.moe.expected_distinct_experts(t) / cfg.moe.num_experts
    for w in layer_weights(cfg, spec):
        add(acc, w.op, acc[w.op][0], weight=w.nbytes(quant, a) * (hit if w.expert else 1.0))
    return acc
