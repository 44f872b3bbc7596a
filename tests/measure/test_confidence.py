"""t intervals over repeats (results/confidence.py) in report, compare and the gate's
decision, and windowed results read through the window."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli

from infbench.core.errors import UserError
from infbench.results.accessor import measured, windowed_name
from infbench.results.confidence import (
    interval,
    parse_confidence,
    t_cdf,
    t_quantile,
)
from infbench.results.gate import compare


@pytest.mark.parametrize("p, df, table", [
    (0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 9, 2.262),
    (0.975, 29, 2.045), (0.95, 5, 2.015), (0.995, 10, 3.169), (0.9995, 1, 636.619),
    (0.9, 3, 1.638), (0.975, 120, 1.980),
])
def test_the_t_quantile_matches_the_tables(p: float, df: int, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, abs=6e-4)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=6e-4)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-10)


def test_an_interval_is_mean_plus_minus_t_s_over_root_n() -> None:
    ci = interval([100.0, 102.0, 98.0], 0.95)
    assert ci is not None and ci.mean == 100.0 and ci.n == 3
    assert ci.half_width == pytest.approx(4.3027 * 2 / math.sqrt(3), rel=1e-4)
    assert (ci.low, ci.high) == pytest.approx((100 - ci.half_width, 100 + ci.half_width))
    assert interval([5.0], 0.95) is None  # one repeat: no interval
    wider = interval([100.0, 102.0, 98.0], 0.99)
    assert wider is not None and wider.half_width > ci.half_width


@pytest.mark.parametrize("raw, level", [("95%", 0.95), (0.9, 0.9), ("0.99", 0.99)])
def test_a_level_is_a_fraction_or_a_percentage(raw: Any, level: float) -> None:
    assert parse_confidence(raw) == pytest.approx(level)


@pytest.mark.parametrize("raw", ["0", "100%", "x", -0.5])
def test_a_level_outside_zero_one_is_refused(raw: Any) -> None:
    with pytest.raises(UserError, match="^--confidence: "):
        parse_confidence(raw)


def test_decision_confidence_calls_a_regression_only_when_the_whole_interval_is_worse(
        fake_result) -> None:  # type: ignore[no-untyped-def]
    base = fake_result()
    noisy = fake_result(speed=0.9, repeat_speeds=(0.7, 1.0, 1.3))  # median -10%, wide
    assert compare(base, noisy).rows[0].status == "regression"  # the median alone
    row = compare(base, noisy, decision="confidence").rows[0]
    assert row.status == "ok" and row.decided_by == "confidence"
    assert row.new_ci is not None and row.new_ci["high"] > row.baseline * 0.95
    assert row.overlap is True
    tight = fake_result(speed=0.8, repeat_speeds=(0.99, 1.0, 1.01))
    row = compare(base, tight, decision="confidence").rows[0]
    assert row.status == "regression" and row.new_ci["high"] < row.baseline * 0.95
    assert row.overlap is False
    faster = compare(base, fake_result(speed=1.3), decision="confidence").rows[0]
    assert faster.status == "improved"
    latency = compare(base, tight, metric="ttft_s.p50", decision="confidence").rows[0]
    assert latency.is_lower_better and latency.status == "regression"
    single = compare(base, fake_result(speed=0.8, repeat_speeds=(1.0,)), decision="confidence")
    assert single.rows[0].decided_by == "median" and single.rows[0].new_ci is None
    assert any("one repeat" in n for n in single.notes)


def windowed(result: dict[str, Any], factor: float) -> dict[str, Any]:
    """The result with a window whose tokens/s is `factor` times the whole run's."""
    out = copy.deepcopy(result)
    for m in [out["metrics"], *out["repeats"]]:
        m["window"] = {"output_tokens_per_s": m["output_tokens_per_s"] * factor,
                       "ttft_s": {"p50": m["ttft_s"]["p50"]}, "num_requests": 3,
                       "start_s": 0.1, "end_s": 1.0, "wall_s": 0.9}
    return out


def test_windowed_results_are_read_and_gated_in_their_window(
        fake_result) -> None:  # type: ignore[no-untyped-def]
    base, new = fake_result(), fake_result()
    assert windowed_name("output_tokens_per_s") == "window.output_tokens_per_s"
    assert windowed_name("decode.mbu") is None and windowed_name("window.wall_s") is None
    wb = windowed(base, 1.0)
    assert measured(windowed(base, 2.0), "output_tokens_per_s") == pytest.approx(
        2 * base["metrics"]["output_tokens_per_s"])
    assert measured(base, "output_tokens_per_s") == base["metrics"]["output_tokens_per_s"]
    res = compare(wb, windowed(new, 0.8))  # the windows differ by 20%, the runs do not
    assert res.rows[0].status == "regression" and res.rows[0].metric == \
        "window.output_tokens_per_s"
    one_sided = compare(wb, windowed(new, 0.8) | {"metrics": new["metrics"],
                                                   "repeats": new["repeats"]})
    assert one_sided.rows[0].status == "ok" and one_sided.rows[0].metric == \
        "output_tokens_per_s"
    assert any("only the baseline has a measure.window" in n for n in one_sided.notes)


def write(path: Path, result: dict[str, Any]) -> Path:
    path.write_text(json.dumps(result))
    return path


def test_report_and_compare_show_the_intervals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        fake_result) -> None:  # type: ignore[no-untyped-def]
    base = write(tmp_path / "base.json", fake_result())
    new = write(tmp_path / "new.json", windowed(fake_result(speed=0.9), 1.0))
    code, out, err = run_cli(monkeypatch, capsys, "report", str(base), "--confidence", "90%")
    assert code == 0, err
    assert "mean ± 90% t interval over the repeats" in out and " ± " in out
    code, out, err = run_cli(monkeypatch, capsys, "report", str(base), "--json")
    ci = json.loads(out)[0]["confidence"]
    expected = interval([r["output_tokens_per_s"] for r in fake_result()["repeats"]], 0.95)
    assert ci["level"] == 0.95 and ci["repeats"] == 3
    assert ci["metrics"]["output_tokens_per_s"]["half_width"] == pytest.approx(
        expected.half_width)
    code, out, err = run_cli(monkeypatch, capsys, "compare", str(base), str(new), "--json",
                             "--decision", "confidence")
    verdict = json.loads(out)
    assert code == 1 and verdict["decision"] == "confidence"
    row = verdict["rows"][0]
    assert row["baseline_ci"]["n"] == 3 and row["overlap"] is False
    assert any("only the new result has a measure.window" in n for n in verdict["notes"])
    code, out, err = run_cli(monkeypatch, capsys, "compare", str(base), str(base))
    assert code == 0 and "95% interval over the repeats, batch_size=4 output_tokens_per_s: " \
        "baseline " in out and ": they overlap" in out
    for flag, value, message in (("--decision", "mean", "error: --decision: unknown value "
                                  "'mean'; allowed: median, confidence"),
                                 ("--confidence", "1.5", "error: --confidence: ")):
        code, out, err = run_cli(monkeypatch, capsys, "compare", str(base), str(base), flag,
                                 value)
        assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
