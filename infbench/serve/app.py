"""The aiohttp application: OpenAI routes over one `EngineLoop`, plus health and metrics.

Each generation request is parsed (protocol.py), submitted to the engine loop, and its
per-step updates turned into text (detokenize.py): collected into one JSON body, or
written as server-sent events (`data: {...}` chunks, then `data: [DONE]`) as they come.
Whatever way a handler ends (finished, client gone, cancelled, error), its `finally`
closes the stream, which aborts a request still in the engine and frees its KV blocks;
run the app with `handler_cancellation=True` so that a client that disconnects while
waiting for a non-streamed answer cancels its handler too.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Callable
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
from infbench.serve.metrics import ServerMetrics
from infbench.serve.protocol import (
    ApiError,
    ChoiceResult,
    GenerationParams,
    ModelContext,
    chunk,
    parse_chat,
    parse_completion,
    response,
    usage_chunk,
)

MAX_BODY_BYTES = 64 << 20  # long prompts given as token ids are large JSON

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
            raise ApiError(event.message, status=event.status,
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
    """The routes' state: the engine loop, the model's context and the metrics."""

    def __init__(self, loop: EngineLoop, ctx: ModelContext, metrics: ServerMetrics) -> None:
        self.loop, self.ctx, self.metrics = loop, ctx, metrics
        self.created = int(time.time())

    # ------------------------------------------------------------ plain routes
    async def health(self, request: web.Request) -> web.Response:
        if self.loop.error is not None:
            return web.Response(status=503, text=self.loop.error)
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
        try:
            body = await _read_json(request)
            params = (parse_chat if kind == "chat" else parse_completion)(body, self.ctx)
            request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
            req = Request(request_id, params.prompt_ids, params.sampling, n=params.sampling.n)
            stream = self.loop.submit(req)
        except ApiError as exc:
            return _error(exc)
        except QueueFull as exc:
            return _error(ApiError(str(exc), status=429, type_="rate_limit_error",
                                   code="queue_full"))
        except ShuttingDown as exc:
            return _error(ApiError(str(exc), status=503, type_="server_error"))
        gen = _Generation(params, stream, self.loop, self.ctx, self.metrics)
        try:
            if params.stream:
                return await self._stream(request, gen, request_id)
            while not gen.is_done:
                await gen.next_deltas()
            return web.json_response(response(params, request_id, int(time.time()),
                                              self.ctx.name, gen.choices()))
        except ApiError as exc:
            return _error(exc)
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


SERVER_KEY = web.AppKey("infbench_server", Server)


async def _read_json(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}") from None


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(exc: ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


def create_app(loop: EngineLoop, ctx: ModelContext, *,
               start_engine: bool = True) -> web.Application:
    """The application; on startup it starts `loop`'s worker (unless `start_engine` is
    False: a test starts it), on cleanup it stops it after the handlers have finished."""
    metrics = ServerMetrics(ctx.name, lambda: loop.stats)
    server = Server(loop, ctx, metrics)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
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


async def serve_app(app: web.Application, host: str, port: int, *, stop: asyncio.Event,
                    ready: Callable[[int], None] | None = None,
                    shutdown_timeout: float = 30.0) -> None:
    """Serve `app` on host:port until `stop` is set, then shut down cleanly: stop
    listening, give in-flight requests `shutdown_timeout` seconds to finish (then cancel
    them, which aborts them in the engine), stop the engine loop.  `ready` gets the port
    bound (useful with port 0)."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=shutdown_timeout,
                           access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        if ready is not None:
            ready(int(runner.addresses[0][1]))
        await stop.wait()
    finally:
        await runner.cleanup()


def run_server(app: web.Application, host: str, port: int, *, shutdown_timeout: float,
               ready: Callable[[int], None] | None = None) -> None:
    """`serve_app` in a new event loop until SIGINT or SIGTERM."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_app(app, host, port, stop=stop, ready=ready,
                        shutdown_timeout=shutdown_timeout)

    asyncio.run(main())
