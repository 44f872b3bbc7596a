"""One response stream, checked chunk by chunk: what counts as a complete completion stream.

The server's values are not trusted.  Each SSE event's data is parsed with the dataset
reader's bounded JSON (depth, integer digits, string length), and every field the client
reads is checked for type and range before it is used: `choices` a list of objects for
completion 0, `text` / `delta.content` strings (and a reasoning model's
`delta.reasoning_content` or `delta.reasoning`, kept as reasoning chunks), `finish_reason` a
short string, `token_ids` and the `usage` counts (with
`completion_tokens_details.reasoning_tokens`) non-negative integers below the request's
`max_tokens` (so a usage of 1e9 tokens never becomes 1e9 timestamps).  A problem raises
`RequestFailed` with a reason from `client.failures.REASONS`; `check_complete` decides at
the end of the stream whether it was a whole answer: `[DONE]` seen, a finish_reason, at
least one token, and usage counts that agree with the chunks that carried text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from infbench.client.failures import RequestFailed
from infbench.client.tokens import Chunk
from infbench.measure.dataset_reader import JSONLimitError, loads, shown

MAX_EVENT_CHARS = 2**20  # one SSE event's data: a chunk is a few hundred bytes
MAX_FINISH_REASON_CHARS = 64
MAX_TOKEN_ID = 2**31 - 1
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
# A chat delta's reasoning text: vLLM's reasoning parsers' field, then the newer name.
REASONING_KEYS = ("reasoning_content", "reasoning")
_MAX_PROMPT_TOKENS = 2**24  # the scenario's sanity limit on every count


@dataclass
class Stream:
    """What one response stream delivered (times on the run clock)."""

    max_tokens: int  # the request's: no completion may count more
    chat: bool = False
    chunks: list[Chunk] = field(default_factory=list)
    usage: dict[str, int] | None = None
    finish_reason: str | None = None
    done: bool = False  # `data: [DONE]` arrived
    num_events: int = 0
    end_s: float = 0.0
    _ids_sent: int = 0
    _chunks_without_ids: int = 0

    @property
    def num_ids(self) -> int | None:
        """Token ids sent, when every text chunk carried them (else None)."""
        return None if not self.chunks or self._chunks_without_ids else self._ids_sent

    def add_event(self, data: str, now: float) -> None:
        """One event's data (not `[DONE]`): parsed, checked, its text chunk kept."""
        self.num_events += 1
        if len(data) > MAX_EVENT_CHARS:
            raise RequestFailed("bad_json", f"an event of {len(data)} characters (at most "
                                            f"{MAX_EVENT_CHARS})")
        try:
            obj = loads(data)
        except json.JSONDecodeError as exc:
            raise RequestFailed("bad_json", f"event {self.num_events} is not JSON ({exc.msg}): "
                                            f"{shown(data)}") from None
        except JSONLimitError as exc:
            raise RequestFailed("bad_json", f"event {self.num_events}: {exc}") from None
        self._apply(obj, now)

    def _apply(self, obj: Any, now: float) -> None:
        where = f"event {self.num_events}"
        if not isinstance(obj, dict):
            raise RequestFailed("bad_chunk", f"{where} is a JSON {type(obj).__name__}, not an "
                                             "object")
        if obj.get("error") or obj.get("object") == "error":
            err = obj.get("error") or obj
            message = err.get("message", err) if isinstance(err, dict) else err
            raise RequestFailed("server_error", f"server error in stream: {shown(message)}")
        if obj.get("usage") is not None:
            self._usage(obj["usage"], where)
        choices = obj.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            raise RequestFailed("bad_chunk", f"{where}: choices: must be a list (got "
                                             f"{shown(choices)})")
        for i, choice in enumerate(choices):
            self._choice(choice, f"{where}: choices[{i}]", now)

    def _choice(self, choice: Any, where: str, now: float) -> None:
        if not isinstance(choice, dict):
            raise RequestFailed("bad_chunk", f"{where}: must be an object (got {shown(choice)})")
        index = choice.get("index", 0)
        if index != 0 or isinstance(index, bool):
            raise RequestFailed("bad_chunk", f"{where}.index: {shown(index)}; one completion "
                                             "(index 0) was asked for")
        reasoning = _reasoning_text(choice, where) if self.chat else ""
        text = _text(choice, self.chat, where)
        ids = _token_ids(choice.get("token_ids"), where)
        finish = choice.get("finish_reason")
        if finish is not None:
            if not isinstance(finish, str) or not 0 < len(finish) <= MAX_FINISH_REASON_CHARS:
                raise RequestFailed("bad_chunk", f"{where}.finish_reason: must be a string of "
                                                 f"1..{MAX_FINISH_REASON_CHARS} characters "
                                                 f"(got {shown(finish)})")
            self.finish_reason = finish
        if reasoning:  # before the content a delta may also carry; ids go with the content
            self._add(Chunk(now, reasoning, None if text else ids, is_reasoning=True))
            if text:
                self._add(Chunk(now, text, ids))
        elif text or ids:
            self._add(Chunk(now, text, ids))

    def _add(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        if chunk.token_ids is None:
            self._chunks_without_ids += 1
        else:
            self._ids_sent += len(chunk.token_ids)
        # Every chunk that carries text carries at least one token: more chunks than
        # max_tokens is a server that does not stop (and memory that would not either).
        sent = max(len(self.chunks), self._ids_sent)
        if sent > self.max_tokens:
            raise RequestFailed("count_mismatch", f"more than max_tokens {self.max_tokens} "
                                                  "tokens streamed")

    def _usage(self, usage: Any, where: str) -> None:
        if not isinstance(usage, dict):
            raise RequestFailed("bad_chunk", f"{where}: usage: must be an object (got "
                                             f"{shown(usage)})")
        checked: dict[str, int] = {}
        for key in USAGE_KEYS:
            value = usage.get(key)
            if value is None:
                continue
            high = self.max_tokens if key == "completion_tokens" else \
                _MAX_PROMPT_TOKENS + self.max_tokens
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RequestFailed("bad_chunk", f"{where}: usage.{key}: must be an integer "
                                                 f">= 0 (got {shown(value)})")
            if value > high:
                raise RequestFailed("count_mismatch", f"{where}: usage.{key} {value} is more "
                                                      f"than {high} (max_tokens "
                                                      f"{self.max_tokens})")
            checked[key] = value
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict) and details.get("reasoning_tokens") is not None:
            value = details["reasoning_tokens"]
            if isinstance(value, bool) or not isinstance(value, int) or not \
                    0 <= value <= self.max_tokens:
                raise RequestFailed("bad_chunk", f"{where}: usage.completion_tokens_details."
                                                 f"reasoning_tokens: must be an integer "
                                                 f"0..{self.max_tokens} (got {shown(value)})")
            checked["reasoning_tokens"] = value
        self.usage = checked

    def check_complete(self) -> None:
        """Raise RequestFailed unless the stream was one whole, consistent completion."""
        got = f"{len(self.chunks)} text chunk(s)"
        if not self.done:
            if self.num_events == 0:
                raise RequestFailed("not_sse", "no SSE event before the connection closed "
                                               "(an empty body, or not an event stream)")
            raise RequestFailed("truncated", f"the stream closed before data: [DONE] after "
                                             f"{got}" + ("" if self.finish_reason else
                                                         ", no finish_reason"))
        if self.finish_reason is None:
            raise RequestFailed("no_finish_reason", f"data: [DONE] after {got} and no "
                                                    "finish_reason")
        completion = (self.usage or {}).get("completion_tokens")
        if completion is None:
            if not self.chunks:
                raise RequestFailed("no_tokens", "no chunk carried text and no usage was sent")
            return
        if completion == 0:
            raise RequestFailed("no_tokens" if not self.chunks else "count_mismatch",
                                f"usage.completion_tokens 0 after {got}")
        if completion < len(self.chunks):
            raise RequestFailed("count_mismatch", f"usage.completion_tokens {completion} is "
                                                  f"fewer than the {got} that arrived")
        ids = self.num_ids
        if ids is not None and ids != completion:
            raise RequestFailed("count_mismatch", f"usage.completion_tokens {completion} but "
                                                  f"{ids} token ids arrived")


def _text(choice: dict[str, Any], chat: bool, where: str) -> str:
    """The text a choice adds: `text` (completions) or `delta.content` (chat)."""
    if chat:
        delta = choice.get("delta")
        if delta is None:
            return ""
        if not isinstance(delta, dict):
            raise RequestFailed("bad_chunk", f"{where}.delta: must be an object (got "
                                             f"{shown(delta)})")
        value, key = delta.get("content"), "delta.content"
    else:
        value, key = choice.get("text"), "text"
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RequestFailed("bad_chunk", f"{where}.{key}: must be a string (got {shown(value)})")
    return value


def _reasoning_text(choice: dict[str, Any], where: str) -> str:
    """A chat delta's reasoning text: vLLM's `reasoning_content` or the newer `reasoning`."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""  # _text reports a delta that is not an object
    for key in REASONING_KEYS:
        value = delta.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise RequestFailed("bad_chunk", f"{where}.delta.{key}: must be a string (got "
                                             f"{shown(value)})")
        if value:
            return value
    return ""


def _token_ids(ids: Any, where: str) -> tuple[int, ...] | None:
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_TOKEN_ID
            for i in ids):
        raise RequestFailed("bad_chunk", f"{where}.token_ids: must be a list of token ids "
                                         f"0..{MAX_TOKEN_ID} (got {shown(ids)})")
    return tuple(ids) if ids else None
