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
BASELINE_DIR = HERE.parents[1] / "results" / "baselines" / "ci"
GOLDEN = json.loads((HERE / "data" / "golden_ci_report_gate.json").read_text())
CASES = sorted(k for k in GOLDEN if k != "report_rows")


def test_report_rows_are_unchanged() -> None:
    rows = [{k: v for k, v in r.items() if k != "file"}
            for r in report_rows(load_results([BASELINE_DIR]))]
    assert rows == GOLDEN["report_rows"]


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
        assert row == old
