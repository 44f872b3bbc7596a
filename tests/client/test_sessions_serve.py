"""Sessions through `infbench serve` (token prompts, the server's ids in the history) give the
engine's own closed loop's greedy replies, turn by turn."""

from __future__ import annotations

import asyncio

from serve_helpers import MODEL_NAME, start_server, tiny_engine

from infbench.client.openai_target import ClientPlan, open_session
from infbench.client.sessions import SessionsRun, run_sessions
from infbench.measure.engine_sessions import run_engine_sessions
from infbench.measure.sessions import plan_sessions
from infbench.scenario.sessions import SessionsSection
from infbench.scenario.target import TargetSection
from infbench.scenario.workload import WorkloadPoint


def test_sessions_via_infbench_serve_equal_the_engine_loop() -> None:
    workload = WorkloadPoint(kind="sessions", seed=3, sessions=SessionsSection.model_validate(
        {"num_sessions": 3, "turns": 3, "user_len": {"dist": "uniform", "mean": 6},
         "output_len": 5, "system_prompt_len": 4}))
    conversations = plan_sessions(workload, 256)  # the tiny preset's vocabulary
    engine, _ = tiny_engine()
    local = run_engine_sessions(engine, conversations, workload, realtime=False)
    expected = {r.request_id: (r.output_ids, r.num_prompt_tokens) for r in local.requests}
    assert len(expected) == 9

    server = start_server()
    try:
        target = TargetSection(kind="openai", base_url=server.url + "/v1", model=MODEL_NAME,
                               return_token_ids=True)

        async def main() -> SessionsRun:
            async with open_session(target, 3) as session:
                return await run_sessions(ClientPlan(target), workload, conversations,
                                          session=session)

        remote = asyncio.run(main())
    finally:
        server.stop()
    assert not remote.failures, remote.failures[:1]
    got = {r.request_id: (r.output_ids, r.num_prompt_tokens) for r in remote.records}
    assert got == expected
    # the prompts grew by every reply: turn 2 holds both earlier replies (5 tokens each)
    for conv in conversations:
        users = [len(t.user_ids) for t in conv.turns]
        assert got[f"{conv.session_id}/t2"][1] == 4 + sum(users) + 2 * 5
