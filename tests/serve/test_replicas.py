"""`infbench serve --replicas`: the router's policies and merged metrics; its failure
handling against fake replicas (in-process aiohttp apps that stream, die mid-stream, or
are gone); and two real replica processes of the tiny model behind the router."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from infbench.core.errors import UserError
from infbench.serve.replicas import Replica, ReplicaSet, core_sets, free_port
from infbench.serve.router import Router, create_router_app
from infbench.serve.router_metrics import merge_metrics

SERVE_ARGS = ["--model", "tiny", "--random-weights", "--dtype", "float32", "--device", "cpu",
              "--backend", "torch", "--max-model-len", "64", "--num-kv-blocks", "64",
              "--max-num-seqs", "4"]
SECRET = "s3cret"
Body = Callable[[ClientSession, str, Router], Awaitable[Any]]


def _replica(index: int, port: int = 0) -> Replica:
    return Replica(index, port, None, None, None)


def test_core_sets_are_disjoint_or_none() -> None:
    assert core_sets(2, 1, [0, 1]) == [[0], [1]]
    assert core_sets(2, 2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert core_sets(3, 1, [0, 1]) is None  # too few cores: nothing pinned


def test_round_robin_and_least_outstanding_skip_unhealthy() -> None:
    reps = [_replica(i) for i in range(3)]
    rr = Router(reps, "round_robin")
    assert [rr.pick().index for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]  # type: ignore[union-attr]
    rr.mark_down(reps[1], "test")
    assert [rr.pick().index for _ in range(4)] == [2, 0, 2, 0]  # type: ignore[union-attr]
    assert rr.pick(exclude=[reps[0], reps[2]]) is None
    rr.mark_up(reps[1])
    lo = Router(reps, "least_outstanding")
    reps[0].outstanding, reps[1].outstanding, reps[2].outstanding = 2, 0, 1
    assert lo.pick().index == 1  # type: ignore[union-attr]
    reps[1].outstanding = 3
    assert lo.pick().index == 2  # type: ignore[union-attr]
    reps[2].outstanding = 2
    assert lo.pick().index == 0  # type: ignore[union-attr]  # a tie: the lowest index
    lo.mark_down(reps[0], "test")
    assert lo.pick().index == 2  # type: ignore[union-attr]
    with pytest.raises(UserError, match="--router 'random': allowed: round_robin, "
                                        "least_outstanding"):
        Router(reps, "random")


def test_merged_metrics_keep_each_family_together() -> None:
    one = ("# HELP a:x_total Things.\n# TYPE a:x_total counter\na:x_total{model=\"m\"} 3\n"
           "# HELP a:h Latency.\n# TYPE a:h histogram\na:h_bucket{le=\"1\"} 1\na:h_sum 0.5\n"
           "a:h_count 1\n")
    two = one.replace(" 3\n", " 4\n")
    lines = merge_metrics([one, two]).splitlines()
    assert lines.count("# TYPE a:x_total counter") == 1
    assert 'a:x_total{replica="0",model="m"} 3' in lines
    assert 'a:x_total{replica="1",model="m"} 4' in lines
    assert 'a:h_sum{replica="1"} 0.5' in lines
    first_h = lines.index("# HELP a:h Latency.")
    assert all(ln.startswith("a:x_total") or ln.startswith("#") for ln in lines[:first_h])
    assert all(ln.startswith("a:h") or ln.startswith("#") for ln in lines[first_h:])


# ------------------------------------------------------------- fake replicas
class Fake:
    """A replica stand-in: answers with the secret only; `mode` says how it streams."""

    def __init__(self, index: int, mode: str = "ok") -> None:
        self.index, self.mode, self.port = index, mode, free_port()
        self.served = 0
        self.cut_off = asyncio.Event()  # a slow stream saw its client (the router) go
        self.runner: web.AppRunner | None = None

    def _authorized(self, request: web.Request) -> None:
        if request.headers.get("Authorization") != f"Bearer {SECRET}":
            raise web.HTTPUnauthorized()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def health(self, request: web.Request) -> web.Response:
        self._authorized(request)
        return web.Response()

    async def models(self, request: web.Request) -> web.Response:
        self._authorized(request)
        return web.json_response({"object": "list", "data": [{"id": f"fake{self.index}"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self._authorized(request)
        self.served += 1
        body = await request.json()
        if not body.get("stream"):
            if self.mode == "die":  # headers promise 100 bytes; 10 come, then the end
                resp = web.StreamResponse(headers={"Content-Length": "100",
                                                   "Content-Type": "application/json"})
                await resp.prepare(request)
                await resp.write(b'{"id": "x"')
                assert request.transport is not None
                request.transport.abort()
                return resp
            return web.json_response({"replica": self.index})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(2):
            await resp.write(b'data: {"n": %d}\n\n' % i)
        if self.mode == "slow":
            try:
                for i in range(400):
                    await resp.write(b'data: {"n": %d}\n\n' % i)
                    await asyncio.sleep(0.01)
            except ConnectionError:
                self.cut_off.set()
                return resp
            except asyncio.CancelledError:
                self.cut_off.set()
                raise
        if self.mode == "die":
            await resp.write(b'data: {"half')  # part of an event, then the replica is gone
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _serve(router: Router, secret: str, body: Body, **app_options: Any) -> Any:
    """Run `body(session, url, router)` against the router's app on a free loopback port."""
    runner = web.AppRunner(create_router_app(router, secret=secret, **app_options))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with ClientSession() as session:
            return await body(session, f"http://127.0.0.1:{port}", router)
    finally:
        await runner.cleanup()


async def _with_router(reps: list[Replica], body: Body, policy: str = "round_robin",
                       health_interval_s: float = 0.05) -> Any:
    return await _serve(Router(reps, policy), SECRET, body,
                        health_interval_s=health_interval_s)


def _events(raw: bytes) -> list[str]:
    return [e for e in raw.decode().split("\n\n") if e.strip()]


def test_a_replica_dying_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async def go() -> None:
        dying, fine = Fake(0, "die"), Fake(1)
        await dying.start()
        await fine.start()

        async def body(session: ClientSession, url: str, router: Router) -> None:
            req = {"prompt": [1], "stream": True}
            async with session.post(url + "/v1/completions", json=req) as resp:
                assert resp.status == 200
                raw = await resp.read()
            assert b"HTTP/1.1" not in raw  # never a second response inside the body
            events = _events(raw)
            assert events[:2] == ['data: {"n": 0}', 'data: {"n": 1}']  # the partial one dropped
            assert events[-1] == "data: [DONE]" and len(events) == 4
            err = json.loads(events[2].removeprefix("data: "))["error"]
            assert err["code"] == "replica_failed" and err["type"] == "server_error"
            assert "replica 0 failed mid-stream" in err["message"]
            assert not router.replicas[0].healthy and router.replicas[0].failed == 1
            # a whole response that breaks off is a clean 502, not a partial body
            async with session.post(url + "/v1/completions", json={"prompt": [1]}) as resp:
                assert resp.status == 200 and (await resp.json()) == {"replica": 1}
            dying.mode, fine.mode = "ok", "die"
            router.mark_down(router.replicas[0], "test")  # only replica 1 in rotation now
            async with session.post(url + "/v1/completions", json={"prompt": [1]}) as resp:
                assert resp.status == 502
                assert (await resp.json())["error"]["code"] == "replica_failed"

        await _with_router([_replica(0, dying.port), _replica(1, fine.port)], body)
        await dying.stop()
        await fine.stop()

    asyncio.run(go())


def test_a_client_hanging_up_closes_the_upstream_stream(
        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        slow = Fake(0, "slow")
        await slow.start()

        async def body(session: ClientSession, url: str, router: Router) -> None:
            resp = await session.post(url + "/v1/completions",
                                      json={"prompt": [1], "stream": True})
            await resp.content.readuntil(b"\n\n")
            resp.close()  # hang up
            await asyncio.wait_for(slow.cut_off.wait(), 5)  # the replica saw it
            for _ in range(100):
                if router.replicas[0].outstanding == 0:
                    break
                await asyncio.sleep(0.01)
            assert router.replicas[0].outstanding == 0 and router.replicas[0].healthy

        await _with_router([_replica(0, slow.port)], body)
        await slow.stop()

    asyncio.run(go())
    assert not [r for r in caplog.records if r.exc_info], "a hang-up is not an error"


def test_a_dead_replica_leaves_the_rotation_and_comes_back() -> None:
    async def go() -> None:
        fakes = [Fake(0), Fake(1)]
        for f in fakes:
            await f.start()

        async def body(session: ClientSession, url: str, router: Router) -> None:
            await fakes[0].stop()  # replica 0 is gone
            statuses = []
            for _ in range(6):
                async with session.post(url + "/v1/completions", json={"prompt": [1]}) as resp:
                    statuses.append(resp.status)
            assert statuses == [200] * 6 and fakes[1].served == 6
            assert not router.replicas[0].healthy
            async with session.get(url + "/v1/models") as resp:
                assert (await resp.json())["data"][0]["id"] == "fake1"
            async with session.get(url + "/health") as resp:
                state = await resp.json()
            assert resp.status == 200 and [r["healthy"] for r in state["replicas"]] == \
                [False, True]
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            assert 'infbench:router_replica_healthy{replica="0"} 0' in text
            await fakes[0].start()  # back on its port: the health check returns it
            for _ in range(500):  # a check may be waiting out its 2 s timeout
                if router.replicas[0].healthy:
                    break
                await asyncio.sleep(0.02)
            assert router.replicas[0].healthy
            for _ in range(4):
                async with session.post(url + "/v1/completions", json={"prompt": [1]}) as resp:
                    assert resp.status == 200
            assert fakes[0].served >= 1

        await _with_router([_replica(0, fakes[0].port), _replica(1, fakes[1].port)], body)
        for f in fakes:
            await f.stop()

    asyncio.run(go())


def test_no_reachable_replica_is_a_502_then_503_with_error_objects() -> None:
    async def body(session: ClientSession, url: str, router: Router) -> None:
        async with session.post(url + "/v1/completions", json={"prompt": [1]}) as resp:
            err = (await resp.json())["error"]
            assert resp.status == 502 and err["code"] == "replica_unavailable"
            assert "replica 0 unavailable" in err["message"]
        for path in ("/v1/completions", "/v1/models", "/health"):
            method = session.post if path == "/v1/completions" else session.get
            async with method(url + path, json={"prompt": [1]}) as resp:
                assert resp.status == 503
                assert (await resp.json())["error"]["code"] == "no_healthy_replica"
        assert router.replicas[0].failed == 1 and router.replicas[0].outstanding == 0

    # no health check before the first request: it finds the replica gone itself
    asyncio.run(_with_router([_replica(0, free_port())], body, health_interval_s=60))


# ------------------------------------------------------------ real replicas
@pytest.fixture(scope="module")
def replica_set() -> Iterator[ReplicaSet]:
    rs = ReplicaSet(SERVE_ARGS, replicas=2, threads=1)
    rs.start(timeout_s=240)
    log_dir = Path(rs.log_dir)
    assert log_dir.is_dir() and sorted(p.name for p in log_dir.iterdir()) == [
        "replica-0.log", "replica-1.log"]
    yield rs
    assert rs.stop()  # SIGTERM: a clean exit of both
    assert all(r.process is not None and r.process.returncode == 0 for r in rs.replicas_)
    assert not log_dir.exists()  # a clean stop removes the logs


async def _real_router(rs: ReplicaSet, policy: str, body: Body) -> Any:
    return await _serve(Router(rs.replicas_, policy), rs.secret, body)


def test_requests_are_spread_and_answers_pass_through(replica_set: ReplicaSet) -> None:
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
        async with session.post(url + "/v1/completions", json={**req, "stream": True}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            events = _events(await resp.read())
        assert events[-1] == "data: [DONE]"
        streamed = "".join(json.loads(e.removeprefix("data: "))["choices"][0]["text"]
                           for e in events[:-1] if json.loads(e.removeprefix("data: "))["choices"])
        assert streamed == texts.pop()
        async with session.post(url + "/v1/completions", json={**req, "max_tokens": 0}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "max_tokens"
        async with session.post(url + "/v1/completions", data=b"[" * 100_000,
                                headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "too_deep"
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
        async with session.get(url + "/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"]
        async with session.get(url + "/metrics") as resp:
            metrics = await resp.text()
        assert 'infbench:router_requests_total{replica="0"} 4' in metrics
        assert 'infbench:router_requests_total{replica="1"} 3' in metrics
        assert 'replica="1",' in metrics and 'replica="0",' in metrics
        assert all(r.outstanding == 0 for r in router.replicas)

    asyncio.run(_real_router(replica_set, "round_robin", body))


def test_least_outstanding_sends_concurrent_requests_to_both(replica_set: ReplicaSet) -> None:
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

    asyncio.run(_real_router(replica_set, "least_outstanding", body))


def test_replicas_answer_only_the_router(replica_set: ReplicaSet) -> None:
    async def go() -> None:
        url = replica_set.replicas_[0].url
        async with ClientSession() as session:
            for path in ("/health", "/metrics", "/v1/models"):
                async with session.get(url + path) as resp:
                    assert resp.status == 401, path
                    assert (await resp.json())["error"]["code"] == "invalid_api_key"
            async with session.post(url + "/v1/completions", json={"prompt": [1]},
                                    headers={"Authorization": "Bearer wrong"}) as resp:
                assert resp.status == 401
            async with session.get(url + "/health", headers={
                    "Authorization": f"Bearer {replica_set.secret}"}) as resp:
                assert resp.status == 200

    asyncio.run(go())
    cmd = replica_set.replicas_[0].process.args  # type: ignore[union-attr]
    assert replica_set.secret not in " ".join(map(str, cmd))  # not on the command line


def test_bad_replica_flags_are_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "infbench.cli", "serve", *SERVE_ARGS,
                           "--replicas", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--replicas" in proc.stderr.strip().splitlines()[-1]


def test_a_replica_that_cannot_start_is_one_line_naming_its_logs(tmp_path: Path) -> None:
    rs = ReplicaSet(["--model", str(tmp_path / "missing")], replicas=1, threads=1)
    with pytest.raises(UserError, match="replica 0 exited with code 2: error:.*logs in ") as e:
        rs.start(timeout_s=120)
    assert Path(rs.log_dir).is_dir() and rs.log_dir in str(e.value)  # kept to be read
    (Path(rs.log_dir) / "replica-0.log").unlink()
    Path(rs.log_dir).rmdir()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie is dead
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PDEATHSIG")
def test_serve_replicas_survive_a_dead_replica_and_die_with_the_router() -> None:
    port = free_port()
    args = [*SERVE_ARGS, "--max-model-len", "1024", "--num-kv-blocks", "300"]
    proc = subprocess.Popen([sys.executable, "-m", "infbench.cli", "serve", *args,
                             "--replicas", "2", "--port", str(port)],
                            stderr=subprocess.PIPE, text=True)
    log_dir = ""
    replicas: list[int] = []
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert "starting 2 replicas" in first and "their logs in " in first, first
        log_dir = first.rsplit("their logs in ", 1)[1].strip()
        assert Path(log_dir).is_dir()
        while "Ctrl-C stops" not in (line := proc.stderr.readline()):
            assert line, "the router exited before it was ready"
        assert "replicas answer only the router" in line
        replicas = _children(proc.pid)
        assert len(replicas) == 2
        by_port = {int(open(f"/proc/{p}/cmdline").read().split("\0--port\0")[1].split("\0")[0]):
                   p for p in replicas}
        first_port = int(line.split("replica 0: port ")[1].split(";")[0].split(",")[0])
        url = f"http://127.0.0.1:{port}"

        async def go() -> None:
            async with ClientSession() as s:
                req = {"prompt": [1, 2], "max_tokens": 1000, "ignore_eos": True, "stream": True}
                async with s.post(url + "/v1/completions", json=req) as resp:
                    assert resp.status == 200
                    await resp.content.readuntil(b"\n\n")  # the first event came
                    subprocess.run(["kill", "-9", str(by_port[first_port])], check=True)
                    rest = await resp.read()
                events = [e for e in rest.decode().split("\n\n") if e.strip()]
                assert events[-1] == "data: [DONE]" and b"HTTP/1.1" not in rest
                assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == \
                    "replica_failed"
                for _ in range(3):  # the other replica answers them all
                    async with s.post(url + "/v1/completions",
                                      json={"prompt": [1], "max_tokens": 2}) as resp:
                        assert resp.status == 200
                async with s.get(url + "/v1/models") as resp:
                    assert resp.status == 200
                async with s.get(url + "/health") as resp:
                    health = await resp.json()
                assert [r["healthy"] for r in health["replicas"]] == [False, True]

        asyncio.run(go())
        proc.kill()  # SIGKILL: no chance to stop the replicas itself
        proc.wait(10)
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in replicas) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(p) for p in replicas)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in replicas:
            if not _gone(pid):
                os.kill(pid, 9)
        if log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)
