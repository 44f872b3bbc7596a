"""End to end through the CLI: a trace dataset with a rate sweep and an SLO on the tiny
model (run, report --json, plots), static num_requests, a text dataset without tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

SCENARIO = """
name: gp
device: cpu
dtype: float32
hardware: cpu
model: {{preset: tiny}}
workload:
  kind: poisson
  rate: [50, inf]
  num_requests: 6
  dataset: {{kind: trace, path: {trace}}}
engine: {{block_size: 4, max_num_batched_tokens: 64}}
measure: {{warmup: 0, repeats: 1, slo: {{ttft_ms: 60000, tpot_ms: 60000, target: 0.5}}}}
"""


def test_rate_sweep_with_dataset_and_slo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.5000000,{6 + i},{2 + i % 3}\n" for i in range(8)))
    scenario = tmp_path / "gp.yaml"
    scenario.write_text(SCENARIO.format(trace=trace))
    out = tmp_path / "run"
    code, stdout, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out", str(out),
                                "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert [p["label"] for p in doc["points"]] == ["rate=50.0", "rate=inf"]
    assert all(p["slo_attainment"] == 1.0 and p["goodput_requests_per_s"] > 0
               for p in doc["points"])
    (summary,) = doc["slo_max_rates"]
    assert summary["max_rate"] == "inf" and summary["rates"] == [50.0, "inf"]
    result = json.loads((out / "gp_001.json").read_text())
    assert result["scenario"]["workload"]["rate"] == "inf"
    assert result["metrics"]["num_slo_met"] == 6
    assert sorted(r["num_prompt_tokens"] for r in result["requests"])[0] >= 6
    code, stdout, err = run_cli(monkeypatch, capsys, "report", str(out), "--json")
    assert code == 0, err
    rows = json.loads(stdout)
    assert [r["slo_max_rate"] for r in rows] == ["inf", "inf"]
    assert all(r["slo_attainment"] == 1.0 for r in rows)
    code, stdout, err = run_cli(monkeypatch, capsys, "report", str(out))
    assert code == 0 and "SLO max rate: highest rate with >= 50% of requests" in stdout
    code, stdout, err = run_cli(monkeypatch, capsys, "plots", str(out), "--out",
                                str(tmp_path / "fig"), "--json")
    assert code == 0, err
    assert Path(json.loads(stdout)["goodput_rate"]).is_file()


def test_static_num_requests_and_text_dataset_errors(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("""
name: st
device: cpu
dtype: float32
hardware: cpu
model: {preset: tiny}
workload: {kind: static, batch_size: 2, num_requests: 5, prompt_len: 6, gen_len: 3}
engine: {block_size: 4}
measure: {warmup: 0, repeats: 1}
""")
    code, stdout, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                                str(tmp_path / "st"), "--json")
    assert code == 0, err
    assert json.loads(stdout)["points"][0]["num_requests"] == 5
    result = json.loads((tmp_path / "st" / "st_000.json").read_text())
    assert result["prediction"]["waves"] == 3  # 5 requests, 2 at a time
    assert sorted(r["arrival_s"] for r in result["requests"])[:2] == [0.0, 0.0]
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                           str(tmp_path / "tx"), "--set", "workload.num_requests=4",
                           "--set", "workload.dataset={kind: jsonl, path: "
                           "'infbench:samples/prompts_small.jsonl'}")
    assert code == 2
    assert err.strip().count("\n") == 0 and "jsonl prompts are text and need the model's " \
        "tokenizer" in err
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                           str(tmp_path / "mi"), "--set",
                           "workload.dataset={kind: trace, path: missing.csv}")
    assert code == 2 and "workload.dataset.path: missing.csv: no such file" in err
