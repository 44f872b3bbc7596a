"""Multi-turn sessions on the engine (measure/engine_sessions.py): a closed loop whose every
turn's prompt is the history with the engine's own replies, with the prefix cache's hits."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import greedy_recompute, make_engine

from infbench.engine.session_loop import sizing_requests
from infbench.measure.engine_sessions import run_engine_sessions
from infbench.measure.sessions import plan_sessions
from infbench.model.loader import load_model
from infbench.scenario.sessions import SessionsSection
from infbench.scenario.workload import WorkloadPoint


@pytest.fixture(scope="module")
def loaded() -> Any:
    return load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=3)


def test_turns_carry_the_engine_replies_and_hit_the_prefix_cache(loaded: Any) -> None:
    workload = WorkloadPoint(kind="sessions", seed=1, sessions=SessionsSection.model_validate(
        {"num_sessions": 2, "turns": 3, "user_len": 5, "output_len": 4,
         "system_prompt_len": 6, "think_time_s": 0.01}))
    conversations = plan_sessions(workload, loaded.config.vocab_size)
    engine = make_engine(loaded, sizing_requests(conversations), enable_prefix_caching=True)
    out = run_engine_sessions(engine, conversations, workload, max_concurrency=1)
    records = {r.request_id: r for r in out.requests}
    assert sorted(records) == [f"s000{s}/t{k}" for s in range(2) for k in range(3)]
    for conv in conversations:
        history = list(conv.system_ids)
        for turn in conv.turns:
            rid = f"{conv.session_id}/t{turn.index}"
            history += turn.user_ids
            assert records[rid].num_prompt_tokens == len(history)
            # the reply is greedy on the whole history (earlier replies included)
            assert out.outputs[rid] == greedy_recompute(loaded.model, history, 4,
                                                        loaded.config)
            history += out.outputs[rid]
            if turn.index > 0:
                prev = records[f"{conv.session_id}/t{turn.index - 1}"]
                # the turn before's full blocks (prompt + reply but its last token, whose
                # KV was never computed; block size 4) are still cached
                computed = prev.num_prompt_tokens + prev.num_output_tokens - 1
                assert records[rid].num_cached_prompt_tokens == computed // 4 * 4
                assert records[rid].arrival_s >= prev.finish_s + 0.01 - 1e-3  # think time
    # with max_concurrency 1 the second session starts after the first one's last turn
    assert records["s0001/t0"].arrival_s >= records["s0000/t2"].finish_s
    # the shared system prompt is cached for the second session (6 tokens: one block of 4)
    assert records["s0001/t0"].num_cached_prompt_tokens >= 4


def test_run_plays_sessions_on_the_engine(tmp_path: Any, monkeypatch: Any,
                                          capsys: Any) -> None:
    from cli_helpers import run_cli

    from infbench.results.store import load_result

    path = tmp_path / "s.yaml"
    path.write_text("""
name: engine_sessions
device: cpu
dtype: float32
hardware: cpu
model: {preset: tiny, overrides: {max_seq_len: 64}}
workload: {kind: sessions, seed: 0, sessions: {num_sessions: 2, turns: 2, user_len: 4,
  output_len: 3, system_prompt_len: 4}}
engine: {block_size: 4, enable_prefix_caching: true}
measure: {warmup: 1, repeats: 1}
""")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / "o"))
    assert code == 0, err
    result = load_result(tmp_path / "o" / "engine_sessions_000.json")
    m = result["metrics"]
    assert [t["mean_prompt_tokens"] for t in m["by_turn"]] == [8.0, 15.0]
    assert m["sessions"]["num_completed"] == 2 and m["num_requests"] == 4
    assert m["prefix_cache_hit_rate"] > 0  # turn 1 reuses turn 0's blocks
    assert {r["turn"] for r in result["requests"]} == {0, 1}
    assert result["prediction"]["note"].startswith("roofline not priced: multi-turn sessions")
    # the simulation's prediction of the same conversations (sim/sessions_sim.py): the same
    # prompts turn by turn (the tiny model's replies run to max_tokens here)
    predicted = result["prediction"]["metrics"]
    assert predicted["num_requests"] == m["num_requests"] == 4
    assert predicted["ttft_s"]["p50"] > 0 and predicted["e2e_s"]["p50"] > 0
    assert [t["mean_prompt_tokens"] for t in predicted["by_turn"]] == [
        t["mean_prompt_tokens"] for t in m["by_turn"]]
    assert predicted["sessions"]["num_completed"] == 2
    assert predicted["prefix_cache_hit_rate"] > 0
