"""GGUF tensor types: which ones infbench loads, which run natively, what each stores (no torch).

`model.quant.weights: native` keeps a GGUF file's quantized projections quantized: the
file's blocks are reinterpreted as infbench's own stored formats (`kernels/quant_format.py`,
`kernels/fp_format.py`) without a float copy.  The formats are named `int4/32` (4-bit codes,
fp16 scale + fp16 min per group of 32: Q4_1's layout), `int8/G` (int8 codes, one fp16 scale
per group of G) and `mxfp4` (E2M1 codes, one E8M0 scale per 32 values: OCP MX):

    Q4_0 -> int4/32  min = -8 * scale (exact; stores 5.0 bits where the file has 4.5)
    Q4_1 -> int4/32  byte for byte
    Q8_0 -> int8/32  byte for byte
    Q4_K -> int4/32  each 32-column sub-block: scale = d * sc, min = -dmin * m (to fp16)
    Q6_K -> int8/16  each 16-column sub-block: q - 32, scale = d * sc (to fp16)
    MXFP4 -> mxfp4   bit for bit (the nibbles re-paired; 4.25 bits, as in the file)

Every other loadable type (F32, F16, BF16, Q5_0, Q5_1, Q5_K, Q2_K, Q3_K) is dequantized to
the model dtype by the `gguf` library: there is no 5-, 3- or 2-bit kernel.  The token
embedding (`token_embd`) and an untied LM head (`output`) follow the same table: in a
native format they stay quantized (the embedding gathers and dequantizes only its rows;
a tied head multiplies the embedding's own bytes), otherwise they are dequantized.  An
MXFP4 `token_embd` is the exception: the gather reads int4 / int8 tables only, so it (and
a tied head, which reads the same table) is dequantized; an untied MXFP4 `output` runs as
stored.  The norms always run in the model dtype.

A fused projection (q/k/v -> qkv_proj, gate/up -> gate_up_proj) is one matrix, so it runs
natively only when all its parts map to the same format; otherwise it is dequantized.
`stored_formats` decides this once for the loader and for the analytic model
(`QuantConfig.native_mix`), so what `predict` prices is what the engine stores.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

FLOAT = "float"  # stored in the model dtype
NATIVE_FORMATS: dict[str, str] = {
    "Q4_0": "int4/32", "Q4_1": "int4/32", "Q4_K": "int4/32", "Q8_0": "int8/32", "Q6_K": "int8/16",
    "MXFP4": "mxfp4",
}
# Stored formats a token embedding's gather reads (`model/quant.QuantEmbedding`)
EMBEDDING_FORMATS = ("int4/32", "int8/32", "int8/16")
DEQUANTIZED_TYPES = ("F32", "F16", "BF16", "Q5_0", "Q5_1", "Q5_K", "Q2_K", "Q3_K")
LOADABLE_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                  "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4")
# Bits per weight in the file (block bytes * 8 / block values), for the docs and the notes.
FILE_BITS = {"F32": 32.0, "F16": 16.0, "BF16": 16.0, "Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5,
             "Q5_1": 6.0, "Q8_0": 8.5, "Q2_K": 2.625, "Q3_K": 3.4375, "Q4_K": 4.5,
             "Q5_K": 5.5, "Q6_K": 6.5625, "MXFP4": 4.25}

_PROJECTION = re.compile(r"blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|"
                         r"ffn_down)\.weight")
# Tensors outside the layers that can stay quantized -> the roofline operator that reads them
TOP_LEVEL = {"token_embd.weight": "embed", "output.weight": "lm_head"}
# GGUF leaf -> (the engine matrix it becomes part of, the roofline operator that reads it)
_LEAF = {
    "attn_q": ("qkv_proj", "qkv_proj"), "attn_k": ("qkv_proj", "qkv_proj"),
    "attn_v": ("qkv_proj", "qkv_proj"), "attn_output": ("o_proj", "o_proj"),
    "ffn_gate": ("gate_up_proj", "mlp"), "ffn_up": ("gate_up_proj", "mlp"),
    "ffn_down": ("down_proj", "mlp"),
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its name, storage type and numpy shape (rows, columns)."""

    name: str
    type_name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


def top_level_format(name: str, type_name: str) -> str:
    """The stored format of `token_embd` / `output` under `weights: native`: the type's
    native format, FLOAT for a float type, and FLOAT for an embedding whose format the
    gather cannot read (EMBEDDING_FORMATS)."""
    fmt = NATIVE_FORMATS.get(type_name, FLOAT)
    if name == "token_embd.weight" and fmt not in EMBEDDING_FORMATS:
        return FLOAT
    return fmt


def format_bits(fmt: str, dtype_bytes: int) -> float:
    """Stored bits per weight of a format: int4/G 4 + 32/G, int8/G 8 + 16/G, float the dtype."""
    if fmt == FLOAT:
        return 8.0 * dtype_bytes
    kind, group = fmt.split("/")
    return 4.0 + 32.0 / int(group) if kind == "int4" else 8.0 + 16.0 / int(group)


def projection(name: str) -> tuple[int, str, str] | None:
    """(layer, engine matrix, roofline operator) of a decoder projection tensor, else None."""
    match = _PROJECTION.fullmatch(name)
    if match is None:
        return None
    matrix, op = _LEAF[match.group(2)]
    return int(match.group(1)), matrix, op


def stored_formats(tensors: Iterable[TensorInfo]) -> dict[str, str]:
    """The stored format of every projection tensor, and of `token_embd` / `output`, under
    `weights: native` (FLOAT where it is dequantized); the other tensors (norms) are absent
    (model dtype)."""
    groups: dict[tuple[int, str], list[TensorInfo]] = defaultdict(list)
    formats: dict[str, str] = {}
    for t in tensors:
        where = projection(t.name)
        if where is not None:
            groups[(where[0], where[1])].append(t)
        elif t.name in TOP_LEVEL:
            formats[t.name] = top_level_format(t.name, t.type_name)
    for parts in groups.values():
        kinds = {NATIVE_FORMATS.get(t.type_name, FLOAT) for t in parts}
        fmt = kinds.pop() if len(kinds) == 1 else FLOAT  # mixed parts: one float matrix
        formats.update((t.name, fmt) for t in parts)
    return formats


def native_mix(tensors: Iterable[TensorInfo]) -> tuple[tuple[str, str, int], ...]:
    """(roofline operator, stored format, weights) summed over a file's projections: what
    `QuantConfig.weight_bits` prices for `weights: native`.  A quantized `token_embd` adds
    an "embed" row, and an "lm_head" row when it is also the (tied) head, which reads the
    same bytes; a quantized `output` adds the "lm_head" row.  A float embedding or head has
    no row (it follows the model dtype and `quant.head`)."""
    infos = list(tensors)
    formats = stored_formats(infos)
    sums: dict[tuple[str, str], int] = defaultdict(int)
    for t in infos:
        where = projection(t.name)
        if where is not None:
            sums[(where[2], formats[t.name])] += t.numel
    top = {t.name: t for t in infos if t.name in TOP_LEVEL}
    if "output.weight" not in top and "token_embd.weight" in top:  # tied: the head reads it
        top["output.weight"] = top["token_embd.weight"]
    for name, t in top.items():
        fmt = top_level_format(t.name, t.type_name)
        if fmt != FLOAT:
            sums[(TOP_LEVEL[name], fmt)] += t.numel
    return tuple(sorted((op, fmt, n) for (op, fmt), n in sums.items()))


def describe_top_level(tensors: Iterable[TensorInfo], dtype: str) -> str:
    """`embedding + tied LM head Q8_0 -> int8/32`: what `weights: native` does with the
    token embedding and the LM head ("" when both are float in the file)."""
    top = {t.name: t for t in tensors if t.name in TOP_LEVEL}
    parts = []
    for name, what in (("token_embd.weight", "embedding"), ("output.weight", "LM head")):
        t = top.get(name)
        if t is None or t.type_name in ("F32", "F16", "BF16"):
            continue
        if name == "token_embd.weight" and "output.weight" not in top:
            what = "embedding + tied LM head"
        fmt = top_level_format(name, t.type_name)
        why = ("the gather reads int4 / int8 tables only" if t.type_name in NATIVE_FORMATS
               else "no kernel for this type")
        parts.append(f"{what} {t.type_name} -> {fmt}" if fmt != FLOAT else
                     f"{what} {t.type_name} dequantized to {dtype} ({why})")
    return ", ".join(parts)


def describe_native(tensors: Iterable[TensorInfo], dtype: str) -> str:
    """`native Q4_1 x210 -> int4/32; dequantized to float32: Q5_K x14 (no kernel for this
    type); embedding + tied LM head Q8_0 -> int8/32`."""
    infos = list(tensors)
    formats = stored_formats(infos)
    native: dict[tuple[str, str], int] = defaultdict(int)
    dequant: dict[tuple[str, str], int] = defaultdict(int)
    for t in infos:
        fmt = formats.get(t.name)
        if fmt is None or t.name in TOP_LEVEL:
            continue
        if fmt != FLOAT:
            native[(t.type_name, fmt)] += 1
        elif t.type_name in NATIVE_FORMATS:
            dequant[(t.type_name, "fused with another format")] += 1
        elif t.type_name in ("F32", "F16", "BF16"):
            dequant[(t.type_name, "float in the file")] += 1
        else:
            dequant[(t.type_name, "no kernel for this type")] += 1
    parts = []
    if native:
        parts.append("native " + ", ".join(f"{name} x{n} -> {fmt}"
                                           for (name, fmt), n in sorted(native.items())))
    if dequant:
        parts.append(f"dequantized to {dtype}: " + ", ".join(
            f"{name} x{n} ({why})" for (name, why), n in sorted(dequant.items())))
    if not parts:
        parts.append("native: no decoder projections in the file")
    top = describe_top_level(infos, dtype)
    return "; ".join([*parts, top] if top else parts)
