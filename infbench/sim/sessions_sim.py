"""Multi-turn sessions on the simulated engine: the sessions' closed loop on the virtual
clock.

`simulate_sessions` plays conversations (`workload.kind: sessions`) as
`measure/engine_sessions.py` plays them on the engine, through the same
`engine/session_loop.SessionLoop`: sessions admitted by the client's rule
(`max_concurrency` caps the active ones), a turn submitted when due (its session's start
for the first, the previous turn's finish plus its think time for the others), its prompt
the system prompt, every earlier message and every earlier reply plus the new message.
Each step is `engine_sim.Sim`'s (the engine's scheduler and block manager, priced by the
cost model), so the prefix cache sees the same history sharing the engine would: a turn's
prompt begins with the blocks of the turn before.

A simulated reply is `max_tokens` copies of the simulation's one sampled token (the
simulation cannot know a model's words, nor when it would emit EOS); those ids join the
history as a real reply would.  Deterministic: no wall clock, no unseeded randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from infbench.engine.records import RequestRecord, StepRecord
from infbench.engine.request import SamplingParams
from infbench.engine.session_loop import Conversation, SessionLoop, Turn
from infbench.sim.engine_sim import Sim, SimConfig, SimOutput, finished_record
from infbench.sim.step_cost import StepPricer


def simulate_sessions(conversations: Sequence[Conversation], pricer: StepPricer,
                      config: SimConfig, sampling: Callable[[Turn], SamplingParams], *,
                      realtime: bool = True, max_concurrency: int | None = None) -> SimOutput:
    """Serve every conversation to its last turn on the virtual clock; `sampling` gives
    each turn's parameters (measure.sessions.turn_sampling)."""
    loop = SessionLoop(conversations, sampling, realtime=realtime,
                       max_concurrency=max_concurrency)
    stops = (t for c in conversations for turn in c.turns
             for t in sampling(turn).stop_token_ids)
    sim = Sim(pricer, config, stops)
    sched = sim.scheduler
    records: list[RequestRecord] = []
    steps: list[StepRecord] = []
    now = 0.0
    while loop.has_unfinished:
        loop.submit_due(now, sim.add)
        if not sched.has_unfinished:  # every session thinking, or none arrived yet
            due = loop.next_due_s()
            assert due > now, "a due turn was not submitted"  # else the clock would stall
            now = due
            continue
        record, finished = sim.step(now)
        steps.append(record)
        now += record.duration_s
        for seq in finished:
            arrival = loop.finished(seq.request_id, seq.output_ids, now)
            records.append(finished_record(seq, seq.request_id, arrival))
    records.sort(key=lambda r: r.request_id)
    return SimOutput(records, steps, now)
