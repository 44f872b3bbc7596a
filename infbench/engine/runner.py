"""ModelRunner: turns a SchedulerOutput into tensors, runs the model, samples.

Selective batching (Orca): every token scheduled this step, from every sequence,
is flattened into one (T,) batch for the dense layers; attention runs per
sequence over its own paged cache.  Sequences are ordered decode-first so the
first `num_decode` rows of every (T, ...) tensor are one-token decodes served by
the paged decode kernel and the rest are prompt chunks served by the varlen
prefill kernel (which reads earlier context, and prefix-cache hits, from the
cache).  A model with several KV groups (engine/kv_groups.py) gets a slot mapping
and block tables per group; each layer reads those of its group.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np
import torch

from infbench.core.config import LayerSpec
from infbench.engine.cuda_graphs import DecodeGraphs
from infbench.engine.kv_cache import KVCache, StatePool
from infbench.engine.sampler import Sampler
from infbench.engine.scheduler import ScheduledSeq, SchedulerOutput
from infbench.engine.sequence import BlockTable, table_array
from infbench.model.context import LanguageModel, LayerState
from infbench.model.ops import Ops


def _padded(tables: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """(B, max_blocks) int64 of the tables' raw block ids, right-padded with 0; lengths."""
    lengths = [t.shape[0] for t in tables]
    out = np.zeros((len(tables), max(lengths, default=1) or 1), dtype=np.int64)
    for b, (table, n) in enumerate(zip(tables, lengths, strict=True)):
        out[b, :n] = table
    return out, lengths


def _table_tensor(padded: np.ndarray, lengths: list[int], first: int,
                  device: torch.device) -> torch.Tensor:
    """(len(lengths), their max) int32 from rows first.. of `padded`.

    Released (-1) and padding entries point at block 0; no rows gives shape (0,).
    """
    if not lengths:
        return torch.zeros(0, dtype=torch.int32, device=device)
    width = max(lengths) or 1
    rows = np.maximum(padded[first:first + len(lengths), :width], 0).astype(np.int32)
    return torch.from_numpy(rows).to(device)


@dataclass
class StepInputs:
    """The flattened batch of one step (T tokens over B sequences, decodes first)."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    slot_mapping: torch.Tensor  # (T,) int64
    num_decode: int  # the first num_decode tokens are single-token decodes
    decode_tables: torch.Tensor  # (num_decode, max_blocks) int32
    decode_context_lens: torch.Tensor  # (num_decode,) int32
    prefill_cu_seqlens: torch.Tensor  # (num_prefill_seqs + 1,) int32, offsets into the prefill part
    prefill_tables: torch.Tensor  # (num_prefill_seqs, max_blocks) int32
    prefill_context_lens: torch.Tensor  # (num_prefill_seqs,) int32, total length incl. new tokens
    logits_rows: list[int]  # rows of the (T, H) hidden state that need logits
    sampled_seqs: list[ScheduledSeq]  # one per logits row
    # Per-sequence layout over all T tokens (decodes first), for recurrent mixers.
    seq_cu_seqlens: torch.Tensor  # (B + 1,) int64
    seq_start_pos: torch.Tensor  # (B,) int64: 0 means the state starts from zero
    state_slots: torch.Tensor  # (B,) int64 (-1 when the model has no recurrent state)
    # KV groups 1.. (group 0 is the fields above): (slot_mapping, decode_tables, prefill_tables)
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)


class PagedAttentionContext:
    """AttentionContext over the paged cache for one step (see model/context.py)."""

    def __init__(self, kv: KVCache, ops: Ops, inputs: StepInputs,
                 states: StatePool | None = None) -> None:
        self.kv = kv
        self.ops = ops
        self.inputs = inputs
        self.states = states

    def paged(self, layer: LayerSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(slot_mapping, decode_tables, prefill_tables) of the layer's KV group."""
        inp = self.inputs
        group = self.kv.layer_group.get(layer.kv_source, 0)
        if group == 0:
            return inp.slot_mapping, inp.decode_tables, inp.prefill_tables
        return inp.groups[group - 1]

    def state(self, layer: LayerSpec) -> LayerState:
        """The recurrent state of a linear-attention or SSM layer for this step."""
        assert self.states is not None, "model has recurrent layers but no state pool"
        inp = self.inputs
        return LayerState(self.states.layer(layer.index), inp.state_slots, inp.seq_cu_seqlens,
                          inp.seq_start_pos, inp.num_decode)

    @property
    def num_decode(self) -> int:
        """The first num_decode rows of the step are single-token decodes."""
        return self.inputs.num_decode

    def store_latent(self, layer: LayerSpec, latent: torch.Tensor) -> torch.Tensor:
        """Write latent (N, Dl + Dr), the step's first N rows, into the layer's latent cache.

        Returns the cache, (num_blocks, block_size, 1, Dl + Dr).
        """
        slot_mapping = self.paged(layer)[0][: latent.shape[0]]  # (N,)
        cache = self.kv.latent(layer)  # (num_blocks, block_size, 1, Dl + Dr)
        flat = cache.view(-1, cache.shape[-1])  # (slots, Dl + Dr)
        flat.index_copy_(0, slot_mapping, latent.to(cache.dtype))
        return cache

    def mla_prefill_latents(
        self, layer: LayerSpec, latent: torch.Tensor
    ) -> list[tuple[torch.Tensor, int]]:
        """Store the step's latent rows (T, Dl + Dr); gather each prefill sequence's context.

        Returns (latent (context_len_b, Dl + Dr), q_len_b) per prefill sequence, the
        latent in the cache's dtype: its earlier cached rows (prefix hits, earlier
        chunks), then this chunk's q_len_b rows.
        """
        inp = self.inputs
        cache = self.store_latent(layer, latent)  # (num_blocks, block_size, 1, Dl + Dr)
        prefill_tables = self.paged(layer)[2]  # (num_prefill_seqs, max_blocks) int32
        block_size = cache.shape[1]
        cu = inp.prefill_cu_seqlens.tolist()
        out = []
        for b, length in enumerate(inp.prefill_context_lens.tolist()):
            num_blocks = -(-length // block_size)
            # Whole blocks are contiguous: index_select copies them at memcpy speed.
            blocks = cache.index_select(0, prefill_tables[b, :num_blocks].long())
            rows = blocks.view(-1, cache.shape[-1])[:length]  # (L_b, Dl + Dr)
            out.append((rows, cu[b + 1] - cu[b]))
        return out

    def mla_attention(self, layer: LayerSpec, q: torch.Tensor, latent: torch.Tensor,
                      scale: float) -> torch.Tensor:
        """MLA with absorbed weights: multi-query attention over the latent cache.

        q: (T, H, kv_lora_rank + rope_dim), queries already projected into the latent
        space and concatenated with their RoPE part; latent: (T, kv_lora_rank +
        rope_dim), this step's compressed KV with the decoupled RoPE key.  Keys are the
        whole latent row, values its first kv_lora_rank dims (the same bytes: MLA reads
        576 values per token, not 2 x heads x head_dim).  Returns (T, H, kv_lora_rank).
        q and latent may also be just the step's first num_decode rows (the decodes), when
        the model runs its prefill rows through `mla_prefill_latents`.
        """
        inp = self.inputs
        slot_mapping, decode_tables, prefill_tables = self.paged(layer)
        cache = self.store_latent(layer, latent)  # (num_blocks, block_size, 1, Dl + Dr)
        rank = self.kv.cfg.attention.kv_lora_rank
        values = cache[..., :rank]  # a strided view: no second copy of the latent
        nd = inp.num_decode
        parts = []
        if nd:
            parts.append(self.ops.mla_decode_attention(
                q[:nd], cache, values, decode_tables, inp.decode_context_lens, scale))
        if nd < q.shape[0]:
            parts.append(self.ops.prefill_attention(
                q[nd:], cache, values, inp.prefill_cu_seqlens, inp.prefill_context_lens,
                prefill_tables, scale, layer.window))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def attention(self, layer: LayerSpec, q: torch.Tensor, k: torch.Tensor | None,
                  v: torch.Tensor | None, scale: float) -> torch.Tensor:
        inp = self.inputs
        slot_mapping, decode_tables, prefill_tables = self.paged(layer)
        k_cache, v_cache = self.kv.layer(layer)
        if k is not None and v is not None:  # CLA non-owners reuse their group's cache
            self.ops.store_kv(k, v, k_cache, v_cache, slot_mapping)
        nd = inp.num_decode
        if nd == q.shape[0]:
            return self.ops.decode_attention(  # type: ignore[no-any-return]
                q, k_cache, v_cache, decode_tables, inp.decode_context_lens, scale,
                layer.window)
        if nd == 0:
            return self.ops.prefill_attention(  # type: ignore[no-any-return]
                q, k_cache, v_cache, inp.prefill_cu_seqlens, inp.prefill_context_lens,
                prefill_tables, scale, layer.window)
        out = torch.empty(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype,
                          device=q.device)  # (T, Hq, Dv)
        out[:nd] = self.ops.decode_attention(
            q[:nd], k_cache, v_cache, decode_tables, inp.decode_context_lens, scale,
            layer.window)
        out[nd:] = self.ops.prefill_attention(
            q[nd:], k_cache, v_cache, inp.prefill_cu_seqlens, inp.prefill_context_lens,
            prefill_tables, scale, layer.window)
        return out


class ModelRunner:
    """Owns the step's tensors; the model and the KV pool are shared across runs."""

    def __init__(self, model: LanguageModel, kv: KVCache, ops: Ops, device: torch.device,
                 seed: int = 0, states: StatePool | None = None) -> None:
        self.model = model
        self.kv = kv
        self.states = states
        self.graphs: DecodeGraphs | None = None  # set by the engine when cuda_graphs is on
        self.ops = ops
        self.device = device
        self.seed = seed
        self.sampler = Sampler(seed)

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        """The step's tensors, in O(B) Python plus vectorized numpy (no per-token loops).

        Block tables come from each BlockTable's incremental array copy, and slot mapping
        and positions are computed from them with numpy, so a decode step costs a few
        microseconds per sequence whatever its context length.
        """
        bs = self.kv.block_size
        order = sorted(out.scheduled, key=lambda s: s.is_prefill)  # stable: decodes first
        num_seqs = len(order)
        seqs = [s.seq for s in order]
        start_list = [s.start_pos for s in order]
        len_list = [s.num_new_tokens for s in order]
        ids: list[int] = []
        for seq, start, n in zip(seqs, start_list, len_list, strict=True):
            if n == 1:  # one token, read in place: no token_ids list needed
                num_prompt = len(seq.prompt_ids)
                ids.append(seq.prompt_ids[start] if start < num_prompt
                           else seq.output_ids[start - num_prompt])
            else:
                ids.extend(seq.token_ids[start:start + n])
        num_decode = sum(1 for s in order if not s.is_prefill)
        sampled = [s for s in order if s.num_samples > 0]
        starts = np.array(start_list, dtype=np.int64)
        lens = np.array(len_list, dtype=np.int64)
        state_slots = np.array([seq.state_slot for seq in seqs], dtype=np.int64)
        # Per group, per sequence: the block table as an array (incremental for a BlockTable).
        tables = [[t.as_array() if type(t) is BlockTable else table_array(t)
                   for t in [seq.block_table for seq in seqs]]]
        tables += [[table_array(seq.group_tables[g]) for seq in seqs]
                   for g in range(1, len(self.kv.group_num_blocks))]
        ends = starts + lens  # context length of each sequence after this step
        seq_cu = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(lens, out=seq_cu[1:])
        num_tokens = int(seq_cu[-1])
        # The last token of each sampled sequence needs logits.
        ends_of_seq = list(accumulate(len_list))
        logits_rows = [ends_of_seq[b] - 1 for b, s in enumerate(order) if s.num_samples > 0]
        if num_tokens == num_seqs:  # every sequence computes one token (decodes)
            positions, token_seq = starts.copy(), np.arange(num_seqs)
        else:
            token_seq = np.repeat(np.arange(num_seqs), lens)  # (T,) sequence of each token
            positions = np.arange(num_tokens) + np.repeat(starts - seq_cu[:-1], lens)
        block_col, block_off = np.divmod(positions, bs)
        nd = num_decode
        dev = self.device

        def i32(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(x.astype(np.int32)).to(dev)

        def i64(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(dev)

        # Per group: the slot of every token, and the decode and prefill block tables.
        paged: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for group_tables in tables:
            padded, lengths = _padded(group_tables)  # (B, max_blocks) int64, raw ids (-1 kept)
            slots = padded[token_seq, block_col] * bs + block_off  # (T,)
            paged.append((i64(slots), _table_tensor(padded, lengths[:nd], 0, dev),
                          _table_tensor(padded, lengths[nd:], nd, dev)))
        pre_cu = np.zeros(num_seqs - nd + 1, dtype=np.int64)
        np.cumsum(lens[nd:], out=pre_cu[1:])
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.long, device=dev),
            positions=i64(positions),
            slot_mapping=paged[0][0],
            num_decode=num_decode,
            decode_tables=paged[0][1],
            decode_context_lens=i32(ends[:nd]),
            prefill_cu_seqlens=i32(pre_cu),
            prefill_tables=paged[0][2],
            prefill_context_lens=i32(ends[nd:]),
            logits_rows=logits_rows,
            sampled_seqs=sampled,
            seq_cu_seqlens=i64(seq_cu),
            seq_start_pos=i64(starts),
            state_slots=i64(state_slots),
            groups=paged[1:],
        )

    def graph_context(self, buf: dict[str, torch.Tensor]) -> PagedAttentionContext:
        """The attention context of a captured decode graph, over its static buffers."""
        empty = torch.zeros(0, dtype=torch.int32, device=self.device)
        size = buf["input_ids"].shape[0]
        inputs = StepInputs(
            input_ids=buf["input_ids"], positions=buf["positions"],
            slot_mapping=buf["slot_mapping"], num_decode=size, decode_tables=buf["tables"],
            decode_context_lens=buf["context_lens"],
            prefill_cu_seqlens=torch.zeros(1, dtype=torch.int32, device=self.device),
            prefill_tables=empty.view(0, 1), prefill_context_lens=empty, logits_rows=[],
            sampled_seqs=[], seq_cu_seqlens=empty.long(), seq_start_pos=empty.long(),
            state_slots=empty.long())
        return PagedAttentionContext(self.kv, self.ops, inputs, self.states)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[int, list[int]]:
        """Run one step; returns the sampled tokens per sequence id."""
        self.kv.copy_blocks(out.block_copies)
        inputs = self.prepare(out)
        if not inputs.logits_rows:  # only partial prefill chunks: no token to sample
            self.model(inputs.input_ids, inputs.positions,
                       PagedAttentionContext(self.kv, self.ops, inputs, self.states))
            return {}
        logits = None
        is_plain_decode = (inputs.num_decode == len(inputs.sampled_seqs) == len(out.scheduled)
                           and all(s.num_samples == 1 for s in inputs.sampled_seqs))
        if self.graphs is not None and is_plain_decode:
            logits = self.graphs.run(inputs.input_ids, inputs.positions, inputs.slot_mapping,
                                     inputs.decode_tables, inputs.decode_context_lens)
        if logits is None:
            ctx = PagedAttentionContext(self.kv, self.ops, inputs, self.states)
            hidden = self.model(inputs.input_ids, inputs.positions, ctx)  # (T, H)
            rows = torch.tensor(inputs.logits_rows, dtype=torch.long, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, rows))  # (N, V) float32
        seqs = [s.seq for s in inputs.sampled_seqs]
        tokens = self.sampler.sample(
            logits,
            [q.sampling for q in seqs],
            [(q.request_id, q.sample_index) for q in seqs],
            [s.num_samples for s in inputs.sampled_seqs],
            [self.sample_seed(q.request_id, q.sampling.seed) for q in seqs],
        )
        return {q.seq_id: t for q, t in zip(seqs, tokens, strict=True)}

    def sample_seed(self, request_id: str, seed: int | None) -> int:
        if seed is not None:
            return seed
        return (zlib.crc32(request_id.encode()) ^ (self.seed * 0x9E3779B1)) & 0x7FFFFFFF
