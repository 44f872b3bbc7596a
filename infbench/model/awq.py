"""AWQ: activation-aware int4 weight quantization (Lin et al. 2023, after AutoAWQ's design).

A few input channels of each projection carry much larger activations than the rest, and
the rounding error of their weights costs the most.  AWQ multiplies those weight columns
by a per-input-channel scale s > 1 before round-to-nearest int4 (so they get relatively
finer steps) and divides the activations by s, which leaves the float product unchanged:
W x = (W s)(x / s).  Per projection it searches

    s = mean|x| ** alpha  (normalized so sqrt(max(s) * min(s)) = 1),  alpha in 0, 0.05, .., 0.95

and keeps the alpha minimizing that projection's output error on the calibration
activations X (T, K), || X (Q(W s) / s - W)^T ||_F^2 (from X itself while T <= K, from
the Gram matrix X^T X beyond: `calibration.InputStats.error`, so one evaluation costs
2 N K min(T, K) flops).  alpha = 0 is s = 1, plain RTN, so the chosen error is never above
RTN's.  Then, as AutoAWQ, a clipping search shrinks each (row, group)'s
quantization range to [r * min, r * max], r in 1, 0.95, .., 0.55, keeping the r with the
smallest output error of that group's share of the product (q and k rows are not clipped:
their error passes through the softmax, as AutoAWQ's note says).

Nothing extra is stored: every 1 / s is folded, exactly in real arithmetic, into the
operation that produces the projection's input, as AWQ does for Llama models:

- qkv_proj input = input_layernorm(h) = rmsnorm(h) * g: g <- g / s;
- gate_up_proj input = post_attention_layernorm(h): likewise;
- down_proj input = silu(gate) * up: the up rows of gate_up_proj (and bias) <- / s,
  before gate_up_proj's own search (which then sees those rows);
- o_proj input = attention output = softmax(..) v: the v rows of qkv_proj <- / s, with one
  scale per (KV head, dim) shared by the query heads that read that KV head (GQA/MQA: the
  activation means of those heads are averaged), before qkv_proj's search.

So an AWQ model stores exactly what RTN int4 stores (`QuantConfig.weight_bits` prices it)
and runs through the same `QuantLinear` kernels with no per-step division.  Projections of
other shapes (MLA, linear attention, SSM mixers, a CLA layer's o_proj with no v rows)
have no foldable producer here and get plain RTN; the loader's source line counts both.
Calibration activations come from the float model (`calibration.for_each_layer`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.calibration import InputStats, for_each_layer
from infbench.model.layers import RMSNorm, SwiGLUMLP
from infbench.model.quant import QuantLinear, quantizable_linears
from infbench.model.transformer import Attention, Transformer
from kernels.quant_format import quantize_int4

NUM_ALPHAS = 20  # alpha = 0, 0.05, .., 0.95: AutoAWQ's grid
SEARCH_BLOCK_ELEMENTS = 65536  # weight elements per block of the search (256 KB float32)
CLIP_RATIOS = [1.0 - i / 20 for i in range(10)]  # 1, 0.95, .., 0.55: AutoAWQ's grid


@dataclass
class AwqResult:
    """What the search chose: alpha per projection kind and layer, and how long it took."""

    alphas: dict[str, list[float]] = field(default_factory=dict)  # kind -> per layer
    num_awq: int = 0
    num_rtn: int = 0
    seconds: float = 0.0
    error_ratio: dict[str, list[float]] = field(default_factory=dict)  # AWQ / RTN error

    def summary(self) -> str:
        kinds = ", ".join(f"{k} alpha {sum(v) / len(v):.2f}" for k, v in self.alphas.items())
        return f"awq x{self.num_awq}, rtn x{self.num_rtn}; mean {kinds}" if kinds else \
            f"awq x0, rtn x{self.num_rtn}"


def fake_quantize_int4(w: torch.Tensor, group_size: int, inplace: bool = False
                       ) -> torch.Tensor:
    """quantize_int4(w, group_size).dequantize() (N, K) float32, the same values, without
    packing the codes.  The searches call it dozens of times per projection, so it works
    in place (on w itself with `inplace`): a fresh 7 MB buffer per step costs page faults."""
    n, k = w.shape
    wg = w.reshape(n, k // group_size, group_size)  # (N, G, g)
    # amin and amax: 3x faster than torch.aminmax on CPU here (torch 2.13)
    lo, hi = wg.amin(dim=2, keepdim=True), wg.amax(dim=2, keepdim=True)  # (N, G, 1)
    scales = ((hi - lo) / 15.0).clamp(min=1e-10).half().float()
    mins = lo.half().float()
    out = wg if inplace else wg.clone()
    out.sub_(mins).div_(scales).round_().clamp_(0, 15).mul_(scales).add_(mins)
    if bool((scales == 0).any()):  # fp16 underflow: the stored group decodes to its min
        out = torch.where(scales == 0, mins, out)
    return out.reshape(n, k)


def search_scale(w: torch.Tensor, stats: InputStats, group_size: int, share: int = 1,
                 head_dim: int = 1) -> tuple[torch.Tensor, float, float, float]:
    """The best s (K,) for w (N, K) float32 on these activations.

    Returns (s, alpha, its output error, RTN's output error).  share > 1 (o_proj under
    GQA): columns are `heads x head_dim` and each run of `share` heads reads one KV head;
    s is then the same for those heads (see `_kv_shared`)."""
    mean = _kv_shared(stats.abs_mean, share, head_dim).clamp(min=1e-4)
    x = stats.inputs()  # (T, K): X, or a K x K factor of X^T X
    n, k = w.shape
    # Row blocks of about 256 KB: the dozen passes of each step then run in cache.
    rows = max(1, SEARCH_BLOCK_ELEMENTS // k)
    blocks = [(w[a:a + rows], x @ w[a:a + rows].t()) for a in range(0, n, rows)]  # X W_b^T
    buf = torch.empty(min(rows, n), k, device=w.device)
    best_s, best_alpha, best_err, rtn_err = torch.ones_like(mean), 0.0, float("inf"), 0.0
    for i in range(NUM_ALPHAS):
        alpha = i / NUM_ALPHAS
        s = mean.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        xs = x / s[None, :]  # (T, K) the activations W s multiplies
        err = 0.0
        for wb, ref in blocks:
            qb = fake_quantize_int4(torch.mul(wb, s[None, :], out=buf[:wb.shape[0]]),
                                    group_size, inplace=True)  # Q(W_b s)
            err += float((xs @ qb.t()).sub_(ref).square_().sum())  # ||X (Q(W_b s)/s - W_b)^T||^2
        if i == 0:
            rtn_err = err
        if err < best_err:
            best_s, best_alpha, best_err = s, alpha, err
    return best_s, best_alpha, best_err, rtn_err


def _kv_shared(mean: torch.Tensor, share: int, head_dim: int) -> torch.Tensor:
    """o_proj under GQA: columns h * D + i for query heads h; heads h with equal
    h // share read one KV head, whose v rows take the fold, so their per-column means are
    averaged and repeated (one scale per (KV head, dim)).  share = 1: unchanged."""
    if share == 1:
        return mean
    kv = mean.view(-1, share, head_dim).mean(1, keepdim=True)  # (KVH, 1, D)
    return kv.expand(-1, share, -1).reshape(-1)  # (H * D,)


def clip_weight(w_scaled: torch.Tensor, blocks: torch.Tensor, group_size: int,
                first_row: int = 0) -> torch.Tensor:
    """Clip each (row, group) of w_scaled (N, K) to [r * min, r * max] with the r of
    CLIP_RATIOS minimizing that group's share of the output error, e_g^T G_g e_g, where
    blocks (K / g, g, g) are the Gram blocks G_g of the activations the scaled weight
    multiplies; rows before `first_row` stay as they are."""
    n, k = w_scaled.shape
    ng = k // group_size
    wg = w_scaled[first_row:].reshape(-1, ng, group_size)  # (n', G, g)
    lo, hi = wg.amin(dim=2, keepdim=True), wg.amax(dim=2, keepdim=True)  # (n', G, 1)
    best_err = torch.full(wg.shape[:2], float("inf"), device=wg.device)  # (n', G)
    best_r = torch.ones_like(lo)  # (n', G, 1)
    e = torch.empty_like(wg)
    for r in CLIP_RATIOS:
        torch.clamp(wg, min=lo * r, max=hi * r, out=e)
        fake_quantize_int4(e.view(-1, k), group_size, inplace=True)
        e -= wg  # (n', G, g) the quantization error of the clipped weight
        err = torch.einsum("ngi,gij,ngj->ng", e, blocks, e)  # (n', G)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_r = torch.where(better[..., None], r, best_r)
    out = w_scaled.clone()
    out[first_row:] = torch.clamp(wg, min=lo * best_r, max=hi * best_r).reshape(-1, k)
    return out


# ---- the folds: exact in real arithmetic, on float32 modules ------------------------------
def scale_norm_input(norm: RMSNorm, linear: nn.Linear, s: torch.Tensor) -> None:
    """linear(norm(h)) unchanged: g <- g / s, W <- W s (norm output divided by s)."""
    norm.weight.div_(s)
    linear.weight.mul_(s[None, :])


def scale_attention_output(attn: Attention, s: torch.Tensor) -> None:
    """o_proj(attention) unchanged: the v rows of qkv_proj (and bias) <- / s_kv, o_proj's
    columns <- * s; s (heads * D,) must be equal across the query heads of one KV head."""
    share = attn.num_heads // attn.num_kv_heads
    s_kv = s.view(attn.num_kv_heads, share, attn.head_dim)[:, 0].reshape(-1)  # (kv * D,)
    q_size, kv_size = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    v_rows = slice(q_size + kv_size, q_size + 2 * kv_size)
    qkv = _linear(attn.qkv_proj)
    qkv.weight[v_rows] /= s_kv[:, None]
    if qkv.bias is not None:
        qkv.bias[v_rows] /= s_kv
    _linear(attn.o_proj).weight.mul_(s[None, :])


def scale_mlp_down(mlp: SwiGLUMLP, s: torch.Tensor) -> None:
    """down_proj(silu(gate) * up) unchanged: up rows of gate_up_proj (and bias) <- / s,
    down_proj's columns <- * s."""
    size = mlp.intermediate_size
    gate_up = _linear(mlp.gate_up_proj)
    gate_up.weight[size:] /= s[:, None]
    if gate_up.bias is not None:
        gate_up.bias[size:] /= s
    _linear(mlp.down_proj).weight.mul_(s[None, :])


def _linear(module: nn.Module) -> nn.Linear:
    assert isinstance(module, nn.Linear), f"AWQ folds into float projections, got {module}"
    return module


def foldable(layer: nn.Module) -> dict[str, str]:
    """Which projections of a decoder layer AWQ can scale: name -> what takes the 1 / s."""
    out: dict[str, str] = {}
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if isinstance(attn, Attention) and isinstance(attn.qkv_proj, nn.Linear):
        if attn.layer.owns_kv and isinstance(attn.o_proj, nn.Linear):
            out["self_attn.o_proj"] = "v rows"
        if isinstance(getattr(layer, "input_layernorm", None), RMSNorm):
            out["self_attn.qkv_proj"] = "input_layernorm"
    if (isinstance(mlp, SwiGLUMLP) and isinstance(mlp.gate_up_proj, nn.Linear)
            and isinstance(mlp.down_proj, nn.Linear)):
        out["mlp.down_proj"] = "up rows"
        if isinstance(getattr(layer, "post_attention_layernorm", None), RMSNorm):
            out["mlp.gate_up_proj"] = "post_attention_layernorm"
    return out


# ---- one layer ------------------------------------------------------------------------------
def _awq_layer(layer: nn.Module, stats: dict[str, InputStats], quant: QuantConfig,
               result: AwqResult) -> None:
    """Search and fold in AutoAWQ's order (each fold lands before the search of the
    projection whose weights it changes), then quantize; the rest of the layer gets RTN."""
    names = foldable(layer)
    modules = dict(layer.named_modules())
    dtypes = {name: modules[name].weight.dtype for name in names}
    norms = [m for m in (getattr(layer, "input_layernorm", None),
                         getattr(layer, "post_attention_layernorm", None))
             if isinstance(m, RMSNorm)]
    norm_dtypes = [n.weight.dtype for n in norms]
    for name in names:  # the folds and searches run in float32
        modules[name].float()
    for norm in norms:
        norm.float()
    scales: dict[str, torch.Tensor] = {}
    clip_from: dict[str, int] = {}

    def search(name: str, share: int = 1, head_dim: int = 1) -> torch.Tensor:
        linear = modules[name]
        s, alpha, err, rtn_err = search_scale(linear.weight, stats[name], quant.group_size,
                                              share, head_dim)
        kind = name.rpartition(".")[2]
        result.alphas.setdefault(kind, []).append(alpha)
        result.error_ratio.setdefault(kind, []).append(err / rtn_err if rtn_err else 1.0)
        scales[name] = s
        return s

    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if "self_attn.o_proj" in names:
        assert isinstance(attn, Attention)
        s = search("self_attn.o_proj", attn.num_heads // attn.num_kv_heads, attn.head_dim)
        scale_attention_output(attn, s)
    if "self_attn.qkv_proj" in names:
        assert isinstance(attn, Attention)
        # AutoAWQ leaves q and k unclipped (their error passes through the softmax).
        clip_from["self_attn.qkv_proj"] = (attn.num_heads + attn.num_kv_heads) * attn.head_dim
        scale_norm_input(layer.input_layernorm, _linear(attn.qkv_proj),  # type: ignore[arg-type]
                         search("self_attn.qkv_proj"))
    if "mlp.down_proj" in names:
        assert isinstance(mlp, SwiGLUMLP)
        scale_mlp_down(mlp, search("mlp.down_proj"))
    if "mlp.gate_up_proj" in names:
        assert isinstance(mlp, SwiGLUMLP)
        scale_norm_input(layer.post_attention_layernorm,  # type: ignore[arg-type]
                         _linear(mlp.gate_up_proj), search("mlp.gate_up_proj"))
    for prefix, parent in list(layer.named_modules()):
        for attr, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            name = f"{prefix}.{attr}" if prefix else attr
            setattr(parent, attr, _quantized(child, scales.get(name), stats[name], quant,
                                             dtypes.get(name, child.weight.dtype),
                                             clip_from.get(name, 0)))
            if name in scales:
                result.num_awq += 1
            else:
                result.num_rtn += 1
    for norm, dtype in zip(norms, norm_dtypes, strict=True):
        norm.to(dtype)


def _quantized(linear: nn.Linear, s: torch.Tensor | None, stats: InputStats,
               quant: QuantConfig, dtype: torch.dtype, clip_from: int = 0) -> QuantLinear:
    """int4 of a projection: a scaled one (its weight already W s) with its range clipped
    from row `clip_from` on; plain RTN otherwise."""
    w = linear.weight.detach().float()
    if s is not None:
        w = clip_weight(w, stats.group_grams(quant.group_size, s), quant.group_size, clip_from)
    return QuantLinear(quantize_int4(w, quant.group_size), linear.bias, dtype)


def awq_quantize(model: Transformer, quant: QuantConfig, ids: list[int]) -> AwqResult:
    """Quantize every projection inside the decoder layers of `model` (a `Transformer`) to
    int4, with AWQ scales searched on the calibration token `ids`; returns what was chosen."""
    for _parent, _name, linear in quantizable_linears(model):
        n, k = linear.weight.shape
        if k % quant.group_size:
            raise ConfigError(f"quant.group_size={quant.group_size} does not divide the input "
                              f"dimension {k} of a {n}x{k} projection")
    result = AwqResult()
    start = time.perf_counter()

    def on_layer(_index: int, layer: nn.Module, stats: dict[str, InputStats]) -> None:
        _awq_layer(layer, stats, quant, result)

    # One CPU thread: the search is thousands of ~1 ms tensor ops, and with two OpenMP
    # threads on the shared 2-core machine, the other core busy, SmolLM2's search took
    # 240 s instead of 19.5 s (fork/join waits on every op).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for_each_layer(model, ids, on_layer, keep_inputs=True)
    finally:
        torch.set_num_threads(threads)
    result.seconds = time.perf_counter() - start
    return result
