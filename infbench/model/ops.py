"""The hot-path operations the model and the runner call, bound to one kernel backend.

Each attribute is the Triton launcher, the C++ CPU kernel or the torch reference from
`kernels/` (the reference is also the portable CPU backend).  The attributes are assigned
from the kernel functions themselves, so mypy knows every exact signature: a launcher
whose signature drifts from its reference, or a call site that passes the wrong arguments, is a type
error rather than a runtime surprise.  Which backend to use is the engine's decision
(`engine/backend.py`); the type lives here because the model layers hold it.
"""

from __future__ import annotations

BACKENDS = ("triton", "torch", "cpu")


class Ops:
    """Kernel functions of one backend: `triton` (launchers), `cpu` (the C++ CPU kernels of
    kernels/csrc, built on first use, the torch references where a kernel has no C++
    version) or `torch` (references)."""

    def __init__(self, backend: str) -> None:
        # Imported here, not at module top: the kernel modules read TRITON_INTERPRET when
        # first imported, and the engine decides the backend only once it knows the device.
        from kernels import (
            activation,
            linear_attention,
            mla_decode_attention,
            paged_decode_attention,
            prefill_attention,
            rmsnorm,
            rope,
            selective_scan,
            store_kv,
        )

        if backend not in BACKENDS:
            raise ValueError(f"Ops: backend must be one of {BACKENDS}, got {backend!r}")
        tri = backend == "triton"
        self.name = backend
        self.store_kv = store_kv.store_kv if tri else store_kv.store_kv_ref
        self.decode_attention = (paged_decode_attention.paged_decode_attention if tri
                                 else paged_decode_attention.paged_decode_attention_ref)
        self.prefill_attention = (prefill_attention.prefill_attention if tri
                                  else prefill_attention.prefill_attention_ref)
        self.mla_decode_attention = (mla_decode_attention.mla_decode_attention if tri
                                     else mla_decode_attention.mla_decode_attention_ref)
        self.rmsnorm = rmsnorm.rmsnorm if tri else rmsnorm.rmsnorm_ref
        self.rope = rope.rope if tri else rope.rope_ref
        self.silu_and_mul = activation.silu_and_mul if tri else activation.silu_and_mul_ref
        if backend == "cpu":
            from kernels.cpu_ops import load

            load()  # CpuKernelsUnavailable says why not; the engine falls back before this
            # The C++ kernels of kernels/csrc; MLA decode, linear attention and the
            # selective scan keep their torch references.
            self.store_kv = store_kv.store_kv_cpu
            self.decode_attention = paged_decode_attention.paged_decode_attention_cpu
            self.prefill_attention = prefill_attention.prefill_attention_cpu
            self.rmsnorm = rmsnorm.rmsnorm_cpu
            self.rope = rope.rope_cpu
            self.silu_and_mul = activation.silu_and_mul_cpu
        self.linear_attention_decode = (linear_attention.linear_attention_decode if tri
                                        else linear_attention.linear_attention_decode_ref)
        self.selective_state_update = (selective_scan.selective_state_update if tri
                                       else selective_scan.selective_state_update_ref)
