"""What one kernel call costs: FLOPs and bytes moved to and from memory.

Every kernel family exports a `<name>_cost(...)` function returning a `KernelCost`
for one call; roofline accounting and the kernel benchmark divide these by measured
time to report achieved FLOP/s and bandwidth.  Bytes count the compulsory traffic
(each input read once, each output written once), as a roofline does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelCost:
    """FLOPs and bytes of one kernel call (multiply and add count as two FLOPs)."""

    flops: float
    bytes: float

    def __post_init__(self) -> None:
        if self.flops < 0 or self.bytes < 0:
            raise ValueError(f"KernelCost must be non-negative, got {self}")

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte (inf for a kernel that moves nothing)."""
        return self.flops / self.bytes if self.bytes else float("inf")

    def __add__(self, other: KernelCost) -> KernelCost:
        return KernelCost(self.flops + other.flops, self.bytes + other.bytes)
