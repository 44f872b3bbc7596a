"""Run a workload's requests against an OpenAI-compatible server, streamed, into RequestRecords.

One asyncio event loop and one aiohttp `ClientSession` whose connection pool is sized to
the concurrency.  Each request is launched at its workload arrival time (`arrival_s`
after the run's start; with a concurrency cap, when a slot frees up, and then its TTFT
counts from that submission, as vLLM's benchmark does), posts a streaming completion with
`stream_options.include_usage`, and reads the SSE stream incrementally.  The hot loop only
timestamps byte pieces and keeps the content chunks; tokens are counted and placed on the
timeline after the stream ends (client/tokens.py), so counting costs no timing accuracy.

A request that fails becomes a `Failure` with a reason (client/failures.py) instead of a
record: an HTTP status, a broken connection, a read timeout (`target.timeout_s` between two
pieces), the request's deadline (`target.request_timeout_s` from sending to `[DONE]`, so
keep-alive comments cannot hold a request open forever), a response that is not an event
stream, a chunk whose fields fail client/stream.py's checks, a stream that ends before
`[DONE]` or without a finish_reason, or usage counts that disagree with the chunks.  The
caller decides what an all-failed run means.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from infbench.client.failures import RequestFailed
from infbench.client.sse import DONE, SSEError, SSEParser
from infbench.client.stream import Stream
from infbench.client.tokens import chunk_token_counts, split_counts, token_times
from infbench.engine.records import RequestRecord
from infbench.engine.request import Request
from infbench.measure.dataset_reader import JSONLimitError, loads
from infbench.scenario.target import TargetSection

_MAX_ERROR_CHARS = 300
_MAX_MODELS_BYTES = 2**20  # GET /models: a list of names, kept in the result's env
_EVENT_STREAM = "text/event-stream"


@dataclass(frozen=True)
class Failure:
    """One failed request: its id, the reason (client/failures.REASONS) and the message."""

    request_id: str
    message: str
    reason: str = "connection"


@dataclass
class TargetRun:
    """One pass over the workload: finished records, failures, wall time on the run clock."""

    records: list[RequestRecord]
    failures: list[Failure]
    wall_s: float
    start_perf_s: float  # time.perf_counter() at the run's t=0 (for accuracy checks)
    num_unsent: int = 0  # requests not sent: due after submit_until_s (measure.duration_s)
    # request id -> when it was handed to the connection pool minus its scheduled arrival
    # (seconds, >= 0 unless the clock is coarse): the pacing's timestamp error
    send_errors_s: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientPlan:
    """How requests go out: the target, prompts as text or ids, the concurrency cap."""

    target: TargetSection
    tokenizer: Any = None
    max_concurrency: int | None = None  # None: every request as soon as it arrives

    def headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    def body(self, request: Request, sample: int) -> dict[str, Any]:
        """The JSON body of one streamed request (sample j of a prompt gets seed + j)."""
        t, s = self.target, request.sampling
        body: dict[str, Any] = {"model": t.model, "max_tokens": s.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True},
                                "temperature": s.temperature, "top_p": s.top_p}
        if s.top_k > 0:  # an extension; servers differ on what 0 / -1 mean, so only when set
            body["top_k"] = s.top_k
        if s.seed is not None:
            body["seed"] = s.seed + sample
        if s.ignore_eos:
            body["ignore_eos"] = True  # vLLM / SGLang / llama.cpp extension
        if t.return_token_ids:
            body["return_token_ids"] = True
        if t.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt_text(request)}]
        elif t.sends_text:
            body["prompt"] = self.prompt_text(request)
        else:
            body["prompt"] = list(request.prompt_ids)
        return body

    def prompt_text(self, request: Request) -> str:
        if self.tokenizer is None:  # the target schema requires one for text prompts
            raise ValueError("text prompts need target.tokenizer")
        return str(self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=True))


async def _read_stream(response: aiohttp.ClientResponse, t0: float, stream: Stream) -> Stream:
    """Consume one SSE response into `stream`; chunks timestamped when their bytes arrived."""
    if response.content_type != _EVENT_STREAM:
        head = " ".join((await _read_capped(response, 200)).decode("utf-8", "replace").split())
        raise RequestFailed("not_sse", f"Content-Type {response.content_type or 'none'}, not "
                                       f"{_EVENT_STREAM}" + (f": {head[:120]}" if head else
                                                             " (an empty body)"))
    parser = SSEParser()
    clock = time.perf_counter
    try:
        async for piece in response.content.iter_any():
            now = clock() - t0
            for data in parser.feed(piece):
                if data == DONE:
                    stream.done = True
                    break
                stream.add_event(data, now)
            if stream.done:
                break
        if not stream.done:
            for data in parser.close():
                if data == DONE:
                    stream.done = True
                    break
                stream.add_event(data, clock() - t0)
    except SSEError as exc:
        raise RequestFailed("bad_json", str(exc)) from None
    stream.end_s = clock() - t0
    stream.check_complete()
    return stream


def to_record(request_id: str, arrival_s: float, request: Request, stream: Stream,
              tokenizer: Any = None) -> RequestRecord:
    """One complete stream as the engine's RequestRecord (tokens counted, times placed).

    `stream.check_complete` has passed: usage, when sent, is at most max_tokens and at least
    one token per text chunk, so the per-token lists below stay as long as the completion.
    """
    counts = chunk_token_counts(stream.chunks, tokenizer)
    usage = stream.usage or {}
    completion = usage.get("completion_tokens")
    total = completion if completion is not None else sum(counts)
    num_reasoning = 0
    if stream.chunks:
        counts, num_reasoning = split_counts(stream.chunks, counts, completion,
                                             usage.get("reasoning_tokens"))
        times = token_times(stream.chunks, counts)
    else:  # tokens the server counted but sent no text for (all special): at the end
        times = [stream.end_s] * total
    # TTFO: the arrival of the first content chunk (observed, not interpolated).
    first_output = next((c.time_s for c in stream.chunks if not c.is_reasoning), None) \
        if num_reasoning else None
    prompt = usage.get("prompt_tokens")
    ids = [i for c in stream.chunks if c.token_ids is not None for i in c.token_ids]
    if len(ids) != len(times):
        ids = []
        if tokenizer is not None and stream.chunks:
            text = "".join(c.text for c in stream.chunks)
            encoded = list(tokenizer.encode(text, add_special_tokens=False))
            ids = encoded if len(encoded) == len(times) else []  # else: not known exactly
    return RequestRecord(
        request_id=request_id, arrival_s=arrival_s,
        num_prompt_tokens=prompt if prompt is not None else len(request.prompt_ids),
        token_times_s=times, finish_reason=stream.finish_reason or "length", output_ids=ids,
        num_reasoning_tokens=num_reasoning, first_output_s=first_output)


async def _read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of a body (what a bad answer's error message quotes)."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        part = await response.content.read(limit - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:_MAX_ERROR_CHARS]


async def _one_request(plan: ClientPlan, request: Request, sample: int, t0: float,
                       session: aiohttp.ClientSession, headers: dict[str, str],
                       stream: Stream, body_json: dict[str, Any] | None = None) -> Stream:
    """Send one request and read its stream; every way it can go wrong is RequestFailed.
    `body_json` replaces `plan.body(request, sample)` (a session turn's history)."""
    body = json.dumps(plan.body(request, sample) if body_json is None else body_json).encode()
    url = plan.target.url
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                detail = " ".join((await _read_capped(resp, 400)).decode("utf-8", "replace")
                                  .split())
                raise RequestFailed("http_status", f"HTTP {resp.status} from {url}: "
                                                   f"{detail[:200]}")
            return await _read_stream(resp, t0, stream)
    except aiohttp.ClientPayloadError as exc:  # the body ended short of its framing
        raise RequestFailed("truncated", f"the stream broke after {len(stream.chunks)} text "
                                         f"chunk(s): {_error_text(exc)}") from None
    except asyncio.TimeoutError:  # aiohttp's sock_connect / sock_read (ServerTimeoutError)
        raise RequestFailed("read_timeout", f"no answer for target.timeout_s "
                                            f"{plan.target.timeout_s:g} s after "
                                            f"{len(stream.chunks)} text chunk(s)") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise RequestFailed("connection", f"{type(exc).__name__}: {_error_text(exc)}") from None


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects alive now frozen until the block ends (vLLM's benchmark client freezes
    its heap too): a full collection over a process that holds torch took 0.4 s on the
    shared test machine, and one that fell inside a pass stalled every stream's timestamps
    at once; frozen, a collection looks only at the pass's own objects.  No collect first
    (it would cost that time per pass): garbage frozen with the heap is collected after the
    block, once unfrozen."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def run_requests(plan: ClientPlan, requests: Sequence[Request], *,
                       session: aiohttp.ClientSession, api_key: str | None = None,
                       on_done: Callable[[], None] | None = None,
                       submit_until_s: float | None = None,
                       t0: float | None = None) -> TargetRun:
    """Serve `requests` through the target once; arrival offsets replayed in real time,
    with the heap frozen (`frozen_heap`).

    `submit_until_s` (measure.duration_s): a request due, or let through the cap, after that
    many seconds is not sent (counted in `num_unsent`); those in flight finish.  `t0` is the
    run's start on `time.perf_counter()`'s clock (default: now); a later one is waited for,
    which is how the processes of client/workers.py start together."""
    with frozen_heap():
        return await _run_requests(plan, requests, session=session, api_key=api_key,
                                   on_done=on_done, submit_until_s=submit_until_s, t0=t0)


async def _run_requests(plan: ClientPlan, requests: Sequence[Request], *,
                        session: aiohttp.ClientSession, api_key: str | None,
                        on_done: Callable[[], None] | None,
                        submit_until_s: float | None, t0: float | None) -> TargetRun:
    t0 = time.perf_counter() if t0 is None else t0
    chat = plan.target.endpoint == "chat"
    headers = plan.headers(api_key)
    deadline = plan.target.request_timeout_s
    records: list[RequestRecord] = []
    failures: list[Failure] = []
    slots = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
    last = [0.0]
    unsent = [0]
    stop = math.inf if submit_until_s is None else submit_until_s
    send_errors: dict[str, float] = {}

    async def one(request: Request, sample: int) -> None:
        rid = request.request_id if request.n == 1 else f"{request.request_id}/{sample}"
        if request.arrival_s >= stop:
            unsent[0] += 1
            return
        delay = request.arrival_s - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        send_errors[rid] = time.perf_counter() - t0 - request.arrival_s
        arrival = request.arrival_s
        if slots is not None:
            await slots.acquire()
            arrival = max(arrival, time.perf_counter() - t0)  # TTFT from the submission
            if arrival >= stop:  # the duration ended while it waited for a slot
                slots.release()
                unsent[0] += 1
                return
        stream = Stream(max_tokens=request.sampling.max_tokens, chat=chat)
        try:
            await asyncio.wait_for(
                _one_request(plan, request, sample, t0, session, headers, stream), deadline)
            records.append(to_record(rid, arrival, request, stream, plan.tokenizer))
            last[0] = max(last[0], stream.end_s)
        except asyncio.TimeoutError:  # only wait_for's: _one_request turns aiohttp's into
            failures.append(Failure(rid, f"no complete answer within "  # RequestFailed
                                         f"target.request_timeout_s {deadline:g} s (the stream "
                                         f"was open: {stream.num_events} event(s), "
                                         f"{len(stream.chunks)} text chunk(s))", "deadline"))
            last[0] = max(last[0], time.perf_counter() - t0)
        except RequestFailed as exc:
            failures.append(Failure(rid, _error_text(exc), exc.reason))
            last[0] = max(last[0], time.perf_counter() - t0)
        finally:
            if slots is not None:
                slots.release()
            if on_done is not None:
                on_done()

    ordered = sorted(requests, key=lambda r: r.arrival_s)
    await asyncio.gather(*(one(r, j) for r in ordered for j in range(r.n)))
    records.sort(key=lambda r: r.request_id)
    failures.sort(key=lambda f: f.request_id)
    return TargetRun(records, failures, max(last[0], 1e-9), t0, unsent[0],
                     dict(sorted(send_errors.items())))


async def fetch_models(session: aiohttp.ClientSession, target: TargetSection,
                       api_key: str | None) -> Any:
    """The server's answer to GET /models (recorded in the result's env), or the error.

    Read with the same limits as a stream (size, JSON depth and numbers), since it is
    written into the result."""
    try:
        async with session.get(target.base_url + "/models", headers=ClientPlan(target)
                               .headers(api_key), timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return {"error": f"HTTP {r.status}"}
            raw = await _read_capped(r, _MAX_MODELS_BYTES + 1)
        if len(raw) > _MAX_MODELS_BYTES:
            return {"error": f"an answer of more than {_MAX_MODELS_BYTES} bytes"}
        return loads(raw.decode("utf-8", errors="replace"))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return {"error": _error_text(exc) if str(exc) else "timed out"}
    except (ValueError, JSONLimitError) as exc:  # JSONDecodeError is a ValueError
        return {"error": f"not JSON: {_error_text(exc)}"}


def open_session(target: TargetSection, concurrency: int) -> aiohttp.ClientSession:
    """One session for a whole point: a pool of `concurrency` connections, read timeouts."""
    connector = aiohttp.TCPConnector(limit=max(1, concurrency),
                                     limit_per_host=max(1, concurrency))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=target.timeout_s,
                                    sock_read=target.timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)

