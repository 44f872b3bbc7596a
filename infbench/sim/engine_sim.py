"""A discrete-event run of the engine's own scheduler over priced steps: the engine, minus
the forward pass.

`simulate` replays requests exactly as `Engine.run` serves them (the same arrival and
client-cap rules, the same `Scheduler`, `BlockManager` / `GroupedBlockManager`, prefix
cache, chunked prefill, preemption by recompute, forks of n samples and speculative slots)
with one difference: instead of running the model, each step advances a virtual clock by
the seconds the cost model gives for exactly the batch the scheduler produced
(`sim/step_cost.py`).  The scheduler, block manager and sequences are the engine's
modules, unchanged and torch-free, so whatever they decide in a run (who is admitted,
when a prompt is chunked, who is preempted, which blocks are prefix hits) they decide
here the same way; what differs is only how long a step takes.

What the model would have produced is not known, so every sampled token is one fixed id
that is no stop token: a request generates exactly its `max_tokens` (the benchmarks'
`ignore_eos`; with EOS allowed a real model may stop earlier).  Speculative decoding: every
decode is offered `num_tokens` drafts, each accepted with probability `acceptance` until
the first rejection (a seeded stream), and the step pays the verification of all drafts
plus `num_tokens x draft_cost_ratio` plain decode steps of those sequences.

The output is the engine's own record types (`RequestRecord`, `StepRecord`), so the
metrics, goodput and SLO code that summarizes a measured run summarizes this one
(`measure/simulation.py` does).  Deterministic: no wall clock, no unseeded randomness.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from infbench.core.config import EngineConfig
from infbench.core.errors import ConfigError
from infbench.core.speculative import SpeculativeConfig
from infbench.engine.admission import ClientAdmission
from infbench.engine.block_manager import BlockManager, StateSlots
from infbench.engine.kv_groups import GroupedBlockManager
from infbench.engine.records import RequestRecord, StepRecord
from infbench.engine.request import Request
from infbench.engine.scheduler import Scheduler, SchedulerOutput
from infbench.engine.sequence import Sequence as Seq
from infbench.sim.step_cost import StepBatch, StepPricer, Work


@dataclass(frozen=True)
class SimConfig:
    """The engine as the simulation builds it: its settings and its KV pool."""

    engine: EngineConfig
    num_kv_blocks: list[int]  # per KV group (one entry: a single pool)
    windows: list[int | None] = field(default_factory=lambda: [None])  # per KV group
    num_state_slots: int | None = None  # constant-state schemes (linear attention, SSM)
    eos_token_id: int | None = None
    speculative: SpeculativeConfig | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.num_kv_blocks) != len(self.windows) or not self.num_kv_blocks:
            raise ConfigError(f"one block count per KV group: {self.num_kv_blocks}, "
                              f"{self.windows}")


@dataclass
class SimOutput:
    """What `Engine.run` returns, from the simulation: records on the virtual clock."""

    requests: list[RequestRecord]
    steps: list[StepRecord]
    wall_s: float


def build_scheduler(config: SimConfig) -> Scheduler:
    """The engine's scheduler and block manager as `Engine.reset` builds them."""
    engine = config.engine
    caching = engine.enable_prefix_caching and config.num_state_slots is None
    block_manager: BlockManager | GroupedBlockManager
    if len(config.num_kv_blocks) > 1:
        block_manager = GroupedBlockManager(config.num_kv_blocks, engine.block_size,
                                            config.windows, engine)
    else:
        block_manager = BlockManager(config.num_kv_blocks[0], engine.block_size, caching)
    slots = StateSlots(config.num_state_slots) if config.num_state_slots is not None else None
    window = config.windows[0] if len(config.windows) == 1 else None
    spec = config.speculative
    return Scheduler(engine, block_manager, state_slots=slots, window=window,
                     eos_token_id=config.eos_token_id,
                     num_spec_tokens=spec.num_tokens if spec is not None else 0)


def _sample_token(eos: int | None, stop_token_ids: Iterable[int]) -> int:
    """A token id that stops nothing: not EOS and no request's stop token."""
    stops = set(stop_token_ids)
    if eos is not None:
        stops.add(eos)
    token = 0
    while token in stops:
        token += 1
    return token


def finished_record(seq: Seq, key: str, arrival_s: float) -> RequestRecord:
    """A finished sequence's record under the id `key`, its arrival as the client counts it."""
    return RequestRecord(
        request_id=key, arrival_s=arrival_s, num_prompt_tokens=seq.num_prompt_tokens,
        token_times_s=seq.token_times_s, num_cached_prompt_tokens=seq.num_cached_tokens,
        num_preemptions=seq.num_preemptions, finish_reason=seq.finish_reason or "length")


class Sim:
    """One simulated run's state: the scheduler, the clock, the pricer.  `stop_token_ids`:
    every stop token the requests may carry (the sampled token is none of them)."""

    def __init__(self, pricer: StepPricer, config: SimConfig, stop_token_ids: Iterable[int]):
        self.pricer = pricer
        self.config = config
        self.scheduler = build_scheduler(config)
        self.token = _sample_token(config.eos_token_id, stop_token_ids)
        self.rng = random.Random(config.seed)
        self.step_index = 0

    def add(self, request: Request) -> None:
        sched = self.scheduler
        sched.add(Seq.from_request(request, sched.next_seq_id()))

    def _speculate(self, out: SchedulerOutput) -> list[int]:
        """Give each decode offered draft slots its drafts (as `Engine._propose`); returns
        the contexts of the sequences that drafted."""
        drafted = []
        for item in out.scheduled:
            if item.num_spec > 0:
                item.spec_tokens = [self.token] * item.num_spec
                item.num_new_tokens = 1 + item.num_spec
                drafted.append(item.start_pos + 1)
        return drafted

    def _accepted(self, num_drafts: int) -> int:
        spec = self.config.speculative
        assert spec is not None
        accepted = 0
        while accepted < num_drafts and self.rng.random() < spec.acceptance:
            accepted += 1
        return accepted

    def step(self, now: float, end_of: Callable[[StepBatch, float], float] | None = None
             ) -> tuple[StepRecord, list[Seq]]:
        """Schedule, price and finish one step started at `now`.  `end_of(batch, now)`:
        when the step's tokens are out, where that is not `now` + its price (a pipeline's
        stages, sim/pipeline_sim.py); the record's duration is then that span."""
        sched, token = self.scheduler, self.token
        out = sched.schedule()
        spec = self.config.speculative
        drafted = self._speculate(out) if spec is not None else []
        prefill: list[Work] = []
        contexts: list[int] = []
        verify: list[Work] = []
        sampled: dict[int, list[int]] = {}
        drafts: list[int] = []
        accepted_counts: list[int] = []
        num_prefill_tokens = num_prefill_seqs = 0
        for item in out.scheduled:
            q, context = item.num_new_tokens, item.start_pos + item.num_new_tokens
            if item.spec_tokens:
                verify.append((q, context, q))
                accepted = self._accepted(len(item.spec_tokens))
                drafts.append(len(item.spec_tokens))
                accepted_counts.append(accepted)
                sampled[item.seq.seq_id] = [token] * (accepted + 1)
                continue
            if item.is_prefill:
                prefill.append((q, context, 1 if item.num_samples else 0))
                num_prefill_tokens += q
                num_prefill_seqs += 1
            else:
                contexts.append(context)
            if item.num_samples:
                sampled[item.seq.seq_id] = [token] * item.num_samples
        batch = StepBatch(prefill, contexts, verify)
        duration = self.pricer.seconds(batch) if end_of is None else end_of(batch, now) - now
        draft_s = 0.0
        if drafted and spec is not None and spec.draft_cost_ratio > 0:
            one = self.pricer.seconds(StepBatch((), drafted))
            draft_s = spec.num_tokens * spec.draft_cost_ratio * one
        duration += draft_s
        end = now + duration
        finished = sched.update(out, sampled, end)
        bm = sched.block_manager
        num_decode_tokens = sum(s.num_new_tokens for s in out.scheduled) - num_prefill_tokens
        record = StepRecord(
            index=self.step_index, start_s=now, duration_s=duration,
            num_prefill_tokens=num_prefill_tokens, num_decode_tokens=num_decode_tokens,
            num_prefill_seqs=num_prefill_seqs,
            num_decode_seqs=len(out.scheduled) - num_prefill_seqs,
            num_running=sched.num_running, num_waiting=sched.num_waiting,
            kv_blocks_used=bm.num_used_blocks, kv_blocks_total=bm.num_blocks,
            kv_slots_used=sum(s.num_computed_tokens for s in sched.running),
            num_preempted=len(out.preempted), spec_drafts=drafts, spec_accepted=accepted_counts,
            draft_time_s=draft_s)
        self.step_index += 1
        return record, finished


def simulate(requests: Sequence[Request], pricer: StepPricer, config: SimConfig, *,
             realtime_arrivals: bool = True, max_concurrency: int | None = None,
             submit_until_s: float | None = None) -> SimOutput:
    """Serve `requests` to completion on the virtual clock, as `Engine.run` would.

    Arrivals are released at their `arrival_s` (all at 0 without `realtime_arrivals`);
    `max_concurrency` N holds a request back while N are outstanding, and its arrival then
    counts from its submission, as `Engine.run` and vLLM's benchmark client count it.
    `submit_until_s` (measure.duration_s): no request is submitted after it.
    """
    admission = ClientAdmission(requests, realtime_arrivals=realtime_arrivals,
                                max_concurrency=max_concurrency,
                                submit_until_s=submit_until_s)
    sim = Sim(pricer, config, (t for r in requests for t in r.sampling.stop_token_ids))
    sched = sim.scheduler
    records: list[RequestRecord] = []
    steps: list[StepRecord] = []
    now = 0.0
    while admission.has_pending or sched.has_unfinished:
        admission.admit(now, sim.add)
        if not sched.has_unfinished:
            if not admission.has_pending:
                break  # submissions stopped (measure.duration_s) and everything finished
            now = max(now, admission.next_due_s())  # idle until the next arrival
            continue
        record, finished = sim.step(now)
        steps.append(record)
        now += record.duration_s
        for seq in finished:
            records.append(finished_record(seq, *admission.finished(seq.request_id,
                                                                    seq.sample_index)))
    return SimOutput(records, steps, now)
