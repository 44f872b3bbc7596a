"""Multi-turn sessions on the in-process engine: a closed loop over `Engine.step`.

`Engine.run` replays a fixed list of requests; a session's turn k+1 cannot exist before
turn k's reply does.  So this loop drives the engine itself, as `Engine.run` does (one
`reset`, then `add_request` / `step` until every session is done), with the rule of
`engine/session_loop.py` (which the simulation replays on its virtual clock): a session
starts at its arrival (with `workload.max_concurrency`, once fewer sessions than that are
active), its first turn is submitted then, and each later turn `think_s` after the previous
one finished, its prompt the system prompt, every earlier user message and every earlier
reply (the engine's output ids) plus the new message.  With `engine.prefix_caching` the
history a turn shares with the one before hits the prefix cache, which the result's
`prefix_cache_hit_rate` and each row's `num_cached_prompt_tokens` show.

A turn's arrival (TTFT and E2E count from it) is the time it became due: its session's
arrival for turn 0 (or, held back by the cap, the moment a slot freed), the previous turn's
finish plus the think time after that.  Without `realtime` (warm-ups) sessions start at
once and think times are skipped.  The records, steps and wall time come back as the
engine's `RunOutput`, so the repeat's metrics, step traffic and prefix-cache figures are
computed exactly as for any other engine run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from infbench.engine.engine import Engine, RunOutput
from infbench.engine.records import RequestRecord, StepRecord
from infbench.engine.session_loop import Conversation, SessionLoop
from infbench.measure.sessions import turn_sampling
from infbench.scenario.workload import WorkloadPoint


def run_engine_sessions(engine: Engine, conversations: Sequence[Conversation],
                        workload: WorkloadPoint, *, realtime: bool = True,
                        on_step: Callable[[StepRecord], None] | None = None,
                        max_concurrency: int | None = None,
                        eos_token_id: int | None = None) -> RunOutput:
    """Serve every conversation to its last turn; the engine's records, steps and wall."""
    engine.reset()  # cold, as Engine.run: the prefix cache fills within the run
    loop = SessionLoop(conversations, lambda turn: turn_sampling(workload, turn, eos_token_id),
                       realtime=realtime, max_concurrency=max_concurrency)
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    records: list[RequestRecord] = []
    steps: list[StepRecord] = []
    outputs: dict[str, list[int]] = {}
    while loop.has_unfinished:
        loop.submit_due(clock(), engine.add_request)  # every due turn before the next step
        if not engine.scheduler.has_unfinished:  # everyone is thinking (or not yet arrived)
            time.sleep(max(0.0, loop.next_due_s() - clock()))
            continue
        record, finished = engine.step(clock)
        steps.append(record)
        if on_step is not None:
            on_step(record)
        done_at = clock()
        for seq in finished:
            outputs[seq.request_id] = list(seq.output_ids)
            arrival = loop.finished(seq.request_id, seq.output_ids, done_at)
            records.append(RequestRecord(
                request_id=seq.request_id, arrival_s=arrival,
                num_prompt_tokens=seq.num_prompt_tokens, token_times_s=list(seq.token_times_s),
                num_cached_prompt_tokens=seq.num_cached_tokens,
                num_preemptions=seq.num_preemptions, finish_reason=seq.finish_reason or "length",
                output_ids=list(seq.output_ids)))
    records.sort(key=lambda r: r.request_id)
    return RunOutput(records, steps, clock(), outputs)
