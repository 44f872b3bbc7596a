"""A mock OpenAI-compatible server (aiohttp) with a known streaming schedule.

For the client's tests and its overhead benchmark: it streams `max_tokens` tokens per
request (or `num_tokens` when set) as soon as it can, or with `first_delay_s` before the
first chunk and `token_delay_s` between chunks, `tokens_per_chunk` tokens to a chunk.
Each token's text is one word of `WORDS` with a leading space, which a word-level or BPE
tokenizer encodes as one token.  Every chunk also carries `mock_sent_s`, the server's
`time.perf_counter()` when it wrote the chunk; on Linux that clock is system-wide, so a
client on the same machine can measure its own timestamp error exactly.

`fail_every=k` answers every k-th request with HTTP 500; `send_usage=False` leaves out
the usage chunk (the client then counts tokens itself).  `misbehave` names one of
`MISBEHAVIORS`, a server that gets the protocol wrong in one way (a stream cut short, an
HTML page, a usage of 1e9 tokens, endless keep-alive comments, ...), for the client's
failure tests; with `misbehave_every=k` only every k-th request does.  `received` keeps
the JSON bodies for tests; `reasoning_tokens=r` makes a chat stream a reasoning model's
(r tokens as `delta.reasoning_content`, or `reasoning_field="reasoning"`, then content, with
`usage.completion_tokens_details.reasoning_tokens` unless `reasoning_usage=False`);
`load_delay_s` makes the server slow down with load: every chunk after the first waits that
much longer per other stream in flight (a capacity search needs latency that grows with the
concurrency or the rate); `api_key` answers 401 to requests without that bearer token;
with `log_sends`, GET /mock/sends lists (seed, chunk index, send time) of every chunk
written.  `metrics="vllm"`, `"sglang"`, `"tgi"` or `"llamacpp"` serves GET /metrics under
that server's names (METRICS_KINDS; without it /metrics is a 404): the streams open now as
running requests, up to `metrics_max_running`, the rest as waiting, KV usage
`metrics_kv_per_request` per running request (the kinds that export one), a preemption
every `metrics_preempt_every`-th request, and `metrics_hit_fraction` of every prompt's
tokens counted as prefix-cache hits, so a scrape's summary is known in
advance.  Run it standalone with `python -m infbench.client.mock_server --port 8000`
(`--misbehave NAME` for a bad server, `--metrics vllm` for one with /metrics;
`--reuse-port` lets several such processes share one port).
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
    misbehave: str | None = None  # one of MISBEHAVIORS
    misbehave_every: int = 1  # only every k-th request misbehaves (1: all of them)
    ping_interval_s: float = 0.05  # misbehave "ping_forever": a comment this often
    # A reasoning model (chat only): the first reasoning_tokens tokens of each request are
    # sent as delta.<reasoning_field> (reasoning_content, vLLM's, or reasoning), the rest as
    # delta.content; usage carries completion_tokens_details.reasoning_tokens when
    # reasoning_usage.
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning_content"
    reasoning_usage: bool = True
    api_key: str | None = None  # set: every route but /mock/sends answers 401 without it
    load_delay_s: float = 0.0  # added to each token gap per other stream in flight
    metrics: str | None = None  # one of METRICS_KINDS: GET /metrics with its names
    metrics_max_running: int = 2  # streams beyond this many count as waiting
    metrics_kv_per_request: float = 0.1  # KV usage of one running request
    metrics_hit_fraction: float = 0.25  # prompt tokens counted as prefix-cache hits
    metrics_preempt_every: int = 0  # every k-th request counts one preemption (0: none)


# Ways to get the protocol wrong (misbehave=NAME), each applied to every misbehaving request.
MISBEHAVIORS = {
    "truncate": "3 tokens, then the connection closes: no finish_reason, usage or [DONE]",
    "cut": "3 tokens, then the socket is closed mid-body (no end of the chunked encoding)",
    "no_done": "a whole completion with finish_reason and usage, then a close without [DONE]",
    "no_finish": "tokens, usage and [DONE], but no chunk has a finish_reason",
    "empty": "HTTP 200, Content-Type text/event-stream, an empty body",
    "html": "HTTP 200 with an HTML page",
    "json": "a non-streamed JSON completion (application/json) although stream was asked for",
    "zero_usage": "the tokens, then usage.completion_tokens 0",
    "huge_usage": "the tokens, then usage.completion_tokens 1000000000",
    "choices_int": 'a chunk with "choices": 5',
    "deep_json": "one data line of 100000 nested arrays",
    "big_int": "one data line with a 5000-digit integer",
    "ping_forever": "`: ping` comments every ping_interval_s, never a chunk, never an end",
    "no_newline": "two MiB of data with no line end",
}


METRICS_KINDS = ("vllm", "sglang", "tgi", "llamacpp")


@dataclass
class _ServerState:
    """The counters the mock's /metrics reports, since the start."""

    num_requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: float = 0.0
    preemptions: int = 0


def _metrics_text(config: MockConfig, state: _ServerState, open_streams: int) -> str:
    """The Prometheus text a vLLM or SGLang server would send with `open_streams` streams
    being written and `state`'s counters (a histogram included, as the real ones have)."""
    running = min(open_streams, config.metrics_max_running)
    waiting = open_streams - running
    kv = running * config.metrics_kv_per_request
    queries = state.prompt_tokens
    rate = state.hit_tokens / queries if queries else 0.0
    if config.metrics == "vllm":
        label = 'engine="0",model_name="mock-model"'
        rows = [("vllm:num_requests_running", "gauge", running),
                ("vllm:num_requests_waiting", "gauge", waiting),
                ("vllm:kv_cache_usage_perc", "gauge", kv),
                ("vllm:num_preemptions_total", "counter", state.preemptions),
                ("vllm:prefix_cache_queries_total", "counter", queries),
                ("vllm:prefix_cache_hits_total", "counter", state.hit_tokens),
                ("vllm:request_success_total", "counter", state.num_requests)]
        hist = "vllm:time_to_first_token_seconds"
    elif config.metrics == "sglang":
        label = 'model_name="mock-model"'
        rows = [("sglang:num_running_reqs", "gauge", running),
                ("sglang:num_queue_reqs", "gauge", waiting),
                ("sglang:token_usage", "gauge", kv),
                ("sglang:cache_hit_rate", "gauge", rate),
                ("sglang:num_retracted_requests_total", "counter", state.preemptions),
                ("sglang:prompt_tokens_total", "counter", queries),
                ("sglang:cached_tokens_total", "counter", state.hit_tokens)]
        hist = "sglang:time_to_first_token_seconds"
    elif config.metrics == "tgi":  # no labels, counters without _total (metrics-rs)
        label = ""
        rows = [("tgi_batch_current_size", "gauge", running),
                ("tgi_queue_size", "gauge", waiting),
                ("tgi_request_success", "counter", state.num_requests)]
        hist = "tgi_request_duration"
    elif config.metrics == "llamacpp":
        label = ""
        rows = [("llamacpp:requests_processing", "gauge", running),
                ("llamacpp:requests_deferred", "gauge", waiting),
                ("llamacpp:kv_cache_usage_ratio", "gauge", kv),
                ("llamacpp:prompt_tokens_total", "counter", queries)]
        hist = ""
    else:
        raise ValueError(f"metrics: unknown value {config.metrics!r}; allowed: "
                         f"{', '.join(METRICS_KINDS)}")
    labels = f"{{{label}}}" if label else ""
    lines = []
    for name, kind, value in rows:
        family = name.removesuffix("_total")
        lines += [f"# HELP {family} mock {kind}", f"# TYPE {family} {kind}",
                  f"{name}{labels} {float(value)!r}"]
    if hist:  # llama.cpp's server exports no histogram
        sep = f"{label}," if label else ""
        lines += [f"# HELP {hist} mock histogram", f"# TYPE {hist} histogram",
                  f'{hist}_bucket{{{sep}le="0.1"}} 0.0',
                  f'{hist}_bucket{{{sep}le="+Inf"}} {float(state.num_requests)!r}',
                  f"{hist}_sum{labels} 0.0", f"{hist}_count{labels} "
                  f"{float(state.num_requests)!r}"]
    return "\n".join(lines) + "\n"


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
    in_flight = [0]  # streams being written (load_delay_s)
    state = _ServerState()

    def refused(request: web.Request) -> web.Response | None:
        if config.api_key is None or request.headers.get("Authorization") == \
                f"Bearer {config.api_key}":
            return None
        return web.json_response({"error": {"message": "invalid API key"}}, status=401)

    async def models(request: web.Request) -> web.Response:
        if (no := refused(request)) is not None:
            return no
        return web.json_response({"object": "list", "data": [
            {"id": config.model, "object": "model", "owned_by": "infbench-mock",
             "max_model_len": 4096}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        if (no := refused(request)) is not None:
            return no
        body = await request.json()
        count[0] += 1
        if config.keep_bodies:
            config.received.append(body)
        if config.fail_every and count[0] % config.fail_every == 0:
            return web.json_response({"error": {"message": "mock failure"}}, status=500)
        chat = request.path.endswith("/chat/completions")
        n = config.num_tokens if config.num_tokens is not None else int(body["max_tokens"])
        if config.misbehave is not None and count[0] % max(1, config.misbehave_every) == 0:
            return await _misbehave(request, config, chat, n, count[0])
        state.num_requests += 1
        state.prompt_tokens += _prompt_tokens(body)
        state.hit_tokens += _prompt_tokens(body) * config.metrics_hit_fraction
        if config.metrics_preempt_every and count[0] % config.metrics_preempt_every == 0:
            state.preemptions += 1
        in_flight[0] += 1
        try:
            return await _stream(request, config, body, chat, n, count[0], in_flight)
        finally:
            in_flight[0] -= 1

    async def metrics(request: web.Request) -> web.Response:
        if (no := refused(request)) is not None:
            return no
        return web.Response(text=_metrics_text(config, state, in_flight[0]),
                            content_type="text/plain")

    async def sends(_request: web.Request) -> web.Response:
        return web.json_response(config.sends)

    app = web.Application()
    app.router.add_get("/mock/sends", sends)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    if config.metrics is not None:
        app.router.add_get("/metrics", metrics)
    return app


async def _stream(request: web.Request, config: MockConfig, body: dict[str, Any], chat: bool,
                  n: int, number: int, in_flight: list[int]) -> web.StreamResponse:
    """One well-behaved completion stream of n tokens on the configured schedule."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    k = max(1, config.tokens_per_chunk)
    sent = 0
    base = {"id": f"cmpl-{number}", "object": "chat.completion.chunk" if chat
            else "text_completion", "model": config.model}
    start = time.perf_counter()
    # Under load each gap also waits load_delay_s per other stream at that moment, summed
    # from the start as the plain schedule is, so a late wake-up does not push every later
    # chunk.
    gaps, loaded = 0, 0.0
    while sent < n:
        if sent // k > gaps:
            loaded += config.load_delay_s * max(0, in_flight[0] - 1) * (sent // k - gaps)
            gaps = sent // k
        due = start + config.first_delay_s + config.token_delay_s * gaps + loaded
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        # a chunk is all reasoning or all content: it ends where the reasoning does
        end = min(sent + k, n)
        is_reasoning = chat and sent < config.reasoning_tokens
        if is_reasoning:
            end = min(end, config.reasoning_tokens)
        text = "".join(_word(i) for i in range(sent, end))
        sent = end
        finish = "length" if sent == n else None
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            key = config.reasoning_field if is_reasoning else "content"
            choice["delta"] = {key: text}
        else:
            choice["text"] = text
        now = time.perf_counter()
        if config.log_sends:
            config.sends.append((body.get("seed"), (sent - 1) // k, now))
        event = {**base, "choices": [choice], "mock_sent_s": now}
        await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    if config.send_usage and (body.get("stream_options") or {}).get("include_usage"):
        usage: dict[str, Any] = {"prompt_tokens": _prompt_tokens(body),
                                 "completion_tokens": n,
                                 "total_tokens": _prompt_tokens(body) + n}
        if chat and config.reasoning_tokens and config.reasoning_usage:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": min(n, config.reasoning_tokens)}
        await resp.write(b"data: " + json.dumps({**base, "choices": [], "usage": usage})
                         .encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _chunk(chat: bool, text: str, finish: str | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    return {"id": "cmpl-bad", "object": "chat.completion.chunk" if chat else
            "text_completion", "model": MOCK_MODEL, "choices": [choice]}


def _data(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


async def _misbehave(request: web.Request, config: MockConfig, chat: bool, n: int,
                     number: int) -> web.StreamResponse:
    """Answer one request the way `config.misbehave` names (see MISBEHAVIORS)."""
    how = config.misbehave
    if how not in MISBEHAVIORS:
        raise ValueError(f"misbehave: unknown value {how!r}; allowed: {', '.join(MISBEHAVIORS)}")
    if how == "html":
        return web.Response(text="<html><body><h1>502 Bad Gateway</h1></body></html>",
                            content_type="text/html")
    if how == "json":
        return web.json_response({"id": f"cmpl-{number}", "object": "text_completion",
                                  "model": config.model, "choices": [
                                      {"index": 0, "text": "".join(_word(i) for i in range(n)),
                                       "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 4, "completion_tokens": n,
                                            "total_tokens": 4 + n}})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if how == "ping_forever":
        while True:
            await resp.write(b": ping\n\n")
            await asyncio.sleep(config.ping_interval_s)
    events: list[Any] = []
    usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
    tokens = [_chunk(chat, _word(i), "length" if i == n - 1 and how != "no_finish" else None)
              for i in range(n)]
    if how in ("truncate", "cut"):
        events = [_chunk(chat, _word(i), None) for i in range(min(3, n - 1))]
    elif how in ("no_done", "no_finish"):
        events = [*tokens, {"choices": [], "usage": usage}]
    elif how in ("zero_usage", "huge_usage"):
        count = 0 if how == "zero_usage" else 10**9
        events = [*tokens, {"choices": [], "usage": {**usage, "completion_tokens": count}}]
    elif how == "choices_int":
        events = [tokens[0], {**tokens[1 % n], "choices": 5}]
    elif how == "deep_json":
        events = [tokens[0], b"[" * 100_000 + b"]" * 100_000]
    elif how == "big_int":
        events = [tokens[0], b'{"choices": [], "usage": {"completion_tokens": '
                  + b"7" * 5000 + b"}}"]
    elif how == "no_newline":
        events = [tokens[0]]
    for event in events:
        await resp.write(_data(event))
    if how == "no_newline":
        await resp.write(b"data: " + b"x" * (2 * 2**20))
    if how == "cut" and request.transport is not None:
        request.transport.close()
        return resp
    if how not in ("truncate", "no_done", "empty", "no_newline"):
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


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
    parser.add_argument("--load-delay-s", type=float, default=0.0,
                        help="Add this to each token gap per other stream in flight.")
    parser.add_argument("--no-usage", action="store_true", help="Send no usage chunk.")
    parser.add_argument("--log-sends", action="store_true",
                        help="Keep every chunk's send time for GET /mock/sends.")
    parser.add_argument("--misbehave", choices=sorted(MISBEHAVIORS), default=None,
                        help="Get the protocol wrong this way (see MISBEHAVIORS).")
    parser.add_argument("--misbehave-every", type=int, default=1,
                        help="Only every k-th request misbehaves.")
    parser.add_argument("--reasoning-tokens", type=int, default=0,
                        help="Chat: send each request's first N tokens as reasoning.")
    parser.add_argument("--metrics", choices=METRICS_KINDS, default=None,
                        help="Serve GET /metrics under vLLM's, SGLang's, TGI's or llama.cpp's "
                             "names.")
    parser.add_argument("--reasoning-field", choices=("reasoning_content", "reasoning"),
                        default="reasoning_content")
    parser.add_argument("--reuse-port", action="store_true",
                        help="SO_REUSEPORT: several mock processes share --port (the kernel "
                             "spreads connections over them; benchmarks/client_workers.py).")
    args = parser.parse_args()
    config = MockConfig(reasoning_tokens=args.reasoning_tokens,
                        reasoning_field=args.reasoning_field, num_tokens=args.num_tokens,
                        tokens_per_chunk=args.tokens_per_chunk,
                        first_delay_s=args.first_delay_s, token_delay_s=args.token_delay_s,
                        load_delay_s=args.load_delay_s,
                        keep_bodies=False, log_sends=args.log_sends,
                        send_usage=not args.no_usage, misbehave=args.misbehave,
                        misbehave_every=args.misbehave_every, metrics=args.metrics)
    web.run_app(make_app(config), host=args.host, port=args.port, access_log=None,
                reuse_port=args.reuse_port or None,
                print=lambda msg: print(msg, flush=True))


if __name__ == "__main__":
    main()
