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


def cache_entries(cfg: ModelConfig, spec: LayerSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Per-token cache entries of one KV-owning layer: (name, shape per token).

    Attention stores K and V per KV head; MLA stores one latent row per token: the
    compressed KV (kv_lora_rank) followed by the decoupled RoPE key (qk_rope_head_dim),
    shared by all heads (DeepSeek-V2).  Values are the latent's first kv_lora_rank dims.
    """
    if spec.mixer == "mla":
        a = cfg.attention
        return [("kv", (1, a.kv_lora_rank + a.qk_rope_head_dim))]
    return [("k", (cfg.kv_heads, cfg.dim_head)), ("v", (cfg.kv_heads, cfg.dim_head))]


def kv_bytes_per_token_for(cfg: ModelConfig, element_size: int) -> int:
    """Bytes per token the pool will allocate (tests check it against the tensors)."""
    total = 0
    for spec in cfg.layers():
        if spec.has_kv_cache:
            for _name, shape in cache_entries(cfg, spec):
                total += math.prod(shape) * element_size
    return total


class KVCache:
    """Owns the KV tensors of every cache-owning layer; plain block ids index them."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.cfg = cfg
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layers: tuple[LayerSpec, ...] = cfg.layers()
        # layer index -> {entry name: (num_blocks, block_size, heads, dim)}
        self._cache: dict[int, dict[str, torch.Tensor]] = {}
        for spec in self.layers:
            if spec.has_kv_cache:
                self._cache[spec.index] = {
                    name: torch.zeros(num_blocks, block_size, *shape, dtype=dtype, device=device)
                    for name, shape in cache_entries(cfg, spec)
                }

    def layer(self, spec: LayerSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The (K, V) cache that `spec` reads (its own, or its CLA group owner's)."""
        entry = self._cache[spec.kv_source]
        return entry["k"], entry["v"]

    def latent(self, spec: LayerSpec) -> torch.Tensor:
        """MLA: the (num_blocks, block_size, 1, kv_lora_rank + rope_dim) latent cache."""
        return self._cache[spec.kv_source]["kv"]

    def tensors(self) -> list[torch.Tensor]:
        return [t for entry in self._cache.values() for t in entry.values()]

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
        tensors = self.tensors()
        if not copies or not tensors:
            return
        device = tensors[0].device
        src = torch.tensor([s for s, _ in copies], dtype=torch.long, device=device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long, device=device)
        for t in tensors:
            t[dst] = t[src]


class StatePool:
    """Constant per-sequence state of linear-attention and SSM layers, one slot per sequence.

    Shapes come from `roofline.shapes.layer_state_entries`, the same source the
    analytic model prices, so the measured state bytes equal the predicted ones.
    """

    def __init__(self, cfg: ModelConfig, num_slots: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        from infbench.roofline.shapes import layer_state_entries

        self.num_slots = num_slots
        # layer index -> {name: (num_slots, *shape)}
        self._state: dict[int, dict[str, torch.Tensor]] = {}
        for spec in cfg.layers():
            entries = layer_state_entries(cfg, spec)
            if entries:
                self._state[spec.index] = {
                    name: torch.zeros(num_slots, *shape, dtype=dtype, device=device)
                    for name, shape in entries
                }

    def layer(self, index: int) -> dict[str, torch.Tensor]:
        return self._state[index]

    def tensors(self) -> list[torch.Tensor]:
        return [t for entry in self._state.values() for t in entry.values()]

    @property
    def bytes_per_seq(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.tensors())

    def copy_slots(self, copies: list[tuple[int, int]]) -> None:
        """A forked sample continues from its parent's state."""
        for src, dst in copies:
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
    if bytes_per_token == 0:
        # Constant-state schemes only: blocks hold no tensors, but the block manager
        # still counts a sequence's positions in them, so give every sequence room.
        tokens = max_tokens_needed or cfg.max_seq_len * engine.max_num_seqs
        return math.ceil(max(tokens, min_tokens) / bs) + 1, budget
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
