"""Multi-turn sessions on the in-process engine: a closed loop over `Engine.step`.

`Engine.run` replays a fixed list of requests; a session's turn k+1 cannot exist before
turn k's reply does.  So this loop drives the engine itself, as `Engine.run` does (one
`reset`, then `add_request` / `step` until every session is done): a session starts at its
arrival (with `workload.max_concurrency`, once fewer sessions than that are active), its
first turn is submitted then, and each later turn `think_s` after the previous one
finished, its prompt the system prompt, every earlier user message and every earlier reply
(the engine's output ids) plus the new message.  With `engine.prefix_caching` the history a
turn shares with the one before hits the prefix cache, which the result's
`prefix_cache_hit_rate` and each row's `num_cached_prompt_tokens` show.

A turn's arrival (TTFT and E2E count from it) is the time it became due: its session's
arrival for turn 0, the previous turn's finish plus the think time after that.  Without
`realtime` (warm-ups) sessions start at once and think times are skipped.  The records,
steps and wall time come back as the engine's `RunOutput`, so the repeat's metrics, step
traffic and prefix-cache figures are computed exactly as for any other engine run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from infbench.engine.engine import Engine, RunOutput
from infbench.engine.records import RequestRecord, StepRecord
from infbench.engine.request import Request, SamplingParams
from infbench.measure.sessions import Conversation, turn_id
from infbench.scenario.workload import WorkloadPoint


@dataclass
class _Session:
    conversation: Conversation
    history: list[int] = field(default_factory=list)
    next_turn: int = 0
    due_s: float = math.inf  # when the next turn goes out (inf: waiting on the engine)
    in_flight: bool = False


def sizing_requests(conversations: Sequence[Conversation]) -> list[Request]:
    """One request per session at its longest (its last turn, every earlier reply at its
    max_tokens): what the engine's KV pool is sized for (a session has one turn resident)."""
    out = []
    for conv in conversations:
        history = len(conv.system_ids) + sum(len(t.user_ids) + t.max_tokens
                                             for t in conv.turns[:-1])
        last = conv.turns[-1]
        out.append(Request(request_id=conv.session_id,
                           prompt_ids=(0,) * (history + len(last.user_ids)),
                           sampling=SamplingParams(max_tokens=last.max_tokens)))
    return out


def _sampling(workload: WorkloadPoint, max_tokens: int, seed: int,
              eos: int | None) -> SamplingParams:
    stop = (eos,) if eos is not None and not workload.ignore_eos else ()
    return SamplingParams(temperature=workload.temperature, top_k=workload.top_k,
                          top_p=workload.top_p, max_tokens=max_tokens, seed=seed,
                          stop_token_ids=stop, ignore_eos=workload.ignore_eos)


def run_engine_sessions(engine: Engine, conversations: Sequence[Conversation],
                        workload: WorkloadPoint, *, realtime: bool = True,
                        on_step: Callable[[StepRecord], None] | None = None,
                        max_concurrency: int | None = None,
                        eos_token_id: int | None = None) -> RunOutput:
    """Serve every conversation to its last turn; the engine's records, steps and wall."""
    engine.reset()  # cold, as Engine.run: the prefix cache fills within the run
    pending = sorted(conversations, key=lambda c: c.arrival_s)
    cap = max_concurrency if max_concurrency is not None else len(pending) + 1
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    active: dict[str, _Session] = {}
    arrivals: dict[str, float] = {}
    records: list[RequestRecord] = []
    steps: list[StepRecord] = []
    outputs: dict[str, list[int]] = {}
    i = 0
    while i < len(pending) or active:
        now = clock()
        while i < len(pending) and len(active) < cap and (
                not realtime or pending[i].arrival_s <= now):
            conv = pending[i]
            start = max(conv.arrival_s, now) if realtime else 0.0
            active[conv.session_id] = _Session(conv, list(conv.system_ids), due_s=start)
            i += 1
        for s in active.values():  # every turn that is due goes in before the next step
            if s.in_flight or s.due_s > now:
                continue
            turn = s.conversation.turns[s.next_turn]
            s.history.extend(turn.user_ids)
            rid = turn_id(s.conversation.session_id, turn.index)
            arrivals[rid] = s.due_s
            engine.add_request(Request(rid, tuple(s.history), _sampling(
                workload, turn.max_tokens, turn.seed, eos_token_id), arrival_s=s.due_s))
            s.in_flight = True
        if not engine.scheduler.has_unfinished:  # everyone is thinking (or not yet arrived)
            waits = [s.due_s for s in active.values() if not s.in_flight]
            if i < len(pending) and len(active) < cap:
                waits.append(pending[i].arrival_s)
            time.sleep(max(0.0, min(waits, default=now) - clock()))
            continue
        record, finished = engine.step(clock)
        steps.append(record)
        if on_step is not None:
            on_step(record)
        done_at = clock()
        for seq in finished:
            sid, _, _turn = seq.request_id.rpartition("/t")
            s = active[sid]
            outputs[seq.request_id] = list(seq.output_ids)
            records.append(RequestRecord(
                request_id=seq.request_id, arrival_s=arrivals[seq.request_id],
                num_prompt_tokens=seq.num_prompt_tokens, token_times_s=list(seq.token_times_s),
                num_cached_prompt_tokens=seq.num_cached_tokens,
                num_preemptions=seq.num_preemptions, finish_reason=seq.finish_reason or "length",
                output_ids=list(seq.output_ids)))
            s.history.extend(seq.output_ids)  # the reply as the engine produced it
            s.next_turn += 1
            s.in_flight = False
            if s.next_turn == len(s.conversation.turns):
                del active[sid]
            else:
                think = s.conversation.turns[s.next_turn].think_s if realtime else 0.0
                s.due_s = done_at + think
    records.sort(key=lambda r: r.request_id)
    return RunOutput(records, steps, clock(), outputs)
