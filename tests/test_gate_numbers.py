"""The gate refuses bad numbers: NaN, inf, zero or negative gated values exit 2, not a verdict.

Before, a NaN metric on either side compared as "ok" (gate PASS, exit 0) and a zero
baseline as "+inf% improved".  Every gated value must be a finite number > 0; the
error names the result file and the metric path, through `infbench compare` and a
scenario's `gate:` block alike.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli
from measure.conftest import make_result  # tests/ is on pythonpath (pyproject)
from rich.console import Console

from infbench.core.errors import ResultSchemaError, UserError
from infbench.results.gate import compare, gate_from_scenario

BAD = [float("nan"), float("inf"), float("-inf"), 0.0, -5.0]
BAD_IDS = ["nan", "inf", "-inf", "zero", "negative"]


def _with(value: float, metric: str = "output_tokens_per_s", repeats: bool = False,
          **kwargs: Any) -> dict[str, Any]:
    """A fake result whose summary metric (and, with `repeats`, one repeat's) is `value`."""
    r = copy.deepcopy(make_result(**kwargs))
    head, _, tail = metric.partition(".")
    if tail:
        r["metrics"][head][tail] = value
    else:
        r["metrics"][head] = value
    if repeats:
        r["repeats"][1][metric] = value
    else:
        r["repeats"] = []  # the gate then reads `metrics`
    return r


def _write(path: Path, result: dict[str, Any]) -> Path:
    path.write_text(json.dumps(result))  # json writes NaN / Infinity literals, as Python reads
    return path


@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("side", ["baseline", "new"])
def test_compare_refuses_bad_values_on_either_side(value, side) -> None:
    good, bad = make_result(), _with(value)
    bad["_path"] = "results/bad.json"
    base, new = (bad, good) if side == "baseline" else (good, bad)
    with pytest.raises(ResultSchemaError) as info:
        compare(base, new)
    msg = str(info.value)
    assert "results/bad.json" in msg and "metrics.output_tokens_per_s" in msg
    assert "finite number > 0" in msg


@pytest.mark.parametrize("value", [float("nan"), 0.0, -1.0], ids=["nan", "zero", "negative"])
def test_one_bad_repeat_is_named(value) -> None:
    bad = _with(value, repeats=True)
    with pytest.raises(ResultSchemaError, match=r"repeats\[1\]\.output_tokens_per_s"):
        compare(make_result(), bad)


def test_latency_path_and_roofline_fraction_denominator() -> None:
    bad = _with(float("nan"), metric="ttft_s.p99")
    with pytest.raises(ResultSchemaError, match=r"metrics\.ttft_s\.p99 is nan"):
        compare(make_result(), bad, metric="ttft_s.p99")
    for value in (float("nan"), 0.0, -2.0):
        pred = copy.deepcopy(make_result())
        pred["prediction"]["output_tokens_per_s"] = value
        with pytest.raises(ResultSchemaError, match=r"prediction\.output_tokens_per_s"):
            compare(make_result(), pred, normalize="roofline_fraction")


def test_good_values_still_give_verdicts() -> None:
    assert compare(make_result(), make_result()).rows[0].status == "ok"
    assert compare(make_result(), make_result(speed=0.5)).rows[0].status == "regression"


@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("side", ["baseline", "new"])
def test_cli_compare_exits_2_with_one_line(value, side, tmp_path, monkeypatch, capsys) -> None:
    bad = _write(tmp_path / "bad.json", _with(value))
    good = _write(tmp_path / "good.json", make_result())
    args = (bad, good) if side == "baseline" else (good, bad)
    code, out, err = run_cli(monkeypatch, capsys, "compare", *map(str, args))
    assert code == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert str(bad) in lines[0] and "metrics.output_tokens_per_s" in lines[0]
    assert "PASS" not in out and "Traceback" not in err


@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
def test_scenario_gate_refuses_a_bad_baseline(value, tmp_path) -> None:
    base = _write(tmp_path / "baseline.json", _with(value))
    gate = {"metric": "output_tokens_per_s", "baseline": str(base), "max_regression": 0.05,
            "normalize": "none"}
    with pytest.raises(UserError) as info:
        gate_from_scenario(gate, [make_result()], Console(file=io.StringIO()))
    assert info.value.exit_code == 2
    assert str(base) in str(info.value) and "metrics.output_tokens_per_s" in str(info.value)


@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
def test_scenario_gate_refuses_a_bad_fresh_result(value, tmp_path) -> None:
    base = _write(tmp_path / "baseline.json", make_result())
    fresh = _with(value)
    fresh["_path"] = str(tmp_path / "out" / "smoke_000.json")
    gate = {"metric": "output_tokens_per_s", "baseline": str(base)}
    out = io.StringIO()
    with pytest.raises(UserError, match="smoke_000.json.*metrics.output_tokens_per_s"):
        gate_from_scenario(gate, [fresh], Console(file=out))
    assert "PASS" not in out.getvalue()


def test_nan_spread_is_not_shown() -> None:
    base = make_result()
    base["repeats"] = []
    base["spread"]["output_tokens_per_s"] = {"min": float("nan"), "max": 1.0, "stdev": 0.1}
    row = compare(base, make_result()).rows[0]
    assert row.baseline_spread is None and row.status == "ok"
