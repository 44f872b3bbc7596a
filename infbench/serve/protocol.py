"""The OpenAI API requests: bodies validated into `GenerationParams` (responses.py builds
the answers).

Validation happens once, here: every bad value raises `ApiError`, which the app answers
with HTTP 400 and an OpenAI-style error object naming the parameter.  The engine never
sees a request it would refuse, except for a prompt the KV pool cannot hold at the
moment of admission (engine_loop reports that one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from infbench.core.errors import UserError
from infbench.engine.request import SamplingParams
from infbench.model.tokenizer import Tokenizer

MAX_SEED = 2**63 - 1  # the largest seed torch's generators take
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions
GREEDY_BELOW = 1e-5  # a temperature below this is greedy (as vLLM does)

# Parameters the engine does not implement: a request that asks for them gets a 400
# naming the parameter rather than a silently different answer.  Values listed are the
# "off" values a client may send anyway.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "min_tokens": (None, 0),
    "min_p": (None, 0, 0.0),
    "tool_choice": (None,),  # no tools are supported, so no choice among them either
    "parallel_tool_calls": (None,),
    "functions": (None, []),
    "function_call": (None,),
    "response_format": (None, {"type": "text"}),  # text is what the server returns anyway
}
# What each endpoint implements; any other key is refused by name, so a client never gets
# a silently different answer from a field it thinks was honoured.  `user` (an end-user id
# for the operator's logs) changes no output, so it is accepted.
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "n", "stop",
           "stop_token_ids", "ignore_eos", "return_token_ids", "stream", "stream_options",
           "user"}
_KNOWN = {"completion": _COMMON | {"prompt"},
          "chat": _COMMON | {"messages", "max_completion_tokens"}}


class ApiError(Exception):
    """A request the server refuses: HTTP `status` with an OpenAI-style error object."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code
        self.status, self.type = status, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class ModelContext:
    """What validation needs to know about the served model and engine."""

    name: str  # --served-model-name
    max_model_len: int  # prompt + completion tokens, at most
    vocab_size: int
    max_num_seqs: int  # n above this could never be scheduled
    tokenizer: Tokenizer | None  # None: prompts as token ids, no chat, no stop strings


@dataclass(frozen=True)
class GenerationParams:
    """One validated /v1/completions or /v1/chat/completions request."""

    kind: Literal["completion", "chat"]
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    stop: tuple[str, ...]  # stop strings, matched on the detokenized text
    stream: bool
    include_usage: bool  # stream_options.include_usage: a final usage chunk
    return_token_ids: bool  # extension: token ids next to the text (always without tokenizer)


# ------------------------------------------------------------------ parsing
def parse_completion(body: Any, ctx: ModelContext) -> GenerationParams:
    _check_common(body, ctx, "completion")
    prompt = body.get("prompt")
    ids = _prompt_ids(prompt, ctx)
    return _params("completion", body, ctx, ids, DEFAULT_COMPLETION_TOKENS, ("max_tokens",))


def parse_chat(body: Any, ctx: ModelContext) -> GenerationParams:
    _check_common(body, ctx, "chat")
    if ctx.tokenizer is None:
        raise ApiError(f"model {ctx.name!r} has no tokenizer, so no chat template; use "
                       "/v1/completions with token ids", param="messages")
    messages = _messages(body.get("messages"))
    try:
        text = ctx.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except UserError as exc:
        raise ApiError(str(exc), param="messages") from None
    ids = ctx.tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise ApiError("the chat template rendered an empty prompt", param="messages")
    return _params("chat", body, ctx, ids, None, ("max_completion_tokens", "max_tokens"))


def _check_common(body: Any, ctx: ModelContext, kind: Literal["completion", "chat"]) -> None:
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {_json_type(body)}")
    known = _KNOWN[kind]
    for key in body:
        if key not in known and key not in _UNSUPPORTED:
            where = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
            raise ApiError(f"unknown parameter {key[:100]!r} for {where}; it is refused "
                           "rather than ignored", param=key[:100], code="unsupported_parameter")
    model = body.get("model")
    if model is not None and model != ctx.name:
        raise ApiError(f"the model {_short(model)} does not exist; this server serves "
                       f"{ctx.name!r}",
                       param="model", code="model_not_found")
    for key, off in _UNSUPPORTED.items():
        value = body.get(key)
        if not any(value == v and type(value) is type(v) for v in off) and value is not None:
            why = (" (tool_choice needs tools, and infbench serve supports none)"
                   if key == "tool_choice" else "")
            raise ApiError(f"{key}={_short(value)} is not supported by infbench serve{why}",
                           param=key, code="unsupported_parameter")


def _params(kind: Literal["completion", "chat"], body: dict[str, Any], ctx: ModelContext,
            ids: list[int], default_max: int | None,
            max_keys: tuple[str, ...]) -> GenerationParams:
    room = ctx.max_model_len - len(ids)
    if room < 1:
        raise ApiError(f"the prompt has {len(ids)} tokens; this model's maximum context length "
                       f"is {ctx.max_model_len} tokens, which leaves no room to generate",
                       param="messages" if kind == "chat" else "prompt",
                       code="context_length_exceeded")
    max_key = next((k for k in max_keys if body.get(k) is not None), max_keys[0])
    max_tokens = _int(body, max_key, default_max if default_max is not None else room,
                      minimum=1)
    if max_tokens > room:
        raise ApiError(f"this model's maximum context length is {ctx.max_model_len} tokens; "
                       f"the prompt has {len(ids)} and {max_key}={max_tokens} asks for "
                       f"{len(ids) + max_tokens}", param=max_key, code="context_length_exceeded")
    n = _int(body, "n", 1, minimum=1)
    if n > ctx.max_num_seqs:
        raise ApiError(f"n={n} exceeds the engine's max_num_seqs ({ctx.max_num_seqs})",
                       param="n")
    temperature = _float(body, "temperature", 1.0, minimum=0.0)
    if temperature < GREEDY_BELOW:  # logits / 1e-300 overflow to inf: sample greedily instead
        temperature = 0.0
    top_p = _float(body, "top_p", 1.0, minimum=0.0)
    if not 0.0 < top_p <= 1.0:
        raise ApiError(f"top_p must be in (0, 1], got {top_p}", param="top_p")
    top_k = _int(body, "top_k", 0, minimum=-1)  # -1 (vLLM) and 0 both mean off
    seed = _optional_int(body, "seed", 0, MAX_SEED)
    stop = _stop_strings(body.get("stop"))
    if stop and ctx.tokenizer is None:
        raise ApiError(f"model {ctx.name!r} has no tokenizer to match stop strings against; "
                       "use stop_token_ids", param="stop")
    stop_ids = _token_ids(body.get("stop_token_ids", []), "stop_token_ids", ctx, allow_empty=True)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError("stream_options is only allowed with stream=true",
                           param="stream_options")
        if not isinstance(options, dict):
            raise ApiError(f"stream_options must be an object, got {_json_type(options)}",
                           param="stream_options")
        include_usage = _bool(options, "include_usage", False, "stream_options.include_usage")
    sampling = SamplingParams(
        temperature=temperature, top_k=max(top_k, 0), top_p=top_p, max_tokens=max_tokens,
        seed=seed, stop_token_ids=tuple(stop_ids), ignore_eos=_bool(body, "ignore_eos", False),
        n=n)
    return GenerationParams(kind, tuple(ids), sampling, stop, stream, include_usage,
                            _bool(body, "return_token_ids", False) or ctx.tokenizer is None)


def _prompt_ids(prompt: Any, ctx: ModelContext) -> list[int]:
    """A string, a list of token ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if ctx.tokenizer is None:
            raise ApiError(f"model {ctx.name!r} has no tokenizer; give the prompt as token ids",
                           param="prompt")
        ids = ctx.tokenizer.encode(prompt)
        if not ids:
            raise ApiError("the prompt is empty", param="prompt")
        return ids
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise ApiError("give one prompt per request (a string or a list of token ids)",
                       param="prompt")
    if prompt is None:
        raise ApiError("prompt is required", param="prompt")
    if not isinstance(prompt, list):
        raise ApiError(f"prompt must be a string or a list of token ids, got "
                       f"{_json_type(prompt)}", param="prompt")
    return _token_ids(prompt, "prompt", ctx, allow_empty=False)


def _token_ids(value: Any, key: str, ctx: ModelContext, *, allow_empty: bool) -> list[int]:
    if not isinstance(value, list) or (not value and not allow_empty):
        raise ApiError(f"{key} must be a non-empty list of token ids" if not allow_empty
                       else f"{key} must be a list of token ids", param=key)
    for t in value:
        if not _is_int(t) or not 0 <= t < ctx.vocab_size:
            raise ApiError(f"{key}: token {_short(t)} is outside the vocabulary "
                           f"(0..{ctx.vocab_size - 1})", param=key)
    return list(value)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ApiError("messages must be a non-empty list of {role, content} objects",
                       param="messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"{where} must be an object with a string role", param=where)
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                        part.get("text"), str):
                    raise ApiError(f"{where}.content: only text parts are supported",
                                   param=f"{where}.content")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ApiError(f"{where}.content must be a string or a list of text parts",
                           param=f"{where}.content")
        out.append({"role": m["role"], "content": content})
    return out


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise ApiError("stop must be a non-empty string or a list of them (token ids go in "
                       "stop_token_ids)", param="stop")
    return tuple(items)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: dict[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if not _is_int(value):
        raise ApiError(f"{key} must be an integer, got {_json_type(value)}", param=key)
    if value < minimum:
        raise ApiError(f"{key} must be >= {minimum}, got {value}", param=key)
    return int(value)


def _optional_int(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value) or not low <= value <= high:
        raise ApiError(f"{key} must be an integer in [{low}, {high}], got {_short(value)}",
                       param=key)
    return int(value)


def _float(body: dict[str, Any], key: str, default: float, *, minimum: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ApiError(f"{key} must be a finite number, got {_short(value)}", param=key)
    if value < minimum:
        raise ApiError(f"{key} must be >= {minimum}, got {value}", param=key)
    return float(value)


def _bool(body: dict[str, Any], key: str, default: bool, name: str | None = None) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(f"{name or key} must be true or false, got {_short(value)}",
                       param=name or key)
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
