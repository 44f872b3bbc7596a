"""The OpenAI response shapes: a whole completion or chat completion, one streamed chunk,
and the last usage chunk of a stream (protocol.py validates the requests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infbench.serve.protocol import GenerationParams


@dataclass
class ChoiceResult:
    """One finished sample, as the non-streaming responses report it."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # stop | length


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(params: GenerationParams, request_id: str, created: int, model: str,
             choices: list[ChoiceResult]) -> dict[str, Any]:
    """The whole non-streaming body of a completion or chat completion."""
    items: list[dict[str, Any]] = []
    for c in choices:
        item: dict[str, Any]
        if params.kind == "chat":
            item = {"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": None, "finish_reason": c.finish_reason}
        else:
            item = {"index": c.index, "text": c.text, "logprobs": None,
                    "finish_reason": c.finish_reason}
        if params.return_token_ids:
            item["token_ids"] = c.token_ids
        items.append(item)
    body = _envelope(params, request_id, created, model, streaming=False)
    body["choices"] = items
    body["usage"] = usage(len(params.prompt_ids), sum(len(c.token_ids) for c in choices))
    return body


def chunk(params: GenerationParams, request_id: str, created: int, model: str, index: int,
          text: str, token_ids: list[int], finish_reason: str | None,
          role: bool = False) -> dict[str, Any]:
    """One streamed choice delta (`role`: the chat stream's opening delta)."""
    item: dict[str, Any]
    if params.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        item = {"index": index, "delta": delta, "logprobs": None,
                "finish_reason": finish_reason}
    else:
        item = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if params.return_token_ids and not role:
        item["token_ids"] = token_ids
    body = _envelope(params, request_id, created, model, streaming=True)
    body["choices"] = [item]
    if params.include_usage:
        body["usage"] = None  # as OpenAI: null on every chunk but the last
    return body


def usage_chunk(params: GenerationParams, request_id: str, created: int, model: str,
                completion_tokens: int) -> dict[str, Any]:
    """The last chunk of a stream with include_usage: no choices, the request's usage."""
    body = _envelope(params, request_id, created, model, streaming=True)
    body["choices"] = []
    body["usage"] = usage(len(params.prompt_ids), completion_tokens)
    return body


def _envelope(params: GenerationParams, request_id: str, created: int, model: str, *,
              streaming: bool) -> dict[str, Any]:
    if params.kind == "chat":
        obj = "chat.completion.chunk" if streaming else "chat.completion"
    else:
        obj = "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": model}
