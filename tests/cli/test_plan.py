"""`infbench plan`: the candidates tried, the plan with the fewest GPUs, and the one line a
plan with no feasible candidate (or a bad --slo) gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

SCENARIO = """
name: plan
model: {preset: llama3-8b}
dtype: bfloat16
hardware: h100-sxm
workload: {kind: poisson, rate: 20, num_requests: 40, prompt_len: 512, gen_len: 64}
engine: {max_num_seqs: 64, max_num_batched_tokens: 4096}
"""


def test_plan_picks_the_fewest_gpus_and_says_when_none_fits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(SCENARIO)
    args = ["plan", str(path), "--hardware", "h100-sxm,a100-80g", "--max-gpus", "2"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--slo", "ttft_ms=500,tpot_ms=50",
                             "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert {(c["hardware"], c["tp"], c["pp"]) for c in doc["candidates"]} == {
        (hw, tp, pp) for hw in ("h100-sxm", "a100-80g") for tp, pp in ((1, 1), (2, 1), (1, 2))}
    # a two-stage pipeline is simulated (virtual engines) and counts both GPUs
    (piped,) = [c for c in doc["candidates"] if c["hardware"] == "h100-sxm" and c["pp"] == 2]
    assert piped["fits"] and piped["gpus"] == 2 and piped["slo_attainment"] is not None
    assert doc["plan"]["gpus"] == 1 and doc["plan"]["feasible"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--slo", "ttft_ms=0.001")
    assert code == 0, err
    assert "plan: no candidate meets the SLO (ttft <= 0.001 ms for >= 90%)" in out
    code, out, err = run_cli(monkeypatch, capsys, *args, "--slo", "ttft=5")
    assert code == 2 and err.startswith("error: --slo: ttft: ") and err.count("\n") == 1
    code, out, err = run_cli(monkeypatch, capsys, *args)  # no objectives anywhere
    assert code == 2 and "plan needs objectives" in err


def test_efficiency_derates_every_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(SCENARIO)
    args = ["plan", str(path), "--hardware", "h100-sxm", "--max-gpus", "1", "--slo",
            "ttft_ms=500,tpot_ms=50", "--json"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    full = json.loads(out)
    code, out, err = run_cli(monkeypatch, capsys, *args, "--efficiency", "0.5")
    assert code == 0, err
    half = json.loads(out)
    assert half["efficiency"].startswith("50% of the bandwidth and 50% of the compute")
    (a,), (b,) = full["candidates"], half["candidates"]
    assert b["tpot_p90_s"] > 1.5 * a["tpot_p90_s"]  # half the rates: about twice the step
    code, out, err = run_cli(monkeypatch, capsys, *args, "--efficiency", "vllm")
    assert code == 0, err
    assert "vllm" in json.loads(out)["efficiency"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--efficiency", "2")
    assert code == 2 and err.startswith("error: --efficiency 2: ") and err.count("\n") == 1


def test_an_moe_model_is_planned_with_its_experts_sharded_and_spread() -> None:
    from infbench.measure.plan import plan
    from infbench.scenario.schema import scenario_from_document

    point = scenario_from_document({
        "name": "moe", "model": {"preset": "tiny-moe"}, "hardware": "h100-sxm",
        "dtype": "bfloat16", "measure": {"slo": {"ttft_ms": 500, "tpot_ms": 50}},
        "workload": {"kind": "poisson", "rate": 50, "num_requests": 8, "prompt_len": 16,
                     "gen_len": 4}}, "moe.yaml").points()[0]
    rows = plan(point, point.measure.slo, ("h100-sxm",), max_gpus=2)
    layouts = {(c.tp, c.pp, c.ep): c for c in rows}
    assert set(layouts) == {(1, 1, 1), (2, 1, 1), (2, 1, 2), (1, 2, 1)}
    for c in layouts.values():  # each simulated, every GPU counted
        assert c.fits and c.attainment is not None and c.gpus == c.tp * c.pp * c.replicas
