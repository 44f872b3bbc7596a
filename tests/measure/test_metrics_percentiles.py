"""measure.percentiles: which latency statistics a run reports, and what the schema refuses."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infbench import cli
from infbench.core.errors import UserError
from infbench.core.metric_names import (
    DEFAULT_PERCENTILES,
    GATE_METRICS,
    is_gate_metric,
    is_stat_name,
    latency_stats_names,
    percentile_key,
)
from infbench.measure.metrics import latency_stats
from infbench.scenario.schema import load_scenario

_BASE = "name: p\nmodel: {preset: tiny}\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(_BASE + text)
    return path


def test_default_statistics_are_mean_p50_p90_p95_p99() -> None:
    assert DEFAULT_PERCENTILES == (50, 90, 95, 99)
    values = [float(v) for v in range(1, 101)]
    stats = latency_stats(values)
    assert list(stats) == ["mean", "p50", "p90", "p95", "p99"]
    # numpy's linear interpolation (vLLM's benchmark scripts): rank q/100 * (n - 1)
    assert stats == {"mean": 50.5, "p50": 50.5, "p90": pytest.approx(90.1),
                     "p95": pytest.approx(95.05), "p99": pytest.approx(99.01)}


def test_custom_percentiles_keys_and_values() -> None:
    values = [3.0, 1.0, 2.0, 10.0]
    stats = latency_stats(values, [25, 99.9, 100])
    assert list(stats) == ["mean", "p25", "p99.9", "p100"]
    assert stats["p25"] == pytest.approx(float(np.percentile(values, 25)))  # 1.75
    assert stats["p99.9"] == pytest.approx(float(np.percentile(values, 99.9)))
    assert stats["p100"] == 10.0
    assert latency_stats([], [25, 99.9]) == {"mean": None, "p25": None, "p99.9": None}
    assert latency_stats_names([50.0, 0.5]) == ("mean", "p50", "p0.5")


def test_percentile_keys_round_trip_and_refuse_out_of_range() -> None:
    for q, key in ((50, "p50"), (50.0, "p50"), (99.9, "p99.9"), (0.001, "p0.001"),
                   (1e-5, "p0.00001"), (100, "p100")):
        assert percentile_key(q) == key and is_stat_name(key)
    for bad in (0, 101, float("nan"), float("inf"), -5):
        with pytest.raises(ValueError):
            percentile_key(bad)
    for name in ("p0", "p101", "p", "p-1", "p1e3", "median", "p50 "):
        assert not is_stat_name(name)


def test_scenario_percentiles_reach_the_point(tmp_path: Path) -> None:
    point = load_scenario(_write(tmp_path, "measure: {percentiles: [99.9, 50]}\n")).points()[0]
    assert point.measure.percentiles == (99.9, 50.0)
    assert point.to_dict()["measure"]["percentiles"] == (99.9, 50.0)
    default = load_scenario(_write(tmp_path, "")).points()[0]
    assert default.measure.percentiles == DEFAULT_PERCENTILES


@pytest.mark.parametrize("value, message", [
    ("[0]", "measure.percentiles[0]: must be > 0 (got 0)"),
    ("[50, 101]", "measure.percentiles[1]: must be <= 100 (got 101)"),
    ("[.nan]", "measure.percentiles[0]: must be a finite number (got nan)"),
    ("[]", "measure.percentiles: needs at least one value"),
    ("[50, 50.0]", "measure.percentiles: each percentile once; repeated: p50"),
    ("['90']", "measure.percentiles[0]: must be a number (got '90')"),
    ("95", "measure.percentiles: must be a list (got 95)"),
])
def test_bad_percentiles_are_one_error_line_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        value: str, message: str) -> None:
    path = _write(tmp_path, f"measure: {{percentiles: {value}}}\n")
    with pytest.raises(UserError, match=re.escape(message)):
        load_scenario(path)
    monkeypatch.setattr(sys, "argv", ["infbench", "predict", str(path)])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_gate_may_name_any_percentile(tmp_path: Path) -> None:
    assert "ttft_s.p95" in GATE_METRICS and "e2e_s.p99" in GATE_METRICS
    for name in ("ttft_s.p95", "itl_s.p99.9", "tpot_s.mean", "output_tokens_per_s", "e2e_s"):
        assert is_gate_metric(name)
        sc = load_scenario(_write(tmp_path, "measure: {percentiles: [50, 95, 99.9]}\n"
                                            f"gate: {{metric: {name}}}\n"))
        assert sc.points()[0].gate.metric == name  # type: ignore[union-attr]
    for name in ("ttft_s.p0", "ttft_s.p100.5", "ttft_s.median", "tokens_per_s"):
        assert not is_gate_metric(name)
        with pytest.raises(UserError, match=f"gate.metric: unknown value '{name}'"):
            load_scenario(_write(tmp_path, f"gate: {{metric: {name}}}\n"))


def test_gate_direction_for_any_percentile() -> None:
    from infbench.results.gate import is_lower_better

    for name in ("ttft_s.p95", "e2e_s.p99.9", "itl_s.p50"):
        assert is_lower_better(name), name
    assert not is_lower_better("output_tokens_per_s")


@pytest.mark.parametrize("stat", ["p95", "p99.9"])
def test_gate_compares_a_configured_percentile(fake_result: Any, stat: str) -> None:
    from infbench.results.gate import compare

    base, new = fake_result(), fake_result()
    for result, value in ((base, 1.0), (new, 1.2)):  # 20% slower tail
        for m in (result["metrics"], *result["repeats"]):
            m["ttft_s"][stat] = value
    res = compare(base, new, metric=f"ttft_s.{stat}", max_regression=0.1)
    assert not res.passed and res.rows[0].status == "regression"
    assert res.rows[0].baseline == 1.0 and res.rows[0].new == pytest.approx(1.2)
    assert compare(new, base, metric=f"ttft_s.{stat}", max_regression=0.1).passed


def test_a_gate_on_an_unmeasured_percentile_is_refused_before_the_run(tmp_path: Path) -> None:
    cases = {
        "measure: {percentiles: [50, 99]}\ngate: {metric: ttft_s.p95}\n":
            "gate.metric: ttft_s.p95 needs p95 in measure.percentiles (got [50.0, 99.0]); "
            "allowed statistics: mean, p50, p99",
        "measure: {percentiles: [90]}\ngate: {metric: ttft_s}\n":  # a bare latency is its p50
            "gate.metric: ttft_s needs p50 in measure.percentiles",
    }
    for text, message in cases.items():
        with pytest.raises(UserError, match=re.escape(message)):
            load_scenario(_write(tmp_path, text))
    for text in ("measure: {percentiles: [99.9]}\ngate: {metric: e2e_s.p99.9}\n",
                 "measure: {percentiles: [90]}\ngate: {metric: tpot_s.mean}\n",
                 "measure: {percentiles: [90]}\ngate: {metric: output_tokens_per_s}\n"):
        assert load_scenario(_write(tmp_path, text)).points()[0].gate is not None
