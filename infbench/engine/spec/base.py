"""What a speculative-decoding proposer is: the interface every draft source implements.

The engine (engine/engine.py) asks the proposer for drafts at the start of each step,
after the scheduler has given every speculating sequence room for 1 + k tokens, and the
target verifies them in the same step (engine/verify.py).  A proposer sees each
sequence as a `SpecRequest` and answers with a `Proposal` per request:

- `tokens`: up to `num_drafts` draft tokens that follow `token_ids` (fewer, even none, is
  allowed: an n-gram proposer that finds no match proposes nothing and the step decodes
  one token as usual).
- `probs`: the draft distribution q each token was drawn from, (len(tokens), V) float32,
  when the proposer sampled them (a draft model under temperature > 0); None when the
  tokens were chosen deterministically (argmax, lookup), which verification treats as a
  one-hot q.  Either way verification keeps the target's distribution exactly.

Proposers that need the target's hidden states (Medusa and EAGLE heads) set
`needs_features`; the runner then calls `observe` after every target forward with the
final-normed hidden states (the LM head's input) of the positions whose KV became valid,
in order.  `epoch` changes when a sequence is preempted (its KV is gone and is
recomputed from position 0): per-sequence state kept by a proposer is void then.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from infbench.engine.request import SamplingParams


@dataclass
class SpecRequest:
    """One speculating sequence at the start of a step."""

    seq_id: int
    token_ids: list[int]  # prompt + generated tokens; the last one is this step's first input
    num_drafts: int  # propose at most this many (k, capped by max_tokens and the context)
    sampling: SamplingParams
    block_table: list[int]  # the target's KV blocks (a draft model writes the same slots)
    epoch: int  # +1 on every preemption of the sequence


@dataclass
class Proposal:
    tokens: list[int]
    probs: torch.Tensor | None = None  # (len(tokens), V) float32 q, or None: one-hot q


class Proposer(ABC):
    """A draft source: a model, a slice of the target, heads on its hidden states, a lookup."""

    name: str = ""
    needs_features: bool = False

    @abstractmethod
    def propose(self, requests: list[SpecRequest]) -> list[Proposal]:
        """One Proposal per request, in order."""

    def observe(self, seq_id: int, epoch: int, start_pos: int, hidden: torch.Tensor) -> None:  # noqa: B027
        """Hidden states (n, H) of positions [start_pos, start_pos + n) of a sequence, from
        the target forward that made their KV valid.  Called only with needs_features."""

    def release(self, seq_id: int) -> None:  # noqa: B027
        """The sequence finished: drop whatever is kept for it."""

    def reset(self) -> None:  # noqa: B027
        """A new run (sequence ids restart)."""

    def cost_ratio_hint(self) -> float | None:
        """The draft's cost per proposed token relative to one target step, when it is known
        without measuring (n-gram lookup: 0); None: measured by the engine."""
        return None
