"""The client through `infbench serve` gives the in-process engine's greedy outputs."""

from __future__ import annotations

import asyncio

from serve_helpers import MODEL_NAME, start_server, tiny_engine

from infbench.client.openai_target import ClientPlan, TargetRun, open_session, run_requests
from infbench.measure.workload import generate_requests
from infbench.scenario.point import WorkloadPoint
from infbench.scenario.target import TargetSection


def test_client_via_infbench_serve_equals_the_engine_greedy() -> None:
    workload = WorkloadPoint(kind="offline", num_requests=5, prompt_len=12, gen_len=9,
                             prompt_len_dist="uniform", seed=5)
    requests = generate_requests(workload, 256)  # the tiny preset's vocabulary
    engine, _ = tiny_engine()
    local = engine.run(requests, realtime_arrivals=False)
    expected = {r.request_id: (r.output_ids, r.num_prompt_tokens, r.num_output_tokens)
                for r in local.requests}

    server = start_server()
    try:
        target = TargetSection(kind="openai", base_url=server.url + "/v1", model=MODEL_NAME,
                               return_token_ids=True)

        async def main() -> TargetRun:
            async with open_session(target, 5) as session:
                return await run_requests(ClientPlan(target), requests, session=session)

        remote = asyncio.run(main())
    finally:
        server.stop()
    assert not remote.failures, remote.failures[:1]
    got = {r.request_id: (r.output_ids, r.num_prompt_tokens, r.num_output_tokens)
           for r in remote.records}
    assert got == expected
    assert all(n == 9 for _, _, n in got.values())
