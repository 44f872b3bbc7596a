"""The async client against the mock server: records, timings, token counts, failures."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from typing import Any

import pytest

from infbench.client.mock_server import WORDS, MockConfig, MockServer
from infbench.client.openai_target import ClientPlan, TargetRun, open_session, run_requests
from infbench.engine.request import Request, SamplingParams
from infbench.measure.metrics import inter_token_latencies
from infbench.model.tokenizer import Tokenizer
from infbench.scenario.target import TargetSection


def requests(num: int, max_tokens: int, *, n: int = 1, ignore_eos: bool = True,
             arrival_step_s: float = 0.0) -> list[Request]:
    return [Request(f"r{i:02d}", (12, 13, 14, 15), SamplingParams(
        temperature=0.0, top_p=0.9, top_k=5, max_tokens=max_tokens, seed=100 + i,
        ignore_eos=ignore_eos), arrival_s=i * arrival_step_s, n=n) for i in range(num)]


def run(server: MockServer, reqs: list[Request], tokenizer: Any = None,
        max_concurrency: int | None = None, **target: Any) -> TargetRun:
    source = target.pop("tokenizer_source", None)
    section = TargetSection(kind="openai", base_url=server.base_url, model="mock-model",
                            tokenizer=source, **target)
    plan = ClientPlan(section, tokenizer, max_concurrency)

    async def main() -> TargetRun:
        async with open_session(section, max_concurrency or 8) as session:
            return await run_requests(plan, reqs, session=session)

    return asyncio.run(main())


def test_request_body_asks_for_a_stream_with_usage_and_the_workload_sampling() -> None:
    config = MockConfig()
    with MockServer(config) as server:
        out = run(server, requests(2, 5, ignore_eos=True))
    assert not out.failures
    body = config.received[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["prompt"] == [12, 13, 14, 15]  # token ids, not text
    assert body["max_tokens"] == 5 and body["ignore_eos"] is True
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.0, 0.9, 5)
    assert {b["seed"] for b in config.received} == {100, 101}


def test_records_from_a_timed_stream_have_the_mocks_ttft_and_itl() -> None:
    config = MockConfig(first_delay_s=0.06, token_delay_s=0.02)
    with MockServer(config) as server:
        out = run(server, requests(3, 8, arrival_step_s=0.03))
    assert not out.failures and len(out.records) == 3
    for i, rec in enumerate(sorted(out.records, key=lambda r: r.request_id)):
        assert rec.request_id == f"r{i:02d}"
        assert rec.arrival_s == pytest.approx(0.03 * i)
        assert rec.num_output_tokens == 8 and rec.num_prompt_tokens == 4
        assert rec.finish_reason == "length"
        ttft = rec.first_token_s - rec.arrival_s
        assert 0.06 <= ttft < 0.06 + 0.05  # the mock's delay plus sleep, loopback and load slack
        gaps = inter_token_latencies(rec.token_times_s)
        assert len(gaps) == 7
        assert statistics.median(gaps) == pytest.approx(0.02, abs=0.008)
        assert rec.finish_s - rec.first_token_s == pytest.approx(7 * 0.02, abs=0.03)
    assert out.wall_s >= max(r.finish_s for r in out.records)


def test_multi_token_chunks_are_split_with_the_tokenizer(tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_hf_dir(tokenizer_dir)
    config = MockConfig(tokens_per_chunk=3, token_delay_s=0.03, send_usage=False)
    with MockServer(config) as server:
        out = run(server, requests(1, 7), tokenizer=tok)
    rec = out.records[0]
    # 7 tokens in chunks of 3, 3, 1: counted by the tokenizer (no usage was sent).
    assert rec.num_output_tokens == 7
    t = rec.token_times_s
    assert t[0] == t[1] == t[2]  # the first chunk's tokens arrive together (TTFT)
    assert t[3] - t[2] == pytest.approx((t[5] - t[2]) / 3)  # spread over the chunk's gap
    assert t[5] - t[2] == pytest.approx(0.03, abs=0.01)
    assert rec.output_ids == tok.encode(" ".join(WORDS[:7]), add_special_tokens=False)


def test_counts_come_from_usage_when_sent_and_otherwise_one_per_chunk() -> None:
    with MockServer(MockConfig(tokens_per_chunk=4)) as server:
        with_usage = run(server, requests(1, 10)).records[0]
    with MockServer(MockConfig(tokens_per_chunk=4, send_usage=False)) as server:
        no_usage = run(server, requests(1, 10)).records[0]
    assert with_usage.num_output_tokens == 10  # usage.completion_tokens, no tokenizer needed
    assert no_usage.num_output_tokens == 3  # no usage, no tokenizer: one per chunk (4, 4, 2)


def test_samples_concurrency_cap_and_chat_endpoint(tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_hf_dir(tokenizer_dir)
    config = MockConfig(token_delay_s=0.01)
    with MockServer(config) as server:
        out = run(server, requests(2, 4, n=2), tokenizer=tok, max_concurrency=1,
                  endpoint="chat", tokenizer_source=str(tokenizer_dir))
    ids = sorted(r.request_id for r in out.records)
    assert ids == ["r00/0", "r00/1", "r01/0", "r01/1"]
    body = config.received[0]
    assert "prompt" not in body
    assert body["messages"] == [{"role": "user", "content": tok.decode([12, 13, 14, 15])}]
    # One stream at a time: each arrives (is submitted) after the previous one finished.
    ordered = sorted(out.records, key=lambda r: r.arrival_s)
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert after.arrival_s >= before.finish_s - 1e-3
    assert all(r.num_output_tokens == 4 for r in out.records)


def test_failed_requests_are_counted_not_raised() -> None:
    with MockServer(MockConfig(fail_every=3)) as server:
        out = run(server, requests(6, 3))
    assert len(out.records) == 4 and len(out.failures) == 2
    assert out.failures[0].message.startswith("HTTP 500 from ")
    assert "mock failure" in out.failures[0].message


def test_connection_refused_is_a_failure() -> None:
    with MockServer(MockConfig()) as server:
        dead = server.base_url
    section = TargetSection(kind="openai", base_url=dead, model="m", timeout_s=5.0)

    async def main() -> TargetRun:
        async with open_session(section, 2) as session:
            return await run_requests(ClientPlan(section), requests(2, 3), session=session)

    out = asyncio.run(main())
    assert not out.records and len(out.failures) == 2
    assert out.failures[0].message
