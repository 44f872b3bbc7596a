"""Figures as a reader sees them: size, title, units, legend, encodings, file formats.

Each figure is built from the committed CI baselines or tiny synthetic results and
checked on the matplotlib objects it returns, not on pixels.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from infbench.core.config import PRESETS
from infbench.core.errors import UserError
from infbench.hardware.spec import get_hardware
from infbench.plots.analytic import (
    FIGURE_SIZES,
    kv_measured_figure,
    roofline_figure,
)
from infbench.plots.measured import (
    distributions_figure,
    latency_throughput_figure,
    measured_roofline_figure,
    swept_labels,
)
from infbench.results.gate import load_results
from infbench.roofline.analysis import predict
from infbench.roofline.tables import roofline_points

# the version-1 CI baseline (fixed numbers; no per-request rows)
BASELINES = Path(__file__).resolve().parents[1] / "results" / "data" / "v1_ci_baseline"
MAGIC = {"png": b"\x89PNG", "svg": b"<?xml", "pdf": b"%PDF"}


@pytest.fixture(scope="module")
def baselines() -> list[dict[str, Any]]:
    return load_results([BASELINES])


def _axes(drawn: dict[str, Any]) -> list[Any]:
    return list(drawn["figure"].axes)


def _legend_texts(ax: Any) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def _analytic(tmp_path: Path, name: str = "r.png", size: str = "column") -> dict[str, Any]:
    cfg, hw = PRESETS["llama2-13b"], get_hardware("h100-sxm")
    preds = [predict(cfg, hw, batch=b, prompt_len=1024, gen_len=128, dtype="bfloat16")
             for b in (1, 8, 64)]
    return roofline_figure(hw, "bfloat16", roofline_points(preds), tmp_path / name,
                           title="llama2-13b", size=size)


def test_analytic_roofline_groups_operators_and_encodes_batch(tmp_path):
    drawn = _analytic(tmp_path)
    fig = drawn["figure"]
    assert tuple(fig.get_size_inches()) == pytest.approx(FIGURE_SIZES["column"][0])
    (ax,) = _axes(drawn)
    assert "llama2-13b" in ax.get_title() and "bfloat16" in ax.get_title()
    assert "h100-sxm" in ax.get_title()
    assert "(FLOP/byte)" in ax.get_xlabel() and "(FLOP/s)" in ax.get_ylabel()
    legend = drawn["legend"]
    assert len(legend) <= 8
    assert {"attention", "lm head", "prefill", "decode"} <= set(legend)
    assert not any("measured" in t for t in legend)  # nothing was measured
    assert "batch" in ax.get_legend().get_title().get_text()
    points = drawn["points"]
    # prefill and decode differ in shape; batch is annotated on whole-step points
    assert {p["marker"] for p in points if p["stage"] == "prefill"} == {"s"}
    assert {p["marker"] for p in points if p["stage"] == "decode"} == {"o"}
    steps = [p for p in points if p["annotation"]]
    assert sorted(p["annotation"] for p in steps) == sorted(
        f"b={b}" for b in (1, 8, 64) for _ in range(2))
    # 13 operators x 2 stages are at most 5 colour families
    assert len({p["colour_key"] for p in points}) <= 5


def test_slide_size_and_every_format(tmp_path):
    slide = _analytic(tmp_path, "slide.png", size="slide")
    assert tuple(slide["figure"].get_size_inches()) == pytest.approx((10.0, 5.625))
    for ext, magic in MAGIC.items():
        path = Path(_analytic(tmp_path, f"r.{ext}")["out_path"])
        assert path.read_bytes()[:len(magic)] == magic
    with pytest.raises(UserError):
        _analytic(tmp_path, size="poster")


def test_measured_roofline_says_measured_and_tells_stages_apart(tmp_path, baselines):
    drawn = measured_roofline_figure(baselines, tmp_path / "m.svg")
    (ax,) = _axes(drawn)
    assert "tiny" in ax.get_title() and "float32" in ax.get_title() and "cpu" in ax.get_title()
    assert {"prefill", "decode", "measured (filled)", "predicted (hollow)"} <= set(
        drawn["legend"])
    assert len(drawn["legend"]) <= 8
    measured = [p for p in drawn["points"] if p["kind"] == "measured"]
    assert {p["annotation"] for p in measured} == {"b=1", "b=8"}
    assert {p["marker"] for p in measured if p["stage"] == "prefill"} == {"s"}
    assert {p["marker"] for p in measured if p["stage"] == "decode"} == {"o"}


def _rate_sweep(baselines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two points of a Poisson-rate sweep at batch 1 (the old figure said 'bs=1' twice)."""
    runs = []
    for rate, base in zip((1.0, 4.0), baselines, strict=True):
        r = copy.deepcopy(base)
        r["name"], r["label"] = "rate_sweep", f"workload.rate={rate}"
        r["scenario"]["workload"].update(kind="poisson", rate=rate, batch_size=1)
        runs.append(r)
    return runs


def test_latency_throughput_labels_what_the_sweep_varies(tmp_path, baselines):
    runs = _rate_sweep(baselines)
    assert swept_labels(runs) == ["rate=1.0", "rate=4.0"]
    drawn = latency_throughput_figure(runs, tmp_path / "lt.pdf")
    (ax,) = _axes(drawn)
    notes = [t.get_text() for t in ax.texts]
    assert sorted(notes) == ["rate=1.0", "rate=4.0"]
    assert "(tokens/s)" in ax.get_xlabel() and "(ms)" in ax.get_ylabel()
    assert "tiny · float32 · cpu" in ax.get_title()
    assert {"TPOT p50 (decode)", "TTFT p50 (prefill)"} <= set(drawn["legend"])
    assert len(drawn["legend"]) <= 8
    assert tuple(drawn["figure"].get_size_inches()) == pytest.approx(FIGURE_SIZES["column"][0])


def test_distributions_without_samples_say_decode_step_time(tmp_path, baselines):
    drawn = distributions_figure(baselines, tmp_path / "d.png")
    cdf, pct = _axes(drawn)
    assert cdf.get_xlabel() == "decode step time (ms)"
    assert not cdf.get_title().startswith("ITL")
    assert "tiny · float32 · cpu" in cdf.get_title()
    assert "(ms)" in pct.get_ylabel()
    # one colour per run across both panels; one marker and line style per metric
    colours = {line.get_color() for line in pct.get_lines()}
    assert len(colours) == len(baselines)
    assert {line.get_color() for line in cdf.get_lines()} == colours
    assert set(_legend_texts(pct)) == {"TTFT", "TPOT", "ITL", "E2E"}
    per_run = [line for line in pct.get_lines() if line.get_color() == sorted(colours)[0]]
    assert len({line.get_marker() for line in per_run}) == 4


def test_distributions_use_per_request_itl_when_present(tmp_path, baselines):
    r = copy.deepcopy(baselines[0])
    r["requests"] = [{"itl_s": [0.001, 0.002, 0.004]}, {"itl_s": [0.003]}]
    drawn = distributions_figure([r], tmp_path / "d.png")
    cdf, _ = _axes(drawn)
    assert cdf.get_xlabel() == "inter-token latency (ms)"
    assert cdf.get_title().startswith("ITL distribution")
    (series,) = drawn["itl_cdf"].values()
    assert series["source"] == "itl"
    assert series["x"] == pytest.approx([1.0, 2.0, 3.0, 4.0])


def _kv_row(scheme: str, kv: int, state: int, tps: float | None) -> dict[str, Any]:
    return {"scheme": scheme, "model": "tiny", "context_len": 256, "batch": 2,
            "kv_cache_bytes_predicted": kv, "state_bytes_per_seq_predicted": state,
            "peak_kv_bytes_measured": kv, "state_bytes_per_seq_measured": state,
            "decode_tokens_per_s_measured": tps}


def test_kv_measured_chart_is_not_a_strip_and_has_no_fake_zero(tmp_path):
    rows = [_kv_row("mha", 4_000_000, 0, 900.0), _kv_row("gqa", 1_000_000, 0, 1100.0),
            _kv_row("mamba", 0, 300_000, 1300.0), _kv_row("hybrid", 500_000, 100_000, None)]
    drawn = kv_measured_figure(rows, tmp_path / "kv.png", hardware="cpu")
    width, height = drawn["figure"].get_size_inches()
    assert width == pytest.approx(3.5) and 0.5 < height / width < 1.5
    bars, speed = _axes(drawn)
    assert bars.get_yscale() == "linear" and speed.get_yscale() == "linear"
    assert "(MB)" in bars.get_ylabel() and "tok/s" in speed.get_ylabel()
    assert "cpu" in bars.get_title() and "tiny" in bars.get_title()
    drawn["figure"].canvas.draw()
    for ax in (bars, speed):
        ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert len(ticks) == len(set(ticks)), ticks
    xticks = [t.get_text() for t in speed.get_xticklabels()]
    assert len(xticks) == len(set(xticks)) == 4
    assert drawn["measured_mb"][2] == pytest.approx(0.6)  # state only, no KV: not dropped
