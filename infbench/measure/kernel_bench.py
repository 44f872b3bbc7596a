"""Kernel micro-benchmarks: time each kernel family over a size sweep, place it on the roofline.

On CUDA the Triton launchers are timed with `triton.testing.do_bench` (median); on a
CPU the torch references are timed instead (the engine's CPU backend; the Triton
interpreter is a correctness tool, not a performance path) with a wall-clock loop:
warm-up calls, then the median of repeated samples, each sample averaging enough calls
to last about 2 ms.  Every row carries the kernel's declared FLOPs and bytes (its
`*_cost` function), so achieved GB/s and TFLOP/s and their fractions of the hardware
peaks follow directly.

torch and triton are imported inside functions: importing this module stays cheap.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from infbench.core.config import DTYPES as MODEL_DTYPES
from infbench.core.errors import UserError
from infbench.hardware.spec import HardwareSpec
from infbench.measure.timing import calls_per_sample, time_op

SCHEMA_VERSION = 1
DTYPES = ("auto", *MODEL_DTYPES)


@dataclass(frozen=True)
class BenchSizes:
    """The sweep: a llama-style layer's shapes and the sizes each kernel is timed at."""

    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    hidden_size: int = 4096
    intermediate_size: int = 14336
    group_size: int = 128
    decode_batches: tuple[int, ...] = (1, 4)
    decode_contexts: tuple[int, ...] = (1024, 4096)
    prefill_lens: tuple[int, ...] = (256,)
    num_tokens: tuple[int, ...] = (1, 128)  # rmsnorm, rope, silu_and_mul, store_kv
    matmul_shapes: tuple[tuple[int, int, int], ...] = ((1, 2048, 2048), (32, 2048, 2048))
    warmup: int = 1
    repeats: int = 5


def default_sizes(device: str, quick: bool) -> BenchSizes:
    """The sweep for a device; `quick` keeps a CPU run to about 20 seconds."""
    if device == "cuda":
        if quick:
            return BenchSizes(decode_batches=(1, 32), decode_contexts=(1024, 4096, 16384),
                              prefill_lens=(512, 4096), num_tokens=(1, 4096),
                              matmul_shapes=((1, 4096, 4096), (8, 4096, 4096),
                                             (512, 4096, 4096)))
        return BenchSizes(decode_batches=(1, 8, 32, 128),
                          decode_contexts=(1024, 4096, 16384, 32768),
                          prefill_lens=(512, 2048, 8192), num_tokens=(1, 256, 4096, 16384),
                          matmul_shapes=((1, 4096, 4096), (8, 4096, 4096), (1, 14336, 4096),
                                         (512, 4096, 4096), (4096, 4096, 4096)))
    if quick:
        return BenchSizes()
    return BenchSizes(decode_contexts=(1024, 4096, 16384), prefill_lens=(512, 2048),
                      num_tokens=(1, 256, 2048),
                      matmul_shapes=((1, 4096, 4096), (1, 14336, 4096), (256, 4096, 4096)),
                      repeats=7)


@dataclass(frozen=True)
class BenchRow:
    kernel: str
    shape: str
    backend: str  # triton | torch
    dtype: str
    time_us: float
    flops: float
    bytes: float
    gb_per_s: float
    tflop_per_s: float
    pct_peak_bandwidth: float
    pct_peak_flops: float


@dataclass(frozen=True)
class _Case:
    kernel: str
    shape: str
    fn: Callable[[], Any]
    cost: Any  # kernels.cost.KernelCost


def resolve_device(device: str) -> str:
    from infbench.core.device import resolve_device as resolve

    return resolve(device, "--device")


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype not in DTYPES:
        raise UserError(f"--dtype: unknown value {dtype!r}; allowed: {', '.join(DTYPES)}")
    if dtype == "auto":  # bf16 where native (GPU, AVX-512 BF16, AMX), else float32
        from infbench.core.device import auto_dtype

        return auto_dtype(device)[0]
    return dtype


def _attention_cases(sizes: BenchSizes, dtype: Any, device: str, triton: bool) -> Iterator[_Case]:
    import torch

    from kernels import paged_decode_attention as pda
    from kernels import prefill_attention as pa

    hq, hkv, d, bs = sizes.num_heads, sizes.num_kv_heads, sizes.head_dim, sizes.block_size
    nbytes = torch.empty(0, dtype=dtype).element_size()
    scale = 1.0 / math.sqrt(d)

    def cache(num_seqs: int, ctx: int) -> tuple[Any, Any, Any, Any]:
        blocks_per_seq = -(-ctx // bs)
        num_blocks = num_seqs * blocks_per_seq
        k = torch.randn(num_blocks, bs, hkv, d, dtype=dtype, device=device)
        v = torch.randn(num_blocks, bs, hkv, d, dtype=dtype, device=device)
        tables = torch.randperm(num_blocks, device=device).view(num_seqs, -1).int()
        lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=device)
        return k, v, tables, lens

    decode = pda.paged_decode_attention if triton else pda.paged_decode_attention_ref
    for ctx in sizes.decode_contexts:
        for batch in sizes.decode_batches:
            k, v, tables, lens = cache(batch, ctx)
            q = torch.randn(batch, hq, d, dtype=dtype, device=device)
            yield _Case(
                "paged_decode_attention", f"B={batch} ctx={ctx} Hq={hq} Hkv={hkv} D={d}",
                partial(decode, q, k, v, tables, lens, scale),
                pda.paged_decode_attention_cost(batch, hq, hkv, d, d, ctx, nbytes),
            )
    prefill = pa.prefill_attention if triton else pa.prefill_attention_ref
    for length in sizes.prefill_lens:
        k, v, tables, lens = cache(1, length)
        q = torch.randn(length, hq, d, dtype=dtype, device=device)
        cu = torch.tensor([0, length], dtype=torch.int32, device=device)
        yield _Case(
            "prefill_attention", f"T={length} Hq={hq} Hkv={hkv} D={d}",
            partial(prefill, q, k, v, cu, lens, tables, scale),
            pa.prefill_attention_cost(hq, hkv, d, d, [length], [length], nbytes),
        )


def _pointwise_cases(sizes: BenchSizes, dtype: Any, device: str, triton: bool) -> Iterator[_Case]:
    import torch

    from kernels import activation, rmsnorm, rope, store_kv

    hq, hkv, d, hidden = sizes.num_heads, sizes.num_kv_heads, sizes.head_dim, sizes.hidden_size
    inter = sizes.intermediate_size
    nbytes = torch.empty(0, dtype=dtype).element_size()
    norm = rmsnorm.rmsnorm if triton else rmsnorm.rmsnorm_ref
    rotate = rope.rope if triton else rope.rope_ref
    act = activation.silu_and_mul if triton else activation.silu_and_mul_ref
    store = store_kv.store_kv if triton else store_kv.store_kv_ref
    for t in sizes.num_tokens:
        x = torch.randn(t, hidden, dtype=dtype, device=device)
        res = torch.randn(t, hidden, dtype=dtype, device=device)
        w = torch.ones(hidden, dtype=dtype, device=device)
        yield _Case("rmsnorm+residual", f"T={t} H={hidden}",
                    partial(norm, x, w, 1e-5, residual=res),
                    rmsnorm.rmsnorm_cost(t, hidden, nbytes, has_residual=True))
        q = torch.randn(t, hq, d, dtype=dtype, device=device)
        k = torch.randn(t, hkv, d, dtype=dtype, device=device)
        pos = torch.arange(t, device=device)
        angles = torch.rand(t, d // 2, device=device) * math.pi  # a real rotation: |x| stays
        cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)  # (T, D)
        yield _Case("rope", f"T={t} Hq={hq} Hkv={hkv} D={d}",
                    partial(rotate, q, k, pos, cos_sin),
                    rope.rope_cost(t, hq, hkv, d, nbytes))
        gate_up = torch.randn(t, 2 * inter, dtype=dtype, device=device)
        yield _Case("silu_and_mul", f"T={t} I={inter}", partial(act, gate_up),
                    activation.silu_and_mul_cost(t, inter, nbytes))
        num_blocks = -(-t // sizes.block_size)
        kc = torch.empty(num_blocks, sizes.block_size, hkv, d, dtype=dtype, device=device)
        vc = torch.empty_like(kc)
        slots = torch.arange(t, device=device)
        yield _Case("store_kv", f"T={t} Hkv={hkv} D={d}",
                    partial(store, k, k, kc, vc, slots),
                    store_kv.store_kv_cost(t, hkv, d, d, nbytes))


def _matmul_cases(sizes: BenchSizes, dtype: Any, device: str, triton: bool) -> Iterator[_Case]:
    import torch

    from kernels import quant_matmul as qm
    from kernels.quant_format import quantize_int4, quantize_int8

    nbytes = torch.empty(0, dtype=dtype).element_size()
    g = sizes.group_size
    int8 = qm.int8_matmul if triton else qm.int8_matmul_ref
    int4 = qm.int4_matmul if triton else qm.int4_matmul_ref
    for m, n, k in sizes.matmul_shapes:
        kind = "gemv" if m <= qm.GEMV_MAX_M else "gemm"
        x = torch.randn(m, k, dtype=dtype, device=device)
        w = torch.randn(n, k, dtype=dtype, device=device)
        w8 = quantize_int8(w)  # on w's device; one fp16 scale per output channel
        yield _Case(f"int8_{kind}", f"M={m} N={n} K={k}", partial(int8, x, w8),
                    qm.int8_matmul_cost(m, n, k, nbytes))
        w4 = quantize_int4(w, g)
        yield _Case(f"int4_{kind}", f"M={m} N={n} K={k} g={g}", partial(int4, x, w4),
                    qm.int4_matmul_cost(m, n, k, g, nbytes))


def time_cpu(fn: Callable[[], Any], warmup: int, repeats: int) -> float:
    """Median seconds per call; each sample averages enough calls to last ~2 ms."""
    for _ in range(warmup):
        fn()
    inner = calls_per_sample(fn)
    return statistics.median(time_op(fn, "cpu", repeats, warmup=0, inner=inner))


def time_cuda(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e-3


def _state_cases(sizes: BenchSizes, dtype: Any, device: str, triton: bool) -> Iterator[_Case]:
    """MLA decode over a latent cache (DeepSeek-V2 dims) and the linear-attention update."""
    import torch

    from kernels import linear_attention as la
    from kernels import mla_decode_attention as mla

    nbytes = torch.empty(0, dtype=dtype).element_size()
    rank, rope, heads, bs = 512, 64, 16, sizes.block_size
    decode = mla.mla_decode_attention if triton else mla.mla_decode_attention_ref
    for ctx in sizes.decode_contexts:
        for batch in sizes.decode_batches:
            per_seq = -(-ctx // bs)
            cache = torch.randn(batch * per_seq, bs, 1, rank + rope, dtype=dtype, device=device)
            tables = torch.randperm(batch * per_seq, device=device).view(batch, -1).int()
            lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
            q = torch.randn(batch, heads, rank + rope, dtype=dtype, device=device)
            yield _Case(
                "mla_decode_attention", f"B={batch} ctx={ctx} H={heads} latent={rank}+{rope}",
                partial(decode, q, cache, cache[..., :rank], tables, lens, 0.1),
                mla.mla_decode_attention_cost(batch, heads, rank, rope, ctx, nbytes),
            )
    update = la.linear_attention_decode if triton else la.linear_attention_decode_ref
    heads, feat, dim = sizes.num_heads, sizes.head_dim, sizes.head_dim
    for batch in sizes.decode_batches:
        s_state = torch.zeros(batch, heads, feat, dim, dtype=torch.float32, device=device)
        z_state = torch.zeros(batch, heads, feat, dtype=torch.float32, device=device)
        qf, kf, v = (torch.rand(batch, heads, n, dtype=dtype, device=device)
                     for n in (feat, feat, dim))
        slots = torch.arange(batch, device=device)
        yield _Case(
            "linear_attention_decode", f"B={batch} H={heads} f={feat} D={dim}",
            partial(update, qf, kf, v, s_state, z_state, slots),
            la.linear_attention_decode_cost(batch, heads, feat, dim, nbytes, 4),
        )


def run_kernel_bench(
    device: str,
    dtype: str,
    hardware: HardwareSpec,
    sizes: BenchSizes,
    on_row: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    """Time every case of the sweep; `device` and `dtype` are resolved names (no 'auto')."""
    import torch

    torch_dtype = getattr(torch, dtype)
    is_cuda = device == "cuda"
    peak_flops = hardware.peak(dtype)
    rows: list[BenchRow] = []
    with torch.inference_mode():
        for family in (_attention_cases, _state_cases, _pointwise_cases, _matmul_cases):
            for case in family(sizes, torch_dtype, device, is_cuda):
                seconds = time_cuda(case.fn) if is_cuda else time_cpu(
                    case.fn, sizes.warmup, sizes.repeats)
                row = BenchRow(
                    kernel=case.kernel, shape=case.shape,
                    backend="triton" if is_cuda else "torch", dtype=dtype,
                    time_us=seconds * 1e6, flops=case.cost.flops, bytes=case.cost.bytes,
                    gb_per_s=case.cost.bytes / seconds / 1e9,
                    tflop_per_s=case.cost.flops / seconds / 1e12,
                    pct_peak_bandwidth=100.0 * case.cost.bytes / seconds / hardware.bandwidth,
                    pct_peak_flops=100.0 * case.cost.flops / seconds / peak_flops,
                )
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows


def bench_document(
    rows: list[BenchRow], device: str, dtype: str, hardware: HardwareSpec, quick: bool
) -> dict[str, Any]:
    """The JSON document of a run: rows plus the environment that produced them."""
    import torch

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    device_name = torch.cuda.get_device_name() if device == "cuda" else platform.processor()
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "kernel_bench",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "device_name": device_name or platform.machine(),
        "dtype": dtype,
        "quick": quick,
        "hardware": hardware.name,
        "peak_bandwidth": hardware.bandwidth,
        "peak_flops": hardware.peak(dtype),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "triton": version("triton"), "infbench": version("infbench")},
        "rows": [asdict(row) for row in rows],
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write atomically: a temp file in the same directory, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
