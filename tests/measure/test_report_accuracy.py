"""A result's `accuracy` section: schema, metric names, report, compare, CSV and run's table."""

from __future__ import annotations

import json
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_args
from rich.console import Console

from infbench.core.errors import ResultSchemaError
from infbench.results.accessor import metric, metric_names
from infbench.results.gate import is_lower_better
from infbench.results.report import (
    accuracy_table,
    report_frame,
    report_table,
    run_summary,
    run_table,
)
from infbench.results.store import flatten_for_csv, load_result

ACCURACY = {"perplexity": 18.2, "reference_perplexity": 17.5, "perplexity_change": 0.04,
            "greedy_agreement": 0.75, "tokens": 2048, "window": 512, "agreement_prompts": 8,
            "agreement_tokens": 32, "text_id": "pydoc_data.topics CPython 3.11.7 split=test",
            "seconds": 12.5}


@pytest.fixture
def quantized(fake_result: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    return {**fake_result(), "accuracy": dict(ACCURACY)}


def _write(tmp_path: Path, name: str, result: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return path


def test_accuracy_names_read_through_the_accessor(quantized: dict[str, Any]) -> None:
    names = metric_names("accuracy")
    for name in ("accuracy.perplexity", "accuracy.perplexity_change",
                 "accuracy.greedy_agreement", "accuracy.reference_perplexity"):
        assert name in names
    assert metric(quantized, "accuracy.perplexity") == 18.2
    assert metric(quantized, "accuracy.greedy_agreement") == 0.75
    assert metric({"accuracy": None}, "accuracy.perplexity") is None
    with pytest.raises(Exception, match="unknown metric 'accuracy.perplexty'"):
        metric(quantized, "accuracy.perplexty")
    assert is_lower_better("accuracy.perplexity")
    assert is_lower_better("accuracy.perplexity_change")
    assert not is_lower_better("accuracy.greedy_agreement")


def test_schema_loads_accuracy_and_refuses_unknown_keys(quantized: dict[str, Any],
                                                        tmp_path: Path) -> None:
    loaded = load_result(_write(tmp_path, "q.json", quantized))
    assert loaded["accuracy"]["perplexity"] == 18.2
    bad = {**quantized, "accuracy": {**ACCURACY, "ppl": 3.0}}
    with pytest.raises(ResultSchemaError, match="accuracy.ppl: unknown field"):
        load_result(_write(tmp_path, "bad.json", bad))
    wrong = {**quantized, "accuracy": {**ACCURACY, "perplexity": "18"}}
    with pytest.raises(ResultSchemaError, match="accuracy.perplexity"):
        load_result(_write(tmp_path, "wrong.json", wrong))


def test_report_shows_accuracy_only_when_present(quantized: dict[str, Any],
                                                 fake_result: Callable[..., dict[str, Any]]
                                                 ) -> None:
    plain = fake_result(point_index=1)
    assert "perplexity" not in report_frame([plain]).columns
    assert accuracy_table([plain]) is None and "accuracy.perplexity" not in run_summary(plain)
    df = report_frame([quantized, plain])
    assert df["perplexity"].iloc[0] == 18.2 and df["perplexity_change_pct"].iloc[0] == 4.0
    assert df["greedy_agreement"].iloc[0] == 0.75 and df["perplexity"].isna().iloc[1]
    out = StringIO()
    Console(file=out, width=200).print(report_table(df))
    assert "perplexity" in out.getvalue() and "18.2 +4.00%" in out.getvalue()
    table = accuracy_table([quantized, plain])
    assert table is not None
    out = StringIO()
    Console(file=out, width=100).print(run_table([quantized]), table)
    text = out.getvalue()
    assert "18.200" in text and "17.500" in text and "+4.00" in text and "0.750" in text
    assert run_summary(quantized)["accuracy.perplexity_change"] == 0.04
    row = flatten_for_csv(quantized)
    assert row["perplexity"] == 18.2 and row["greedy_agreement"] == 0.75
    assert "perplexity" not in flatten_for_csv(plain)


def test_report_and_compare_commands(quantized: dict[str, Any], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    base = _write(tmp_path, "base.json", quantized)
    worse = _write(tmp_path, "new.json", {**quantized, "accuracy": {**ACCURACY,
                                                                      "perplexity": 20.0}})
    code, out, err = run_args(["report", str(base), "--markdown", str(tmp_path / "r.md")],
                              capsys)
    assert code == 0, err
    assert "greedy_agreement" in (tmp_path / "r.md").read_text()
    code, out, err = run_args(["compare", str(base), str(worse), "--metric",
                               "accuracy.perplexity", "--max-regression", "5%"], capsys)
    assert code == 1, (out, err)  # perplexity rose 9.9%: lower is better, so a regression
    code, out, err = run_args(["compare", str(worse), str(base), "--metric",
                               "accuracy.perplexity", "--max-regression", "5%"], capsys)
    assert code == 0, (out, err)
