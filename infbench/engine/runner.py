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

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from infbench.core.config import LayerSpec
from infbench.engine.cuda_graphs import DecodeGraphs
from infbench.engine.input_batch import TableRows
from infbench.engine.kv_cache import KVCache, StatePool
from infbench.engine.sampler import Sampler, argmax_rows, filtered_probs
from infbench.engine.scheduler import ScheduledSeq, SchedulerOutput
from infbench.engine.verify import verify_greedy, verify_sampled
from infbench.model.context import LanguageModel, LayerState
from infbench.model.ops import Ops
from infbench.model.softcap import paged_softcapped_attention


@dataclass
class StepInputs:
    """The flattened batch of one step (T tokens over B sequences, decodes first)."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    slot_mapping: torch.Tensor  # (T,) int64
    num_decode: int  # the first num_decode tokens are decode rows (one token each, over
    # its context up to its own position; a verification has 1 + k of them)
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
    # Logits rows per sampled sequence, when a speculative verification (1 + k rows) is in
    # the step; empty: one row each.
    logits_counts: list[int] = field(default_factory=list)
    order: list[ScheduledSeq] = field(default_factory=list)  # the B sequences, decodes first
    num_decode_seqs: int = 0  # sequences served by the decode rows (0: one row each)


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
    def num_decode_seqs(self) -> int:
        """Sequences the decode rows belong to (fewer than the rows in a speculative step)."""
        return self.inputs.num_decode_seqs or self.inputs.num_decode

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

    def decode_layer_args(self, layer: LayerSpec) -> tuple[torch.Tensor, ...] | None:
        """(k_cache, v_cache, slot_mapping, decode_tables, decode_context_lens) of `layer` for
        a fused decode layer (model/fused_decode.py) when every token of this step is a
        single-token decode and the layer's cache is unquantized; None otherwise."""
        inp = self.inputs
        if inp.num_decode != inp.input_ids.shape[0] or self.kv.scales(layer)[0] is not None:
            return None
        slot_mapping, decode_tables, _ = self.paged(layer)
        k_cache, v_cache = self.kv.layer(layer)
        return k_cache, v_cache, slot_mapping, decode_tables, inp.decode_context_lens

    def attention(self, layer: LayerSpec, q: torch.Tensor, k: torch.Tensor | None,
                  v: torch.Tensor | None, scale: float,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        """The step's attention: decode rows, then prefill rows.  `sinks` (gpt-oss) go to
        the kernels of every backend (the C++ ones run their torch reference for it)."""
        inp = self.inputs
        slot_mapping, decode_tables, prefill_tables = self.paged(layer)
        k_cache, v_cache = self.kv.layer(layer)
        # A quantized cache (model.quant.kv) has its scales beside it; else (None, None).
        k_scales, v_scales = self.kv.scales(layer)
        if k is not None and v is not None:  # CLA non-owners reuse their group's cache
            self.ops.store_kv(k, v, k_cache, v_cache, slot_mapping, k_scales, v_scales)
        nd = inp.num_decode
        if layer.softcap is not None:  # no kernel caps scores: model/softcap.py, any backend
            assert layer.chunk is None, "soft-capped chunked attention is refused at build"
            return self._softcapped(layer, q, k_cache, v_cache, k_scales, v_scales, scale)
        # Llama-4's chunk masks like the window (the cpu backend's C++ kernels have no chunk
        # mask: a chunked layer runs their torch references, kernels/*_attention_cpu).
        chunk = layer.chunk
        if nd == q.shape[0]:
            return self.ops.decode_attention(  # type: ignore[no-any-return]
                q, k_cache, v_cache, decode_tables, inp.decode_context_lens, scale,
                layer.window, k_scales=k_scales, v_scales=v_scales, chunk=chunk,
                sinks=sinks)
        if nd == 0:
            return self.ops.prefill_attention(  # type: ignore[no-any-return]
                q, k_cache, v_cache, inp.prefill_cu_seqlens, inp.prefill_context_lens,
                prefill_tables, scale, layer.window, k_scales=k_scales, v_scales=v_scales,
                chunk=chunk, sinks=sinks)
        out = torch.empty(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype,
                          device=q.device)  # (T, Hq, Dv)
        out[:nd] = self.ops.decode_attention(
            q[:nd], k_cache, v_cache, decode_tables, inp.decode_context_lens, scale,
            layer.window, k_scales=k_scales, v_scales=v_scales, chunk=chunk, sinks=sinks)
        out[nd:] = self.ops.prefill_attention(
            q[nd:], k_cache, v_cache, inp.prefill_cu_seqlens, inp.prefill_context_lens,
            prefill_tables, scale, layer.window, k_scales=k_scales, v_scales=v_scales,
            chunk=chunk, sinks=sinks)
        return out


    def _softcapped(self, layer: LayerSpec, q: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, k_scales: torch.Tensor | None,
                    v_scales: torch.Tensor | None, scale: float) -> torch.Tensor:
        """Soft-capped attention (Gemma-2) of the step: decode rows, then prefill rows."""
        assert layer.softcap is not None
        inp = self.inputs
        _, decode_tables, prefill_tables = self.paged(layer)
        nd = inp.num_decode
        parts = []
        if nd:  # each decode row: one query over its own context
            parts.append(paged_softcapped_attention(
                q[:nd], k_cache, v_cache, list(range(nd + 1)),
                inp.decode_context_lens.tolist(), decode_tables, scale, layer.window,
                layer.softcap, k_scales, v_scales))
        if nd < q.shape[0]:
            parts.append(paged_softcapped_attention(
                q[nd:], k_cache, v_cache, inp.prefill_cu_seqlens.tolist(),
                inp.prefill_context_lens.tolist(), prefill_tables, scale, layer.window,
                layer.softcap, k_scales, v_scales))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass(slots=True)
class _StepLayout:
    """Where each scheduled sequence's tokens sit in the step's flat (T,) batch (host side).

    Decodes first, in scheduled order (the stable partition sorted(key=is_prefill) gives),
    then the prefill chunks.  A speculative verification (a decode plus its k drafts) runs
    as k + 1 decode rows of its sequence, row i attending over the context up to its own
    position: the same kernels, in the same order, as k + 1 plain decode steps, so greedy
    speculation emits exactly the tokens plain decoding would (in bf16 as well).
    """

    decodes: list[ScheduledSeq]  # served by decode rows: plain decodes, then verifications
    prefills: list[ScheduledSeq]
    order: list[ScheduledSeq]  # (B,) decodes + prefills
    has_specs: bool  # a verification is in the step
    ids: list[int]  # (T,) the token computed at each row
    starts: np.ndarray  # (B,) int64 first position computed
    lens: np.ndarray  # (B,) int64 tokens computed
    seq_cu: np.ndarray  # (B + 1,) int64 offsets of each sequence's tokens
    positions: np.ndarray  # (T,) int64
    token_seq: np.ndarray | None  # (T,) sequence of each token; None: one token each
    decode_seq: np.ndarray | None  # (num_decode_rows,) sequence of each decode row; None: one each

    @property
    def num_decode_seqs(self) -> int:
        return len(self.decodes)

    @property
    def num_decode_rows(self) -> int:
        return int(self.seq_cu[len(self.decodes)])


def _step_token_ids(decodes: list[ScheduledSeq], prefills: list[ScheduledSeq],
                    has_specs: bool) -> list[int]:
    """(T,) token ids: each decode's last sampled token (and its drafts), then the chunks."""
    # A decode computes the token it sampled last step: output_ids[-1], read in place.
    if not has_specs:
        ids = [s.seq.output_ids[-1] for s in decodes]
    else:
        ids = []
        for s in decodes:
            ids.append(s.seq.output_ids[-1])
            if s.spec_tokens:
                ids.extend(s.spec_tokens)
    for s in prefills:
        seq, start, n = s.seq, s.start_pos, s.num_new_tokens
        if n == 1:  # one token, read in place: no token_ids list needed
            num_prompt = len(seq.prompt_ids)
            ids.append(seq.prompt_ids[start] if start < num_prompt
                       else seq.output_ids[start - num_prompt])
        else:
            ids.extend(seq.token_ids[start:start + n])
    return ids


def _step_layout(out: SchedulerOutput) -> _StepLayout:
    """The step's order, token ids, lengths, offsets and positions (numpy, no tensors)."""
    decodes = [s for s in out.scheduled if not s.is_prefill and not s.spec_tokens]
    specs = [s for s in out.scheduled if s.spec_tokens]
    prefills = [s for s in out.scheduled if s.is_prefill]
    if specs:
        decodes += specs  # plain decodes, then verifications: all served by decode rows
    order = decodes + prefills if prefills else decodes
    nd, num_seqs = len(decodes), len(order)  # nd: sequences served by decode rows
    ids = _step_token_ids(decodes, prefills, bool(specs))
    starts = np.array([s.start_pos for s in order], dtype=np.int64)
    # Decodes compute one token each; only verifications and prefill chunks need
    # their lengths read.
    lens = np.ones(num_seqs, dtype=np.int64)
    if specs:
        lens[:nd] = [s.num_new_tokens for s in decodes]
    if prefills:
        lens[nd:] = [s.num_new_tokens for s in prefills]
    seq_cu = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(lens, out=seq_cu[1:])
    num_tokens = int(seq_cu[-1])
    if num_tokens == num_seqs:  # every sequence computes one token
        positions, token_seq = starts, None
    else:
        token_seq = np.repeat(np.arange(num_seqs), lens)  # (T,) sequence of each token
        positions = np.arange(num_tokens) + np.repeat(starts - seq_cu[:-1], lens)
    # The sequence of each decode row (a verification has several).
    decode_seq = None if not specs or token_seq is None else token_seq[:int(seq_cu[nd])]
    return _StepLayout(decodes, prefills, order, bool(specs), ids, starts, lens, seq_cu,
                       positions, token_seq, decode_seq)


def _logits_rows(lay: _StepLayout) -> tuple[list[int], list[int], list[ScheduledSeq]]:
    """(rows that need logits, logits rows per sampled sequence, the sampled sequences).

    Every decode's one token, every row of a verification, and the last token of each
    prefill chunk that completes its sequence; the counts only with a verification.
    """
    nd = lay.num_decode_seqs
    sampled = lay.decodes + [s for s in lay.prefills if s.num_samples > 0]
    logits_rows = list(range(lay.num_decode_rows))
    logits_counts = lay.lens[:nd].tolist() if lay.has_specs else []
    if lay.prefills:
        done = [int(lay.seq_cu[nd + b + 1]) - 1 for b, s in enumerate(lay.prefills)
                if s.num_samples > 0]
        logits_rows += done
        if lay.has_specs:
            logits_counts += [1] * len(done)
    return logits_rows, logits_counts, sampled


def _i32(x: np.ndarray, dev: torch.device) -> torch.Tensor:
    return torch.from_numpy(x.astype(np.int32)).to(dev)


def _i64(x: np.ndarray, dev: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(dev)


def _table_tensor(rows: np.ndarray, lengths: np.ndarray, array: np.ndarray,
                  dev: torch.device) -> torch.Tensor:
    """(len(rows), their widest table) int32; no rows gives shape (0,)."""
    if not len(rows):
        return torch.zeros(0, dtype=torch.int32, device=dev)
    return torch.from_numpy(array[rows, : int(lengths.max()) or 1]).to(dev)


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
        # Speculative decoding: a proposer's `observe` when it drafts from hidden states,
        # and (drafts, accepted) per verification of the last step.
        self.feature_sink: Callable[[int, int, int, torch.Tensor], None] | None = None
        self.verified: list[tuple[int, int]] = []
        self.table_rows: list[TableRows] = []  # the persistent batch's block tables

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        """The step's tensors, in O(B) Python plus vectorized numpy (no per-token loops).

        Per-sequence Python is a handful of list comprehensions over attributes: a step at
        batch 256 has ~1 us per sequence for all of the host loop, so no per-sequence
        function call or numpy call is affordable (a few calls per step are).  Block
        tables come from the persistent rows (`TableRows`, written only where a table
        changed), and positions, slot mapping and padded tables are numpy gathers over
        them, so a decode step costs the same whatever the context length.
        """
        lay = _step_layout(out)
        nd, dev = lay.num_decode_seqs, self.device
        logits_rows, logits_counts, sampled = _logits_rows(lay)
        paged = self._paged_tables(lay)
        pre_cu = lay.seq_cu[nd:] - lay.seq_cu[nd]  # (num_prefill_seqs + 1,) prefill offsets
        # Without a state pool every sequence's state_slot is -1: no need to read them.
        state_slots = (np.full(len(lay.order), -1, dtype=np.int64) if self.states is None
                       else np.array([s.seq.state_slot for s in lay.order], dtype=np.int64))
        ends = lay.starts + lay.lens  # context length of each sequence after this step
        # A decode row's context: up to and including its own position.
        decode_lens = (ends[:nd] if lay.decode_seq is None
                       else lay.positions[:lay.num_decode_rows] + 1)
        return StepInputs(
            input_ids=torch.from_numpy(np.array(lay.ids, dtype=np.int64)).to(dev),
            positions=_i64(lay.positions, dev),
            slot_mapping=paged[0][0],
            num_decode=lay.num_decode_rows,
            decode_tables=paged[0][1],
            decode_context_lens=_i32(decode_lens, dev),
            prefill_cu_seqlens=_i32(pre_cu, dev),
            prefill_tables=paged[0][2],
            prefill_context_lens=_i32(ends[nd:], dev),
            logits_rows=logits_rows,
            sampled_seqs=sampled,
            logits_counts=logits_counts,
            order=lay.order,
            num_decode_seqs=nd,
            seq_cu_seqlens=_i64(lay.seq_cu, dev),
            seq_start_pos=_i64(lay.starts, dev),
            state_slots=_i64(state_slots, dev),
            groups=paged[1:],
        )

    def _paged_tables(self, lay: _StepLayout
                      ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per KV group: the slot of every token, and the decode and prefill block tables."""
        bs, dev, nd = self.kv.block_size, self.device, lay.num_decode_seqs
        block_col, block_off = np.divmod(lay.positions, bs)
        seqs = [s.seq for s in lay.order]
        seq_ids = [seq.seq_id for seq in seqs]
        paged: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for g, table_rows in enumerate(self._table_rows()):
            group_tables = ([seq.block_table for seq in seqs] if g == 0
                            else [seq.group_tables[g] for seq in seqs])
            rows, lengths = table_rows.gather(seq_ids, group_tables)
            array = table_rows.array  # (rows, max_blocks) int32
            token_rows = rows if lay.token_seq is None else rows[lay.token_seq]  # (T,)
            slots = array[token_rows, block_col].astype(np.int64) * bs + block_off  # (T,)
            dec_rows, dec_lengths = ((rows[:nd], lengths[:nd]) if lay.decode_seq is None
                                     else (rows[lay.decode_seq], lengths[lay.decode_seq]))
            paged.append((torch.from_numpy(slots).to(dev),
                          _table_tensor(dec_rows, dec_lengths, array, dev),
                          _table_tensor(rows[nd:], lengths[nd:], array, dev)))
        return paged

    def _table_rows(self) -> list[TableRows]:
        """The persistent block-table rows, one `TableRows` per KV group (made on first use)."""
        if not self.table_rows:
            self.table_rows = [TableRows() for _ in self.kv.group_num_blocks]
        return self.table_rows

    def release(self, seq_id: int) -> None:
        """A sequence left the batch (finished): hand its block-table rows back."""
        for table_rows in self.table_rows:
            table_rows.release(seq_id)

    def reset(self) -> None:
        """A new run: fresh sampler streams, no persistent rows (sequence ids restart)."""
        self.sampler = type(self.sampler)(self.seed)
        for table_rows in self.table_rows:
            table_rows.clear()

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
        """Run one step; returns the sampled tokens per sequence id (a verified
        speculative step: the accepted drafts and the token after them)."""
        self.kv.copy_blocks(out.block_copies)
        inputs = self.prepare(out)
        self.verified = []
        sink = self.feature_sink
        if not inputs.logits_rows:  # only partial prefill chunks: no token to sample
            hidden = self.model(inputs.input_ids, inputs.positions,
                                PagedAttentionContext(self.kv, self.ops, inputs, self.states))
            if sink is not None:
                self._observe(inputs, hidden, {})
            return {}
        logits = None
        full_hidden = None
        sampled = inputs.sampled_seqs
        if self.graphs is not None and sink is None and (
                inputs.num_decode == len(sampled) == len(out.scheduled)
                and all(s.num_samples == 1 for s in sampled)):  # a plain decode step
            logits = self.graphs.run(inputs.input_ids, inputs.positions, inputs.slot_mapping,
                                     inputs.decode_tables, inputs.decode_context_lens)
        if logits is None:
            ctx = PagedAttentionContext(self.kv, self.ops, inputs, self.states)
            hidden = full_hidden = self.model(inputs.input_ids, inputs.positions, ctx)  # (T, H)
            if len(inputs.logits_rows) < hidden.shape[0]:
                rows = torch.from_numpy(np.array(inputs.logits_rows, dtype=np.int64))
                hidden = hidden.index_select(0, rows.to(self.device))
            # else every row needs logits (a decode step): no gather of all T rows
            logits = self.model.compute_logits(hidden)  # (N, V) float32
        if inputs.logits_counts:  # speculative verifications in this step
            result = self._verify(logits, inputs)
        else:
            result = self._sample(logits, inputs)
        if sink is not None and full_hidden is not None:
            self._observe(inputs, full_hidden, result)
        return result

    def _sample(self, logits: torch.Tensor, inputs: StepInputs) -> dict[int, list[int]]:
        """One row of logits per sampled sequence."""
        sampled = inputs.sampled_seqs
        seqs = [s.seq for s in sampled]
        params = [q.sampling for q in seqs]
        if inputs.num_decode == len(sampled) and not any([p.temperature for p in params]):
            # Only decodes (one sample each), all greedy: the argmax is the whole sampler,
            # and no per-sequence key, seed or generator is looked at.
            return {q.seq_id: [t] for q, t in zip(seqs, self.sampler.greedy(logits),
                                                  strict=True)}
        tokens = self.sampler.sample(
            logits,
            params,
            [(q.request_id, q.sample_index) for q in seqs],
            [s.num_samples for s in sampled],
            [self.sample_seed(q.request_id, p.seed) for q, p in zip(seqs, params, strict=True)],
        )
        return {q.seq_id: t for q, t in zip(seqs, tokens, strict=True)}

    def _verify(self, logits: torch.Tensor, inputs: StepInputs) -> dict[int, list[int]]:
        """Sample the plain rows and verify the drafts of the speculative ones
        (engine/verify.py); `verified` gets (drafts, accepted) per verification."""
        result: dict[int, list[int]] = {}
        seqs = [s.seq for s in inputs.sampled_seqs]
        greedy = (argmax_rows(logits) if any(q.sampling.is_greedy for q in seqs) else [])
        offset = 0
        for item, count in zip(inputs.sampled_seqs, inputs.logits_counts, strict=True):
            seq, params = item.seq, item.seq.sampling
            rows = range(offset, offset + count)
            offset += count
            key = (seq.request_id, seq.sample_index)
            seed = self.sample_seed(seq.request_id, params.seed) + seq.sample_index
            if not item.spec_tokens:
                if params.is_greedy:
                    result[seq.seq_id] = [greedy[rows[0]]] * item.num_samples
                else:
                    result[seq.seq_id] = self.sampler.sample(
                        logits[rows[0]:rows[0] + 1], [params], [key], [item.num_samples],
                        [seed - seq.sample_index])[0]
                continue
            drafts = item.spec_tokens
            if params.is_greedy:
                tokens = verify_greedy(greedy[rows[0]:rows[-1] + 1], drafts)
            else:
                p = torch.stack([filtered_probs(logits[r].float(), params) for r in rows]).cpu()
                tokens = verify_sampled(p, drafts, item.spec_probs,
                                        self.sampler.generator(key, seed))
            self.verified.append((len(drafts), len(tokens) - 1))
            result[seq.seq_id] = tokens
        return result

    def _observe(self, inputs: StepInputs, hidden: torch.Tensor,
                 result: dict[int, list[int]]) -> None:
        """Hand a proposer that drafts from hidden states the rows whose KV is now valid."""
        sink = self.feature_sink
        assert sink is not None
        cu = inputs.seq_cu_seqlens.tolist()
        for b, item in enumerate(inputs.order):
            seq = item.seq
            count = cu[b + 1] - cu[b]
            if item.spec_tokens:
                count = len(result[seq.seq_id])  # the input token and the accepted drafts
            sink(seq.seq_id, seq.num_preemptions, item.start_pos, hidden[cu[b]:cu[b] + count])

    def sample_seed(self, request_id: str, seed: int | None) -> int:
        """The request's seed, or one derived from the run seed and the request id."""
        if seed is not None:
            return seed
        return (_request_hash(request_id) ^ (self.seed * 0x9E3779B1)) & 0x7FFFFFFF


@functools.lru_cache(maxsize=4096)
def _request_hash(request_id: str) -> int:
    """crc32 of a request id: computed once per request, not once per sequence per step."""
    return zlib.crc32(request_id.encode())
