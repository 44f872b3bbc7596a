"""`infbench serve --replicas`: the router's policies and merged metrics, and two real
replica processes of the tiny model behind the router."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from infbench.core.errors import UserError
from infbench.serve.replicas import (
    Replica,
    ReplicaSet,
    Router,
    core_sets,
    create_router_app,
    free_port,
    merge_metrics,
)

SERVE_ARGS = ["--model", "tiny", "--random-weights", "--dtype", "float32", "--device", "cpu",
              "--backend", "torch", "--max-model-len", "64", "--num-kv-blocks", "64",
              "--max-num-seqs", "4"]


def _replica(index: int) -> Replica:
    return Replica(index, 0, None, None, None)  # type: ignore[arg-type]


def test_core_sets_are_disjoint_or_none() -> None:
    assert core_sets(2, 1, [0, 1]) == [[0], [1]]
    assert core_sets(2, 2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert core_sets(3, 1, [0, 1]) is None  # too few cores: nothing pinned


def test_round_robin_and_least_outstanding() -> None:
    reps = [_replica(i) for i in range(3)]
    rr = Router(reps, "round_robin")
    assert [rr.pick().index for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    lo = Router(reps, "least_outstanding")
    reps[0].outstanding, reps[1].outstanding, reps[2].outstanding = 2, 0, 1
    assert lo.pick().index == 1
    reps[1].outstanding = 3
    assert lo.pick().index == 2
    reps[2].outstanding = 2
    assert lo.pick().index == 0  # a tie goes to the lowest index
    with pytest.raises(UserError, match="--router 'random': allowed: round_robin, "
                                        "least_outstanding"):
        Router(reps, "random")


def test_merged_metrics_keep_each_family_together() -> None:
    one = ("# HELP a:x_total Things.\n# TYPE a:x_total counter\na:x_total{model=\"m\"} 3\n"
           "# HELP a:h Latency.\n# TYPE a:h histogram\na:h_bucket{le=\"1\"} 1\na:h_sum 0.5\n"
           "a:h_count 1\n")
    two = one.replace(" 3\n", " 4\n")
    text = merge_metrics([one, two])
    lines = text.splitlines()
    assert lines.count("# TYPE a:x_total counter") == 1
    assert 'a:x_total{replica="0",model="m"} 3' in lines
    assert 'a:x_total{replica="1",model="m"} 4' in lines
    assert 'a:h_sum{replica="1"} 0.5' in lines
    # every sample of a family comes right after its comments, before the next family
    first_h = lines.index("# HELP a:h Latency.")
    assert all(ln.startswith("a:x_total") or ln.startswith("#") for ln in lines[:first_h])
    assert all(ln.startswith("a:h") or ln.startswith("#") for ln in lines[first_h:])


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    rs = ReplicaSet(SERVE_ARGS, replicas=2, threads=1)
    reps = rs.start(timeout_s=240, log_dir=str(tmp_path_factory.mktemp("replicas")))
    yield reps
    rs.stop()
    assert all(r.process.returncode == 0 for r in reps)  # SIGTERM: a clean exit


async def _with_router(reps: list[Replica], policy: str, body: Any) -> Any:
    router = Router(reps, policy)
    runner = web.AppRunner(create_router_app(router))
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        async with ClientSession() as session:
            return await body(session, f"http://127.0.0.1:{port}", router)
    finally:
        await runner.cleanup()


def test_requests_are_spread_and_answers_pass_through(replicas: list[Replica]) -> None:
    async def body(session: ClientSession, url: str, router: Router) -> None:
        req = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 5, "temperature": 0}
        answers = []
        for _ in range(4):
            async with session.post(url + "/v1/completions", json=req) as resp:
                assert resp.status == 200
                answers.append(await resp.json())
        assert [r.routed for r in router.replicas] == [2, 2]
        texts = {a["choices"][0]["text"] for a in answers}
        assert len(texts) == 1  # the same seeded weights, greedy: the same tokens
        assert all(a["usage"]["completion_tokens"] == 5 for a in answers)
        # streaming passes through as SSE, ending with [DONE]
        async with session.post(url + "/v1/completions", json={**req, "stream": True}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            raw = (await resp.read()).decode()
        events = [e for e in raw.split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]"
        streamed = "".join(json.loads(e.removeprefix("data: "))["choices"][0]["text"]
                           for e in events[:-1] if json.loads(e.removeprefix("data: "))["choices"])
        assert streamed == texts.pop()
        # an error status passes through too
        async with session.post(url + "/v1/completions", json={**req, "max_tokens": 0}) as resp:
            assert resp.status == 400 and "error" in await resp.json()
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
        async with session.get(url + "/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"]
        async with session.get(url + "/metrics") as resp:
            metrics = await resp.text()
        assert 'infbench:router_requests_total{replica="0"} 3' in metrics
        assert 'infbench:router_requests_total{replica="1"} 3' in metrics
        assert 'replica="1",' in metrics and 'replica="0",' in metrics
        assert all(r.outstanding == 0 for r in router.replicas)

    asyncio.run(_with_router(replicas, "round_robin", body))


def test_least_outstanding_sends_concurrent_requests_to_both(replicas: list[Replica]) -> None:
    async def body(session: ClientSession, url: str, router: Router) -> None:
        req = {"model": "tiny", "prompt": [9, 10, 11], "max_tokens": 16, "temperature": 0,
               "ignore_eos": True}

        async def one() -> int:
            async with session.post(url + "/v1/completions", json=req) as resp:
                return resp.status

        before = [r.routed for r in router.replicas]
        assert await asyncio.gather(*[one() for _ in range(6)]) == [200] * 6
        routed = [r.routed - b for r, b in zip(router.replicas, before, strict=True)]
        assert sum(routed) == 6 and min(routed) >= 2

    asyncio.run(_with_router(replicas, "least_outstanding", body))


def test_bad_replica_flags_are_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "infbench.cli", "serve", *SERVE_ARGS,
                           "--replicas", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--replicas" in proc.stderr.strip().splitlines()[-1]


def test_a_replica_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    rs = ReplicaSet(["--model", str(tmp_path / "missing")], replicas=1, threads=1)
    with pytest.raises(UserError, match="replica 0 exited with code 2: error:"):
        rs.start(timeout_s=120, log_dir=str(tmp_path))


def test_an_unreachable_replica_is_a_502_and_an_unhealthy_router() -> None:
    dead = Replica(0, free_port(), None, None, None)  # type: ignore[arg-type]

    async def body(session: ClientSession, url: str, router: Router) -> None:
        async with session.post(url + "/v1/completions", json={"prompt": [1]}) as resp:
            assert resp.status == 502
            err = (await resp.json())["error"]
            assert err["type"] == "server_error" and "replica 0 unavailable" in err["message"]
        async with session.get(url + "/health") as resp:
            assert resp.status == 503
        assert router.replicas[0].failed == 1 and router.replicas[0].outstanding == 0

    asyncio.run(_with_router([dead], "round_robin", body))
