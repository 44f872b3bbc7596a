"""report, compare and the gate give the numbers they gave before the typed schema.

data/golden_ci_report_gate.json was captured from the code before the schema and the
accessor (commit ea7bb76's report_rows and compare_many on results/baselines/ci, every
metric x normalize mode below); the reads now go through load_result and the accessor.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from infbench.core.errors import UserError
from infbench.results.gate import compare_many, load_results
from infbench.results.report import report_rows

HERE = Path(__file__).resolve().parent
# The version-1 CI baseline as it was committed before the schema (recorded on the AMD EPYC
# development machine); results/baselines/ci now holds a version-2 recording.
BASELINE_DIR = HERE / "data" / "v1_ci_baseline"
GOLDEN = json.loads((HERE / "data" / "golden_ci_report_gate.json").read_text())
CASES = sorted(k for k in GOLDEN if k != "report_rows")


def test_report_rows_are_unchanged() -> None:
    results = load_results([BASELINE_DIR])
    rows = [{k: v for k, v in r.items() if k != "file"} for r in report_rows(results)]
    assert len(rows) == len(GOLDEN["report_rows"])
    for row, old, result in zip(rows, GOLDEN["report_rows"], results, strict=True):
        # The golden's tpot_ms_* columns held the decode step time: they are decode_step_*
        # now, and tpot_ms_* is the per-request TPOT of the metric definition.
        renamed = {k.replace("tpot_ms_", "decode_step_ms_").replace("tpot_error",
                                                                      "decode_step_error"): v
                   for k, v in old.items()}
        tpot = {k: row.pop(k) for k in ("tpot_ms_measured", "tpot_ms_predicted",
                                        "tpot_error_pct")}
        assert row == renamed
        assert tpot["tpot_ms_measured"] == result["metrics"]["tpot_s"]["p50"] * 1e3
        assert tpot["tpot_ms_predicted"] == result["prediction"]["tpot_s"] * 1e3


@pytest.mark.parametrize("case", CASES)
def test_gate_numbers_are_unchanged(case: str) -> None:
    metric, normalize = case.split("|")
    expected = GOLDEN[case]
    if isinstance(expected, str):  # refused before (exit 2): still refused
        with pytest.raises(UserError):
            compare_many(load_results([BASELINE_DIR]), load_results([BASELINE_DIR]),
                         metric=metric, normalize=normalize)
        return
    got = compare_many(load_results([BASELINE_DIR]), load_results([BASELINE_DIR]),
                       metric=metric, normalize=normalize)
    rows = [dataclasses.asdict(r) for r in got.rows]
    assert len(rows) == len(expected)
    for row, old in zip(rows, expected, strict=True):
        # A bare latency is now shown with the statistic it gates (ttft_s -> ttft_s.p50).
        if metric == "ttft_s":
            assert row["metric"] == old["metric"].replace("ttft_s", "ttft_s.p50")
            row["metric"] = old["metric"]
        # The intervals over the repeats came later (docs/windows.md): added beside the
        # numbers, which stay as they were.
        added = {"baseline_ci", "new_ci", "overlap", "decided_by"}
        assert set(row) == set(old) | added and row["decided_by"] == "median"
        assert {k: v for k, v in row.items() if k not in added} == old
