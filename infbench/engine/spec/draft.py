"""A draft model as proposer: a separate model, the target's first N layers, or a
quantized copy of the target (engine/spec/build.py picks which).

The draft keeps its own paged KV cache with as many blocks as the target's pool and writes
the same slots: a sequence's block table (the target's) addresses both caches, so the
draft needs no block manager of its own, and the scheduler's allotment of 1 + k slots per
speculating sequence covers the draft's k - 1 speculative positions too.  Per sequence the
proposer remembers how many leading positions its cache holds for the sequence's current
tokens; after verification only positions before the step's last emitted token are
settled (accepted drafts are the tokens the draft itself fed), so the next proposal
resumes from there: usually one token (the target's correction), two when all k drafts
were accepted, the whole prompt for a new sequence or after a preemption (`epoch`).

Each proposal is one forward over the catch-up chunks of all sequences (as decode rows when
they are short, the usual one or two tokens: the fused decode path on the cpu backend; the
varlen prefill path for a prompt), then k - 1 batched one-token decode steps.  Greedy
requests draft by argmax (q one-hot); sampled requests draw from the draft's distribution
under the request's temperature / top-k / top-p, with a generator per sequence, and return
that q for the rejection rule.
"""

from __future__ import annotations

import numpy as np
import torch

from infbench.core.config import ModelConfig
from infbench.engine.kv_cache import KVCache
from infbench.engine.runner import PagedAttentionContext, StepInputs
from infbench.engine.sampler import argmax_rows, filtered_probs
from infbench.engine.spec.base import Proposal, Proposer, SpecRequest
from infbench.model.context import LanguageModel
from infbench.model.ops import Ops

# Catch-up chunks up to this long run as decode rows (the fused decode path on the cpu
# backend); longer ones (a new sequence's prompt) as varlen prefill chunks.
MAX_DECODE_ROW_CHUNK = 4


def paged_inputs(chunks: list[tuple[list[int], int, list[int]]], block_size: int,
                 device: torch.device) -> StepInputs:
    """StepInputs for chunks of (token ids, first position, block table).  Short chunks
    (every one at most MAX_DECODE_ROW_CHUNK tokens: the usual catch-up of one or two
    tokens, and the one-token draft steps) run as decode rows, row i of a chunk attending
    up to its own position; otherwise all chunks are varlen prefill chunks.  Logits rows:
    the last token of each chunk."""
    lens = np.array([len(ids) for ids, _, _ in chunks], dtype=np.int64)
    starts = np.array([start for _, start, _ in chunks], dtype=np.int64)
    cu = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    positions = np.arange(int(cu[-1])) + np.repeat(starts - cu[:-1], lens)
    width = max(len(t) for _, _, t in chunks)
    tables = np.zeros((len(chunks), width), dtype=np.int32)
    for b, (_, _, table) in enumerate(chunks):
        tables[b, :len(table)] = table
    token_seq = np.repeat(np.arange(len(chunks)), lens)
    slots = tables[token_seq, positions // block_size].astype(np.int64) * block_size \
        + positions % block_size
    ends = (starts + lens).astype(np.int32)
    ids = [t for chunk, _, _ in chunks for t in chunk]

    def dev(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x)).to(device)

    empty = torch.zeros(0, dtype=torch.int32, device=device)
    decode = int(lens.max()) <= MAX_DECODE_ROW_CHUNK
    rows = len(ids)
    return StepInputs(
        input_ids=dev(np.array(ids, dtype=np.int64)), positions=dev(positions.astype(np.int64)),
        slot_mapping=dev(slots), num_decode=rows if decode else 0,
        decode_tables=dev(tables[token_seq]) if decode else empty,
        decode_context_lens=dev((positions + 1).astype(np.int32)) if decode else empty,
        prefill_cu_seqlens=dev(np.zeros(1, np.int32) if decode else cu.astype(np.int32)),
        prefill_tables=empty.view(0, 1) if decode else dev(tables),
        prefill_context_lens=empty if decode else dev(ends),
        logits_rows=(cu[1:] - 1).tolist(), sampled_seqs=[],
        num_decode_seqs=len(chunks) if decode else 0,
        seq_cu_seqlens=dev(cu), seq_start_pos=dev(starts),
        state_slots=dev(np.full(len(chunks), -1, dtype=np.int64)))


class DraftModelProposer(Proposer):
    name = "draft"

    def __init__(self, model: LanguageModel, cfg: ModelConfig, num_blocks: int,
                 block_size: int, dtype: torch.dtype, device: torch.device, ops: Ops,
                 seed: int = 0, label: str = "draft") -> None:
        self.model = model
        self.cfg = cfg
        self.kv = KVCache(cfg, num_blocks, block_size, dtype, device)
        self.ops = ops
        self.device = device
        self.seed = seed
        self.label = label
        self._written: dict[int, tuple[int, int]] = {}  # seq_id -> (epoch, positions held)
        self._generators: dict[int, torch.Generator] = {}

    @property
    def cache_bytes(self) -> int:
        return self.kv.total_bytes

    def reset(self) -> None:
        self._written.clear()
        self._generators.clear()

    def release(self, seq_id: int) -> None:
        self._written.pop(seq_id, None)
        self._generators.pop(seq_id, None)

    def _generator(self, r: SpecRequest) -> torch.Generator:
        gen = self._generators.get(r.seq_id)
        if gen is None:
            seed = r.sampling.seed if r.sampling.seed is not None else self.seed
            gen = torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + r.seq_id) ^ 0x5EED)
            self._generators[r.seq_id] = gen
        return gen

    def _forward(self, chunks: list[tuple[list[int], int, list[int]]]) -> torch.Tensor:
        """Logits (len(chunks), V) float32 after each chunk's last token."""
        inputs = paged_inputs(chunks, self.kv.block_size, self.device)
        ctx = PagedAttentionContext(self.kv, self.ops, inputs)
        hidden = self.model(inputs.input_ids, inputs.positions, ctx)
        rows = torch.tensor(inputs.logits_rows, dtype=torch.int64, device=hidden.device)
        if len(inputs.logits_rows) < hidden.shape[0]:
            hidden = hidden.index_select(0, rows)
        return self.model.compute_logits(hidden).float().cpu()

    def _choose(self, logits: torch.Tensor, reqs: list[SpecRequest]
                ) -> list[tuple[int, torch.Tensor | None]]:
        """A draft token per row, with the distribution it was drawn from (None: argmax)."""
        greedy = argmax_rows(logits) if any(r.sampling.is_greedy for r in reqs) else []
        out: list[tuple[int, torch.Tensor | None]] = []
        for i, r in enumerate(reqs):
            if r.sampling.is_greedy:
                out.append((greedy[i], None))
                continue
            q = filtered_probs(logits[i], r.sampling)
            out.append((int(torch.multinomial(q, 1, generator=self._generator(r))), q))
        return out

    @torch.inference_mode()
    def propose(self, requests: list[SpecRequest]) -> list[Proposal]:
        proposals = [Proposal([]) for _ in requests]
        active = [i for i, r in enumerate(requests) if r.num_drafts > 0]
        if not active:
            return proposals
        chunks = []
        for i in active:
            r = requests[i]
            epoch, held = self._written.get(r.seq_id, (r.epoch, 0))
            start = min(held if epoch == r.epoch else 0, len(r.token_ids) - 1)
            chunks.append((r.token_ids[start:], start, r.block_table))
        probs: dict[int, list[torch.Tensor | None]] = {i: [] for i in active}
        logits = self._forward(chunks)
        step = 0
        while True:
            reqs = [requests[i] for i in active]
            for i, (token, q) in zip(active, self._choose(logits, reqs), strict=True):
                proposals[i].tokens.append(token)
                probs[i].append(q)
            step += 1
            active = [i for i in active if requests[i].num_drafts > step]
            if not active:
                break
            # Draft token `step` goes in at position len(token_ids) - 1 + step.
            logits = self._forward([
                ([proposals[i].tokens[-1]], len(requests[i].token_ids) - 1 + step,
                 requests[i].block_table) for i in active])
        for i, r in enumerate(requests):
            n = len(proposals[i].tokens)
            if n:
                # Positions 0 .. len - 2 + n hold this proposal's tokens (the last draft is
                # never fed back).
                self._written[r.seq_id] = (r.epoch, len(r.token_ids) - 1 + n)
                qs = probs[i]
                if any(q is not None for q in qs):
                    proposals[i].probs = torch.stack([
                        q if q is not None else _one_hot(t, logits.shape[-1])
                        for q, t in zip(qs, proposals[i].tokens, strict=True)])
        return proposals


def _one_hot(token: int, vocab: int) -> torch.Tensor:
    row = torch.zeros(vocab, dtype=torch.float32)
    row[token] = 1.0
    return row
