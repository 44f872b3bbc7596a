"""A mock OpenAI-compatible server (aiohttp) with a known streaming schedule.

For the client's tests and its overhead benchmark: it streams `max_tokens` tokens per
request (or `num_tokens` when set) as soon as it can, or with `first_delay_s` before the
first chunk and `token_delay_s` between chunks, `tokens_per_chunk` tokens to a chunk.
Each token's text is one word of `WORDS` with a leading space, which a word-level or BPE
tokenizer encodes as one token.  Every chunk also carries `mock_sent_s`, the server's
`time.perf_counter()` when it wrote the chunk; on Linux that clock is system-wide, so a
client on the same machine can measure its own timestamp error exactly.

`fail_every=k` answers every k-th request with HTTP 500; `send_usage=False` leaves out
the usage chunk (the client then counts tokens itself).  `received` keeps the JSON bodies
for tests; with `log_sends`, GET /mock/sends lists (seed, chunk index, send time) of every
chunk written.  Run it standalone with `python -m infbench.client.mock_server --port 8000`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept")
MOCK_MODEL = "mock-model"


@dataclass
class MockConfig:
    num_tokens: int | None = None  # tokens per request; None: the request's max_tokens
    tokens_per_chunk: int = 1
    first_delay_s: float = 0.0
    token_delay_s: float = 0.0
    fail_every: int = 0  # every k-th request answers HTTP 500 (0: never)
    send_usage: bool = True
    model: str = MOCK_MODEL
    received: list[dict[str, Any]] = field(default_factory=list)
    keep_bodies: bool = True
    # (request seed, chunk index, perf_counter when written) of every chunk, when asked:
    # GET /mock/sends returns them (the overhead benchmark's reference schedule).
    log_sends: bool = False
    sends: list[tuple[Any, int, float]] = field(default_factory=list)


def _word(i: int) -> str:
    return " " + WORDS[i % len(WORDS)]


def _prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or ())


def make_app(config: MockConfig) -> web.Application:
    count = [0]

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": config.model, "object": "model", "owned_by": "infbench-mock",
             "max_model_len": 4096}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        count[0] += 1
        if config.keep_bodies:
            config.received.append(body)
        if config.fail_every and count[0] % config.fail_every == 0:
            return web.json_response({"error": {"message": "mock failure"}}, status=500)
        chat = request.path.endswith("/chat/completions")
        n = config.num_tokens if config.num_tokens is not None else int(body["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        start = time.perf_counter()
        k = max(1, config.tokens_per_chunk)
        sent = 0
        base = {"id": f"cmpl-{count[0]}", "object": "chat.completion.chunk" if chat
                else "text_completion", "model": config.model}
        while sent < n:
            due = start + config.first_delay_s + config.token_delay_s * (sent // k)
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            text = "".join(_word(i) for i in range(sent, min(sent + k, n)))
            sent = min(sent + k, n)
            finish = "length" if sent == n else None
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            now = time.perf_counter()
            if config.log_sends:
                config.sends.append((body.get("seed"), (sent - 1) // k, now))
            event = {**base, "choices": [choice], "mock_sent_s": now}
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        if config.send_usage and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": _prompt_tokens(body), "completion_tokens": n,
                     "total_tokens": _prompt_tokens(body) + n}
            await resp.write(b"data: " + json.dumps({**base, "choices": [], "usage": usage})
                             .encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def sends(_request: web.Request) -> web.Response:
        return web.json_response(config.sends)

    app = web.Application()
    app.router.add_get("/mock/sends", sends)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


class MockServer:
    """The mock on its own thread and event loop: `with MockServer(cfg) as s: s.base_url`."""

    def __init__(self, config: MockConfig | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.config = config or MockConfig()
        self.host, self.port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> MockServer:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("mock server did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=10)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(make_app(self.config), access_log=None)
        loop.run_until_complete(runner.setup())
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))  # port 0: the OS picks a free one
        self.port = int(sock.getsockname()[1])
        loop.run_until_complete(web.SockSite(runner, sock).start())
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--num-tokens", type=int, default=None)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--first-delay-s", type=float, default=0.0)
    parser.add_argument("--token-delay-s", type=float, default=0.0)
    parser.add_argument("--no-usage", action="store_true", help="Send no usage chunk.")
    parser.add_argument("--log-sends", action="store_true",
                        help="Keep every chunk's send time for GET /mock/sends.")
    args = parser.parse_args()
    config = MockConfig(num_tokens=args.num_tokens, tokens_per_chunk=args.tokens_per_chunk,
                        first_delay_s=args.first_delay_s, token_delay_s=args.token_delay_s,
                        keep_bodies=False, log_sends=args.log_sends,
                        send_usage=not args.no_usage)
    web.run_app(make_app(config), host=args.host, port=args.port, access_log=None,
                print=lambda msg: print(msg, flush=True))


if __name__ == "__main__":
    main()
