"""Multi-turn sessions against the mock server: every turn's prompt is the history with the
server's replies, think times are kept, failures end a session, the result and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_args

from infbench.client.mock_server import MockConfig, MockServer
from infbench.measure.datasets import resolve_path
from infbench.measure.metrics import from_request_rows
from infbench.results.store import load_result

REPLY_IDS = [2, 3, 4, 5, 6]  # " the cat sat on a": the mock's 5 words, one id each


def scenario(tmp_path: Path, target: str, sessions: str, model: str = "") -> Path:
    path = tmp_path / "sessions.yaml"
    path.write_text(f"""
name: sess
{model}
target: {target}
workload: {{kind: sessions, seed: 2, sessions: {sessions}}}
measure: {{warmup: 0, repeats: 1}}
""")
    return path


def target(server: MockServer, tokenizer: Path | None, extra: str = "") -> str:
    tok = f", tokenizer: '{tokenizer}'" if tokenizer is not None else ""
    return f"{{kind: openai, base_url: '{server.base_url}', model: mock-model{tok}{extra}}}"


def test_token_prompts_carry_the_history_and_the_replies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    config = MockConfig(token_delay_s=0.001)
    with MockServer(config) as server:
        path = scenario(tmp_path, target(server, tokenizer_dir),
                        "{num_sessions: 3, turns: 3, user_len: 4, output_len: 5, "
                        "system_prompt_len: 3, think_time_s: 0.02}")
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    prompts = [b["prompt"] for b in config.received]
    assert len(prompts) == 9 and all(isinstance(p, list) for p in prompts)
    firsts = [p for p in prompts if len(p) == 3 + 4]
    assert len(firsts) == 3 and len({tuple(p[:3]) for p in prompts}) == 1  # one system prompt
    for p in prompts:
        if len(p) > 7:  # a later turn: an earlier turn's prompt, its reply, 4 new ids
            base = p[:len(p) - 4 - len(REPLY_IDS)]
            assert base in prompts and p[len(base):len(base) + 5] == REPLY_IDS
    assert sorted(len(p) for p in prompts) == [7] * 3 + [16] * 3 + [25] * 3
    result = load_result(tmp_path / "out" / "sess_000.json")  # the schema, validated
    rows = result["requests"]
    assert {(r["session_id"], r["turn"]) for r in rows} == {
        (f"s{s:04d}", k) for s in range(3) for k in range(3)}
    by_id = {r["id"]: r for r in rows}
    for s in range(3):  # think time 0.02 s between a reply's end and the next turn
        for k in (1, 2):
            gap = by_id[f"s{s:04d}/t{k}"]["arrival_s"] - by_id[f"s{s:04d}/t{k - 1}"]["finish_s"]
            assert gap >= 0.02 - 1e-3
    by_turn = result["metrics"]["by_turn"]
    assert [(t["turn"], t["num_requests"], t["mean_prompt_tokens"]) for t in by_turn] == [
        (0, 3, 7.0), (1, 3, 16.0), (2, 3, 25.0)]
    turn2 = from_request_rows([r for r in rows if r["turn"] == 2], [50, 90, 95, 99])
    for key in ("ttft_s", "tpot_s", "e2e_s"):  # the turn's own rows, summarized as any run
        assert by_turn[2][key] == pytest.approx(turn2[key])
    assert by_turn[2]["ttft_s"]["p50"] > 0
    s = result["metrics"]["sessions"]
    assert (s["num_sessions"], s["num_completed"], s["num_turns_done"]) == (3, 3, 9)
    assert s["duration_s"]["p50"] >= 0.04  # two think times at least
    code, out, err = run_args(["report", str(tmp_path / "out"), "--json"], capsys)
    assert code == 0
    code, out, err = run_args(["report", str(tmp_path / "out")], capsys)
    assert code == 0 and "sessions by turn" in out and "3 of 3 completed" in out


def test_chat_sends_the_conversation_as_messages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    config = MockConfig()
    with MockServer(config) as server:
        path = scenario(tmp_path, target(server, tokenizer_dir, ", endpoint: chat"),
                        "{num_sessions: 2, turns: 3, user_len: 3, output_len: 5, "
                        "system_prompt_len: 2}")
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    bodies = sorted(config.received, key=lambda b: len(b["messages"]))
    assert [len(b["messages"]) for b in bodies] == [2, 2, 4, 4, 6, 6]
    for b in bodies:
        roles = [m["role"] for m in b["messages"]]
        assert roles == ["system", *["user", "assistant"] * ((len(roles) - 2) // 2), "user"]
        assert all(m["content"] == " the cat sat on a" for m in b["messages"]
                   if m["role"] == "assistant")  # the replies as the server streamed them
        assert len(b["messages"][-1]["content"].split()) == 3
    last = bodies[-1]["messages"]
    assert any(b["messages"] == last[:4] for b in bodies)  # its earlier turn, verbatim


def test_a_failed_turn_ends_its_session_and_is_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    config = MockConfig(fail_every=4)
    with MockServer(config) as server:
        path = scenario(tmp_path, target(server, tokenizer_dir),
                        "{num_sessions: 4, turns: 3, user_len: 2, output_len: 3}")
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    result = load_result(tmp_path / "out" / "sess_000.json")
    s = result["metrics"]["sessions"]
    client = result["telemetry"]["client"]
    assert client["num_failed"] >= 1 and client["failures_by_reason"] == {
        "http_status": client["num_failed"]}
    assert s["num_turns_done"] + client["num_failed"] + s["num_turns_skipped"] == 12
    assert s["num_completed"] < 4 and s["num_turns_skipped"] >= 1
    assert client["num_sent"] == len(config.received) == 12 - s["num_turns_skipped"]
    assert "request(s) failed" in err


def test_token_sessions_need_a_way_to_get_the_reply_ids(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MockServer(MockConfig()) as server:
        model = "model: {preset: tiny}"
        path = scenario(tmp_path, target(server, None), "{num_sessions: 1}", model)
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert "sessions with target.prompt_format tokens sends each reply back as token ids" \
            in err
        # asked for the server's ids, which the mock does not send: the second turn fails
        path = scenario(tmp_path, target(server, None, ", return_token_ids: true"),
                        "{num_sessions: 2, turns: 3, user_len: 2, output_len: 2}", model)
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "o2")], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "o2" / "sess_000.json").read_text())
    client = result["telemetry"]["client"]
    assert client["failures_by_reason"] == {"no_token_ids": 2}
    assert [f["request_id"] for f in client["failed_requests"]] == ["s0000/t1", "s0001/t1"]
    assert result["metrics"]["sessions"]["num_turns_skipped"] == 2


def test_a_conversation_file_sends_its_messages_as_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    config = MockConfig(num_tokens=2)
    with MockServer(config) as server:
        path = scenario(tmp_path, target(server, tokenizer_dir, ", prompt_format: text"),
                        "{num_sessions: 2, dataset: {kind: jsonl, "
                        "path: 'infbench:samples/sessions_small.jsonl'}}")
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    lines = [json.loads(x) for x in resolve_path("infbench:samples/sessions_small.jsonl")
             .read_text().splitlines()]
    by_prompt = {x["prompt"]: x for x in lines}
    firsts = [b for b in config.received if b["prompt"] in by_prompt]
    assert len(firsts) == 2 and all(b["max_tokens"] == by_prompt[b["prompt"]]["output_len"]
                                    for b in firsts)
    for b in config.received:
        if b not in firsts:  # a later turn: an earlier prompt, its reply, the next message
            head = next(f["prompt"] for f in config.received
                        if b["prompt"].startswith(f["prompt"] + " the cat\n"))
            following = b["prompt"][len(head) + len(" the cat\n"):]
            assert following in by_prompt or any(
                following.startswith(p) for p in by_prompt), following
