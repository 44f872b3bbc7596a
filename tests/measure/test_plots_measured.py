"""Measured-result figures: the plotted coordinates, not just the files."""

from __future__ import annotations

import pytest

from infbench.hardware.spec import HARDWARE
from infbench.plots.measured import (
    decode_step_ms,
    distributions_figure,
    latency_throughput_figure,
    measured_roofline_figure,
    measured_roofline_points,
)


def test_roofline_points_measured_and_predicted_twins(fake_result):
    r = fake_result(batch_size=4)
    pts = {p.label: p for p in measured_roofline_points([r])}
    run = r["label"]
    dec, pdec = r["metrics"]["decode"], r["prediction"]["decode"]
    m = pts[f"{run} decode"]
    assert (m.kind, m.intensity, m.flops_per_s) == ("measured", dec["intensity"],
                                                    dec["achieved_flops_per_s"])
    p = pts[f"{run} decode (predicted)"]
    assert p.kind == "predicted" and p.intensity == pdec["intensity"]
    # decode FLOPs are per step: divided by the predicted step time
    assert p.flops_per_s == pytest.approx(pdec["flops"] / pdec["step_time_s"])
    pp = pts[f"{run} prefill (predicted)"]
    pre = r["prediction"]["prefill"]
    assert pp.flops_per_s == pytest.approx(pre["flops"] / pre["time_s"])
    assert m.group == p.group != pts[f"{run} prefill"].group  # twins pair by stage
    assert {q.series for q in pts.values()} == {run}
    assert len(pts) == 4


def test_predicted_point_falls_back_to_the_roof(fake_result):
    r = fake_result()
    del r["prediction"]["decode"]["step_time_s"], r["prediction"]["decode"]["time_per_token_s"]
    hw = HARDWARE["cpu"]
    pts = {p.label: p for p in measured_roofline_points([r], hw)}
    p = pts[f"{r['label']} decode (predicted)"]
    intensity = r["prediction"]["decode"]["intensity"]
    assert p.flops_per_s == pytest.approx(min(hw.peak("float32"), intensity * hw.bandwidth))


def test_step_points_optional(fake_result):
    r = fake_result(gen_len=8)
    base = measured_roofline_points([r])
    with_steps = measured_roofline_points([r], include_steps=True)
    steps = [p for p in with_steps if " step " in p.label]
    assert len(with_steps) == len(base) + len(r["steps"]) == len(base) + 8
    s1 = r["steps"][1]
    got = next(p for p in steps if p.label.endswith("step 1"))
    assert got.flops_per_s == pytest.approx(s1["flops"] / s1["duration_s"])
    assert got.group == "" and got.stage == "decode"


def test_measured_roofline_figure(fake_result, tmp_path):
    results = [fake_result(batch_size=1), fake_result(batch_size=8, point_index=1)]
    info = measured_roofline_figure(results, tmp_path / "roof.png")
    assert (tmp_path / "roof.png").stat().st_size > 0
    assert len(info["points"]) == 8
    assert len(info["links"]) == 4  # each measured stage joined to its prediction
    dec = results[1]["metrics"]["decode"]
    drawn = {p["label"]: p for p in info["points"]}
    assert drawn[f"{results[1]['label']} decode"]["flops_per_s"] == pytest.approx(
        dec["achieved_flops_per_s"])


def test_latency_throughput_coordinates(fake_result, tmp_path):
    results = [fake_result(batch_size=bs, point_index=i) for i, bs in enumerate((8, 1, 4))]
    info = latency_throughput_figure(results, tmp_path / "lt.png")
    assert (tmp_path / "lt.png").stat().st_size > 0
    assert [d["batch_size"] for d in info["measured"]] == [1, 4, 8]
    by_bs = {r["scenario"]["workload"]["batch_size"]: r for r in results}
    for d in info["measured"]:
        m = by_bs[d["batch_size"]]["metrics"]
        assert d["x"] == pytest.approx(m["output_tokens_per_s"])
        assert d["y"] == pytest.approx(m["tpot_s"]["p50"] * 1e3)
    xs = [d["x"] for d in info["measured"]]
    ys = [d["y"] for d in info["measured"]]
    assert xs == sorted(xs) and ys == sorted(ys)  # the trade-off: more tok/s, slower tokens
    p = info["predicted"][0]
    assert p["y"] == pytest.approx(by_bs[1]["prediction"]["tpot_s"] * 1e3)


def test_distributions_coordinates(fake_result, tmp_path):
    r = fake_result(gen_len=11)
    info = distributions_figure([r], tmp_path / "dist.png")
    assert (tmp_path / "dist.png").stat().st_size > 0
    cdf = info["itl_cdf"][r["label"]]
    expected = sorted(s["duration_s"] * 1e3 for s in r["steps"] if s["stage"] == "decode")
    assert cdf["x"] == pytest.approx(expected) and len(expected) == 10
    assert cdf["y"][-1] == pytest.approx(1.0) and cdf["y"][0] == pytest.approx(0.1)
    pct = info["percentiles"][r["label"]]
    assert pct["ttft_ms"]["p99"] == pytest.approx(r["metrics"]["ttft_s"]["p99"] * 1e3)
    assert pct["tpot_ms"]["p50"] == pytest.approx(r["metrics"]["tpot_s"]["p50"] * 1e3)


def test_decode_steps_without_stage_field(fake_result):
    r = fake_result(gen_len=5)
    for s in r["steps"]:
        del s["stage"]
    assert len(decode_step_ms(r)) == 4  # the prefill step is recognised by its tokens
