"""Safetensors checkpoints that store their projections in FP8, MXFP4 or NVFP4, loaded as
stored.

A projection `P` of such a checkpoint is stored as (read from the tensors' own dtypes and
names, so any `quantization_config` spelling of the same layout loads):

    fp8, DeepSeek-V3 (`quant_method: fp8`, `weight_block_size: [bn, bk]`):
        P.weight float8_e4m3fn (N, K), P.weight_scale_inv float32 (ceil(N/bn), ceil(K/bk))
    fp8, compressed-tensors / vLLM (`float-quantized`, strategy tensor or channel):
        P.weight float8_e4m3fn (N, K), P.weight_scale float32 () / (1,) (tensor) or (N, 1)
    nvfp4, NVIDIA ModelOpt (`quant_algo: NVFP4`):
        P.weight uint8 (N, K/2) E2M1 pairs, P.weight_scale float8_e4m3fn (N, K/16),
        P.weight_scale_2 float32 ()
    mxfp4 (OCP MX, one E8M0 byte per 32 inputs):
        P.weight uint8 (N, K/2) E2M1 pairs, P.weight_scale uint8 or float8_e8m0fnu (N, K/32)
    gpt-oss's released MXFP4 routed experts (`quant_method: mxfp4`), per layer and matrix
    X = gate_up_proj (N = 2I rows, gate and up rows alternating, K = H) or down_proj
    (N = H, K = I), every expert's matrix (out, in) as transformers' mxfp4 integration
    reads them:
        mlp.experts.X_blocks uint8 (E, N, K/32, 16) E2M1 pairs (even column low nibble),
        mlp.experts.X_scales uint8 (E, N, K/32) E8M0

The scale tensors multiply the codes (DeepSeek's "inv" is the inverse of the quantizer's
division).  A static activation scale (`P.input_scale`) is not used: activations are
whatever `quant.activations` says.

With `quant.weights: native`, `plan` reads only the headers and `swap` replaces each such
projection of the model, still on the meta device, by a `FloatCodeLinear` of its stored
format (a fused q/k/v or gate/up whose parts the file stores separately becomes a
`ShardedLinear` of one per part, each with its own scales); `Loader.put` then copies the
codes and scales into those buffers: no float copy of a quantized projection ever exists.
Under any other `quant.weights` the same tensors are dequantized, one at a time, into the
float model (as a GGUF file's blocks are without `native`).  gpt-oss's expert blocks
(`plan_experts`, `ExpertLoader`) likewise: stored as `StackedFloatCodes` in the MoE layers
under `native` (gate / up rows de-interleaved into MoEMLP's gate-then-up order, which
moves whole rows of codes and scales, exactly), dequantized one stacked matrix at a time
otherwise.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from infbench.checkpoint.metadata import reading
from infbench.core.errors import UserError
from infbench.model.float_quant import FloatCodeLinear, ShardedLinear, StackedFloatCodes
from infbench.model.moe import MoEMLP
from kernels.fp_format import (
    FP8_BLOCK,
    MX_BLOCK,
    NV_BLOCK,
    FloatQuantWeight,
    Fp8Weight,
    Mxfp4Weight,
    Nvfp4Weight,
)

SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale", "weight_scale_2")
SKIPPED_SUFFIXES = ("input_scale",)  # static activation scales: activations are quant's

@dataclass(frozen=True)
class StoredMatrix:
    """One quantized projection of the file: its weight's name, format and (N, K)."""

    weight: str  # "model.layers.0.self_attn.q_proj.weight"
    kind: str  # fp8 | mxfp4 | nvfp4
    shape: tuple[int, int]  # (N, K) of the float matrix
    block: tuple[int, int]  # fp8: (block_n, block_k); nvfp4: (1, 16)
    scales: tuple[str, ...]  # the names of its scale tensors

    @property
    def prefix(self) -> str:
        return self.weight.removesuffix(".weight")

    def empty(self, device: str | torch.device) -> FloatQuantWeight:
        n, k = self.shape
        if self.kind == "mxfp4":
            return Mxfp4Weight(torch.empty(n, k // 2, dtype=torch.uint8, device=device),
                               torch.empty(n, k // MX_BLOCK, dtype=torch.uint8, device=device))
        if self.kind == "fp8":
            bn, bk = self.block
            codes = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=device)
            return Fp8Weight(codes, torch.empty(-(-n // bn), -(-k // bk), device=device), bn, bk)
        return Nvfp4Weight(torch.empty(n, k // 2, dtype=torch.uint8, device=device),
                           torch.empty(n, k // NV_BLOCK, dtype=torch.float8_e4m3fn,
                                       device=device),
                           torch.empty((), device=device))


def _headers(files: list[Path]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype string, shape) of every tensor, without reading data."""
    from safetensors import safe_open

    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        with reading(file, "safetensors file"), safe_open(str(file), framework="pt",
                                                          device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                piece = f.get_slice(name)
                out[name] = (piece.get_dtype(), tuple(piece.get_shape()))
    return out


def block_size(root: Path) -> tuple[int, int]:
    """DeepSeek-V3's `quantization_config.weight_block_size` ([128, 128] when absent)."""
    config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    block = (config.get("quantization_config") or {}).get("weight_block_size") or [FP8_BLOCK] * 2
    if not (isinstance(block, list) and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)):
        raise UserError(f"{root}/config.json: quantization_config.weight_block_size must be two "
                        f"positive integers, got {block!r}")
    return int(block[0]), int(block[1])


def plan(root: Path, files: list[Path]) -> list[StoredMatrix]:
    """The file's quantized projections (empty for a float checkpoint)."""
    heads = _headers(files)
    out = []
    for name, (dtype, shape) in heads.items():
        if not name.endswith(".weight"):
            continue
        prefix = name.removesuffix(".weight")
        scale = next((s for s in SCALE_SUFFIXES if f"{prefix}.{s}" in heads), None)
        if dtype == "F8_E4M3":
            out.append(_fp8_matrix(root, name, shape, heads, scale))
        elif scale is not None and dtype == "U8":
            scale_dtype = heads.get(f"{prefix}.weight_scale", ("", ()))[0]
            if scale_dtype in ("U8", "F8_E8M0"):
                out.append(_mxfp4_matrix(root, name, shape, heads))
            else:
                out.append(_nvfp4_matrix(root, name, shape, heads))
        elif scale is not None:
            raise UserError(f"{root}: tensor {name!r} has scales ({prefix}.{scale}) but is "
                            f"stored as {dtype}; allowed quantized weights: F8_E4M3 (fp8), "
                            "U8 (E2M1 pairs: nvfp4, mxfp4)")
    return out


def _fp8_matrix(root: Path, name: str, shape: tuple[int, ...],
                heads: dict[str, tuple[str, tuple[int, ...]]], scale: str | None) -> StoredMatrix:
    prefix = name.removesuffix(".weight")
    if len(shape) != 2 or scale not in ("weight_scale_inv", "weight_scale"):
        raise UserError(f"{root}: fp8 tensor {name!r} of shape {shape} needs a 2-D weight and "
                        f"{prefix}.weight_scale_inv (block scales) or {prefix}.weight_scale "
                        "(per-tensor / per-channel)")
    n, k = shape
    s_dtype, s_shape = heads[f"{prefix}.{scale}"]
    if scale == "weight_scale_inv":
        bn, bk = block_size(root)
        expect: tuple[tuple[int, ...], ...] = ((-(-n // bn), -(-k // bk)),)
    elif s_shape in ((), (1,), (1, 1)):
        bn, bk, expect = n, k, (s_shape,)
    else:
        bn, bk, expect = 1, k, ((n, 1), (n,))
    if s_dtype != "F32" or s_shape not in expect:
        raise UserError(f"{root}: {prefix}.{scale} is {s_dtype} {s_shape}; a {n}x{k} fp8 "
                        f"weight needs F32 of shape {' or '.join(map(str, expect))}")
    return StoredMatrix(name, "fp8", (n, k), (bn, bk), (f"{prefix}.{scale}",))


def _mxfp4_matrix(root: Path, name: str, shape: tuple[int, ...],
                  heads: dict[str, tuple[str, tuple[int, ...]]]) -> StoredMatrix:
    prefix = name.removesuffix(".weight")
    n, half = shape if len(shape) == 2 else (0, 0)
    got = heads[f"{prefix}.weight_scale"]
    want = (n, 2 * half // MX_BLOCK)
    if len(shape) != 2 or got[1] != want or (2 * half) % MX_BLOCK:
        raise UserError(f"{root}: mxfp4 tensor {name!r} {shape} needs {prefix}.weight_scale "
                        f"U8 / F8_E8M0 of shape {want}, found {got}")
    return StoredMatrix(name, "mxfp4", (n, 2 * half), (1, MX_BLOCK),
                        (f"{prefix}.weight_scale",))


def _nvfp4_matrix(root: Path, name: str, shape: tuple[int, ...],
                  heads: dict[str, tuple[str, tuple[int, ...]]]) -> StoredMatrix:
    prefix = name.removesuffix(".weight")
    n, half = shape if len(shape) == 2 else (0, 0)
    want = {f"{prefix}.weight_scale": ("F8_E4M3", ((n, 2 * half // NV_BLOCK),)),
            f"{prefix}.weight_scale_2": ("F32", ((), (1,)))}
    for scale, (dtype, shapes) in want.items():
        got = heads.get(scale)
        if len(shape) != 2 or got is None or got[0] != dtype or got[1] not in shapes:
            raise UserError(f"{root}: nvfp4 tensor {name!r} {shape} needs {scale} {dtype} of "
                            f"shape {' or '.join(map(str, shapes))}, found {got}")
    return StoredMatrix(name, "nvfp4", (n, 2 * half), (1, NV_BLOCK), tuple(want))


def owned(matrices: dict[str, StoredMatrix], name: str) -> bool:
    """Whether tensor `name` is a weight or scale of one of `matrices` (by prefix), or a
    static activation scale (which is skipped)."""
    prefix, _, leaf = name.rpartition(".")
    if leaf in SKIPPED_SUFFIXES:
        return True
    return prefix in matrices and leaf in ("weight", *SCALE_SUFFIXES)


def describe(matrices: list[StoredMatrix], native: bool, kept: int = 0) -> str:
    """`fp8/block x14, run as stored` / `... dequantized to the model dtype`: the load
    summary; `kept`: how many of them native weights keep in the model dtype."""
    counts: dict[str, int] = {}
    for m in matrices:
        name = m.kind if m.kind != "fp8" else f"fp8/{_granularity(m)}"
        counts[name] = counts.get(name, 0) + 1
    what = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
    note = f" ({kept} kept in the model dtype: MLA's kv_b_proj)" if kept else ""
    return f"{what}, {'run as stored' if native else 'dequantized to the model dtype'}{note}"


def _granularity(m: StoredMatrix) -> str:
    return Fp8Weight(torch.empty(m.shape, device="meta"), torch.empty(0), *m.block).granularity


@dataclass
class Dequantizer:
    """Without `native`: each quantized matrix's tensors gathered until complete, then its
    float values (one matrix at a time)."""

    matrices: dict[str, StoredMatrix]  # by checkpoint prefix
    held: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def take(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        """(weight name, float32 matrix) once `name` completes a matrix, else None."""
        prefix, _, leaf = name.rpartition(".")
        if leaf in SKIPPED_SUFFIXES:
            return None
        matrix = self.matrices[prefix]
        pieces = self.held.setdefault(prefix, {})
        pieces[name] = tensor
        if len(pieces) < 1 + len(matrix.scales):
            return None
        del self.held[prefix]
        return matrix.weight, dequantized(matrix, pieces)


@dataclass
class Loader:
    """Where each quantized matrix of the file goes in a model with swapped projections."""

    root: Path
    matrices: dict[str, StoredMatrix]  # by checkpoint prefix
    parts: dict[str, FloatCodeLinear] = field(default_factory=dict)  # by checkpoint prefix
    dequantized: dict[str, StoredMatrix] = field(default_factory=dict)  # kept in float
    pending: set[str] = field(default_factory=set)  # "prefix.weight" / "prefix.<scale>"

    def owns(self, name: str) -> bool:
        """Whether `name` is a weight or scale of a matrix stored as such (or a skipped
        tensor); those of `dequantized` matrices go through a `Dequantizer`."""
        return owned({p: m for p, m in self.matrices.items() if p not in self.dequantized},
                     name)

    def put(self, name: str, tensor: torch.Tensor) -> None:
        prefix, _, leaf = name.rpartition(".")
        if leaf in SKIPPED_SUFFIXES:
            return
        part = self.parts.get(prefix)
        if part is None:
            raise UserError(f"{self.root}: quantized tensor {name!r} has no place in this "
                            "model (routed experts and the embedding / LM head run in float)")
        with torch.no_grad():
            if leaf == "weight":
                part.codes.copy_(tensor.view(part.codes.dtype))
            elif leaf == "weight_scale_2":
                assert part.global_scale is not None
                part.global_scale.copy_(tensor.reshape(()))
            else:  # E8M0 scales are kept as their bytes (uint8)
                raw = tensor.view(torch.uint8) if tensor.dtype == torch.float8_e8m0fnu else tensor
                part.scales.copy_(raw.reshape(part.scales.shape))
        self.pending.discard(name)

    def finish(self) -> None:
        if self.pending:
            first = sorted(self.pending)[0]
            raise UserError(f"{self.root}: checkpoint has no {first!r} and "
                            f"{len(self.pending) - 1} more quantized tensors")


def dequantized(matrix: StoredMatrix, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The float32 values of one quantized matrix from its weight and scale tensors."""
    p = matrix.prefix
    weight = tensors[f"{p}.weight"]
    if matrix.kind == "fp8":
        scale = tensors[matrix.scales[0]]
        n, k = matrix.shape
        bn, bk = matrix.block
        return Fp8Weight(weight, scale.float().reshape(-(-n // bn), -(-k // bk)),
                         bn, bk).dequantize()
    if matrix.kind == "mxfp4":
        scale = tensors[f"{p}.weight_scale"]
        return Mxfp4Weight(weight, scale.view(torch.uint8) if scale.dtype != torch.uint8
                           else scale).dequantize()
    return Nvfp4Weight(weight, tensors[f"{p}.weight_scale"],
                       tensors[f"{p}.weight_scale_2"].float().reshape(())).dequantize()


def swap(model: nn.Module, sink: Any, matrices: list[StoredMatrix], root: Path,
         dtype: torch.dtype) -> Loader:
    """Replace (on the meta device) every engine projection the file stores quantized.

    sink: the loader's `_WeightSink` on the meta model, for its name mapping (`target`)
    and the row counts of fused parameters (`shards`)."""
    by_module: dict[str, dict[int, StoredMatrix]] = {}
    for matrix in matrices:
        dest = sink.target(matrix.weight)
        if dest is None:
            continue
        ours, shard = dest
        by_module.setdefault(ours.removesuffix(".weight"), {})[shard] = matrix
    loader = Loader(root, {m.prefix: m for m in matrices})
    for path, shards in by_module.items():
        parent_path, _, attr = path.rpartition(".")
        linear = _linear(model, parent_path, attr)
        if linear is not None and attr in getattr(model.get_submodule(parent_path),
                                                  "float_children", ()):
            # kept in the model dtype (MLA's kv_b_proj): dequantized as it is read
            loader.dequantized.update({m.prefix: m for m in shards.values()})
            continue
        if linear is None:
            names = ", ".join(sorted(m.weight for m in shards.values()))
            raise UserError(f"{root}: {names}: quantized tensors are run only for the "
                            "decoder's projections (attention and dense MLP); the routed "
                            "experts, the embedding and the LM head must be stored in float")
        sizes = sink.shards.get(f"{path}.weight", [linear.out_features])
        if -1 not in shards and sorted(shards) != list(range(len(sizes))):
            raise UserError(f"{root}: {path}: the file stores only some parts of this fused "
                            "projection quantized; allowed: all its parts quantized, or none")
        parts = []
        for _, matrix in sorted(shards.items()):
            part = FloatCodeLinear(matrix.empty("meta"), None, dtype)
            loader.parts[matrix.prefix] = part
            loader.pending |= {matrix.weight, *matrix.scales}
            parts.append(part)
        # A float bias keeps its parameter name (Qwen2's qkv_proj.bias), so the sink fills it.
        module: nn.Module = ShardedLinear(parts, linear.bias) if len(parts) > 1 else parts[0]
        if len(parts) == 1 and linear.bias is not None:
            parts[0].bias = linear.bias
        setattr(model.get_submodule(parent_path), attr, module)
    return loader


def _linear(model: nn.Module, parent_path: str, attr: str) -> nn.Linear | None:
    try:
        parent = model.get_submodule(parent_path)
    except AttributeError:
        return None
    linear = getattr(parent, attr, None)
    return linear if isinstance(linear, nn.Linear) else None


# ---------------------------------------------------------- gpt-oss's MXFP4 experts
_EXPERT_BLOCKS = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)"
                            r"_(blocks|scales)")


@dataclass(frozen=True)
class StoredExperts:
    """One layer's stacked expert matrix stored as MXFP4 blocks: its checkpoint prefix
    ("model.layers.0.mlp.experts.gate_up_proj") and the float (E, N, K)."""

    prefix: str
    layer: int
    leaf: str  # gate_up_proj | down_proj
    shape: tuple[int, int, int]


def plan_experts(root: Path, files: list[Path]) -> list[StoredExperts]:
    """gpt-oss's `_blocks` / `_scales` expert tensors of the file (empty for a float one);
    a one-line UserError when a pair is incomplete or its dtypes / shapes disagree."""
    heads = _headers(files)
    out = []
    for name, (dtype, shape) in sorted(heads.items()):
        match = _EXPERT_BLOCKS.fullmatch(name)
        if match is None or match.group(3) != "blocks":
            if match is not None and name.replace("_scales", "_blocks") not in heads:
                raise UserError(f"{root}: {name!r} has no {name.replace('_scales', '_blocks')!r}"
                                " (MXFP4 experts store both)")
            continue
        scales = name.removesuffix("_blocks") + "_scales"
        got = heads.get(scales)
        e, n, groups = shape[:3] if len(shape) == 4 else (0, 0, 0)
        if dtype != "U8" or len(shape) != 4 or shape[3] != MX_BLOCK // 2 or got is None \
                or got[0] not in ("U8", "F8_E8M0") or got[1] != (e, n, groups):
            raise UserError(f"{root}: MXFP4 experts {name!r} U8 {shape} need U8 of shape "
                            f"(E, N, K/32, 16) and {scales!r} U8 (E, N, K/32); found {dtype} "
                            f"{shape} and {got}")
        out.append(StoredExperts(name.removesuffix("_blocks"), int(match.group(1)),
                                 match.group(2), (e, n, groups * MX_BLOCK)))
    return out


def mxfp4_experts(blocks: torch.Tensor, scales: torch.Tensor, leaf: str) -> StackedFloatCodes:
    """A layer's `_blocks` / `_scales` pair as MoEMLP stores it: gate_up's alternating
    gate / up rows reordered to gate rows then up rows (codes and scales alike)."""
    e, n = blocks.shape[:2]
    packed = blocks.reshape(e, n, -1)  # (E, N, K / 2)
    raw = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales  # (E, N, K/32)
    if leaf == "gate_up_proj":
        packed = torch.cat([packed[:, 0::2], packed[:, 1::2]], dim=1)
        raw = torch.cat([raw[:, 0::2], raw[:, 1::2]], dim=1)
    return StackedFloatCodes([Mxfp4Weight(packed[i].contiguous(), raw[i].contiguous())
                              for i in range(e)])


def empty_mxfp4_experts(shape: tuple[int, int, int], device: str | torch.device
                        ) -> StackedFloatCodes:
    e, n, k = shape
    return StackedFloatCodes([Mxfp4Weight(
        torch.empty(n, k // 2, dtype=torch.uint8, device=device),
        torch.empty(n, k // MX_BLOCK, dtype=torch.uint8, device=device)) for _ in range(e)])


def swap_experts(model: nn.Module, experts: list[StoredExperts]) -> None:
    """Under `native`, on the meta device: each MoE layer whose experts the file stores as
    MXFP4 holds empty `StackedFloatCodes` of their shapes (both matrices, or the file is
    refused)."""
    by_layer: dict[int, dict[str, StoredExperts]] = {}
    for stored in experts:
        by_layer.setdefault(stored.layer, {})[stored.leaf] = stored
    for layer, leaves in sorted(by_layer.items()):
        mlp = _layer_mlp(model, layer)
        if mlp is None or set(leaves) != {"gate_up_proj", "down_proj"}:
            raise UserError(f"{next(iter(leaves.values())).prefix}: MXFP4 experts need an MoE "
                            "layer of the config storing both gate_up_proj and down_proj so")
        w13 = empty_mxfp4_experts(leaves["gate_up_proj"].shape, "meta")
        w2 = empty_mxfp4_experts(leaves["down_proj"].shape, "meta")
        if w13.shape != tuple(mlp.w13.shape) or w2.shape != tuple(mlp.w2.shape):
            raise UserError(f"model.layers.{layer}.mlp.experts: MXFP4 experts of shapes "
                            f"{w13.shape} and {w2.shape}; the config expects "
                            f"{tuple(mlp.w13.shape)} and {tuple(mlp.w2.shape)}")
        mlp.set_stored_experts(w13, w2)


def _layer_mlp(model: nn.Module, layer: int) -> MoEMLP | None:
    """Layer `layer`'s MoE MLP, or None when there is no such layer or it is dense."""
    try:
        mlp = model.get_submodule(f"layers.{layer}.mlp")
    except AttributeError:
        return None
    return mlp if isinstance(mlp, MoEMLP) else None


@dataclass
class ExpertLoader:
    """Pairs each `_blocks` tensor with its `_scales`, then stores them in the model
    (`native`) or hands `sink.put` the dequantized float matrix in the checkpoint's float
    layout (E, K, N) under the float name."""

    root: Path
    experts: dict[str, StoredExperts]  # by prefix
    native: bool
    held: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)

    def owns(self, name: str) -> bool:
        return _EXPERT_BLOCKS.fullmatch(name) is not None

    def put(self, name: str, tensor: torch.Tensor, model: nn.Module, sink: Any) -> None:
        prefix, _, kind = name.rpartition("_")
        stored = self.experts[prefix]
        pieces = self.held.setdefault(prefix, {})
        pieces[kind] = tensor
        if len(pieces) < 2:
            return
        del self.held[prefix]
        codes = mxfp4_experts(pieces["blocks"], pieces["scales"], stored.leaf)
        if self.native:
            mlp = _layer_mlp(model, stored.layer)
            assert mlp is not None  # swap_experts checked it
            into = mlp.w13 if stored.leaf == "gate_up_proj" else mlp.w2
            assert isinstance(into, StackedFloatCodes)
            with torch.no_grad():
                into.codes.copy_(codes.codes)
                into.scales.copy_(codes.scales)
        else:  # float: back to the checkpoint's (E, K, N) layout (gate / up alternating)
            raw = mxfp4_experts(pieces["blocks"], pieces["scales"], "down_proj")
            sink.put(prefix, raw.dequantized().transpose(1, 2))
        self.done.add(prefix)

    def finish(self) -> None:
        missing = sorted(set(self.experts) - self.done)
        if missing:
            raise UserError(f"{self.root}: checkpoint has no complete {missing[0]!r}_blocks / "
                            f"_scales and {len(missing) - 1} more MXFP4 expert matrices")
