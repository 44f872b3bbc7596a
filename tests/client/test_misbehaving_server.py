"""The client against servers that get the protocol wrong: each case is a failed request with
its reason, never a success with made-up tokens and never an exception out of the run."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infbench.client.failures import REASONS, RequestFailed, count_reasons, failure_notes
from infbench.client.mock_server import MISBEHAVIORS, MockConfig, MockServer
from infbench.client.openai_target import ClientPlan, TargetRun, open_session, run_requests
from infbench.client.stream import Stream
from infbench.engine.request import Request, SamplingParams
from infbench.scenario.target import TargetSection


def requests(num: int, max_tokens: int = 8) -> list[Request]:
    return [Request(f"r{i:02d}", (12, 13, 14, 15), SamplingParams(
        temperature=0.0, max_tokens=max_tokens, seed=100 + i, ignore_eos=True))
        for i in range(num)]


def run(server: MockServer, reqs: list[Request], **target: Any) -> TargetRun:
    section = TargetSection(kind="openai", base_url=server.base_url, model="mock-model",
                            **target)

    async def main() -> TargetRun:
        async with open_session(section, 4) as session:
            return await run_requests(ClientPlan(section), reqs, session=session)

    return asyncio.run(main())


CASES = {
    "truncate": ("truncated", "closed before data: [DONE] after 3 text chunk(s), no finish"),
    "cut": ("truncated", ""),
    "no_done": ("truncated", "closed before data: [DONE] after 8 text chunk(s)"),
    "no_finish": ("no_finish_reason", "no finish_reason"),
    "empty": ("not_sse", "no SSE event before the connection closed"),
    "html": ("not_sse", "Content-Type text/html, not text/event-stream: <html>"),
    "json": ("not_sse", "Content-Type application/json"),
    "zero_usage": ("count_mismatch", "usage.completion_tokens 0 after 8 text chunk(s)"),
    "huge_usage": ("count_mismatch", "usage.completion_tokens 1000000000 is more than 8"),
    "choices_int": ("bad_chunk", "event 2: choices: must be a list (got 5)"),
    "deep_json": ("bad_json", "event 2: nested deeper than 64 levels"),
    "big_int": ("bad_json", "event 2: an integer of 5000 digits"),
    "no_newline": ("bad_json", "a line of more than 1048576 bytes"),
}


def test_every_misbehavior_has_a_case() -> None:
    assert set(CASES) | {"ping_forever"} == set(MISBEHAVIORS)


@pytest.mark.parametrize("how", sorted(CASES))
def test_a_misbehaving_server_gives_failed_requests_with_the_reason(how: str) -> None:
    reason, message = CASES[how]
    with MockServer(MockConfig(misbehave=how)) as server:
        out = run(server, requests(3))
    assert out.records == []
    assert [f.reason for f in out.failures] == [reason] * 3
    assert [f.request_id for f in out.failures] == ["r00", "r01", "r02"]
    for failure in out.failures:
        assert message in failure.message, failure.message
        assert "\n" not in failure.message and len(failure.message) <= 300


def test_keep_alive_comments_do_not_outlive_the_request_deadline() -> None:
    """`: ping` every 50 ms resets the per-read timeout (5 s) forever; the deadline ends it."""
    with MockServer(MockConfig(misbehave="ping_forever")) as server:
        start = time.perf_counter()
        out = run(server, requests(2), timeout_s=5.0, request_timeout_s=0.5)
        took = time.perf_counter() - start
    assert out.records == [] and [f.reason for f in out.failures] == ["deadline"] * 2
    assert "target.request_timeout_s 0.5 s" in out.failures[0].message
    assert took < 3.0


def test_the_read_timeout_is_its_own_reason() -> None:
    with MockServer(MockConfig(first_delay_s=2.0)) as server:
        out = run(server, requests(1), timeout_s=0.3)
    assert [f.reason for f in out.failures] == ["read_timeout"]


def test_a_good_stream_next_to_bad_ones_still_counts() -> None:
    with MockServer(MockConfig(fail_every=2)) as server:
        out = run(server, requests(4, max_tokens=5))
    assert len(out.records) == 2 and {f.reason for f in out.failures} == {"http_status"}
    assert all(r.num_output_tokens == 5 for r in out.records)


def stream_of(*events: str, max_tokens: int = 8, done: bool = True) -> Stream:
    stream = Stream(max_tokens=max_tokens)
    for i, event in enumerate(events):
        stream.add_event(event, 0.1 * i)
    stream.done = done
    stream.check_complete()
    return stream


TEXT = '{"choices": [{"index": 0, "text": " a", "finish_reason": null}]}'
LAST = '{"choices": [{"index": 0, "text": " b", "finish_reason": "length"}]}'


@pytest.mark.parametrize(("event", "reason", "message"), [
    ('{"choices": [{"index": 1, "text": " x"}]}', "bad_chunk", "index: 1; one completion"),
    ('{"choices": [{"index": true, "text": " x"}]}', "bad_chunk", "index: True"),
    ('{"choices": [{"text": 7}]}', "bad_chunk", "choices[0].text: must be a string (got 7)"),
    ('{"choices": ["x"]}', "bad_chunk", "choices[0]: must be an object"),
    ('{"choices": [{"text": " x", "finish_reason": 3}]}', "bad_chunk", "finish_reason: must"),
    ('{"choices": [{"text": " x", "token_ids": [-1]}]}', "bad_chunk", "token_ids: must be"),
    ('{"choices": [{"text": " x", "token_ids": [1.5]}]}', "bad_chunk", "token_ids: must be"),
    ('{"choices": [], "usage": {"completion_tokens": -2}}', "bad_chunk", "usage.completion"),
    ('{"choices": [], "usage": {"completion_tokens": 1e9}}', "bad_chunk", "got 1000000000.0"),
    ('{"choices": [], "usage": {"completion_tokens": true}}', "bad_chunk", "got True"),
    ('{"choices": [], "usage": {"prompt_tokens": "4"}}', "bad_chunk", "usage.prompt_tokens"),
    ('{"choices": [], "usage": [1]}', "bad_chunk", "usage: must be an object"),
    ('{"choices": [], "usage": {"completion_tokens": 9}}', "count_mismatch", "more than 8"),
    ('[1, 2]', "bad_chunk", "is a JSON list, not an object"),
    ('{"error": {"message": "overloaded"}}', "server_error", "'overloaded'"),
    ('{"object": "error", "message": "bad"}', "server_error", "server error in stream"),
    ('not json', "bad_json", "is not JSON"),
    ('{"a": NaN}', "bad_json", "NaN is not JSON"),
    ('{"a": "\\ud800"}', "bad_json", "lone surrogate"),
    ('{"a": 1e999}', "bad_json", "beyond a float's range"),
])
def test_every_chunk_field_is_checked(event: str, reason: str, message: str) -> None:
    with pytest.raises(RequestFailed) as exc:
        stream_of(TEXT, event, LAST)
    assert exc.value.reason == reason and message in str(exc.value), str(exc.value)


def test_counts_that_disagree_with_the_chunks_fail() -> None:
    usage = '{"choices": [], "usage": {"completion_tokens": %d}}'
    assert stream_of(TEXT, LAST, usage % 2).usage == {"completion_tokens": 2}
    assert stream_of(TEXT, LAST, usage % 5).usage == {"completion_tokens": 5}  # merged chunks
    with pytest.raises(RequestFailed, match="1 is fewer than the 2 text chunk"):
        stream_of(TEXT, LAST, usage % 1)
    ids = '{"choices": [{"text": " a", "token_ids": [5, 6], "finish_reason": "stop"}]}'
    assert stream_of(ids, usage % 2).num_ids == 2
    with pytest.raises(RequestFailed, match="completion_tokens 3 but 2 token ids"):
        stream_of(ids, usage % 3)
    with pytest.raises(RequestFailed, match="more than max_tokens 2 tokens streamed"):
        stream_of(TEXT, TEXT, LAST, max_tokens=2)
    with pytest.raises(RequestFailed) as exc:
        stream_of('{"choices": [{"text": "", "finish_reason": "stop"}]}')
    assert exc.value.reason == "no_tokens"


def test_reasons_are_counted_and_reported() -> None:
    assert count_reasons(["truncated", "deadline", "truncated"]) == {"truncated": 2,
                                                                     "deadline": 1}
    with pytest.raises(ValueError, match="unknown failure reason"):
        RequestFailed("oops", "x")
    result = {"name": "c", "label": "rate=4", "telemetry": {"client": {
        "num_failed": 3, "num_sent": 12, "failures_by_reason": {"truncated": 2, "deadline": 1},
        "first_error": "r0001 (truncated): the stream closed"}}}
    assert failure_notes([result, {"name": "ok", "telemetry": {"client": {"num_failed": 0}}}]) \
        == ["client failures: c [rate=4]: 3 of 12 request(s) failed (truncated 2, deadline 1); "
            "first r0001 (truncated): the stream closed"]
    assert set(REASONS) >= {"truncated", "deadline", "not_sse", "count_mismatch"}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["choices", "text", "delta", "content", "usage", "index",
                         "finish_reason", "token_ids", "completion_tokens", "prompt_tokens",
                         "error", "object", "message"]), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(events=st.lists(JSON.map(json.dumps) | st.text(max_size=30), max_size=5),
       done=st.booleans(), chat=st.booleans())
def test_any_event_sequence_is_a_whole_stream_or_a_failure_with_a_reason(
        events: list[str], done: bool, chat: bool) -> None:
    stream = Stream(max_tokens=4, chat=chat)
    try:
        for i, event in enumerate([TEXT, *events, LAST]):
            stream.add_event(event, 0.1 * i)
        stream.done = done
        stream.check_complete()
    except RequestFailed as exc:
        assert exc.reason in REASONS and "\n" not in str(exc)
    else:
        assert stream.finish_reason and stream.done
        assert len(stream.chunks) <= 4 and (stream.usage or {}).get("completion_tokens", 4) <= 4
