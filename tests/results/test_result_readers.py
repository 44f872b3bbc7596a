"""Readers outside results/ on results the schema allows: no p50 recorded, a null latency."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infbench.commands.predict_views import kv_measured
from infbench.hardware.spec import get_hardware
from infbench.results.gate import load_results
from infbench.results.kv_report import kv_measured_rows

BASELINE = Path(__file__).resolve().parents[2] / "results/baselines/ci/ci_gate_000.json"


@pytest.mark.parametrize("ttft", [{"mean": 0.1, "p90": 0.2, "p99": 0.3}, None],
                         ids=["percentiles-without-p50", "no-samples"])
def test_kv_results_without_a_ttft_p50(tmp_path: Path, ttft: object, capsys) -> None:
    doc = json.loads(BASELINE.read_text())
    doc["metrics"]["ttft_s"] = ttft
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    rows = kv_measured_rows(load_results([path]), get_hardware("cpu"))
    assert rows[0]["ttft_p50_s_measured"] is None
    assert rows[0]["peak_kv_bytes_measured"] == doc["metrics"]["peak_kv_bytes"]
    kv_measured([path], get_hardware("cpu"), as_json=False)
    assert "KV cache: measured" in capsys.readouterr().out  # printed, no TypeError


def test_kv_results_reads_the_stored_p50() -> None:
    rows = kv_measured_rows(load_results([BASELINE]), get_hardware("cpu"))
    stored = json.loads(BASELINE.read_text())["metrics"]["ttft_s"]["p50"]
    assert rows[0]["ttft_p50_s_measured"] == stored
