"""The paged KV cache pool: one (K, V) tensor pair per layer that owns a KV cache.

Layout per layer (the kernels' contract, vLLM's "flash" layout):
    k: (num_blocks, block_size, num_kv_heads, head_dim)
    v: (num_blocks, block_size, num_kv_heads, v_head_dim)
A CLA layer that does not own its KV reads the cache of `LayerSpec.kv_source`;
linear-attention and SSM layers hold no blocks at all.  A model whose layers mix
windows has one pool per KV group (engine/kv_groups.py): each group's layers get
that group's num_blocks.

A quantized cache (`model.quant.kv: int8 | fp8`, the format of `kernels/kv_quant.py`)
keeps this layout with one-byte values and adds one float32 scale per token per KV
head beside each pool:
    k_scale, v_scale: (num_blocks, block_size, num_kv_heads)
Only softmax-attention layers (MHA/GQA/MQA, sliding, CLA) quantize; MLA's latent cache
is refused (`kv_quant_refusal`), and linear-attention / SSM state stays in the model
dtype.

The bytes per token this pool allocates are computed from the tensors themselves
(`bytes_per_token`), so tests can check them against the analytic model exactly.
"""

from __future__ import annotations

import math

import torch

from infbench.core.config import EngineConfig, LayerSpec, ModelConfig
from infbench.core.device import available_memory_bytes
from infbench.core.errors import DoesNotFitError
from infbench.engine.kv_groups import layer_groups
from infbench.model.dtypes import TORCH_DTYPES  # noqa: F401  (the engine reads it here)
from kernels.kv_quant import KV_QUANT_DTYPES, SCALE_DTYPE


def kv_value_dtype(kv_quant: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype of cached K/V values: the model's (kv_quant none), int8 or float8_e4m3fn."""
    if kv_quant != "none" and kv_quant not in KV_QUANT_DTYPES:
        raise ValueError(f"kv_quant must be none or one of {tuple(KV_QUANT_DTYPES)}, "
                         f"got {kv_quant!r}")
    return KV_QUANT_DTYPES.get(kv_quant, dtype)


def kv_quant_refusal(kv_quant: str, device: torch.device,
                     cfg: ModelConfig | None = None) -> str | None:
    """Why this device or model cannot run a quantized KV cache, or None when it can.

    int8 runs everywhere (the C++ CPU kernels, Triton, the torch reference).  fp8 (e4m3)
    runs on CUDA GPUs of compute capability 8.9 or later (Ada, Hopper), where Triton
    converts e4m3 natively.  Only softmax-attention caches quantize: MLA's latent cache
    would need its own absorbed-attention kernels, and linear-attention / SSM models hold
    no KV cache at all (their state stays in the model dtype).
    """
    if kv_quant == "none":
        return None
    if kv_quant == "fp8":
        if device.type != "cuda":
            return (f"fp8 (e4m3) KV runs on CUDA GPUs only, not on {device.type}; "
                    "allowed here: none, int8")
        if torch.cuda.get_device_capability(device) < (8, 9):
            name = torch.cuda.get_device_name(device)
            return (f"fp8 (e4m3) KV needs a GPU of compute capability 8.9+ (Ada, Hopper); "
                    f"{name} has not; allowed here: none, int8")
    if cfg is None:
        return None
    specs = cfg.layers()
    if any(spec.mixer == "mla" for spec in specs):
        return (f"model {cfg.name!r} keeps an MLA latent cache, which the engine does not "
                "quantize; allowed for MLA models: none")
    if not any(spec.has_kv_cache for spec in specs):
        return (f"model {cfg.name!r} has no softmax-attention KV cache to quantize (its "
                "linear-attention / SSM state stays in the model dtype); allowed: none")
    return None


def cache_entries(cfg: ModelConfig, spec: LayerSpec, kv_quant: str = "none"
                  ) -> list[tuple[str, tuple[int, ...], bool]]:
    """Per-token cache entries of one KV-owning layer: (name, shape per token, is_scale).

    Attention stores K and V per KV head; MLA stores one latent row per token: the
    compressed KV (kv_lora_rank) followed by the decoupled RoPE key (qk_rope_head_dim),
    shared by all heads (DeepSeek-V2).  Values are the latent's first kv_lora_rank dims.
    A quantized attention cache adds a scale per KV head beside K and beside V.
    """
    if spec.mixer == "mla":
        a = cfg.attention
        return [("kv", (1, a.kv_lora_rank + a.qk_rope_head_dim), False)]
    entries: list[tuple[str, tuple[int, ...], bool]] = [
        ("k", (cfg.kv_heads, cfg.dim_head), False), ("v", (cfg.kv_heads, cfg.dim_head), False)]
    if kv_quant != "none":
        entries += [("k_scale", (cfg.kv_heads,), True), ("v_scale", (cfg.kv_heads,), True)]
    return entries


def kv_bytes_per_token_for(cfg: ModelConfig, element_size: int, group: int | None = None,
                           kv_quant: str = "none") -> int:
    """Bytes per token the pool will allocate (tests check it against the tensors).

    `element_size`: bytes of a cached value (1 when quantized); scales add
    SCALE_DTYPE's bytes per row.  With `group`, only the layers of that KV group
    (engine/kv_groups.py).
    """
    groups = layer_groups(cfg) if group is not None else {}
    scale_size = SCALE_DTYPE.itemsize
    total = 0
    for spec in cfg.layers():
        if spec.has_kv_cache and groups.get(spec.index, group) == group:
            for _name, shape, is_scale in cache_entries(cfg, spec, kv_quant):
                total += math.prod(shape) * (scale_size if is_scale else element_size)
    return total


class KVCache:
    """Owns the KV tensors of every cache-owning layer; plain block ids index them.

    `num_blocks` is one count, or a list with one count per KV group; then
    `num_blocks` is their sum and `layer_group` maps an owning layer to its group.
    `kv_quant` (int8 | fp8) stores one-byte values with their scales beside them.
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int | list[int], block_size: int,
                 dtype: torch.dtype, device: torch.device, kv_quant: str = "none") -> None:
        self.cfg = cfg
        self.kv_quant = kv_quant
        value_dtype = kv_value_dtype(kv_quant, dtype)
        self.group_num_blocks = [num_blocks] if isinstance(num_blocks, int) else list(num_blocks)
        self.num_blocks = sum(self.group_num_blocks)
        self.block_size = block_size
        self.layers: tuple[LayerSpec, ...] = cfg.layers()
        self.layer_group = layer_groups(cfg) if len(self.group_num_blocks) > 1 else {}
        # layer index -> {entry name: (num_blocks of its group, block_size, heads, dim)}
        self._cache: dict[int, dict[str, torch.Tensor]] = {}
        for spec in self.layers:
            if spec.has_kv_cache:
                n = self.group_num_blocks[self.layer_group.get(spec.index, 0)]
                self._cache[spec.index] = {
                    name: torch.zeros(n, block_size, *shape, device=device,
                                      dtype=SCALE_DTYPE if is_scale else value_dtype)
                    for name, shape, is_scale in cache_entries(cfg, spec, kv_quant)
                }

    def layer(self, spec: LayerSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The (K, V) cache that `spec` reads (its own, or its CLA group owner's)."""
        entry = self._cache[spec.kv_source]
        return entry["k"], entry["v"]

    def scales(self, spec: LayerSpec) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The (K, V) scales, (num_blocks, block_size, Hkv) float32, beside the cache that
        `spec` reads; (None, None) for a cache in the model dtype."""
        entry = self._cache[spec.kv_source]
        return entry.get("k_scale"), entry.get("v_scale")

    def latent(self, spec: LayerSpec) -> torch.Tensor:
        """MLA: the (num_blocks, block_size, 1, kv_lora_rank + rope_dim) latent cache."""
        return self._cache[spec.kv_source]["kv"]

    def tensors(self, group: int | None = None) -> list[torch.Tensor]:
        """Every KV tensor, or those of one KV group."""
        return [t for index, entry in self._cache.items()
                if group is None or self.layer_group.get(index, 0) == group
                for t in entry.values()]

    def group_bytes_per_token(self, group: int) -> int:
        """Bytes of one token slot of a KV group, read off its tensors."""
        return sum(t[0, 0].numel() * t.element_size() for t in self.tensors(group))

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies across all layers, read off the allocated tensors."""
        return sum(t[0, 0].numel() * t.element_size() for t in self.tensors())

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (src -> dst) in every layer."""
        tensors = self.tensors()
        if not copies or not tensors:
            return
        if len(self.group_num_blocks) > 1:  # ids offset per group (GroupedBlockManager)
            start = 0
            for g, n in enumerate(self.group_num_blocks):
                pairs = [(s - start, d - start) for s, d in copies if start <= s < start + n]
                start += n
                self._copy(self.tensors(g), pairs)
            return
        self._copy(tensors, copies)

    @staticmethod
    def _copy(tensors: list[torch.Tensor], copies: list[tuple[int, int]]) -> None:
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


def kv_budget_bytes(engine: EngineConfig, device: torch.device) -> int:
    """The KV byte budget: engine.kv_cache_memory as bytes (> 1) or as a memory fraction."""
    if engine.kv_cache_memory > 1:
        return int(engine.kv_cache_memory)
    return int(engine.kv_cache_memory * available_memory_bytes(device))


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
    budget = kv_budget_bytes(engine, device)
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
