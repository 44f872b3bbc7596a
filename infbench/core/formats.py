"""Weight formats, defined once (stdlib only).

`model.quant.weights` takes one of `WEIGHT_FORMATS`: `none` (the model dtype), the formats
infbench quantizes float weights into (`QUANTIZED_WEIGHTS`: what `model/quant.py`, the loader,
`speculative.draft_quant` and the analytic model's quantized rates take), and `native`: a GGUF
file's own tensors, of the types `gguf_types.NATIVE_FORMATS` maps to a stored format.  The
scenario's Literal and its text, `QuantConfig`'s checks, the CLI's choices, the loaders and
the docs' tables (checked by tests/test_scenario_registries.py) read these names; adding a
format is one entry here plus its quantizer (`kernels/quant_format.py`, `model/quant.py`).
"""

from __future__ import annotations

from typing import Literal, get_args

from infbench.core.gguf_types import NATIVE_FORMATS

QuantizedWeights = Literal["int8", "int4"]
WeightQuant = Literal["none", QuantizedWeights, "native"]
DraftQuant = Literal["none", QuantizedWeights]  # a draft model is quantized from float
Int4GroupSize = Literal[32, 64, 128]
QUANTIZED_WEIGHTS: tuple[str, ...] = get_args(QuantizedWeights)
WEIGHT_QUANT: tuple[str, ...] = get_args(WeightQuant)
DRAFT_QUANT: tuple[str, ...] = get_args(DraftQuant)
INT4_GROUP_SIZES: tuple[int, ...] = get_args(Int4GroupSize)
NATIVE_TYPES: tuple[str, ...] = tuple(NATIVE_FORMATS)  # GGUF types `native` runs as stored

# Format -> what it stores: the scenario's text for model.quant.weights and the docs' table.
WEIGHT_FORMATS: dict[str, str] = {
    "none": "the model dtype",
    "int8": "int8 codes, one fp16 scale per output channel",
    "int4": "4-bit codes in groups of group_size input columns (32, 64 or 128), an fp16 "
            "scale and an fp16 minimum per group (Q4_1's layout)",
    "native": f"a GGUF file's own {'/'.join(NATIVE_TYPES)} tensors, run as stored",
}
assert tuple(WEIGHT_FORMATS) == WEIGHT_QUANT


def weight_formats_text() -> str:
    """`none (the model dtype) | int8 (...) | ...`: one line per format, for help and docs."""
    return " | ".join(f"{name} ({what})" for name, what in WEIGHT_FORMATS.items())
