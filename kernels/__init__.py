"""Triton kernels for the inference hot path, each with a torch reference (leaf package).

One module per kernel family: `_<name>_kernel` (triton.jit), the `<name>()` launcher,
the `<name>_ref()` torch reference (also the engine's CPU backend) and `<name>_cost()`
(FLOPs and bytes of one call, a `kernels.cost.KernelCost`).  Submodules are imported
on demand (`from kernels.rmsnorm import rmsnorm`): importing `kernels` itself loads
neither torch nor triton.
"""

__all__ = [
    "activation",
    "cost",
    "linear_attention",
    "mla_decode_attention",
    "paged_decode_attention",
    "prefill_attention",
    "quant_matmul",
    "rmsnorm",
    "rope",
    "selective_scan",
    "store_kv",
]
