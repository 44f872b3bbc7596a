"""One generation stream: its tokens, KV block table, progress and timestamps.

A `Sequence` is the unit the scheduler and block manager work on (vLLM's
`Request` in v1, nano-vllm's `Sequence`).  Progress is a single counter,
`num_computed_tokens`: the scheduler gives each sequence the next tokens whose KV
is not yet in the cache, so prefill, chunked prefill, decode and recompute after
preemption are all the same operation.  A request with `n > 1` starts as one
sequence that forks into `n` at the end of its prompt, sharing the prompt's blocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from infbench.engine.request import Request, SamplingParams


class SeqStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(eq=False)
class Sequence:
    """Mutable bookkeeping of one sample; identity (not value) equality."""

    seq_id: int
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    arrival_s: float
    n: int = 1  # samples still to fork from this sequence at prompt end
    sample_index: int = 0
    output_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    block_table: list[int] = field(default_factory=list)  # -1: released by a sliding window
    group_tables: dict[int, list[int]] = field(default_factory=dict)  # KV groups 1.. (kv_groups)
    token_times_s: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str | None = None  # length | stop | eos
    state_slot: int = -1  # constant-state schemes (linear attention, SSM)

    @classmethod
    def from_request(cls, request: Request, seq_id: int) -> Sequence:
        return cls(
            seq_id=seq_id,
            request_id=request.request_id,
            prompt_ids=list(request.prompt_ids),
            sampling=request.sampling,
            arrival_s=request.arrival_s,
            n=request.n,
        )

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED
