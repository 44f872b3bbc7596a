"""The paged KV cache pool: one (K, V) tensor pair per layer that owns a KV cache.

Layout per layer (the kernels' contract, vLLM's "flash" layout):
    k: (num_blocks, block_size, num_kv_heads, head_dim)
    v: (num_blocks, block_size, num_kv_heads, v_head_dim)
A CLA layer that does not own its KV reads the cache of `LayerSpec.kv_source`;
linear-attention and SSM layers hold no blocks at all.

The bytes per token this pool allocates are computed from the tensors themselves
(`bytes_per_token`), so tests can check them against the analytic model exactly.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from infbench.config import EngineConfig, LayerSpec, ModelConfig
from infbench.errors import DoesNotFitError

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def available_memory_bytes(device: torch.device) -> int:
    """Memory the process could still take: free device memory, or MemAvailable on CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


@dataclass(frozen=True)
class CacheLayout:
    """Shapes of one layer's cache entries (per token)."""

    num_kv_heads: int
    head_dim: int
    v_head_dim: int


def cache_layout(cfg: ModelConfig) -> CacheLayout:
    return CacheLayout(cfg.kv_heads, cfg.dim_head, cfg.dim_head)


class KVCache:
    """Owns the KV tensors of every cache-owning layer; plain block ids index them."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.cfg = cfg
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout = cache_layout(cfg)
        self.layers: tuple[LayerSpec, ...] = cfg.layers()
        lay = self.layout
        self._k: dict[int, torch.Tensor] = {}
        self._v: dict[int, torch.Tensor] = {}
        for spec in self.layers:
            if spec.has_kv_cache:
                # (num_blocks, block_size, num_kv_heads, head_dim)
                self._k[spec.index] = torch.zeros(
                    num_blocks, block_size, lay.num_kv_heads, lay.head_dim,
                    dtype=dtype, device=device)
                self._v[spec.index] = torch.zeros(
                    num_blocks, block_size, lay.num_kv_heads, lay.v_head_dim,
                    dtype=dtype, device=device)

    def layer(self, spec: LayerSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The (K, V) cache that `spec` reads (its own, or its CLA group owner's)."""
        return self._k[spec.kv_source], self._v[spec.kv_source]

    def tensors(self) -> list[torch.Tensor]:
        return [*self._k.values(), *self._v.values()]

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies across all layers, read off the allocated tensors."""
        slots = self.num_blocks * self.block_size
        return sum(t.numel() // slots * t.element_size() for t in self.tensors())

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (src -> dst) in every layer."""
        if not copies:
            return
        device = next(iter(self._k.values())).device if self._k else None
        src = torch.tensor([s for s, _ in copies], dtype=torch.long, device=device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long, device=device)
        for t in self.tensors():
            t[dst] = t[src]


def plan_num_blocks(cfg: ModelConfig, engine: EngineConfig, bytes_per_token: int,
                    weight_bytes: int, device: torch.device, max_tokens_needed: int | None,
                    min_tokens: int) -> tuple[int, int]:
    """How many blocks the KV budget buys; returns (num_blocks, budget_bytes).

    `engine.kv_cache_memory` > 1 is a byte budget; otherwise a fraction of the memory
    still available after the weights were loaded (vLLM's gpu_memory_utilization is a
    fraction of the total; ours is of what is left, which also behaves on a shared CPU).
    `max_tokens_needed` caps the pool at what the workload can ever use, so a CPU run
    does not reserve tens of GB for a 16-request benchmark.
    """
    if engine.kv_cache_memory > 1:
        budget = int(engine.kv_cache_memory)
    else:
        budget = int(engine.kv_cache_memory * available_memory_bytes(device))
    bs = engine.block_size
    if bytes_per_token == 0:  # constant-state schemes only: blocks are not used
        return 1, budget
    block_bytes = bytes_per_token * bs
    num_blocks = budget // block_bytes
    if max_tokens_needed is not None:
        num_blocks = min(num_blocks, math.ceil(max_tokens_needed / bs) + 1)
    need = math.ceil(min_tokens / bs)
    if num_blocks < need:
        raise DoesNotFitError(
            f"model {cfg.name!r}: weights ({weight_bytes / 1e9:.2f} GB) plus the KV cache of one "
            f"sequence of {min_tokens} tokens ({need * block_bytes / 1e9:.3f} GB) do not fit the "
            f"KV budget engine.kv_cache_memory={engine.kv_cache_memory} "
            f"({budget / 1e9:.3f} GB); lower the lengths or raise the budget"
        )
    return int(num_blocks), budget
