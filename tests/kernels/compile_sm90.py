"""Compile every Triton kernel for an H100 (sm_90) on a machine without a GPU.

Run as a script in a process where TRITON_INTERPRET is unset (the interpreter replaces
@triton.jit functions at import time).  The front end, the MLIR passes and ptxas all
run on the CPU, so code-generation errors that the interpreter cannot see (loop-carried
types, constexpr misuse, unsupported layouts) show up here.  Prints one line per
kernel variant and exits 1 if any fails.  Usage: compile_sm90.py [bf16 fp16 fp32 ...]
"""

from __future__ import annotations

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import activation, rmsnorm, rope, store_kv  # noqa: E402
from kernels import fused_moe as moe  # noqa: E402
from kernels import paged_decode_attention as pda  # noqa: E402
from kernels import prefill_attention as pa  # noqa: E402
from kernels import quant_matmul as qm  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FLOAT_ARGS = {"qk_scale", "eps", "alpha", "limit"}


def compile_one(label: str, kernel, ptrs: dict[str, str], consts: dict, num_warps: int = 4) -> bool:
    signature = {
        name: "constexpr" if name in consts else ptrs.get(name, "fp32" if name in FLOAT_ARGS
                                                          else "i32")
        for name in kernel.arg_names
    }
    try:
        triton.compile(ASTSource(kernel, signature, consts), target=TARGET,
                       options={"num_warps": num_warps})
    except Exception as exc:  # report every failure, not just the first
        print(f"FAIL {label}: {type(exc).__name__}: {str(exc)[:2000]}")
        return False
    print(f"ok   {label}")
    return True


def variants(dt: str):
    prec = "ieee" if dt == "fp32" else "tf32"
    p = "*" + dt
    attn = dict(q_ptr=p, k_cache_ptr=p, v_cache_ptr=p, block_tables_ptr="*i32",
                context_lens_ptr="*i32", cu_seqlens_ptr="*i32", out_ptr=p, lse_ptr="*fp32",
                k_scales_ptr="*fp32", v_scales_ptr="*fp32", sinks_ptr=p)
    heads = dict(HEAD_DIM=128, V_HEAD_DIM=128, BLOCK_D=128, BLOCK_DV=128, DOT_PRECISION=prec)
    for splits in (1, 4):
        ptrs = {**attn, "out_ptr": p if splits == 1 else "*fp32"}
        yield (f"decode {dt} splits={splits}", pda._paged_decode_attention_kernel, ptrs,
               dict(GROUP=4, NUM_SPLITS=splits, BLOCK_M=16, BLOCK_N=64, KV_QUANT=False,
                    HAS_SINKS=False, **heads))
    # gpt-oss's attention sinks: in the kernel with one split, in the reduce with several
    yield (f"decode {dt} sinks", pda._paged_decode_attention_kernel, attn,
           dict(GROUP=8, NUM_SPLITS=1, BLOCK_M=16, BLOCK_N=64, KV_QUANT=False, HAS_SINKS=True,
                **heads))
    for sinks in (False, True):
        yield (f"decode-reduce {dt}" + (" sinks" if sinks else ""),
               pda._paged_decode_reduce_kernel,
               dict(partial_ptr="*fp32", lse_ptr="*fp32", out_ptr=p, sinks_ptr=p),
               dict(V_HEAD_DIM=128, NUM_SPLITS=4, BLOCK_R=4, BLOCK_DV=128, HAS_SINKS=sinks))
    for sinks in (False, True):
        yield (f"prefill {dt}" + (" sinks" if sinks else ""), pa._prefill_attention_kernel, attn,
               dict(GROUP=4, BLOCK_Q=16, BLOCK_M=64, BLOCK_N=64, KV_QUANT=False,
                    HAS_SINKS=sinks, **heads))
    store = dict(key_ptr=p, value_ptr=p, k_cache_ptr=p, v_cache_ptr=p, slot_mapping_ptr="*i64",
                 k_scales_ptr="*fp32", v_scales_ptr="*fp32", sinks_ptr=p)
    store_consts = dict(HEAD_DIM=128, V_HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128, BLOCK_DV=128)
    yield (f"store_kv {dt}", store_kv._store_kv_kernel, store,
           dict(QUANT=False, QMAX=1.0, IS_INT8=False, **store_consts))
    # Quantized KV caches (kernels/kv_quant.py): int8 and fp8 e4m3 values, fp32 scales.
    for kv, qmax in (("i8", 127.0), ("fp8e4nv", 448.0)):
        cache = {"k_cache_ptr": "*" + kv, "v_cache_ptr": "*" + kv}
        yield (f"decode {dt} kv={kv}", pda._paged_decode_attention_kernel,
               {**attn, **cache, "out_ptr": "*fp32"},
               dict(GROUP=4, NUM_SPLITS=4, BLOCK_M=16, BLOCK_N=64, KV_QUANT=True,
                    HAS_SINKS=False, **heads))
        yield (f"prefill {dt} kv={kv}", pa._prefill_attention_kernel, {**attn, **cache},
               dict(GROUP=4, BLOCK_Q=16, BLOCK_M=64, BLOCK_N=64, KV_QUANT=True,
                    HAS_SINKS=False, **heads))
        yield (f"store_kv {dt} kv={kv}", store_kv._store_kv_kernel, {**store, **cache},
               dict(QUANT=True, QMAX=qmax, IS_INT8=kv == "i8", **store_consts))
    for has_residual in (False, True):
        yield (f"rmsnorm {dt} residual={has_residual}", rmsnorm._rmsnorm_kernel,
               dict(x_ptr=p, residual_ptr=p, weight_ptr=p, out_ptr=p, new_residual_ptr=p),
               dict(HAS_RESIDUAL=has_residual, BLOCK_T=1, BLOCK_H=4096))
    yield (f"rope {dt}", rope._rope_kernel,
           dict(q_ptr=p, k_ptr=p, positions_ptr="*i64", cos_sin_ptr="*fp32"),
           dict(HALF=64, BLOCK_HALF=64, BLOCK_HQ=32, BLOCK_HK=8))
    yield (f"silu_and_mul {dt}", activation._silu_and_mul_kernel, dict(x_ptr=p, out_ptr=p),
           dict(BLOCK_T=4, BLOCK_I=1024))
    for bits in (8, 4):
        ptrs = dict(x_ptr=p, w_ptr="*i8" if bits == 8 else "*u8", scale_ptr="*fp16",
                    min_ptr="*fp16", out_ptr="*fp32")
        for block_m in (1, 8):
            yield (f"gemv int{bits} {dt} M={block_m}", qm._quant_gemv_kernel, ptrs,
                   dict(BITS=bits, BLOCK_M=block_m, BLOCK_N=32, BLOCK_K=64 if block_m <= 2 else 32,
                        COL_SCALES=False))
        col_scales = (False, True) if bits == 8 else (False,)
        for col in col_scales:  # a scale per column: int8 groups narrower than 16
            yield (f"gemm int{bits} {dt}" + (" col-scales" if col else ""), qm._quant_gemm_kernel,
                   {**ptrs, "out_ptr": p},
                   dict(BITS=bits, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, COL_SCALES=col,
                        DOT_PRECISION=prec))
    # Fused MoE (kernels/fused_moe.py): the gate/up and the down GEMMs over sorted pairs.
    sort = dict(sorted_ptr="*i32", block_expert_ptr="*i32")
    tiles = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, DOT_PRECISION=prec)
    for gpt_oss in (False, True):  # gpt-oss: expert biases and the clamped SwiGLU
        label = " gpt-oss" if gpt_oss else ""
        yield (f"moe gate_up {dt}{label}", moe._moe_gate_up_kernel,
               dict(x_ptr=p, w13_ptr=p, inter_ptr=p, b13_ptr=p, **sort),
               dict(HAS_BIAS=gpt_oss, CLAMPED=gpt_oss, **tiles))
        yield (f"moe down {dt}{label}", moe._moe_down_kernel,
               dict(inter_ptr=p, w2_ptr=p, out_ptr="*fp32", weights_ptr="*fp32", b2_ptr=p,
                    **sort), dict(HAS_BIAS=gpt_oss, **tiles))

if __name__ == "__main__":
    dtypes = sys.argv[1:] or ["bf16"]
    results = [compile_one(*v) for dt in dtypes for v in variants(dt)]
    sys.exit(0 if all(results) else 1)
