"""The router of `infbench serve --replicas N`: one public app in front of N replicas.

- POST /v1/completions and /v1/chat/completions go to one healthy replica, chosen
  round-robin or by the fewest requests outstanding (ties to the lowest index).  A replica
  that cannot be reached is taken out of rotation and the request goes to the next one
  (nothing reached the first, so nothing is done twice).  A stream is passed through event
  by event; if the replica fails mid-stream the client's stream ends with an SSE error
  event and `[DONE]` (the status line went out already, so that is the only honest end).
  A whole (non-streamed) answer is read completely first, so a failure is a clean 502.
- A health check every `health_interval_s` takes a replica that does not answer (or whose
  process exited) out of rotation and puts it back when it answers again.
- GET /v1/models is the first healthy replica's; /health is 200 while any replica is in
  rotation (503 when none is); /metrics is the router's counters followed by the healthy
  replicas' metrics, merged family by family with a `replica="i"` label.
- Every call to a replica carries the per-start secret (`Authorization: Bearer`), which
  is the replicas' API key: they answer no one else.

Errors are OpenAI error objects with string codes: `no_healthy_replica` (503),
`replica_unavailable` (502: could not be reached), `replica_failed` (502: failed while
answering).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import (
    ClientConnectorError,
    ClientError,
    ClientSession,
    ClientTimeout,
    TCPConnector,
    web,
)

from infbench.core.errors import UserError
from infbench.serve.limits import BodyBudget, ServerLimits, check_content_type, read_body
from infbench.serve.protocol import ApiError
from infbench.serve.replicas import Replica
from infbench.serve.router_metrics import merge_metrics, router_metrics
from infbench.serve.security import LOG, Security, error_response, secure_app

ROUTERS = ("round_robin", "least_outstanding")
_SSE = "text/event-stream"
_DONE = b"data: [DONE]\n\n"


class Router:
    """Picks a healthy replica per request; counts what each was given."""

    def __init__(self, replicas: Sequence[Replica], policy: str) -> None:
        if policy not in ROUTERS:
            raise UserError(f"--router {policy!r}: allowed: {', '.join(ROUTERS)}")
        if not replicas:
            raise UserError("--replicas must be >= 1")
        self.replicas, self.policy = list(replicas), policy
        self._next = 0  # round robin: the index to try first

    def pick(self, exclude: Sequence[Replica] = ()) -> Replica | None:
        """The next replica in rotation (not in `exclude`), or None when there is none."""
        n = len(self.replicas)
        if self.policy == "round_robin":
            for k in range(n):
                rep = self.replicas[(self._next + k) % n]
                if rep.healthy and rep not in exclude:
                    self._next = (rep.index + 1) % n
                    return rep
            return None
        live = [r for r in self.replicas if r.healthy and r not in exclude]
        return min(live, key=lambda r: (r.outstanding, r.index)) if live else None

    def mark_down(self, rep: Replica, reason: str) -> None:
        if rep.healthy:
            LOG.warning("replica %d out of rotation: %s", rep.index, reason[:200])
        rep.healthy, rep.last_error = False, reason

    def mark_up(self, rep: Replica) -> None:
        if not rep.healthy:
            LOG.warning("replica %d back in rotation", rep.index)
        rep.healthy, rep.last_error = True, ""


def _error(message: str, status: int, code: str) -> ApiError:
    return ApiError(message, status=status, type_="server_error", code=code)


class _Unreachable(Exception):
    """The replica could not be connected to: the request never reached it."""


class RouterApp:
    """The router's routes and their state (one pooled session to the replicas)."""

    def __init__(self, router: Router, secret: str | None, limits: ServerLimits,
                 health_interval_s: float, on_drain: Callable[[], None] | None) -> None:
        self.router, self.limits, self.on_drain = router, limits, on_drain
        self.upstream_headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        self.health_interval_s = health_interval_s
        self.budget = BodyBudget(limits.max_body_bytes_in_flight)
        self.session: ClientSession | None = None
        self.draining = False
        self.num_forwarding = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._checker: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- lifetime
    async def start(self, _app: web.Application) -> None:
        # No total timeout: a long generation streams for as long as it takes.
        self.session = ClientSession(connector=TCPConnector(limit=0),
                                     timeout=ClientTimeout(total=None, sock_connect=10))
        self._checker = asyncio.create_task(self._check_forever())

    async def cleanup(self, _app: web.Application) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        if self.session is not None:
            await self.session.close()

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests, stop the replicas (each finishes its requests up to the grace
        time, then ends the rest with an error), wait for the forwards to end."""
        self.draining = True
        if self.on_drain is not None:
            self.on_drain()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace_s + 10.0)

    async def _check_forever(self) -> None:
        while True:  # the replicas were healthy at start (ReplicaSet.start waits for it)
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self.check(rep) for rep in self.router.replicas))

    async def check(self, rep: Replica) -> None:
        """One health check of `rep`: in rotation if it answers /health with 200."""
        if rep.process is not None and rep.process.poll() is not None:
            self.router.mark_down(rep, f"its process exited with code {rep.process.returncode}")
            return
        assert self.session is not None
        try:
            async with self.session.get(rep.url + "/health", headers=self.upstream_headers,
                                        timeout=ClientTimeout(total=2)) as resp:
                if resp.status != 200:
                    raise ClientError(f"/health answered {resp.status}")
        except (ClientError, OSError, asyncio.TimeoutError) as exc:
            self.router.mark_down(rep, f"{type(exc).__name__}: {exc}")
            return
        self.router.mark_up(rep)

    # ------------------------------------------------------------------- routes
    async def forward(self, request: web.Request) -> web.StreamResponse:
        if self.draining:
            raise _error("the server is shutting down", 503, "shutting_down")
        check_content_type(request)
        body = await read_body(request, self.limits, self.budget)
        self.num_forwarding += 1
        self._idle.clear()
        held = [len(body)]  # bytes of `budget` this request holds until it was sent

        def sent() -> None:
            self.budget.release(held[0])
            held[0] = 0

        try:
            tried: list[Replica] = []
            last = ""
            while (rep := self.router.pick(tried)) is not None:
                tried.append(rep)
                try:
                    return await self._relay(request, rep, body, sent)
                except _Unreachable as exc:
                    rep.failed += 1
                    self.router.mark_down(rep, str(exc))
                    last = f"replica {rep.index} unavailable: {exc}"
            if last:
                raise _error(last, 502, "replica_unavailable")
            raise _error("no replica is healthy", 503, "no_healthy_replica")
        finally:
            sent()
            self.num_forwarding -= 1
            if self.num_forwarding == 0:
                self._idle.set()

    async def _relay(self, request: web.Request, rep: Replica, body: bytes,
                     sent: Callable[[], None]) -> web.StreamResponse:
        assert self.session is not None
        rep.outstanding += 1
        rep.routed += 1
        try:
            headers = {"Content-Type": "application/json", **self.upstream_headers}
            try:
                upstream = await self.session.post(rep.url + request.path, data=body,
                                                   headers=headers)
            except ClientConnectorError as exc:
                raise _Unreachable(str(exc)) from None
            except (ClientError, OSError, asyncio.TimeoutError) as exc:
                rep.failed += 1
                self.router.mark_down(rep, f"{type(exc).__name__}: {exc}")
                raise _error(f"replica {rep.index} failed: {type(exc).__name__}: {exc}", 502,
                             "replica_failed") from None
            sent()
            complete = False
            try:
                if upstream.status == 200 and upstream.content_type == _SSE:
                    out, complete = await self._pipe_events(request, rep, upstream)
                    return out
                try:
                    data = await upstream.read()
                except (ClientError, OSError, asyncio.TimeoutError) as exc:
                    rep.failed += 1
                    self.router.mark_down(rep, f"{type(exc).__name__}: {exc}")
                    raise _error(f"replica {rep.index} failed while answering: "
                                 f"{type(exc).__name__}: {exc}", 502, "replica_failed") from None
                complete = True
                return web.Response(status=upstream.status, body=data,
                                    content_type=upstream.content_type or "application/json")
            finally:
                if complete:
                    upstream.release()
                else:  # not read to its end: closed, so the replica aborts the request
                    upstream.close()
        finally:
            rep.outstanding -= 1

    async def _pipe_events(self, request: web.Request, rep: Replica,
                           upstream: Any) -> tuple[web.StreamResponse, bool]:
        """Pass the replica's SSE events through whole; end with an error event and [DONE]
        if the replica fails before its own [DONE].  Returns (response, read to the end)."""
        out = web.StreamResponse(headers={"Content-Type": _SSE, "Cache-Control": "no-cache"})
        await out.prepare(request)
        pending, done, failure = b"", False, ""
        while True:
            try:
                piece = await upstream.content.readany()
            except (ClientError, OSError, asyncio.TimeoutError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
                break
            if not piece:
                failure = "" if done else "the replica closed the stream before [DONE]"
                break
            pending += piece
            cut = pending.rfind(b"\n\n")
            if cut >= 0:  # only whole events, so an error event never lands inside one
                events, pending = pending[:cut + 2], pending[cut + 2:]
                try:
                    await out.write(events)
                except ConnectionError:  # the client went away: the caller closes upstream
                    return out, False
                done = done or events.endswith(_DONE)
        if failure:
            rep.failed += 1
            self.router.mark_down(rep, failure)
            err = _error(f"replica {rep.index} failed mid-stream: {failure}", 502,
                         "replica_failed")
            event = b"data: " + json.dumps(err.body()).encode() + b"\n\n"
            with contextlib.suppress(ConnectionError):
                await out.write(event + _DONE)
        with contextlib.suppress(ConnectionError):
            await out.write_eof()
        return out, not failure

    async def models(self, _request: web.Request) -> web.Response:
        assert self.session is not None
        for rep in self.router.replicas:
            if not rep.healthy:
                continue
            with contextlib.suppress(ClientError, OSError, asyncio.TimeoutError):
                async with self.session.get(rep.url + "/v1/models",
                                            headers=self.upstream_headers,
                                            timeout=ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        return web.Response(body=await resp.read(),
                                            content_type="application/json")
        raise _error("no replica is healthy", 503, "no_healthy_replica")

    async def health(self, _request: web.Request) -> web.Response:
        state = {"replicas": [{"index": r.index, "healthy": r.healthy,
                               "error": r.last_error or None} for r in self.router.replicas]}
        if self.draining:
            return error_response(_error("the server is shutting down", 503, "shutting_down"))
        if not any(r.healthy for r in self.router.replicas):
            return error_response(_error("no replica is healthy: " + "; ".join(
                f"replica {r.index}: {r.last_error}" for r in self.router.replicas),
                503, "no_healthy_replica"))
        return web.json_response(state)

    async def metrics(self, _request: web.Request) -> web.Response:
        assert self.session is not None
        texts = []
        for rep in self.router.replicas:
            text = ""  # an unhealthy or unreachable replica contributes no samples
            if rep.healthy:
                with contextlib.suppress(ClientError, OSError, asyncio.TimeoutError):
                    async with self.session.get(rep.url + "/metrics",
                                                headers=self.upstream_headers,
                                                timeout=ClientTimeout(total=5)) as resp:
                        if resp.status == 200:
                            text = await resp.text()
            texts.append(text)
        return web.Response(text=router_metrics(self.router.replicas) + merge_metrics(texts),
                            content_type="text/plain", charset="utf-8")


ROUTER_KEY = web.AppKey("infbench_router", RouterApp)


def create_router_app(router: Router, *, secret: str | None = None,
                      security: Security | None = None, limits: ServerLimits | None = None,
                      health_interval_s: float = 1.0,
                      on_drain: Callable[[], None] | None = None) -> web.Application:
    """The public app in front of the replicas; serve it with
    runtime.serve_app(..., drain=app[ROUTER_KEY].drain)."""
    state = RouterApp(router, secret, limits or ServerLimits(), health_interval_s, on_drain)
    app = web.Application()
    secure_app(app, security or Security())
    app[ROUTER_KEY] = state
    app.on_startup.append(state.start)
    app.on_cleanup.append(state.cleanup)
    app.router.add_post("/v1/completions", state.forward)
    app.router.add_post("/v1/chat/completions", state.forward)
    app.router.add_get("/v1/models", state.models)
    app.router.add_get("/health", state.health)
    app.router.add_get("/metrics", state.metrics)
    return app
