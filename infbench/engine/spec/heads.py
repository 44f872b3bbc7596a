"""Medusa and EAGLE proposers: greedy drafts from heads on the target's hidden states.

Both set `needs_features`: the runner hands every sequence's final-normed hidden states
to `observe` as the target computes them, and each proposer keeps them per sequence
(`_Features`, keyed by seq_id and voided when the epoch changes).  A later `observe` of
positions already held overwrites them and drops everything after them (a re-send
follows a rollback, so what came after it is stale); `propose` also drops features of
positions >= L-1, which the target cannot have computed yet.

When `propose` sees a sequence of L tokens it holds f_0..f_{L-2}; token_ids[L-1] is this
step's first input.  Drafts are the tokens at positions L, L+1, ...:

- `MedusaProposer`: head j on f_{L-2} drafts position L-1+j, all heads in one batched
  LM-head product (`MedusaHeads.draft`); at most K drafts.
- `EagleProposer`: the head's cache holds one entry per real row j (f_j, x_{j+1}); a
  step first catches up on the rows that became real since the last one (batched over
  the sequences), then drafts autoregressively on copies of the caches
  (`EagleHead.draft`), so no entry built from a draft stays.  Entries are dropped when
  the features they were built from are re-sent or their token no longer matches.

Drafts are argmax tokens (`Proposal.probs` None: verification treats them as one-hot).
"""

from __future__ import annotations

import os
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from infbench.core.errors import UserError
from infbench.engine.spec.base import Proposal, Proposer, SpecRequest
from infbench.model.draft_heads import EagleHead, EagleKV, MedusaHeads
from infbench.model.draft_train import DraftHeads, load_draft_heads
from infbench.model.mtp import MTPCache, MTPHead
from infbench.model.transformer import Transformer


class _Features:
    """One sequence's target features by position: rows[0:count] are f_0..f_{count-1}."""

    def __init__(self) -> None:
        self.rows: torch.Tensor | None = None  # (capacity, H)
        self.count = 0
        self.first_rewritten: int | None = None  # lowest position re-sent since `clean`

    def write(self, start: int, hidden: torch.Tensor) -> None:
        if start > self.count:
            raise ValueError(f"features of positions {self.count}..{start - 1} were never "
                             f"observed (got positions from {start})")
        end = start + hidden.shape[0]
        if start < self.count:
            low = start if self.first_rewritten is None else min(self.first_rewritten, start)
            self.first_rewritten = low
        if self.rows is None or self.rows.shape[0] < end:
            capacity = max(64, 1 << (end - 1).bit_length())
            grown = hidden.new_empty(capacity, hidden.shape[1])  # (capacity, H)
            if self.rows is not None:
                grown[:start] = self.rows[:start]
            self.rows = grown
        self.rows[start:end] = hidden
        self.count = end  # positions after a re-sent range are stale

    def span(self, start: int, end: int) -> torch.Tensor:
        """f_start..f_{end-1} (end - start, H)."""
        assert self.rows is not None and end <= self.count
        return self.rows[start:end]

    def truncate(self, count: int) -> None:
        self.count = min(self.count, count)

    def clean(self) -> None:
        self.first_rewritten = None


@dataclass
class _Seq:
    epoch: int
    features: _Features = field(default_factory=_Features)
    kv: EagleKV | MTPCache | None = None  # EAGLE / MTP: entries j from (f_j, x_{j+1})
    kv_tokens: list[int] = field(default_factory=list)  # x_{j+1} of every entry
    last_g: torch.Tensor | None = None  # (H,) the output of the last entry


class _HeadProposer(Proposer):
    """Per-sequence feature bookkeeping shared by the head proposers."""

    needs_features = True

    def __init__(self, target: Transformer) -> None:
        self.target = target
        self._seqs: dict[int, _Seq] = {}

    def _seq(self, seq_id: int, epoch: int) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None or seq.epoch != epoch:  # new, or preempted and recomputed
            seq = self._seqs[seq_id] = _Seq(epoch)
        return seq

    def _ready(self, request: SpecRequest) -> _Seq | None:
        """The sequence's state when it can draft now: drafts wanted and f_0..f_{L-2} held."""
        seq = self._seq(request.seq_id, request.epoch)
        length = len(request.token_ids)
        seq.features.truncate(length - 1)
        if request.num_drafts <= 0 or length < 2 or seq.features.count < length - 1:
            return None
        return seq

    def propose(self, requests: list[SpecRequest]) -> list[Proposal]:
        proposals = [Proposal([]) for _ in requests]
        with torch.inference_mode():
            ready = [(i, seq) for i, r in enumerate(requests)
                     if (seq := self._ready(r)) is not None]
            if ready:
                for (i, _), tokens in zip(ready, self._draft(requests, ready), strict=True):
                    proposals[i] = Proposal(tokens)
        return proposals

    @abstractmethod
    def _draft(self, requests: list[SpecRequest], ready: list[tuple[int, _Seq]]
               ) -> list[list[int]]:
        """The drafts of the ready sequences (request index, state), in order."""

    def observe(self, seq_id: int, epoch: int, start_pos: int, hidden: torch.Tensor) -> None:
        with torch.inference_mode():
            self._seq(seq_id, epoch).features.write(start_pos, hidden)

    def release(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def reset(self) -> None:
        self._seqs.clear()


class MedusaProposer(_HeadProposer):
    name = "medusa"

    def __init__(self, target: Transformer, heads: MedusaHeads) -> None:
        super().__init__(target)
        self.heads = heads

    def _draft(self, requests: list[SpecRequest], ready: list[tuple[int, _Seq]]
               ) -> list[list[int]]:
        counts = [min(requests[i].num_drafts, self.heads.num_heads) for i, _ in ready]
        last = torch.cat([seq.features.span(len(requests[i].token_ids) - 2,
                                            len(requests[i].token_ids) - 1)
                          for i, seq in ready])  # (B, H): f_{L-2}
        drafts = self.heads.draft(self.target, last, max(counts)).tolist()  # (B, k)
        return [[int(t) for t in row[:count]] for row, count in zip(drafts, counts, strict=True)]


class _DraftLayer(Protocol):
    """What EagleProposer needs of its draft layer (EagleHead, MTPHead): per-sequence
    immutable caches, extended by rows, and the greedy draft loop."""

    def empty_cache(self) -> Any: ...

    def extend(self, features: torch.Tensor, embeds: torch.Tensor, counts: list[int],
               caches: list[Any]) -> tuple[torch.Tensor, list[Any]]: ...

    def draft(self, target: Transformer, last_g: torch.Tensor, caches: list[Any],
              num_drafts: list[int]) -> list[list[int]]: ...


class EagleProposer(_HeadProposer):
    name = "eagle"

    def __init__(self, target: Transformer, head: EagleHead | MTPHead) -> None:
        super().__init__(target)
        self.head: _DraftLayer = head

    def _valid_entries(self, seq: _Seq, token_ids: list[int]) -> int:
        """How many cache entries still match the features and tokens (then truncated)."""
        assert seq.kv is not None
        length = len(token_ids)
        valid = min(seq.kv.length, length - 1)
        if seq.features.first_rewritten is not None:
            valid = min(valid, seq.features.first_rewritten)
        if seq.kv_tokens[:valid] != token_ids[1:valid + 1]:
            valid = next(j for j in range(valid) if seq.kv_tokens[j] != token_ids[j + 1])
        if valid < seq.kv.length:
            seq.kv, seq.kv_tokens, seq.last_g = seq.kv.truncate(valid), seq.kv_tokens[:valid], None
        if seq.last_g is None and valid == length - 1:  # recompute the last row for its g
            valid -= 1
            seq.kv, seq.kv_tokens = seq.kv.truncate(valid), seq.kv_tokens[:valid]
        seq.features.clean()
        return valid

    def _draft(self, requests: list[SpecRequest], ready: list[tuple[int, _Seq]]
               ) -> list[list[int]]:
        features, tokens, counts, behind = [], [], [], []
        for i, seq in ready:
            ids = requests[i].token_ids
            if seq.kv is None:
                seq.kv = self.head.empty_cache()
            valid = self._valid_entries(seq, ids)
            if valid < len(ids) - 1:  # rows j = valid..L-2 became real
                features.append(seq.features.span(valid, len(ids) - 1))
                tokens += ids[valid + 1:]
                counts.append(len(ids) - 1 - valid)
                behind.append(seq)
        if behind:
            self._catch_up(behind, features, tokens, counts)
        last_g = torch.stack([_last_g(seq) for _, seq in ready])  # (B, H)
        return self.head.draft(self.target, last_g, [_kv(seq) for _, seq in ready],
                               [requests[i].num_drafts for i, _ in ready])

    def _catch_up(self, seqs: list[_Seq], features: list[torch.Tensor], tokens: list[int],
                  counts: list[int]) -> None:
        """Build the real entries of every sequence behind, in one batched extend."""
        ids = torch.tensor(tokens, dtype=torch.long,
                           device=self.target.device)  # (T,)
        g, caches = self.head.extend(torch.cat(features), self.target.embed_tokens(ids),
                                     counts, [_kv(seq) for seq in seqs])
        end = 0
        for seq, cache, n in zip(seqs, caches, counts, strict=True):
            seq.kv_tokens += tokens[end:end + n]
            end += n
            seq.kv, seq.last_g = cache, g[end - 1]


class MTPProposer(EagleProposer):
    """DeepSeek-V3's MTP module as the draft layer (`model/mtp.py`): EAGLE's bookkeeping
    (rows from real features kept, rows from drafts dropped), the checkpoint's own weights."""

    name = "mtp"


def _kv(seq: _Seq) -> Any:
    assert seq.kv is not None
    return seq.kv


def _last_g(seq: _Seq) -> torch.Tensor:
    assert seq.last_g is not None
    return seq.last_g


HEAD_PROPOSERS = {"medusa": MedusaProposer, "eagle": EagleProposer}


def head_proposer(target: Transformer, heads: DraftHeads) -> MedusaProposer | EagleProposer:
    """The proposer of trained heads."""
    if isinstance(heads, MedusaHeads):
        return MedusaProposer(target, heads)
    return EagleProposer(target, heads)


def load_head_proposer(method: str, path: str | os.PathLike[str], target: Transformer
                       ) -> MedusaProposer | EagleProposer:
    """The `method` proposer of a draft-head file (`infbench train-draft`) for `target`; a
    file of another method, or made for another model, is a one-line UserError."""
    if method not in HEAD_PROPOSERS:
        raise UserError(f"speculative.method={method!r} has no draft heads; allowed: "
                        f"{', '.join(HEAD_PROPOSERS)}")
    heads = load_draft_heads(path, target)
    found = "medusa" if isinstance(heads, MedusaHeads) else "eagle"
    if found != method:
        raise UserError(f"{path}: holds {found} heads, not {method} ones; train them with "
                        f"`infbench train-draft --method {method}`")
    return head_proposer(target, heads)
