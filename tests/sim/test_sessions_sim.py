"""Multi-turn sessions on the simulated engine (sim/sessions_sim.py): the sessions' closed
loop on the virtual clock, each turn's prompt the history with the simulated replies.

Checked against what must hold whatever the step prices: the same seed gives the same
records; a turn is due exactly think time after its session's previous turn finished; the
prefix cache sees the history (hits with prefix caching, none without); one-turn sessions
are the same requests as a Poisson workload; `predict` prints them (that `run` records
them is checked in tests/engine/test_engine_sessions.py, beside the engine's own figures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli

from infbench.core.config import QuantConfig
from infbench.engine.request import Request
from infbench.engine.session_loop import sizing_requests, turn_id
from infbench.hardware.spec import get_hardware
from infbench.measure.sessions import plan_sessions, turn_sampling
from infbench.measure.simulation import sim_config, simulate_point
from infbench.scenario.schema import scenario_from_document
from infbench.sim.engine_sim import simulate
from infbench.sim.sessions_sim import simulate_sessions
from infbench.sim.step_cost import make_pricer

HW = get_hardware("h100-sxm")
SESSIONS = {"num_sessions": 12, "turns": {"dist": "uniform", "mean": 3, "spread": 0.5},
            "user_len": {"dist": "lognormal", "mean": 96, "spread": 0.5}, "output_len": 24,
            "think_time_s": {"dist": "exponential", "mean": 0.05}, "system_prompt_len": 64}


def _point(workload: dict[str, Any], engine: dict[str, Any] | None = None) -> Any:
    doc = {"name": "simsessions", "model": {"preset": "llama3-8b"}, "hardware": "h100-sxm",
           "dtype": "bfloat16", "workload": workload, "engine": engine or {}}
    return scenario_from_document(doc, "simsessions.yaml").points()[0]


def _sessions(seed: int = 0, engine: dict[str, Any] | None = None, **top: Any) -> Any:
    return _point({"kind": "sessions", "rate": 20.0, "seed": seed, "sessions": SESSIONS,
                   **top}, engine)


def _run(point: Any) -> Any:
    return simulate_point(point, point.model_config(), HW)


def test_deterministic_for_a_seed() -> None:
    first, again, other = _run(_sessions()), _run(_sessions()), _run(_sessions(seed=1))
    assert first.metrics == again.metrics and first.rows == again.rows
    assert first.rows != other.rows
    m = first.metrics
    assert m["sessions"]["num_completed"] == 12 and m["num_requests"] == m["sessions"][
        "num_turns"]
    assert [t["turn"] for t in m["by_turn"]] == list(range(len(m["by_turn"])))
    # every turn resends the history: the mean prompt grows turn by turn
    means = [t["mean_prompt_tokens"] for t in m["by_turn"]]
    assert means == sorted(means) and means[-1] > means[0] + 96


def test_a_turn_waits_for_the_previous_reply_and_the_think_time() -> None:
    point = _sessions(max_concurrency=4)
    cfg = point.model_config()
    conversations = plan_sessions(point.workload, cfg.vocab_size)
    rows = {r["id"]: r for r in _run(point).rows}
    assert len(rows) == sum(len(c.turns) for c in conversations)
    for conv in conversations:
        prompt = len(conv.system_ids)
        for turn in conv.turns:
            row = rows[turn_id(conv.session_id, turn.index)]
            prompt += len(turn.user_ids)
            assert row["num_prompt_tokens"] == prompt  # history + the new message
            assert row["num_output_tokens"] == turn.max_tokens
            assert (row["session_id"], row["turn"]) == (conv.session_id, turn.index)
            if turn.index > 0:
                prev = rows[turn_id(conv.session_id, turn.index - 1)]
                assert row["arrival_s"] >= prev["finish_s"] + turn.think_s  # never earlier
                assert row["arrival_s"] == pytest.approx(prev["finish_s"] + turn.think_s)
            prompt += turn.max_tokens  # the simulated reply joins the history
    # max_concurrency 4 caps the active sessions: at most 4 turns ever in flight
    spans = [(r["arrival_s"], r["finish_s"]) for r in rows.values()]
    assert max(sum(a <= t < f for a, f in spans) for t, _ in spans) <= 4


def test_the_prefix_cache_sees_the_history() -> None:
    cached = _run(_sessions()).metrics
    cold = _run(_sessions(engine={"enable_prefix_caching": False})).metrics
    assert cached["prefix_cache_hit_rate"] > 0.3 and cold["prefix_cache_hit_rate"] == 0
    later = [t["ttft_s"]["p50"] for t in cached["by_turn"][1:]]
    cold_later = [t["ttft_s"]["p50"] for t in cold["by_turn"][1:]]
    assert sum(later) < sum(cold_later)  # the cached history is not prefilled again


@pytest.mark.parametrize("cap", [None, 3])
def test_one_turn_sessions_are_the_same_requests_as_poisson(cap: int | None) -> None:
    one_turn = {**SESSIONS, "turns": 1}
    point = _point({"kind": "sessions", "rate": 50.0, "seed": 2, "sessions": one_turn,
                    "max_concurrency": cap})
    cfg = point.model_config()
    conversations = plan_sessions(point.workload, cfg.vocab_size)
    # the poisson workload of the same requests: each session's one turn, at its arrival
    requests = [Request(turn_id(c.session_id, 0), c.system_ids + c.turns[0].user_ids,
                        turn_sampling(point.workload, c.turns[0], None), arrival_s=c.arrival_s)
                for c in conversations]
    pricer = make_pricer(cfg, HW, "bfloat16", QuantConfig())
    config = sim_config(point, cfg, HW, QuantConfig(), sizing_requests(conversations), None)
    assert config == sim_config(point, cfg, HW, QuantConfig(), requests, None)  # same pool
    sessions = simulate_sessions(conversations, pricer, config,
                                 lambda t: turn_sampling(point.workload, t, None),
                                 max_concurrency=cap)
    poisson = simulate(requests, pricer, config, realtime_arrivals=True, max_concurrency=cap)
    assert sessions.requests == sorted(poisson.requests, key=lambda r: r.request_id)
    assert sessions.steps == poisson.steps and sessions.wall_s == poisson.wall_s
    # and through simulate_point: the poisson point given those requests predicts the same
    rate = _point({"kind": "poisson", "rate": 50.0, "seed": 2, "max_concurrency": cap})
    m, p = _run(point).metrics, simulate_point(rate, cfg, HW, requests=requests).metrics
    assert {k: v for k, v in m.items() if k not in ("by_turn", "sessions")} == p


def test_conversation_text_without_a_tokenizer_counts_words() -> None:
    point = _point({"kind": "sessions", "seed": 0, "sessions": {
        "num_sessions": 3, "dataset": {"kind": "jsonl",
                                       "path": "infbench:samples/sessions_small.jsonl"}}})
    sim = _run(point)
    assert "one token per word" in sim.note
    assert sim.metrics["sessions"]["num_completed"] == 3


def test_predict_prints_sessions_under_load(tmp_path: Any, monkeypatch: Any,
                                            capsys: Any) -> None:
    scenario = Path(__file__).parents[2] / "scenarios" / "sessions_tiny.yaml"
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(scenario))
    assert code == 0, err
    assert "Predicted under load" in out and "│ sessions │" in out
    assert "Predicted sessions by turn" in out
    assert "predicted sessions: sessions_tiny: 6 of 6 completed, 18 turns answered" in out
    # the longest turn (158 prompt tokens + 16) cannot fit a 100-token context
    short = tmp_path / "short.yaml"
    short.write_text(scenario.read_text().replace("preset: tiny",
                                                  "{preset: tiny, overrides: {max_seq_len: 100}}"))
    code, _, err = run_cli(monkeypatch, capsys, "predict", str(short))
    assert code == 2 and err.count("\n") == 1
    assert "workload.sessions: the longest turn's prompt" in err
