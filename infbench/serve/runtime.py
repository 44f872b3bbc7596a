"""Listening, connection hygiene and shutdown for the server and the router.

aiohttp's protocol handler answers a malformed request (a bad request line, a header over
8190 bytes, more than 128 headers) with a plain-text 400 and logs a traceback for each;
`HardenedHandler` answers the same status as an OpenAI error object and logs one line.
It also caps open connections (the next one gets a 503 and is closed at once) and closes a
connection that has not sent a whole request head within `header_timeout_s` (aiohttp's
keep-alive timeout covers the idle time between later requests).

`serve_app` runs an app until `stop` is set, then: stop listening, `drain` (the app's own
shutdown: finish what is in flight up to the grace time, then end the rest with an error
event or a 503), then close every connection.  `run_server` does that in a fresh event
loop until SIGTERM or SIGINT; a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from infbench.serve.limits import ServerLimits
from infbench.serve.protocol import ApiError
from infbench.serve.security import LOG, SERVER_NAME

Drain = Callable[[float], Awaitable[None]]
LINGER_S = 1.0


def _busy_response() -> bytes:
    body = json.dumps(ApiError("the server has too many open connections; retry shortly",
                               status=503, type_="server_error",
                               code="too_many_connections").body()).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nServer: {SERVER_NAME}\r\n"
            "Retry-After: 1\r\n\r\n").encode()
    return head + body


_BUSY = _busy_response()


class HardenedHandler(RequestHandler):
    """aiohttp's per-connection protocol with the limits of the module docstring."""

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop,
                 limits: ServerLimits) -> None:
        # lingering_time: after refusing a body unread (413, 415), read and drop what the
        # client still sends for at most a second, so it sees the answer, then close.
        super().__init__(manager, loop=loop, keepalive_timeout=limits.keepalive_timeout_s,
                         logger=LOG, access_log=None,  # type: ignore[arg-type]
                         lingering_time=LINGER_S)
        self.limits = limits
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager = self._manager
        if manager is not None and len(manager.connections) >= self.limits.max_connections:
            # Refused before aiohttp registers it: answer and half-close; what the client
            # sends is dropped (closing with it unread would reset the connection, and the
            # client could lose the answer), and the socket is closed a moment later.
            self._force_close = True
            tr: Any = transport
            tr.write(_BUSY)
            if tr.can_write_eof():
                tr.write_eof()
            self._loop.call_later(LINGER_S, tr.close)
            self._manager = None  # connection_lost then has nothing to unregister
            return
        super().connection_made(transport)
        self._head_timer = self._loop.call_later(self.limits.header_timeout_s,
                                                 self._head_deadline)

    def _head_deadline(self) -> None:
        self._head_timer = None
        # _request_count: heads parsed on this connection (aiohttp's; 1 where it is absent,
        # so an older aiohttp never has a working connection closed by this timer)
        if getattr(self, "_request_count", 1) == 0 and not self._force_close:
            LOG.info("closed a connection that sent no request within %g s",
                     self.limits.header_timeout_s)
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse (4xx), or a handler's uncaught error (500)."""
        remote = getattr(request, "remote", None) or "?"
        if isinstance(exc, ConnectionError):  # the client went away while being answered
            LOG.debug("client %s went away: %s", remote, exc)
            raise ConnectionError("the client went away")
        if status >= 500:
            LOG.error("internal error handling a request from %s", remote, exc_info=exc)
            text = "internal server error"
        else:
            text = " ".join(str(message or exc or "bad request").split())[:300]
            LOG.info("malformed HTTP request from %s: %d %s", remote, status, text)
        if request.writer.output_size > 0:  # the response started: nothing else can be sent
            raise ConnectionError("the response was sent already")
        err = ApiError(text, status=status,
                       type_="server_error" if status >= 500 else "invalid_request_error",
                       code="malformed_http_request" if status < 500 else None)
        resp = web.json_response(err.body(), status=status, headers={"Server": SERVER_NAME})
        resp.force_close()
        return resp


async def serve_app(app: web.Application, host: str, port: int, *, stop: asyncio.Event,
                    limits: ServerLimits | None = None,
                    ready: Callable[[int], None] | None = None,
                    shutdown_timeout: float = 30.0, drain: Drain | None = None) -> None:
    """Serve `app` on host:port until `stop` is set, then shut down as the module docstring
    says.  `ready` gets the port bound (useful with port 0)."""
    limits = limits or ServerLimits()
    # With a drain, the handlers are done (or being ended) when the runner's own shutdown
    # starts, so it waits only briefly for writes to finish before closing connections.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0 if drain else shutdown_timeout)
    await runner.setup()
    loop = asyncio.get_running_loop()
    server = runner.server
    assert server is not None
    listener: asyncio.Server | None = None
    try:
        listener = await loop.create_server(
            lambda: HardenedHandler(server, loop=loop, limits=limits), host or None, port,
            reuse_address=True, backlog=min(limits.max_connections, 1024))
        if ready is not None:
            ready(int(listener.sockets[0].getsockname()[1]))
        await stop.wait()
        listener.close()  # no new connections; open ones get 503 while draining
        if drain is not None:
            await drain(shutdown_timeout)
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()


def run_server(app: web.Application, host: str, port: int, *, shutdown_timeout: float,
               limits: ServerLimits | None = None, ready: Callable[[int], None] | None = None,
               drain: Drain | None = None) -> None:
    """`serve_app` in a new event loop until SIGINT or SIGTERM; a second one exits now.
    Refused requests and replica changes are logged on stderr, one line each."""
    if not LOG.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("infbench serve: %(message)s"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)
        LOG.propagate = False

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set():
                print(f"infbench serve: {sig.name} again, exiting now", file=sys.stderr,
                      flush=True)
                os._exit(128 + sig.value)
            print(f"infbench serve: {sig.name}, stopping: requests in flight get up to "
                  f"{shutdown_timeout:g} s (Ctrl-C again exits now)", file=sys.stderr,
                  flush=True)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        await serve_app(app, host, port, stop=stop, limits=limits, ready=ready,
                        shutdown_timeout=shutdown_timeout, drain=drain)

    asyncio.run(main())
