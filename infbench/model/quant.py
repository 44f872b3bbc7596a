"""Weight-quantized projections and the load-time pass that makes them.

`quantize_model(model, quant)` replaces every projection inside the decoder layers (the
attention / MLA / SSM projections and the MLP matrices) with a `QuantLinear` holding the
packed weights of `kernels/quant_format.py` (int8 / int4), or a `FloatCodeLinear`
(`model/float_quant.py`) holding fp8 / mxfp4 / nvfp4 codes; the float weights are dropped,
so the model holds only what `QuantConfig.weight_bits` prices.  The embedding, the LM head
and the norms stay in the model dtype (as in AWQ/GPTQ checkpoints and `roofline/shapes.py`), except
`quant.head: int8` (`quantize_head`) and a GGUF file's quantized `token_embd` / `output`
under `weights: native`, which the loader builds as a `QuantEmbedding` / `QuantLinear`
of the file's own format.

A `QuantLinear` runs through the engine's backend (`set_backend`, called by
`linear.use_cpu_linears`): `cpu` runs the C++ dequantize-in-GEMV kernels
(`kernels/cpu_quant_linear.py`) up to their row limit; the reference path dequantizes
the weight and calls F.linear (float math, the same values up to rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.core.formats import FLOAT_CODE_WEIGHTS, QUANTIZED_WEIGHTS
from infbench.model.float_quant import FloatCodeLinear, float_code_linear
from infbench.model.gguf_blocks import map_rows
from infbench.model.moe import moe_layers
from kernels.cpu_linear import gemm
from kernels.cpu_quant_linear import MAX_ROWS as CPU_MAX_ROWS
from kernels.cpu_quant_linear import cpu_dequantize, cpu_quant_linear
from kernels.quant_format import (
    Int4Weight,
    Int8Weight,
    quantize_activations,
    quantize_int4,
    quantize_int8,
)


class QuantLinear(nn.Module):
    """y = x @ dequantize(W)^T [+ bias] with W stored as int8 or int4 (kernels/quant_format).

    `input_scales` (K,), when set, divides the activations before the product (AWQ folds
    its per-input-channel scales into the quantized weight this way).

    `act_int8` (`quant.activations: int8`, set by `use_int8_activations`): the activations
    are rounded to int8 in blocks of 32 columns first (`quantize_activations`); decode rows on
    the `cpu` backend run that as integer dot products in C++ (`kernels/csrc/linear_q8act.cpp`)."""

    qweight: torch.Tensor  # int8 (N, K) or packed int4 (N, K // 2) uint8
    scales: torch.Tensor
    mins: torch.Tensor | None
    input_scales: torch.Tensor | None

    def __init__(self, weight: Int8Weight | Int4Weight, bias: torch.Tensor | None,
                 dtype: torch.dtype, input_scales: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kind = "int8" if isinstance(weight, Int8Weight) else "int4"
        self.group_size = weight.group_size
        self.dtype = dtype
        if isinstance(weight, Int8Weight):
            self.register_buffer("qweight", weight.q)
            self.register_buffer("scales", weight.scales)
            self.register_buffer("mins", None)
        else:
            self.register_buffer("qweight", weight.packed)
            self.register_buffer("scales", weight.scales)
            self.register_buffer("mins", weight.mins)
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype),
                                                           requires_grad=False)
        self.register_buffer("input_scales",
                             None if input_scales is None else input_scales.to(dtype))
        self.backend = "torch"
        self.act_int8 = False

    # ---- format ----------------------------------------------------------------------
    def weight_format(self) -> Int8Weight | Int4Weight:
        if self.kind == "int8":
            return Int8Weight(self.qweight, self.scales, self.group_size)
        assert self.mins is not None
        return Int4Weight(self.qweight, self.scales, self.mins, self.group_size)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32, input scales folded back out (what the product multiplies by)."""
        w = self.weight_format().dequantize()
        if self.input_scales is not None:
            w = w / self.input_scales.float()[None, :]
        return w

    @property
    def stored_bytes(self) -> int:
        """Bytes of the quantized weight, scales and input scales (bias not included)."""
        extra = 0 if self.input_scales is None else self.input_scales.numel() * 2
        return self.weight_format().nbytes + extra

    def set_backend(self, backend: str) -> None:
        self.backend = backend

    # ---- product ---------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scales is not None:
            x = x / self.input_scales
        route = self._cpu_route(x)
        if self.act_int8 and route != "gemv":  # the C++ GEMV rounds int8 activations itself
            x = quantize_activations(x).to(x.dtype)
        if x.is_cuda:  # Triton dequantize-in-GEMV / GEMM on this format
            from kernels.quant_matmul import int4_matmul, int8_matmul
            fmt = self.weight_format()
            x2 = x.reshape(-1, self.in_features)
            y = int8_matmul(x2, fmt) if isinstance(fmt, Int8Weight) else int4_matmul(x2, fmt)
            if self.bias is not None:
                y = y + self.bias
            return y.view(*x.shape[:-1], self.out_features)
        if route == "gemv":  # decode: dequantize inside the GEMV
            return cpu_quant_linear(x, self.weight_format(), self.bias, act_int8=self.act_int8)
        if route == "gemm":  # prefill: the float matrix once (multi-threaded C++), then BLAS
            return gemm(x, cpu_dequantize(self.weight_format(), x.dtype), self.bias)
        return self.reference(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The product in float32 (a quantized LM head: no rounding of the logits to bf16 on
        the CPU).  CUDA: the Triton kernels of `forward`, as the float head's F.linear."""
        if hidden.is_cuda:
            return self.forward(hidden).float()
        route = self._cpu_route(hidden)
        if self.act_int8 and route != "gemv":
            hidden = quantize_activations(hidden).to(hidden.dtype)
        if route == "gemv":
            return cpu_quant_linear(hidden, self.weight_format(), self.bias,
                                    out_float32=True, act_int8=self.act_int8)
        if route == "gemm":  # many rows (perplexity windows): the float matrix, then BLAS
            return gemm(hidden, cpu_dequantize(self.weight_format(), hidden.dtype), self.bias,
                        out_float32=True)
        return self.reference(hidden).float()

    def _cpu_route(self, x: torch.Tensor) -> str | None:
        """"gemv" (up to CPU_MAX_ROWS rows) or "gemm" on the `cpu` backend's C++ kernels, None
        for every other case (the Triton kernels on CUDA, the torch reference)."""
        if not (x.device.type == "cpu" and self.backend == "cpu" and x.dim() == 2
                and x.dtype in (torch.float32, torch.bfloat16)):
            return None
        return "gemv" if x.shape[0] <= CPU_MAX_ROWS else "gemm"

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize, then F.linear in x's dtype (the torch backend; prefill on `cpu`)."""
        w = self.weight_format().dequantize().to(x.dtype)
        return F.linear(x, w, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{self.kind}, group_size={self.group_size}"
                + (", int8 activations" if self.act_int8 else ""))


class QuantEmbedding(nn.Module):
    """A token embedding whose table stays in a stored format (a GGUF file's Q8_0 / Q4_K /
    ... `token_embd` under `weights: native`).

    The gather reads the quantized rows of the step's tokens and dequantizes only those, to
    the model dtype: the same values as a float table dequantized from the same bytes.
    `table` is a `QuantLinear` over the same (V, H) matrix; a tied LM head runs through its
    `logits` (`Transformer.compute_logits`), so the head and the embedding share one copy
    of the bytes, which `stored_weight_bytes` counts once."""

    def __init__(self, weight: Int8Weight | Int4Weight, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype
        self.table = QuantLinear(weight, None, dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (...,) -> (..., H) in the model dtype."""
        flat = ids.reshape(-1)  # (T,)
        rows = map_rows(self.table.weight_format(), lambda t: t.index_select(0, flat))
        return rows.dequantize().to(self.dtype).view(*ids.shape, self.embedding_dim)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied LM head: hidden (N, H) -> float32 logits (N, V) on the same bytes."""
        return self.table.logits(hidden)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


def quantized_head(model: nn.Module) -> QuantLinear | None:
    """The QuantLinear that computes the logits when the LM head is stored quantized (an
    int8 copy `head_q`, a quantized `lm_head`, or a quantized tied embedding), else None."""
    head_q = getattr(model, "head_q", None)
    if isinstance(head_q, QuantLinear):
        return head_q
    lm_head = getattr(model, "lm_head", None)
    if isinstance(lm_head, QuantLinear):
        return lm_head
    embed = getattr(model, "embed_tokens", None)
    if lm_head is None and isinstance(embed, QuantEmbedding):
        return embed.table
    return None


def quantizable_linears(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, linear) for every projection inside the decoder layers, except
    those a module names in its `float_children` (MLA's kv_b_proj: decode multiplies by
    per-head slices of its float weight)."""
    layers = getattr(model, "layers", None)
    if layers is None:
        return
    for layer in layers:
        for parent in layer.modules():
            keep = getattr(parent, "float_children", ())
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and name not in keep:
                    yield parent, name, child


Quantizer = Callable[[nn.Linear, QuantConfig], nn.Module]


def rtn(linear: nn.Linear, quant: QuantConfig) -> QuantLinear | FloatCodeLinear:
    """Round-to-nearest quantization of one projection (fp8 / mxfp4 / nvfp4: a
    `FloatCodeLinear`, model/float_quant.py)."""
    w = linear.weight
    n, k = w.shape
    if quant.weights in FLOAT_CODE_WEIGHTS:
        try:
            return float_code_linear(linear, quant.weights, quant.fp8_scales or "channel")
        except ValueError as exc:  # fp4: K not a multiple of the scale block
            raise ConfigError(f"quant.weights={quant.weights}: {exc}; allowed for this "
                              "model: fp8, int8") from None
    if quant.weights == "int8":
        fmt: Int8Weight | Int4Weight = quantize_int8(w)
    else:
        if k % quant.group_size:
            raise ConfigError(f"quant.group_size={quant.group_size} does not divide the input "
                              f"dimension {k} of a {n}x{k} projection")
        fmt = quantize_int4(w, quant.group_size)
    return QuantLinear(fmt, linear.bias, w.dtype)


def quantize_model(model: nn.Module, quant: QuantConfig,
                   quantizer: Quantizer | None = None) -> int:
    """Replace the projections of `model` by QuantLinear / FloatCodeLinear (RTN unless
    `quantizer` is given); returns how many.  `quant.weights` none/native does nothing here."""
    if quant.weights not in (*QUANTIZED_WEIGHTS, *FLOAT_CODE_WEIGHTS):
        return 0
    make = quantizer or rtn
    count = 0
    for parent, name, linear in list(quantizable_linears(model)):
        setattr(parent, name, make(linear, quant))
        count += 1
    return count + quantize_experts(model, quant)


def quantize_experts(model: nn.Module, quant: QuantConfig) -> int:
    """The routed experts of every MoE layer stored as `quant.weights` fp8 / mxfp4 / nvfp4
    (`MoEMLP.quantize_experts`); returns how many expert matrices (2 per expert).  Integer
    formats do not store experts: the loader refuses them for MoE models."""
    layers = moe_layers(model)
    if not layers:
        return 0
    assert quant.weights in FLOAT_CODE_WEIGHTS, quant.weights
    count = 0
    for layer in layers:
        try:
            layer.quantize_experts(quant.weights, quant.fp8_scales or "channel")
        except ValueError as exc:  # fp4: H or I not a multiple of the scale block
            raise ConfigError(f"quant.weights={quant.weights}: routed experts: {exc}; "
                              "allowed for this model: fp8, none") from None
        count += 2 * layer.moe.num_experts
    return count


def quantize_head(model: nn.Module, quant: QuantConfig) -> bool:
    """`quant.head` int8: the LM head as an int8 QuantLinear (one fp16 scale per vocabulary
    row).  An untied `lm_head` is replaced; a tied one gets `head_q`, an int8 copy of the
    embedding, which `Transformer.compute_logits` uses (the embedding stays for the gather).
    A head that is stored quantized already (a GGUF file's own format under `weights:
    native`) is kept as it is.  Returns whether it quantized."""
    if quant.head != "int8" or quantized_head(model) is not None:
        return False
    lm_head = getattr(model, "lm_head", None)
    source: Any = lm_head if isinstance(lm_head, nn.Linear) else model.embed_tokens
    weight = source.weight
    head = QuantLinear(quantize_int8(weight), getattr(source, "bias", None), weight.dtype)
    if isinstance(lm_head, nn.Linear):
        model.lm_head = head
    else:
        model.head_q = head
    return True


def use_int8_activations(model: nn.Module) -> int:
    """`quant.activations: int8`: every QuantLinear of `model` (the decoder projections and a
    quantized LM head / tied embedding table) rounds its inputs to int8 blocks.  Returns how
    many.  Call before the fused CPU decode layers are built: they read the flag once."""
    count = 0
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.act_int8 = True
            count += 1
    return count


def stored_weight_bytes(model: nn.Module) -> int:
    """Bytes the model holds for its weights: parameters (a tied embedding once) plus the
    quantized buffers of every quantized projection (QuantLinear, llm_int8.LLMInt8Linear:
    any module with an int `stored_bytes`)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        nbytes = getattr(module, "stored_bytes", None)
        if isinstance(nbytes, int):
            total += nbytes
    return total
