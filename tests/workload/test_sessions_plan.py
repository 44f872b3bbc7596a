"""workload.kind sessions: the section's refusals, the seeded plan, the conversation files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from infbench.core.errors import DamagedFileError
from infbench.measure.sessions import (
    load_conversations,
    plan_sessions,
    session_lengths,
    sessions_metrics,
    tag_rows,
)
from infbench.scenario.sessions import SessionsSection
from infbench.scenario.workload import WorkloadPoint


class WordTokenizer:
    """One id per whitespace word (new words get new ids)."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]


def sessions(seed: int = 0, rate: float | None = None, **section: object) -> WorkloadPoint:
    return WorkloadPoint(kind="sessions", seed=seed, rate=rate,
                         sessions=SessionsSection.model_validate(section))


def test_the_plan_is_seeded_and_follows_its_distributions() -> None:
    point = sessions(seed=4, rate=5.0, num_sessions=40,
                     turns={"dist": "uniform", "mean": 4, "spread": 0.5},
                     user_len={"dist": "lognormal", "mean": 20, "spread": 0.4},
                     output_len=7, think_time_s={"dist": "exponential", "mean": 0.5},
                     system_prompt_len=5)
    plan = plan_sessions(point, vocab_size=100)
    assert plan == plan_sessions(point, vocab_size=100)  # identical for the same seed
    assert plan != plan_sessions(sessions(seed=5, rate=5.0, num_sessions=40), 100)
    assert len(plan) == 40 and [c.session_id for c in plan[:2]] == ["s0000", "s0001"]
    counts = [len(c.turns) for c in plan]
    assert min(counts) >= 2 and max(counts) <= 6 and len(set(counts)) > 1  # uniform 2..6
    assert {c.system_ids for c in plan} == {plan[0].system_ids}  # one shared system prompt
    assert len(plan[0].system_ids) == 5
    turns = [t for c in plan for t in c.turns]
    assert all(t.max_tokens == 7 for t in turns)
    assert all(t.think_s == 0 for t in turns if t.index == 0)
    thinks = [t.think_s for t in turns if t.index > 0]
    assert 0.3 < float(np.mean(thinks)) < 0.8 and min(thinks) >= 0  # exponential, mean 0.5
    assert 15 < np.mean([len(t.user_ids) for t in turns]) < 26
    arrivals = [c.arrival_s for c in plan]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals)
    assert 4.0 < arrivals[-1] < 14.0  # 39 gaps of mean 0.2 s
    # without a rate every session starts at t=0
    assert {c.arrival_s for c in plan_sessions(sessions(num_sessions=3), 100)} == {0.0}


def test_session_lengths_bound_every_turn_by_its_history() -> None:
    point = sessions(num_sessions=2, turns=3, user_len=10, output_len=4, system_prompt_len=6)
    prompts, outs = session_lengths(point)
    # turn k: system + k * (user + reply) + the new user message
    assert prompts.tolist() == [16, 30, 44] * 2 and outs.tolist() == [4] * 6


@pytest.mark.parametrize(("workload", "message"), [
    ("{kind: sessions, num_requests: 4}",
     "workload.num_requests: kind sessions draws its turns from workload.sessions; remove "
     "num_requests (use workload.sessions.num_sessions)"),
    ("{kind: sessions, prompt_len: 64}", "remove prompt_len (use workload.sessions.user_len)"),
    ("{kind: offline, sessions: {num_sessions: 2}}",
     "workload.sessions: describes multi-turn conversations; allowed with workload.kind "
     "sessions (got kind offline)"),
    ("{kind: sessions, sessions: {turns: 0}}", "workload.sessions: turns: mean must be in "
     "1..1024"),
    ("{kind: sessions, sessions: {think_time_s: {dist: gamma, mean: 1}}}",
     "workload.sessions.think_time_s.dist: unknown value 'gamma'; allowed: fixed, uniform, "
     "normal, lognormal, exponential"),
    ("{kind: sessions, sessions: {turn: 3}}", "workload.sessions.turn: unknown key"),
    ("{kind: sessions, sessions: {turns: 4, dataset: {kind: jsonl, path: x.jsonl}}}",
     "workload.sessions: turns: the turns come from dataset (x.jsonl); remove turns"),
    ("{kind: sessions, rate: 0.001, sessions: {num_sessions: 1000}}",
     "workload.rate: 1000 sessions at 0.001/s arrive over about"),
])
def test_bad_sessions_keys_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str], workload: str,
                                        message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nmodel: {{preset: tiny}}\nworkload: {workload}\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / "o"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}: ") and message in lines[0], err
    assert not (tmp_path / "o").exists()


def test_a_history_beyond_the_context_is_refused_before_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmodel: {preset: tiny, overrides: {max_seq_len: 64}}\n"
                    "workload: {kind: sessions, sessions: {turns: 4, user_len: 10, "
                    "output_len: 8}}\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1, err
    assert "workload.sessions: the longest turn's prompt" in err and "64 tokens" in err
    assert not (tmp_path / "o").exists()


def test_the_conversation_files_read_as_sessions() -> None:
    share = load_conversations("sharegpt", "infbench:samples/sharegpt_small.json")
    assert len(share) == 32 + 1  # the unanswered last conversation keeps its user turn
    two = next(c for c in share if len(c.turns) == 2)
    assert all(t.reference for t in two.turns)
    assert share[-1].turns[-1].reference is None
    jsonl = load_conversations("jsonl", "infbench:samples/sessions_small.jsonl")
    assert [len(c.turns) for c in jsonl] == [4, 3, 2, 4, 3, 2]
    assert jsonl[0].turns[0].output_len == 40 and jsonl[0].where == "session 'garden'"
    tok = WordTokenizer()
    point = sessions(seed=1, num_sessions=8, output_len=9,
                     dataset={"kind": "jsonl", "path": "infbench:samples/sessions_small.jsonl"})
    plan = plan_sessions(point, vocab_size=10_000, tokenizer=tok)
    assert len(plan) == 8 and sorted(len(c.turns) for c in plan[:6]) == [2, 2, 3, 3, 4, 4]
    first = plan[0].turns[0]
    assert first.user_text is not None and len(first.user_ids) == len(first.user_text.split())


@pytest.mark.parametrize(("text", "message"), [
    ('{"session_id": "a", "turn": 0, "prompt": "hi"}\n{"session_id": "a", "turn": 0, '
     '"prompt": "again"}\n', "x.jsonl:2: turn: session 'a' already has turn 0"),
    ('{"session_id": "a", "prompt": "hi"}\n', "x.jsonl:1: turn: required, an integer >= 0"),
    ('{"session_id": true, "turn": 0, "prompt": "hi"}\n', "x.jsonl:1: session_id: required"),
    ('{"session_id": "a", "turn": 0, "prompt": "hi", "reply": "x"}\n',
     "x.jsonl:1: unknown key 'reply'; allowed: session_id, turn, prompt, output_len"),
    ('{"session_id": "a", "turn": 0, "prompt": "hi", "output_len": 0}\n',
     "x.jsonl:1: output_len: must be an integer in 1.."),
])
def test_a_damaged_sessions_jsonl_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              text: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text(text)
    with pytest.raises(DamagedFileError) as exc:
        load_conversations("jsonl", "x.jsonl")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_sessions_metrics_group_by_turn_and_count_sessions() -> None:
    point = sessions(num_sessions=2, turns=2, user_len=3, output_len=2)
    plan = plan_sessions(point, vocab_size=100)

    def row(rid: str, arrival: float, first: float, finish: float, prompt: int) -> dict:
        return {"id": rid, "arrival_s": arrival, "first_token_s": first, "finish_s": finish,
                "itl_s": [finish - first], "num_prompt_tokens": prompt,
                "num_output_tokens": 2}

    rows = tag_rows([row("s0000/t0", 0.0, 0.1, 0.2, 3), row("s0000/t1", 0.5, 0.8, 1.0, 8),
                     row("s0001/t0", 0.0, 0.3, 0.4, 3)])  # s0001's second turn failed
    assert rows[1]["session_id"] == "s0000" and rows[1]["turn"] == 1
    m = sessions_metrics(rows, plan, wall_s=2.0, percentiles=[50.0], num_failed=1)
    assert [t["turn"] for t in m["by_turn"]] == [0, 1]
    assert m["by_turn"][0]["num_requests"] == 2 and m["by_turn"][1]["mean_prompt_tokens"] == 8
    assert m["by_turn"][0]["ttft_s"]["p50"] == pytest.approx(0.2)
    assert m["by_turn"][1]["ttft_s"]["p50"] == pytest.approx(0.3)
    s = m["sessions"]
    assert (s["num_sessions"], s["num_completed"], s["num_turns"], s["num_turns_done"],
            s["num_turns_skipped"]) == (2, 1, 4, 3, 0)
    assert s["duration_s"]["p50"] == pytest.approx(1.0) and s["sessions_per_s"] == 0.5
