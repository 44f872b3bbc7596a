"""Run a workload's requests against an OpenAI-compatible server, streamed, into RequestRecords.

One asyncio event loop and one aiohttp `ClientSession` whose connection pool is sized to
the concurrency.  Each request is launched at its workload arrival time (`arrival_s`
after the run's start; with a concurrency cap, when a slot frees up, and then its TTFT
counts from that submission, as vLLM's benchmark does), posts a streaming completion with
`stream_options.include_usage`, and reads the SSE stream incrementally.  The hot loop only
timestamps byte pieces and keeps the content chunks; tokens are counted and placed on the
timeline after the stream ends (client/tokens.py), so counting costs no timing accuracy.

A request that fails (HTTP status, connection error, timeout, a malformed stream, an
`error` object in the stream) becomes a `Failure` instead of a record; the caller decides
what an all-failed run means.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from infbench.client.sse import DONE, SSEParser
from infbench.client.tokens import Chunk, chunk_token_counts, share_total, token_times
from infbench.core.target import TargetSection
from infbench.engine.records import RequestRecord
from infbench.engine.request import Request

_MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class Failure:
    request_id: str
    message: str


@dataclass
class TargetRun:
    """One pass over the workload: finished records, failures, wall time on the run clock."""

    records: list[RequestRecord]
    failures: list[Failure]
    wall_s: float
    start_perf_s: float  # time.perf_counter() at the run's t=0 (for accuracy checks)


@dataclass
class _Stream:
    """What one response stream delivered (times on the run clock)."""

    chunks: list[Chunk] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    end_s: float = 0.0


class RequestFailed(Exception):
    """One request's failure, with the message the run reports."""


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
        if self.tokenizer is None:
            raise RequestFailed("text prompts need target.tokenizer")
        return str(self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=True))


def content_of(choice: dict[str, Any], chat: bool) -> str:
    """The text a choice adds: `text` (completions) or `delta.content` (chat)."""
    if chat:
        delta = choice.get("delta") or {}
        return str(delta.get("content") or "") if isinstance(delta, dict) else ""
    return str(choice.get("text") or "")


async def _read_stream(response: aiohttp.ClientResponse, t0: float, chat: bool) -> _Stream:
    """Consume one SSE response; chunks timestamped when their bytes arrived."""
    parser = SSEParser()
    out = _Stream()
    clock = time.perf_counter
    done = False
    async for piece in response.content.iter_any():
        now = clock() - t0
        for data in parser.feed(piece):
            if data == DONE:
                done = True
                break
            _event(json.loads(data), now, chat, out)
        if done:
            break
    if not done:
        for data in parser.close():
            if data != DONE:
                _event(json.loads(data), clock() - t0, chat, out)
    out.end_s = clock() - t0
    return out


def _event(obj: Any, now: float, chat: bool, out: _Stream) -> None:
    if not isinstance(obj, dict):
        raise RequestFailed(f"stream event is not a JSON object: {str(obj)[:80]}")
    if obj.get("error"):
        err = obj["error"]
        raise RequestFailed(f"server error in stream: "
                            f"{err.get('message', err) if isinstance(err, dict) else err}")
    if isinstance(obj.get("usage"), dict):
        out.usage = obj["usage"]
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            raise RequestFailed(f"stream choice is not a JSON object: {str(choice)[:80]}")
        text = content_of(choice, chat)
        ids = choice.get("token_ids")
        ids = ids if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None
        if text or ids:
            out.chunks.append(Chunk(now, text, tuple(int(i) for i in ids) if ids else None))
        if choice.get("finish_reason"):
            out.finish_reason = str(choice["finish_reason"])


def to_record(request_id: str, arrival_s: float, request: Request, stream: _Stream,
              tokenizer: Any = None) -> RequestRecord:
    """One finished stream as the engine's RequestRecord (tokens counted, times placed)."""
    counts = chunk_token_counts(stream.chunks, tokenizer)
    usage = stream.usage or {}
    completion = usage.get("completion_tokens")
    total = int(completion) if isinstance(completion, int) else sum(counts)
    if stream.chunks:
        counts = share_total(counts, total)
        times = token_times(stream.chunks, counts)
    else:  # tokens the server counted but sent no text for (all special): at the end
        times = [stream.end_s] * total
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
        num_prompt_tokens=int(prompt) if isinstance(prompt, int) else len(request.prompt_ids),
        token_times_s=times, finish_reason=stream.finish_reason or "length", output_ids=ids)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:_MAX_ERROR_CHARS]


async def run_requests(plan: ClientPlan, requests: Sequence[Request], *,
                       session: aiohttp.ClientSession, api_key: str | None = None,
                       on_done: Callable[[], None] | None = None) -> TargetRun:
    """Serve `requests` through the target once; arrival offsets replayed in real time."""
    t0 = time.perf_counter()
    chat = plan.target.endpoint == "chat"
    headers = plan.headers(api_key)
    records: list[RequestRecord] = []
    failures: list[Failure] = []
    slots = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
    last = [0.0]

    async def one(request: Request, sample: int) -> None:
        rid = request.request_id if request.n == 1 else f"{request.request_id}/{sample}"
        delay = request.arrival_s - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        arrival = request.arrival_s
        if slots is not None:
            await slots.acquire()
            arrival = max(arrival, time.perf_counter() - t0)  # TTFT from the submission
        try:
            body = json.dumps(plan.body(request, sample)).encode()
            async with session.post(plan.target.url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    detail = " ".join((await resp.text(errors="replace")).split())
                    raise RequestFailed(f"HTTP {resp.status} from {plan.target.url}: "
                                        f"{detail[:200]}")
                stream = await _read_stream(resp, t0, chat)
            records.append(to_record(rid, arrival, request, stream, plan.tokenizer))
            last[0] = max(last[0], stream.end_s)
        except (RequestFailed, aiohttp.ClientError, asyncio.TimeoutError, ValueError,
                OSError) as exc:
            failures.append(Failure(rid, _error_text(exc)))
            last[0] = max(last[0], time.perf_counter() - t0)
        finally:
            if slots is not None:
                slots.release()
            if on_done is not None:
                on_done()

    ordered = sorted(requests, key=lambda r: r.arrival_s)
    await asyncio.gather(*(one(r, j) for r in ordered for j in range(r.n)))
    records.sort(key=lambda r: r.request_id)
    return TargetRun(records, failures, max(last[0], 1e-9), t0)


async def fetch_models(session: aiohttp.ClientSession, target: TargetSection,
                       api_key: str | None) -> Any:
    """The server's answer to GET /models (recorded in the result's env), or the error."""
    try:
        async with session.get(target.base_url + "/models", headers=ClientPlan(target)
                               .headers(api_key), timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return {"error": f"HTTP {r.status}"}
            return await r.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as exc:
        return {"error": _error_text(exc)}


def open_session(target: TargetSection, concurrency: int) -> aiohttp.ClientSession:
    """One session for a whole point: a pool of `concurrency` connections, read timeouts."""
    connector = aiohttp.TCPConnector(limit=max(1, concurrency),
                                     limit_per_host=max(1, concurrency))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=target.timeout_s,
                                    sock_read=target.timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)

