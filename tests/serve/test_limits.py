"""The request-body limits without a server: JSON depth, number length, constants,
duplicated keys, lone surrogates (with the parameter named), and the bytes-in-flight
budget."""

from __future__ import annotations

import pytest

from infbench.serve.limits import (
    MAX_JSON_DEPTH,
    MAX_NUMBER_CHARS,
    BodyBudget,
    ServerLimits,
    parse_json,
)
from infbench.serve.protocol import ApiError


@pytest.mark.parametrize(("raw", "code", "param", "message"), [
    (b"[" * 100_000 + b"]" * 100_000, "too_deep", None, "nests deeper"),
    (b'{"prompt": ' + b"[" * 40 + b"]" * 40 + b"}", "too_deep", "prompt", "nests deeper"),
    (b'{"max_tokens": ' + b"9" * 5000 + b"}", "number_too_long", None, "5000 characters"),
    (b'{"temperature": 1.' + b"5" * 100 + b"}", "number_too_long", None, "characters"),
    (b'{"temperature": NaN}', None, None, "not a JSON number"),
    (b'{"temperature": -Infinity}', None, None, "not a JSON number"),
    (b'{"a": 1, "a": 2}', "duplicate_key", "a", "appears twice"),
    (b'{"prompt": "ok \\ud800"}', "invalid_string", "prompt", "lone UTF-16 surrogate"),
    (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "invalid_string",
     "messages[0].content", "surrogate"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
     "invalid_string", "messages[0].content", "surrogate"),
    (b'{"stop": ["a", "\\ud800"]}', "invalid_string", "stop", "surrogate"),
    (b'{"\\ud800": 1}', "invalid_string", None, "a key"),
    (b'{"prompt": "\xff\xfe"}', None, None, "not UTF-8"),
    (b"", None, None, "not valid JSON"),
    (b"{not json", None, None, "not valid JSON"),
], ids=lambda v: None if isinstance(v, bytes) else str(v))
def test_json_outside_the_limits_is_a_400(raw: bytes, code: str | None, param: str | None,
                                          message: str) -> None:
    with pytest.raises(ApiError) as exc:
        parse_json(raw)
    assert exc.value.status == 400 and exc.value.code == code and exc.value.param == param
    assert message in exc.value.message and len(exc.value.message) < 300


def test_json_inside_the_limits_parses() -> None:
    deep = b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1)
    assert parse_json(b'{"x": ' + deep + b"}")["x"] is not None
    big = int("9" * MAX_NUMBER_CHARS)
    assert parse_json(b'{"seed": ' + str(big).encode() + b"}") == {"seed": big}
    # a surrogate pair is one real character (U+1F600), not a lone surrogate
    assert parse_json(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}


def test_budget_refuses_past_its_capacity_and_frees() -> None:
    budget = BodyBudget(100)
    budget.reserve(60)
    with pytest.raises(ApiError) as exc:
        budget.reserve(41)
    assert exc.value.status == 429 and exc.value.code == "too_many_request_bytes"
    budget.release(60)
    budget.reserve(100)
    assert budget.in_use == 100
    with pytest.raises(ValueError):
        ServerLimits(max_body_bytes=10, max_body_bytes_in_flight=5)
