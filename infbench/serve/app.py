"""The aiohttp application: OpenAI routes over one `EngineLoop`, plus health and metrics.

Each generation request is parsed (protocol.py), submitted to the engine loop, and its
per-step updates turned into text (detokenize.py): collected into one JSON body, or
written as server-sent events (`data: {...}` chunks, then `data: [DONE]`) as they come.
Whatever way a handler ends (finished, client gone, cancelled, error), its `finally`
closes the stream, which aborts a request still in the engine and frees its KV blocks;
run the app with `handler_cancellation=True` (runtime.serve_app does) so that a client
that disconnects while waiting for a non-streamed answer cancels its handler too.

Bodies are read and parsed within the limits of limits.py; access (key, Host) and errors
as OpenAI objects are security.py's middlewares.  On shutdown `Server.drain` lets the
requests in flight finish up to the grace time, then ends each with a 503: an SSE error
event and `[DONE]` for a stream, an error object for a whole response.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Literal

from aiohttp import web

from infbench.engine.request import Request
from infbench.serve.detokenize import SampleText
from infbench.serve.engine_loop import (
    EngineLoop,
    QueueFull,
    RequestStream,
    SampleUpdate,
    ShuttingDown,
    StreamError,
)
from infbench.serve.limits import BodyBudget, ServerLimits, parse_body
from infbench.serve.metrics import ServerMetrics
from infbench.serve.protocol import (
    ApiError,
    GenerationParams,
    ModelContext,
    parse_chat,
    parse_completion,
)
from infbench.serve.responses import ChoiceResult, chunk, response, usage_chunk
from infbench.serve.security import LOG, Security, error_response, secure_app

Delta = tuple[int, str, list[int], str | None]  # (sample index, text, token ids, finish)


class _Generation:
    """One request's samples on the asyncio side: text, finish reasons, latencies."""

    def __init__(self, params: GenerationParams, stream: RequestStream, loop: EngineLoop,
                 ctx: ModelContext, metrics: ServerMetrics) -> None:
        self.params, self.stream, self.loop, self.metrics = params, stream, loop, metrics
        n = params.sampling.n
        self.samples = [SampleText(ctx.tokenizer, params.stop) for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.last_token_s: float | None = None  # when the previous token batch arrived

    @property
    def is_done(self) -> bool:
        return all(f is not None for f in self.finish)

    async def next_deltas(self) -> list[Delta]:
        """Wait for the engine's next step of this request; raise ApiError if it failed."""
        event = await self.stream.events.get()
        if isinstance(event, StreamError):
            raise ApiError(event.message, status=event.status, code=event.code,
                           type_="server_error" if event.status >= 500 else
                           "invalid_request_error")
        self._observe_latency(event)
        return [d for d in (self._apply(u) for u in event) if d is not None]

    def _observe_latency(self, updates: list[SampleUpdate]) -> None:
        if not any(u.token_ids for u in updates):
            return
        now = time.perf_counter()
        if self.last_token_s is None:
            self.metrics.ttft.observe(now - self.stream.arrival_s)
        else:
            self.metrics.itl.observe(now - self.last_token_s)
        self.last_token_s = now

    def _apply(self, update: SampleUpdate) -> Delta | None:
        i = update.index
        if self.finish[i] is not None:
            return None  # cut by a stop string already; the engine's late tokens are dropped
        text = self.samples[i]
        new: list[int] = []
        for token in update.token_ids:
            new.append(token)
            if text.add(token):
                self.finish[i] = "stop"
                if update.finish_reason is None:
                    self.loop.finish_sample(self.stream, i)  # the engine stops it too
                else:
                    self.stream.num_done += 1
                break
        if self.finish[i] is None and update.finish_reason is not None:
            text.finish()
            self.finish[i] = "stop" if text.stopped else update.finish_reason
            self.stream.num_done += 1
        return i, text.take(final=self.finish[i] is not None), new, self.finish[i]

    def choices(self) -> list[ChoiceResult]:
        return [ChoiceResult(i, s.text, list(s.token_ids), f or "length")
                for i, (s, f) in enumerate(zip(self.samples, self.finish, strict=True))]

    def num_completion_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)

    def record(self) -> None:
        """Count the request in the metrics (once, however it ended)."""
        if not self.is_done:
            reason = "abort"
        else:
            reason = "stop" if "stop" in self.finish else "length"
        end = self.last_token_s if self.last_token_s is not None else time.perf_counter()
        self.metrics.finish_request(reason, len(self.params.prompt_ids),
                                    self.num_completion_tokens(), end - self.stream.arrival_s)


class Server:
    """The routes' state: the engine loop, the model's context, the metrics, the limits."""

    def __init__(self, loop: EngineLoop, ctx: ModelContext, metrics: ServerMetrics,
                 limits: ServerLimits) -> None:
        self.loop, self.ctx, self.metrics, self.limits = loop, ctx, metrics, limits
        self.budget = BodyBudget(limits.max_body_bytes_in_flight)
        self.created = int(time.time())
        self.draining = False
        self.num_handlers = 0  # generation handlers running (reading, waiting, streaming)
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------ plain routes
    async def health(self, request: web.Request) -> web.Response:
        reason = self.loop.error or ("the server is shutting down" if self.draining else None)
        if reason is not None:
            return error_response(ApiError(reason, status=503, type_="server_error"))
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.ctx.name, "object": "model", "created": self.created,
                "owned_by": "infbench", "root": self.ctx.name,
                "max_model_len": self.ctx.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(), content_type="text/plain",
                            charset="utf-8", headers={"X-Content-Format": "version=0.0.4"})

    # -------------------------------------------------------------- generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request,
                        kind: Literal["completion", "chat"]) -> web.StreamResponse:
        self.num_handlers += 1
        self._idle.clear()
        try:
            return await self._generate_one(request, kind)
        finally:
            self.num_handlers -= 1
            if self.num_handlers == 0:
                self._idle.set()

    async def _generate_one(self, request: web.Request,
                            kind: Literal["completion", "chat"]) -> web.StreamResponse:
        parse = parse_chat if kind == "chat" else parse_completion
        try:
            if self.draining:
                raise ShuttingDown("the server is shutting down")
            params = await parse_body(request, self.limits, self.budget,
                                      lambda body: parse(body, self.ctx))
            request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
            req = Request(request_id, params.prompt_ids, params.sampling, n=params.sampling.n)
            stream = self.loop.submit(req)
        except QueueFull as exc:
            raise ApiError(str(exc), status=429, type_="rate_limit_error",
                           code="queue_full") from None
        except ShuttingDown as exc:
            raise ApiError(str(exc), status=503, type_="server_error",
                           code="shutting_down") from None
        gen = _Generation(params, stream, self.loop, self.ctx, self.metrics)
        try:
            if params.stream:
                return await self._stream(request, gen, request_id)
            while not gen.is_done:
                await gen.next_deltas()
            return web.json_response(response(params, request_id, int(time.time()),
                                              self.ctx.name, gen.choices()))
        finally:
            self.loop.close(stream)
            gen.record()

    async def _stream(self, request: web.Request, gen: _Generation,
                      request_id: str) -> web.StreamResponse:
        params, name, created = gen.params, self.ctx.name, int(time.time())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            if params.kind == "chat":
                await resp.write(b"".join(
                    _sse(chunk(params, request_id, created, name, i, "", [], None, role=True))
                    for i in range(params.sampling.n)))
            while not gen.is_done:
                try:
                    deltas = await gen.next_deltas()
                except ApiError as exc:
                    await resp.write(_sse(exc.body()) + b"data: [DONE]\n\n")
                    await resp.write_eof()
                    return resp
                # A step that only added part of a character, or text held back as a
                # possible stop string, sends nothing (unless token ids are asked for).
                data = b"".join(_sse(chunk(params, request_id, created, name, i, text, ids, fin))
                                for i, text, ids, fin in deltas
                                if text or fin or (ids and params.return_token_ids))
                if data:
                    await resp.write(data)
            tail = b""
            if params.include_usage:
                tail = _sse(usage_chunk(params, request_id, created, name,
                                        gen.num_completion_tokens()))
            await resp.write(tail + b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the client went away: `finally` above aborts
            pass
        return resp

    # ---------------------------------------------------------------- shutdown
    async def drain(self, grace_s: float) -> None:
        """Refuse new requests (503), give those in flight `grace_s` seconds, then end the
        rest with a 503 (an SSE error event and [DONE] for a stream) and wait for their
        handlers to write it."""
        self.draining = True
        self.loop.stop_accepting()
        if await self._wait_idle(grace_s):
            return
        num = self.loop.fail_all(f"the server is shutting down: the request did not finish "
                                 f"within the shutdown timeout ({grace_s:g} s)", 503,
                                 "shutting_down")
        LOG.warning("shutdown: %d requests did not finish within %g s; ended with a 503",
                    num, grace_s)
        await self._wait_idle(5.0)

    async def _wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False


SERVER_KEY = web.AppKey("infbench_server", Server)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def create_app(loop: EngineLoop, ctx: ModelContext, *, start_engine: bool = True,
               security: Security | None = None,
               limits: ServerLimits | None = None) -> web.Application:
    """The application; on startup it starts `loop`'s worker (unless `start_engine` is
    False: a test starts it), on cleanup it stops it after the handlers have finished.
    Serve it with runtime.serve_app(..., drain=app[SERVER_KEY].drain)."""
    metrics = ServerMetrics(ctx.name, lambda: loop.stats)
    server = Server(loop, ctx, metrics, limits or ServerLimits())
    app = web.Application()  # bodies are read by limits.read_body, not client_max_size
    secure_app(app, security or Security())
    app[SERVER_KEY] = server
    app.router.add_get("/health", server.health)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/metrics", server.metrics_text)
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_post("/v1/chat/completions", server.chat_completions)

    async def on_startup(_app: web.Application) -> None:
        if start_engine:
            loop.start(asyncio.get_running_loop())

    async def on_cleanup(_app: web.Application) -> None:
        await loop.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
