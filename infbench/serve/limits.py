"""Request bodies read and parsed with limits, before any validation sees them.

Every limit here answers a client with a 4xx OpenAI error object instead of letting the
input reach code that fails on it: a body over `max_body_bytes` (413, refused from its
Content-Length before it is read), a body that does not arrive within `body_timeout_s`
(408), bodies in flight over `max_body_bytes_in_flight` together (429), JSON nested deeper
than `MAX_JSON_DEPTH` (Python's parser would raise RecursionError), a number literal longer
than `MAX_NUMBER_CHARS` (Python's int() refuses 4300+ digits with ValueError), NaN and
Infinity literals, duplicated keys, and strings holding a lone UTF-16 surrogate ("\\ud800":
valid JSON, but not text, so the tokenizer would fail on it).  Bodies larger than
`OFFLOAD_BYTES` are parsed in a worker thread so the event loop keeps answering /health.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from infbench.serve.protocol import ApiError

MAX_JSON_DEPTH = 32  # a chat request with content parts nests 5 deep
MAX_NUMBER_CHARS = 64  # seeds need 19 digits; no field needs more than a few dozen
OFFLOAD_BYTES = 256 << 10  # parse bodies larger than this off the event loop
_SURROGATE = re.compile("[\ud800-\udfff]")
T = TypeVar("T")


@dataclass(frozen=True)
class ServerLimits:
    """The HTTP limits of one server (the router has its own copy)."""

    max_body_bytes: int = 16 << 20  # one request body; far above any context's prompt
    max_body_bytes_in_flight: int = 64 << 20  # all bodies being read or parsed at once
    max_connections: int = 1024  # open connections; the next ones get a 503 and are closed
    header_timeout_s: float = 10.0  # a new connection must send a whole request head by then
    keepalive_timeout_s: float = 30.0  # an idle keep-alive connection is closed after this
    body_timeout_s: float = 60.0  # the body must arrive within this after the headers

    def __post_init__(self) -> None:
        if self.max_body_bytes_in_flight < self.max_body_bytes:
            raise ValueError("max_body_bytes_in_flight must be >= max_body_bytes")


class BodyBudget:
    """Bytes of request bodies being read or parsed; a request that would exceed the cap
    is refused (429) rather than queued, as the engine's queue does with requests."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0

    def reserve(self, num_bytes: int) -> None:
        if self.in_use + num_bytes > self.capacity:
            raise ApiError(f"the server is reading {self.in_use} bytes of request bodies, "
                           f"its limit is {self.capacity}; retry shortly", status=429,
                           type_="rate_limit_error", code="too_many_request_bytes")
        self.in_use += num_bytes

    def release(self, num_bytes: int) -> None:
        self.in_use -= num_bytes


def check_content_type(request: web.Request) -> None:
    """POST bodies are JSON only: a `text/plain` or form body is what a cross-site page can
    send without a CORS preflight, so refusing them closes that path (415)."""
    mime = request.content_type  # "application/octet-stream" when the header is missing
    charset = request.charset
    if "Content-Type" not in request.headers or mime != "application/json":
        given = request.headers.get("Content-Type", "none")
        raise ApiError(f"the request body must be application/json, got Content-Type "
                       f"{given[:100]!r}", status=415, code="unsupported_media_type")
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise ApiError(f"the request body must be UTF-8, got charset {charset[:40]!r}",
                       status=415, code="unsupported_media_type")


async def read_body(request: web.Request, limits: ServerLimits, budget: BodyBudget) -> bytes:
    """The whole body, within the size, time and in-flight limits.  The caller releases
    `len(result)` bytes of `budget` when it is done parsing them."""
    declared = request.content_length
    if declared is not None and declared > limits.max_body_bytes:
        raise _too_large(declared, limits)
    reserved = declared if declared is not None else 0
    budget.reserve(reserved)
    chunks: list[bytes] = []
    held = [reserved]

    async def read() -> None:
        size = 0
        while True:
            piece = await request.content.readany()
            if not piece:
                return
            size += len(piece)
            if size > limits.max_body_bytes:
                raise _too_large(size, limits)
            if size > held[0]:  # chunked or a short Content-Length: reserve as it comes
                budget.reserve(size - held[0])
                held[0] = size
            chunks.append(piece)

    try:
        await asyncio.wait_for(read(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        budget.release(held[0])
        raise ApiError(f"the request body did not arrive within {limits.body_timeout_s:g} s",
                       status=408, code="body_timeout") from None
    except ApiError:
        budget.release(held[0])
        raise
    except asyncio.CancelledError:
        budget.release(held[0])
        raise
    except Exception as exc:  # a malformed chunked body, or the client went away
        budget.release(held[0])
        raise ApiError(f"the request body could not be read: {type(exc).__name__}: "
                       f"{str(exc)[:200]}") from None
    data = b"".join(chunks)
    if held[0] > len(data):  # a Content-Length larger than what came
        budget.release(held[0] - len(data))
    return data


def _too_large(size: int, limits: ServerLimits) -> ApiError:
    return ApiError(f"the request body has {size} bytes; the limit is {limits.max_body_bytes}",
                    status=413, code="request_too_large")


# ------------------------------------------------------------------- JSON
def _number(text: str, kind: type) -> Any:
    if len(text) > MAX_NUMBER_CHARS:
        raise ApiError(f"a number in the request body has {len(text)} characters; the limit "
                       f"is {MAX_NUMBER_CHARS}", code="number_too_long")
    return kind(text)


def _constant(name: str) -> Any:
    raise ApiError(f"{name} is not a JSON number (the request body is not valid JSON)")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: find the key given twice
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ApiError(f"the key {_param_name(key)!r} appears twice in one object",
                               param=_param_name(key), code="duplicate_key")
            seen.add(key)
    return out


def parse_json(data: bytes) -> Any:
    """`data` as JSON within the limits above; ApiError (400) otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(f"the request body is not UTF-8: {exc}") from None
    try:
        value = json.loads(text, parse_int=lambda s: _number(s, int),
                           parse_float=lambda s: _number(s, float), parse_constant=_constant,
                           object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels",
                       code="too_deep") from None
    check_structure(value)
    return value


def check_structure(value: Any) -> None:
    """Depth at most MAX_JSON_DEPTH and no lone surrogate in any string or key; the error
    names the top-level field the bad value is in (its path in the message)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels "
                           f"(at {path or 'the top'})", param=_top(path), code="too_deep")
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise ApiError(f"{path or 'the body'}: the string holds a lone UTF-16 "
                               "surrogate (such as \\ud800), which is not text",
                               param=_top(path), code="invalid_string")
        elif isinstance(item, dict):
            for key, sub in item.items():
                where = f"{path}.{key}" if path else key
                if _SURROGATE.search(key):
                    raise ApiError(f"{path or 'the body'}: a key holds a lone UTF-16 "
                                   "surrogate, which is not text", param=_top(path) or None,
                                   code="invalid_string")
                stack.append((sub, where, depth + 1))
        elif isinstance(item, list):
            stack.extend((sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(item))


def _top(path: str) -> str | None:
    """The request field a path is in: `messages[0].content` for a message's content (the
    protocol's own param names), else the top-level key."""
    if not path:
        return None
    match = re.match(r"messages\[\d+\](\.content)?", path)
    if match:
        return match.group(0)
    return _param_name(re.split(r"[.\[]", path, maxsplit=1)[0])


def _param_name(key: str) -> str:
    return _SURROGATE.sub("\ufffd", key)[:100]


async def parse_body(request: web.Request, limits: ServerLimits, budget: BodyBudget,
                     then: Callable[[Any], T]) -> T:
    """Content type checked, body read and parsed within the limits, then `then(value)`
    (validation, which tokenizes the prompt): both in a worker thread for a large body."""
    check_content_type(request)
    data = await read_body(request, limits, budget)

    def work() -> T:
        return then(parse_json(data))

    try:
        if len(data) > OFFLOAD_BYTES:
            return await asyncio.get_running_loop().run_in_executor(None, work)
        return work()
    finally:
        budget.release(len(data))
