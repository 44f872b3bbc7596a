"""Weight formats, defined once (stdlib only).

`model.quant.weights` takes one of `WEIGHT_FORMATS`: `none` (the model dtype), the integer
formats infbench quantizes float weights into (`QUANTIZED_WEIGHTS`: what `model/quant.py`, the
loader, `speculative.draft_quant` and the analytic model's quantized rates take), the
low-precision float formats of current deployments (`FLOAT_CODE_WEIGHTS`: fp8 E4M3, and the
4-bit E2M1 block formats mxfp4 / nvfp4), and `native`: a checkpoint's own stored tensors (a
GGUF file's, of the types `gguf_types.NATIVE_FORMATS` maps to a stored format, or a
safetensors checkpoint's `quantization_config`).  The scenario's Literal and its text,
`QuantConfig`'s checks, the CLI's choices, the loaders and the docs' tables (checked by
tests/test_scenario_registries.py) read these names; adding a format is one entry here plus
its quantizer (`kernels/quant_format.py`, `model/quant.py`) and its bits in `stored_bits`.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from infbench.core.gguf_types import NATIVE_FORMATS, format_bits

QuantizedWeights = Literal["int8", "int4"]
FloatCodeWeights = Literal["fp8", "mxfp4", "nvfp4"]
WeightQuant = Literal["none", QuantizedWeights, FloatCodeWeights, "native"]
DraftQuant = Literal["none", QuantizedWeights]  # a draft model is quantized from float
Int4GroupSize = Literal[32, 64, 128]
Fp8Scales = Literal["tensor", "channel", "block"]
QUANTIZED_WEIGHTS: tuple[str, ...] = get_args(QuantizedWeights)
FLOAT_CODE_WEIGHTS: tuple[str, ...] = get_args(FloatCodeWeights)
FP4_WEIGHTS: tuple[str, ...] = ("mxfp4", "nvfp4")  # E2M1 codes: what fp4 activations need
WEIGHT_QUANT: tuple[str, ...] = get_args(WeightQuant)
DRAFT_QUANT: tuple[str, ...] = get_args(DraftQuant)
INT4_GROUP_SIZES: tuple[int, ...] = get_args(Int4GroupSize)
FP8_SCALES: tuple[str, ...] = get_args(Fp8Scales)
NATIVE_TYPES: tuple[str, ...] = tuple(NATIVE_FORMATS)  # GGUF types `native` runs as stored

FP8_BLOCK = 128  # fp8 block scales: one fp32 per 128 x 128 tile (DeepSeek-V3 weight_block_size)
MX_BLOCK = 32  # mxfp4: one E8M0 (8-bit power of two) scale per 32 input values (OCP MX)
NV_BLOCK = 16  # nvfp4: one FP8-E4M3 scale per 16 input values, plus one fp32 per tensor

# Format -> what it stores: the scenario's text for model.quant.weights and the docs' table.
WEIGHT_FORMATS: dict[str, str] = {
    "none": "the model dtype",
    "int8": "int8 codes, one fp16 scale per output channel",
    "int4": "4-bit codes in groups of group_size input columns (32, 64 or 128), an fp16 "
            "scale and an fp16 minimum per group (Q4_1's layout)",
    "fp8": "FP8 E4M3 codes with fp32 scales of fp8_scales granularity: one per tensor, per "
           "output channel or per 128x128 block",
    "mxfp4": "FP4 E2M1 codes, one E8M0 power-of-two scale per 32 input values (OCP MX, "
             "4.25 bits a weight)",
    "nvfp4": "FP4 E2M1 codes, one FP8 E4M3 scale per 16 input values and one fp32 scale per "
             "tensor (4.5 bits a weight)",
    "native": f"a checkpoint's own stored tensors, run as stored: a GGUF file's "
              f"{'/'.join(NATIVE_TYPES)}, or a safetensors checkpoint's quantization_config "
              "(fp8, mxfp4, nvfp4)",
}
assert tuple(WEIGHT_FORMATS) == WEIGHT_QUANT


def weight_formats_text() -> str:
    """`none (the model dtype) | int8 (...) | ...`: one line per format, for help and docs."""
    return " | ".join(f"{name} ({what})" for name, what in WEIGHT_FORMATS.items())


def float_code_format(weights: str, fp8_scales: str) -> str:
    """The stored-format name (as `native_mix` rows name them) of `quant.weights` fp8 /
    mxfp4 / nvfp4: `fp8/tensor`, `fp8/channel`, `fp8/block`, `mxfp4`, `nvfp4`."""
    return f"fp8/{fp8_scales}" if weights == "fp8" else weights


def stored_bits(fmt: str, in_features: int, out_features: int, dtype_bytes: int) -> float:
    """Stored bits per weight of one (out_features x in_features) matrix in stored format
    `fmt`, scales included (fmt as `native_mix` names it: `float`, `int4/G`, `int8/G`, or a
    `float_code_format` name):

        fp8/tensor   8 + 32 / (out * in)
        fp8/channel  8 + 32 / in                                (one fp32 per output row)
        fp8/block    8 + 32 * ceil(out/128) * ceil(in/128) / (out * in)
        mxfp4        4 + 8 * ceil(in/32) / in                   (E8M0 per 32 inputs)
        nvfp4        4 + 8 * ceil(in/16) / in + 32 / (out * in) (E4M3 per 16, fp32 per tensor)
    """
    numel = in_features * out_features
    if fmt == "fp8/tensor":
        return 8.0 + 32.0 / numel
    if fmt == "fp8/channel":
        return 8.0 + 32.0 / in_features
    if fmt == "fp8/block":
        tiles = math.ceil(out_features / FP8_BLOCK) * math.ceil(in_features / FP8_BLOCK)
        return 8.0 + 32.0 * tiles / numel
    if fmt == "mxfp4":
        return 4.0 + 8.0 * math.ceil(in_features / MX_BLOCK) / in_features
    if fmt == "nvfp4":
        return 4.0 + 8.0 * math.ceil(in_features / NV_BLOCK) / in_features + 32.0 / numel
    return format_bits(fmt, dtype_bytes)
