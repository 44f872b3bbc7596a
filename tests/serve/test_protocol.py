"""Request validation, incremental detokenization with stop strings, and the metrics text,
without a server."""

from __future__ import annotations

import re
from typing import Any

import pytest
from serve_helpers import byte_tokenizer

from infbench.serve.detokenize import SampleText
from infbench.serve.metrics import EngineStats, Histogram, ServerMetrics
from infbench.serve.protocol import ApiError, ModelContext, parse_chat, parse_completion

TOK = byte_tokenizer()
CTX = ModelContext("m", max_model_len=64, vocab_size=256, max_num_seqs=4, tokenizer=TOK)
NO_TOK = ModelContext("m", max_model_len=64, vocab_size=256, max_num_seqs=4, tokenizer=None)


def test_completion_defaults_and_sampling() -> None:
    p = parse_completion({"model": "m", "prompt": "hello", "max_tokens": 5, "temperature": 0,
                          "top_k": -1, "seed": 3, "stop": "x", "stop_token_ids": [7],
                          "ignore_eos": True, "n": 2}, CTX)
    assert p.prompt_ids == tuple(TOK.encode("hello"))
    s = p.sampling
    assert (s.max_tokens, s.temperature, s.top_k, s.seed, s.stop_token_ids, s.ignore_eos,
            s.n) == (5, 0.0, 0, 3, (7,), True, 2)
    assert p.stop == ("x",) and not p.stream and not p.return_token_ids
    assert parse_completion({"prompt": [1, 2]}, CTX).sampling.max_tokens == 16
    assert parse_completion({"prompt": [1], "temperature": 1e-300}, CTX).sampling.is_greedy
    assert parse_completion({"prompt": [[1, 2]]}, NO_TOK).return_token_ids  # no tokenizer
    chat = parse_chat({"messages": [{"role": "user", "content": [{"type": "text",
                                                                   "text": "hi"}]}]}, CTX)
    assert TOK.decode(list(chat.prompt_ids)) == "<user>hi\n<assistant>"
    assert chat.sampling.max_tokens == 64 - len(chat.prompt_ids)  # chat: up to the context


BAD: list[tuple[dict[str, Any], str, str | None]] = [
    ({"prompt": "x", "model": "other"}, "does not exist", "model"),
    ({"prompt": "x", "max_tokens": 0}, ">= 1", "max_tokens"),
    ({"prompt": "x", "max_tokens": 64}, "maximum context length", "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, "must be an integer", "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "must be an integer", "max_tokens"),
    ({"prompt": "x" * 64}, "leaves no room", "prompt"),
    ({"prompt": [1, 300]}, "outside the vocabulary", "prompt"),
    ({"prompt": []}, "non-empty list", "prompt"),
    ({"prompt": ["a", "b"]}, "one prompt per request", "prompt"),
    ({"prompt": 5}, "string or a list", "prompt"),
    ({}, "required", "prompt"),
    ({"prompt": "x", "temperature": -1}, ">= 0", "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "finite number", "temperature"),
    ({"prompt": "x", "top_p": 0}, "(0, 1]", "top_p"),
    ({"prompt": "x", "n": 5}, "max_num_seqs", "n"),
    ({"prompt": "x", "seed": -1}, "integer in", "seed"),
    ({"prompt": "x", "stop": [""]}, "stop must be", "stop"),
    ({"prompt": "x", "stop": 3}, "stop must be", "stop"),
    ({"prompt": "x", "stop_token_ids": [1.5]}, "outside the vocabulary", "stop_token_ids"),
    ({"prompt": "x", "stream": "yes"}, "true or false", "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "only allowed", "stream_options"),
    ({"prompt": "x", "logprobs": 2}, "not supported", "logprobs"),
    ({"prompt": "x", "presence_penalty": 0.5}, "not supported", "presence_penalty"),
    ({"prompt": "x", "min_p": 0.1}, "not supported", "min_p"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "not supported",
     "response_format"),
    ({"prompt": "x", "tool_choice": "none"}, "needs tools", "tool_choice"),
    ({"prompt": "x", "tool_choice": "auto"}, "needs tools", "tool_choice"),
    ({"prompt": "x", "parallel_tool_calls": True}, "not supported", "parallel_tool_calls"),
    ({"prompt": "x", "frobnicate": 1}, "unknown parameter 'frobnicate'", "frobnicate"),
    ({"prompt": "x", "messages": []}, "unknown parameter 'messages'", "messages"),
    ({"prompt": "x", "max_completion_tokens": 3}, "unknown parameter", "max_completion_tokens"),
    ({"prompt": "x", "model": "y" * 10_000}, "does not exist", "model"),
]


@pytest.mark.parametrize(("body", "message", "param"), BAD, ids=[b[2] or "body" for b in BAD])
def test_bad_completion_requests_name_the_parameter(body: dict[str, Any], message: str,
                                                     param: str | None) -> None:
    with pytest.raises(ApiError) as exc:
        parse_completion(body, CTX)
    assert message in exc.value.message and exc.value.param == param
    err = exc.value.body()["error"]
    assert exc.value.status == 400 and err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(("parse", "body", "param"), [
    (parse_chat, [], None),
    (parse_chat, {"messages": []}, "messages"),
    (parse_chat, {"messages": [{"content": "x"}]}, "messages[0]"),
    (parse_chat, {"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    (parse_chat, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
])
def test_bad_chat_requests(parse: Any, body: Any, param: str | None) -> None:
    with pytest.raises(ApiError) as exc:
        parse(body, CTX)
    assert exc.value.param == param


def test_off_values_of_unsupported_fields_and_user_are_accepted() -> None:
    p = parse_completion({"prompt": "x", "min_p": 0, "response_format": {"type": "text"},
                          "tool_choice": None, "logprobs": None, "user": "u-1"}, CTX)
    assert p.prompt_ids == tuple(TOK.encode("x"))
    chat = {"messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(ApiError, match="unknown parameter 'prompt'") as exc:
        parse_chat({**chat, "prompt": "x"}, CTX)
    assert exc.value.code == "unsupported_parameter"
    with pytest.raises(ApiError, match="needs tools"):
        parse_chat({**chat, "tool_choice": {"type": "function"}}, CTX)


def test_an_error_never_echoes_a_huge_value() -> None:
    with pytest.raises(ApiError) as exc:
        parse_completion({"prompt": "x", "seed": [1] * 100_000}, CTX)
    assert exc.value.param == "seed" and len(exc.value.message) < 200


def test_no_tokenizer_refuses_text_chat_and_stop_strings() -> None:
    for parse, body in ((parse_completion, {"prompt": "x"}),
                        (parse_completion, {"prompt": [1], "stop": "a"}),
                        (parse_chat, {"messages": [{"role": "user", "content": "x"}]})):
        with pytest.raises(ApiError, match="tokenizer"):
            parse(body, NO_TOK)


def _feed(text: SampleText, data: str) -> tuple[str, bool]:
    """Add the tokens of `data` (one per UTF-8 byte) one at a time; the streamed text and
    whether a stop string matched."""
    out = ""
    for token in TOK.encode(data):
        stopped = text.add(token)
        out += text.take()
        if stopped:
            return out, True
    text.finish()
    return out + text.take(final=True), False


def test_detokenize_multibyte_characters_arrive_whole() -> None:
    text = SampleText(TOK)
    out, stopped = _feed(text, "a€b😀c")
    assert out == "a€b😀c" and not stopped and text.text == "a€b😀c"
    assert len(text.token_ids) == len("a€b😀c".encode())


def test_detokenize_stop_string_is_cut_and_held_back() -> None:
    text = SampleText(TOK, stop=("STOP", "xyz"))
    streamed = ""
    for i, ch in enumerate("abSTxSTOPtail"):
        assert not text.stopped
        done = text.add(TOK.encode(ch)[0])
        delta = text.take()
        streamed += delta
        if i == 3:  # "abST": "ST" could begin "STOP", so it is held back
            assert streamed == "ab"
        if done:
            break
    assert text.stopped and text.text == "abSTx" and streamed == "abSTx"
    assert len(text.token_ids) == len("abSTxSTOP")
    with pytest.raises(ValueError):
        text.add(1)


def test_detokenize_without_stop_flushes_held_text_at_the_end() -> None:
    text = SampleText(TOK, stop=("STOP",))
    out, stopped = _feed(text, "xxST")
    assert out == "xxST" and not stopped


def test_histogram_and_metrics_text() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    lines = h.lines("x", 'a="b"')
    assert lines[:3] == ['x_bucket{a="b",le="0.1"} 2', 'x_bucket{a="b",le="1"} 3',
                         'x_bucket{a="b",le="+Inf"} 4']
    assert lines[3:] == ['x_sum{a="b"} 3.65', 'x_count{a="b"} 4']
    m = ServerMetrics('m"1', lambda: EngineStats(2, 3, 0.25, 7, prefix_cache_queries=40,
                                                  prefix_cache_hits=16, num_steps=9,
                                                  step_seconds=0.125))
    m.finish_request("stop", 10, 4, 0.2)
    text = m.render()
    assert 'infbench:num_requests_running{model_name="m\\"1"} 2' in text
    assert 'infbench:kv_cache_usage_perc{model_name="m\\"1"} 0.25' in text
    assert 'infbench:num_preemptions_total{model_name="m\\"1"} 7' in text
    assert 'infbench:prefix_cache_queries_total{model_name="m\\"1"} 40' in text
    assert 'infbench:prefix_cache_hits_total{model_name="m\\"1"} 16' in text
    assert 'infbench:engine_steps_total{model_name="m\\"1"} 9' in text
    assert 'infbench:engine_step_seconds_total{model_name="m\\"1"} 0.125' in text
    assert re.search(r'request_success_total\{.*finished_reason="stop"\} 1', text)
