"""`infbench predict SCENARIO --json` and the prediction `infbench run SCENARIO` records are
one price of the same point (`measure/prediction.py`): every key the result file records
has the same value in predict's row, for a plain point and a speculative one, both run in
waves (3 requests, 2 at a time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

SCENARIO = """
name: same
device: cpu
dtype: float32
hardware: cpu
model: {preset: tiny, overrides: {max_seq_len: 64}}
workload: {kind: static, batch_size: 2, num_requests: 3, prompt_len: 8, gen_len: 4, seed: 0}
engine: {block_size: 4, max_num_batched_tokens: 32}
speculative: {num_tokens: 2, acceptance: 0.6}
sweep: {speculative.method: [none, ngram]}
measure: {warmup: 0, repeats: 1}
"""


def test_predict_prices_the_point_run_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "same.yaml"
    scenario.write_text(SCENARIO)
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(scenario), "--json")
    assert code == 0, err
    rows = json.loads(out)
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                           str(tmp_path / "out"))
    assert code == 0, err
    recorded = [json.loads((tmp_path / "out" / f"same_{i:03d}.json").read_text())["prediction"]
                for i in range(2)]
    assert [r["point"] for r in rows] == ["speculative.method=none",
                                          "speculative.method=ngram"]
    for row, prediction in zip(rows, recorded, strict=True):
        assert prediction["waves"] == 2 and prediction["batch"] == 2
        assert set(prediction) <= set(row)
        assert {key: row[key] for key in prediction} == prediction
    plain, spec = recorded
    assert plain["speculative"] is None
    assert spec["speculative"]["num_tokens"] == 2 and spec["speculative"]["acceptance"] == 0.6
    assert spec["tpot_s"] < plain["tpot_s"]  # drafts are free here (draft_cost_ratio 0)
