"""Reasoning models: TTFT at the first token of any kind, TTFO at the first content token,
reasoning and content tokens counted apart, ITL/TPOT over every token, old rows unchanged."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from test_openai_target import requests, run

from infbench.client.mock_server import MockConfig, MockServer
from infbench.client.openai_target import to_record
from infbench.client.stream import Stream
from infbench.client.tokens import Chunk, split_counts
from infbench.engine.request import Request, SamplingParams
from infbench.measure.metrics import from_request_rows, inter_token_latencies, request_rows
from infbench.model.tokenizer import Tokenizer
from infbench.results.store import load_result

FIRST_S, GAP_S, NUM_REASONING, NUM_TOKENS = 0.05, 0.02, 4, 8


def _chat(config: MockConfig, tokenizer_dir: Path, tokenizer: Any = None) -> list[Any]:
    with MockServer(config) as server:
        out = run(server, requests(2, NUM_TOKENS), tokenizer=tokenizer or
                  Tokenizer.from_hf_dir(tokenizer_dir), endpoint="chat",
                  tokenizer_source=str(tokenizer_dir))
    assert not out.failures
    return out.records


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("usage", [True, False], ids=["usage-details", "no-details"])
def test_ttft_at_first_reasoning_chunk_ttfo_at_first_content(
        tokenizer_dir: Path, field: str, usage: bool) -> None:
    config = MockConfig(first_delay_s=FIRST_S, token_delay_s=GAP_S,
                        reasoning_tokens=NUM_REASONING, reasoning_field=field,
                        reasoning_usage=usage)
    for rec in _chat(config, tokenizer_dir):
        assert rec.num_output_tokens == NUM_TOKENS
        assert rec.num_reasoning_tokens == NUM_REASONING
        ttft = rec.first_token_s - rec.arrival_s
        # Tolerances allow a loaded machine's late wake-ups yet keep the first content
        # chunk (FIRST_S + NUM_REASONING * GAP_S = 0.13 s) outside the TTFT bound.
        assert FIRST_S <= ttft < FIRST_S + 0.04
        assert rec.first_output_s is not None
        ttfo = rec.first_output_s - rec.arrival_s
        assert ttfo == pytest.approx(FIRST_S + NUM_REASONING * GAP_S, abs=0.03)
        # ITL and TPOT over every generated token, reasoning ones included
        gaps = inter_token_latencies(rec.token_times_s)
        assert len(gaps) == NUM_TOKENS - 1
        assert statistics.median(gaps) == pytest.approx(GAP_S, abs=0.01)
    rows = request_rows(_chat(config, tokenizer_dir))
    m = from_request_rows(rows)
    assert m["ttfo_s"]["p50"] > m["ttft_s"]["p50"] + (NUM_REASONING - 1) * GAP_S
    assert m["tpot_s"]["p50"] == pytest.approx(GAP_S, abs=0.01)
    assert all(r["num_reasoning_tokens"] == NUM_REASONING for r in rows)


def test_counts_without_usage_come_from_the_tokenizer_else_one_per_chunk(
        tokenizer_dir: Path) -> None:
    config = MockConfig(reasoning_tokens=3, tokens_per_chunk=2, send_usage=False)
    # tokenizer: chunks of 2 words count 2 tokens each (the reasoning ends after 3)
    for rec in _chat(config, tokenizer_dir):
        assert (rec.num_output_tokens, rec.num_reasoning_tokens) == (NUM_TOKENS, 3)
    # usage with details beats the chunk count: 2 reasoning chunks hold 3 tokens
    stream = _stream(config_chunks=[(True, " a b"), (True, " c"), (False, " d e"),
                                    (False, " f g"), (False, " h")],
                     usage={"completion_tokens": 8, "completion_tokens_details":
                            {"reasoning_tokens": 3}})
    rec = to_record("r", 0.0, _request(), stream, None)
    assert (rec.num_output_tokens, rec.num_reasoning_tokens) == (8, 3)
    # no usage, no tokenizer: one token a chunk
    stream = _stream(config_chunks=[(True, " a b"), (True, " c"), (False, " d e")], usage=None)
    rec = to_record("r", 0.0, _request(), stream, None)
    assert (rec.num_output_tokens, rec.num_reasoning_tokens) == (3, 2)
    assert rec.first_output_s == pytest.approx(0.3)


def test_usage_without_details_shares_the_total_over_all_chunks() -> None:
    stream = _stream(config_chunks=[(True, " a"), (True, " b"), (False, " c"), (False, " d")],
                     usage={"completion_tokens": 8})
    rec = to_record("r", 0.0, _request(), stream, None)
    assert (rec.num_output_tokens, rec.num_reasoning_tokens) == (8, 4)


def test_split_counts_falls_back_when_the_details_do_not_fit_the_chunks() -> None:
    chunks = [Chunk(0.1, "a", is_reasoning=True), Chunk(0.2, "b"), Chunk(0.3, "c")]
    assert split_counts(chunks, [1, 1, 1], 6, 2) == ([2, 2, 2], 2)
    assert split_counts(chunks, [1, 1, 1], 6, 1) == ([1, 3, 2], 1)
    # 6 reasoning tokens leave none for the 2 content chunks: shared over all, as without
    assert split_counts(chunks, [1, 1, 1], 6, 6) == ([2, 2, 2], 2)
    assert split_counts(chunks, [1, 1, 1], None, 5) == ([1, 1, 1], 1)


def test_a_delta_with_both_fields_is_reasoning_then_content() -> None:
    stream = Stream(max_tokens=8, chat=True)
    stream.add_event(json.dumps({"choices": [{"index": 0, "delta": {
        "reasoning": " x", "content": " y"}}]}), 0.1)
    assert [(c.text, c.is_reasoning) for c in stream.chunks] == [(" x", True), (" y", False)]


def test_a_non_string_reasoning_field_is_a_bad_chunk() -> None:
    from infbench.client.failures import RequestFailed

    stream = Stream(max_tokens=8, chat=True)
    with pytest.raises(RequestFailed, match="reasoning_content: must be a string"):
        stream.add_event(json.dumps({"choices": [{"index": 0, "delta": {
            "reasoning_content": 5}}]}), 0.1)
    stream = Stream(max_tokens=8, chat=True)
    with pytest.raises(RequestFailed, match="reasoning_tokens: must be an integer"):
        stream.add_event(json.dumps({"choices": [], "usage": {
            "completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 9}}}),
            0.1)


def test_a_stream_without_reasoning_has_no_ttfo_and_its_rows_are_unchanged(
        tokenizer_dir: Path) -> None:
    records = _chat(MockConfig(first_delay_s=0.01), tokenizer_dir)
    assert all(r.num_reasoning_tokens == 0 and r.first_output_s is None for r in records)
    rows = request_rows(records)
    assert all("num_reasoning_tokens" not in r and "first_output_s" not in r for r in rows)
    assert "ttfo_s" not in from_request_rows(rows)


def test_mixed_rows_give_ttft_as_ttfo_for_requests_without_reasoning() -> None:
    rows = [{"arrival_s": 0.0, "first_token_s": 0.1, "finish_s": 0.5, "itl_s": [],
             "num_prompt_tokens": 1, "num_output_tokens": 3},
            {"arrival_s": 0.0, "first_token_s": 0.1, "finish_s": 0.5, "itl_s": [],
             "num_prompt_tokens": 1, "num_output_tokens": 3, "num_reasoning_tokens": 2,
             "first_output_s": 0.4},
            {"arrival_s": 0.0, "first_token_s": 0.1, "finish_s": 0.5, "itl_s": [],
             "num_prompt_tokens": 1, "num_output_tokens": 3, "num_reasoning_tokens": 3,
             "first_output_s": None}]  # reasoned to max_tokens: no content, no TTFO sample
    m = from_request_rows(rows, [50.0])
    assert m["ttfo_s"] == {"mean": pytest.approx(0.25), "p50": pytest.approx(0.25)}


def test_old_and_new_result_files_load(tmp_path: Path) -> None:
    old = Path(__file__).resolve().parents[1] / "results" / "data" / "v1_ci_baseline" / \
        "ci_gate_000.json"
    assert "ttfo_s" not in load_result(old)["metrics"]
    new = json.loads(old.read_text())
    stats = dict(new["metrics"]["ttft_s"])
    new["metrics"]["ttfo_s"] = stats
    new["metrics"]["num_reasoning_tokens"] = 5
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new))
    assert load_result(path)["metrics"]["ttfo_s"] == stats


def _request() -> Request:
    return Request("r", (1, 2), SamplingParams(max_tokens=16, ignore_eos=True))


def _stream(config_chunks: list[tuple[bool, str]], usage: dict[str, Any] | None) -> Stream:
    stream = Stream(max_tokens=16, chat=True)
    for i, (is_reasoning, text) in enumerate(config_chunks):
        key = "reasoning_content" if is_reasoning else "content"
        stream.add_event(json.dumps({"choices": [{"index": 0, "delta": {key: text}}]}),
                         0.1 * (i + 1))
    stream.add_event(json.dumps({"choices": [{"index": 0, "delta": {},
                                              "finish_reason": "length"}]}), 0.9)
    if usage is not None:
        stream.add_event(json.dumps({"choices": [], "usage": usage}), 0.9)
    stream.done = True
    stream.check_complete()
    return stream


def test_run_against_a_reasoning_server_records_ttfo_and_report_shows_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    from cli_helpers import run_args
    from test_target_cli import scenario

    config = MockConfig(first_delay_s=0.01, token_delay_s=0.005, reasoning_tokens=3,
                        reasoning_field="reasoning")
    out = tmp_path / "out"
    with MockServer(config) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', "
                                  f"model: mock-model, endpoint: chat, "
                                  f"tokenizer: '{tokenizer_dir}'}}")
        code, stdout, err = run_args(["run", str(path), "--out", str(out)], capsys)
    assert code == 0, err
    assert "TTFO" in stdout  # run's table (its headers fold)
    result = load_result(out / "client_e2e_000.json")  # the schema, validated
    m = result["metrics"]
    assert m["num_output_tokens"] == 30 and m["num_reasoning_tokens"] == 18
    assert m["ttfo_s"]["p50"] > m["ttft_s"]["p50"] + 2 * 0.005
    assert all(r["num_reasoning_tokens"] == 3 and r["first_output_s"] > r["first_token_s"]
               for r in result["requests"])
    code, _, err = run_args(["report", str(out)], capsys)
    assert code == 0, err
    code, _, err = run_args(["compare", str(out / "client_e2e_000.json"),
                             str(out / "client_e2e_000.json"), "--metric", "ttfo_s"], capsys)
    assert code == 0, err


def test_report_of_a_run_without_reasoning_has_no_ttfo_column() -> None:
    from infbench.results.report import run_table

    old = Path(__file__).resolve().parents[1] / "results" / "data" / "v1_ci_baseline" / \
        "ci_gate_000.json"
    table = run_table([load_result(old)])
    assert "TTFO p50 ms" not in [str(c.header) for c in table.columns]
