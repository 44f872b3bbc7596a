"""The Pareto view (plots/pareto.py): the front, the axes' definitions, one curve per
variant or target, and the figure `plots` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infbench.plots.pareto import (
    TEXT,
    curve_key,
    pareto_data,
    pareto_figure,
    pareto_front,
    per_user_tokens_per_s,
)


def result(tps: float, tpot_s: float | None, *, variant: str | None = None,
           target: dict[str, Any] | None = None, label: str = "p",
           requests: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    scenario: dict[str, Any] = {"swept": {"variant": variant} if variant else {}}
    if target is not None:
        scenario["target"] = target
    metrics: dict[str, Any] = {"output_tokens_per_s": tps}
    if tpot_s is not None:
        metrics["tpot_s"] = {"p50": tpot_s}
    return {"name": "sweep", "label": label, "scenario": scenario, "metrics": metrics,
            "requests": requests or []}


def test_the_front_keeps_points_no_other_beats_on_both_axes() -> None:
    points = [(10.0, 50.0), (20.0, 40.0), (15.0, 30.0), (30.0, 10.0), (20.0, 40.0),
              (5.0, 50.0)]
    # (15, 30) is beaten by (20, 40); (5, 50) by (10, 50); the repeated (20, 40) once
    assert pareto_front(points) == [0, 1, 3]
    assert pareto_front([(1.0, 1.0)]) == [0]


def test_per_user_is_one_over_tpot_else_tokens_over_e2e() -> None:
    assert per_user_tokens_per_s(result(100.0, 0.02)) == pytest.approx(50.0)
    rows = [{"num_output_tokens": 1, "arrival_s": 0.0, "finish_s": 0.5},
            {"num_output_tokens": 1, "arrival_s": 0.0, "finish_s": 0.25},
            {"num_output_tokens": 1, "arrival_s": 0.0, "finish_s": 0.1},
            {"num_output_tokens": 0, "arrival_s": 0.0, "finish_s": None}]  # made no token
    assert per_user_tokens_per_s(result(10.0, None, requests=rows)) == pytest.approx(4.0)
    assert per_user_tokens_per_s(result(10.0, 0.0)) is None


def test_one_curve_per_variant_or_target_and_per_device_only_when_known() -> None:
    engine = [result(100.0, 0.010, variant="bf16", label="a"),
              result(300.0, 0.020, variant="bf16", label="b"),
              result(200.0, 0.040, variant="bf16", label="c"),  # beaten by b
              result(150.0, 0.008, variant="int8", label="d")]
    data = pareto_data(engine)
    assert data is not None and data["per_device"] and data["x_label"] == TEXT["device"]
    curves = {c["key"]: c for c in data["curves"]}
    assert set(curves) == {"bf16", "int8"}
    assert [p["label"] for p in curves["bf16"]["points"] if p["on_front"]] == ["a", "b"]
    assert curves["bf16"]["points"][1]["x"] == 300.0  # the engine: one device
    assert curves["bf16"]["points"][1]["y"] == pytest.approx(50.0)
    server = {"model": "m", "base_url": "http://gpu-box:8000/v1"}
    mixed = pareto_data([*engine[:2], result(500.0, 0.01, target=server)])
    assert mixed is not None and not mixed["per_device"]  # a server's devices are unknown
    assert mixed["x_label"] == TEXT["server"]
    assert curve_key(result(1.0, 1.0, target=server)) == "m @ gpu-box:8000"
    assert curve_key(result(1.0, 1.0)) == "sweep"
    two = [result(100.0, 0.01), result(100.0, 0.01)]
    two[1]["scenario"]["parallel"] = {"devices": 4}
    spread = pareto_data(two)
    assert spread is not None and [p["x"] for p in spread["curves"][0]["points"]] == [100, 25]
    assert pareto_data([engine[0]]) is None  # one point is no trade-off


def test_the_figure_marks_each_curves_front(tmp_path: Path) -> None:
    results = [result(100.0, 0.010, variant="bf16"), result(300.0, 0.020, variant="bf16"),
               result(200.0, 0.040, variant="bf16"), result(150.0, 0.008, variant="int8")]
    drawn = pareto_figure(results, tmp_path / "pareto.png")
    assert drawn is not None and Path(drawn["path"]).read_bytes()[:4] == b"\x89PNG"
    assert drawn["legend"] == ["bf16 (front)", "int8 (front)"]
    ax = drawn["figure"].axes[0]
    assert ax.get_xlabel() == TEXT["device"] and ax.get_ylabel() == TEXT["user"]
    front_line = ax.get_lines()[0]
    assert list(front_line.get_xdata()) == [100.0, 300.0]
    assert pareto_figure(results[:1], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
