"""`infbench predict SCENARIO` predicts every workload kind under its load (the simulated
engine), prints the predicted SLO max rate of a rate sweep, and `run` records the same
`prediction.metrics` that `report` sets beside the measured ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

HEAD = """
name: load
device: cpu
dtype: float32
hardware: cpu
model: {preset: tiny, overrides: {max_seq_len: 256}}
engine: {block_size: 4, max_num_batched_tokens: 64, max_num_seqs: 4}
measure: {warmup: 0, repeats: 1, percentiles: [50, 90]"""


def _scenario(tmp_path: Path, workload: str, slo: str = "") -> Path:
    path = tmp_path / "load.yaml"
    path.write_text(HEAD + (f", slo: {slo}" if slo else "") + "}\n" + workload)
    return path


@pytest.mark.parametrize("workload", [
    "workload: {kind: static, batch_size: 2, num_requests: 5, prompt_len: 12, gen_len: 5}",
    "workload: {kind: offline, num_requests: 6, prompt_len: 12, gen_len: 5}",
    "workload: {kind: poisson, rate: 40, num_requests: 6, prompt_len: 12, gen_len: 5,"
    " prompt_len_dist: uniform, len_spread: 0.5}",
    "workload: {kind: poisson, rate: 40, num_requests: 6, dataset: {kind: trace, path: TRACE}}",
    "workload: {kind: offline, num_requests: 4, gen_len: 5, dataset: {kind: jsonl,"
    " path: 'infbench:samples/prompts_small.jsonl'}}",
], ids=["static", "offline", "poisson", "trace", "dataset"])
def test_every_workload_kind_is_predicted(workload: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.5000000,{6 + i},{2 + i % 3}\n" for i in range(8)))
    path = _scenario(tmp_path, workload.replace("TRACE", str(trace)))
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(path), "--json")
    assert code == 0, err
    (row,) = json.loads(out)
    m = row["metrics"]
    assert m["num_requests"] >= 4 and m["output_tokens_per_s"] > 0
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(m[name]) == {"mean", "p50", "p90"} and m[name]["p50"] > 0
    if "jsonl" in workload:  # a preset has no tokenizer: text counted in words, and said
        assert "without the model's tokenizer" in row["simulation_note"]
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(path))
    assert code == 0 and "Predicted under load" in out


def test_rate_sweep_prints_the_predicted_slo_max_rate(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    sweep = ("workload: {kind: poisson, num_requests: 40, prompt_len: 32, gen_len: 8}\n"
             "sweep: {workload.rate: [1, 1000000]}\n")
    path = _scenario(tmp_path, sweep, "{ttft_ms: 0.5, tpot_ms: 100}")
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(path))
    assert code == 0, err
    assert "predicted SLO max rate: highest rate with >= 90% of requests within SLO" in out
    assert ": 1 req/s (goodput" in out  # light load meets it, a million req/s does not
    # an SLO no rate can meet: one clear line, not a traceback
    path = _scenario(tmp_path, sweep, "{ttft_ms: 0.000001}")
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(path))
    assert code == 0, err
    assert "none of the rates tried (1, 1e+06 req/s)" in out.replace("\n", "")


def test_run_records_the_simulation_and_report_compares_it(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    path = _scenario(tmp_path, "workload: {kind: poisson, rate: 20, num_requests: 5, "
                               "prompt_len: 12, gen_len: 5}\n", "{ttft_ms: 60000}")
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(path), "--json")
    assert code == 0, err
    (predicted,) = json.loads(out)
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / "o"))
    assert code == 0, err
    result = json.loads((tmp_path / "o" / "load_000.json").read_text())
    # the same requests, simulated the same way before the run and beside it
    assert result["prediction"]["metrics"] == predicted["metrics"]
    assert set(result["prediction"]["metrics"]) <= set(result["metrics"]) | {"num_steps"}
    code, out, err = run_cli(monkeypatch, capsys, "report", str(tmp_path / "o"), "--json")
    assert code == 0, err
    (row,) = json.loads(out)
    loads = row["under_load"]
    assert loads["ttft_p90_ms_measured"] > 0 and loads["ttft_p90_ms_predicted"] > 0
    assert loads["goodput_req_s_error_pct"] is not None
    code, out, err = run_cli(monkeypatch, capsys, "report", str(tmp_path / "o"))
    assert code == 0 and "under load: measured / predicted" in out
