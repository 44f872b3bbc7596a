"""The predicted-under-load curves (`prediction.metrics`) beside the measured ones: what the
latency-vs-rate, goodput, latency-throughput and Pareto figures draw, PNG and HTML, equals
the simulated values, a point without a simulation gets no predicted marker, results
without any draw none, and `infbench plots DIR` writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_args
from measure.conftest import fake_metrics
from report_html.report_data import engine_run, rate_sweep, write_run

from infbench.plots.goodput import goodput_rate_figure
from infbench.plots.html import figures
from infbench.plots.measured import latency_throughput_figure
from infbench.plots.pareto import pareto_figure
from infbench.plots.predicted import PREDICTED_LABEL
from infbench.plots.rate import latency_rate_data, latency_rate_figure


def simulate(result: dict[str, Any], speed: float, attained: float | None = None) -> None:
    """Give a result a `prediction.metrics` unlike its measured one (the schema's shape)."""
    wl = result["scenario"]["workload"]
    predicted = fake_metrics(wl["batch_size"], wl["prompt_len"], wl["gen_len"], speed, 17.0)
    if attained is not None:
        predicted.update(goodput_requests_per_s=10.0 * attained, slo_attainment=attained,
                         num_slo_met=6 * attained)
    result["prediction"]["metrics"] = predicted


def simulated_sweep(skip: int | None = None) -> list[dict[str, Any]]:
    """The HTML tests' three-rate sweep with SLOs, each point simulated (but `skip`)."""
    results = rate_sweep()
    for i, (r, attained) in enumerate(zip(results, (1.0, 0.6, 0.2), strict=True)):
        if i != skip:
            simulate(r, speed=2.0 + i, attained=attained)
    return results


def sim_ms(result: dict[str, Any], name: str, stat: str) -> float:
    return float(result["prediction"]["metrics"][name][stat]) * 1e3


def predicted_lines(ax: Any) -> list[Any]:
    """The lines a figure drew as predicted: dashed with hollow markers."""
    return [line for line in ax.get_lines()
            if line.get_linestyle() == "--" and line.get_markerfacecolor() == "none"
            and len(line.get_xdata())]


def test_latency_against_rate_draws_the_simulated_p50_and_p90(tmp_path: Path) -> None:
    results = simulated_sweep(skip=1)  # the middle rate has no simulation
    drawn = latency_rate_figure(results, tmp_path / "lr.png")
    assert drawn is not None and Path(drawn["path"]).read_bytes()[:4] == b"\x89PNG"
    (line,) = drawn["lines"]
    assert line["rates"] == [2.0, 8.0, 32.0]
    for metric, stat in (("ttft", "p50"), ("ttft", "p90"), ("tpot", "p50"), ("tpot", "p90")):
        expected = [sim_ms(results[0], f"{metric}_s", stat), None,
                    sim_ms(results[2], f"{metric}_s", stat)]
        assert line["predicted"][f"{metric}_{stat}_ms"] == pytest.approx(expected)
        measured = [float(r["metrics"][f"{metric}_s"][stat]) * 1e3 for r in results]
        assert line["measured"][f"{metric}_{stat}_ms"] == pytest.approx(measured)
    # what reached the axes: two points per predicted series, the unsimulated rate left out
    predicted = [d for d in drawn["drawn"] if d["kind"] == "predicted"]
    assert len(predicted) == 4
    ttft_p50 = next(d for d in predicted if d["series"] == "ttft_p50_ms")
    assert [x for x, _ in ttft_p50["xy"]] == [2.0, 32.0]
    assert [y for _, y in ttft_p50["xy"]] == pytest.approx(
        [sim_ms(results[0], "ttft_s", "p50"), sim_ms(results[2], "ttft_s", "p50")])
    ttft_ax, tpot_ax = drawn["figure"].axes
    assert len(predicted_lines(ttft_ax)) == 2 and len(predicted_lines(tpot_ax)) == 2
    tpot_ys = sorted(y for ln in predicted_lines(tpot_ax) for y in ln.get_ydata())
    assert tpot_ys == pytest.approx(sorted(
        sim_ms(results[i], "tpot_s", s) for i in (0, 2) for s in ("p50", "p90")))
    assert PREDICTED_LABEL in drawn["legend"]


def test_no_predicted_series_without_a_simulation(tmp_path: Path) -> None:
    results = rate_sweep()  # prediction.tpot_s and the rest, but no prediction.metrics
    drawn = latency_rate_figure(results, tmp_path / "lr.png")
    assert drawn is not None
    assert not [d for d in drawn["drawn"] if d["kind"] == "predicted"]
    assert all(v is None for vs in drawn["lines"][0]["predicted"].values() for v in vs)
    assert all(not predicted_lines(ax) for ax in drawn["figure"].axes)
    assert PREDICTED_LABEL not in drawn["legend"]
    goodput = goodput_rate_figure(results, tmp_path / "g.png")
    assert goodput is not None and PREDICTED_LABEL not in goodput["legend"]
    assert all(not predicted_lines(ax) for ax in goodput["axes"])
    assert goodput["lines"][0]["predicted_max_rate"] is None
    throughput = latency_throughput_figure(results, tmp_path / "lt.png")
    assert throughput["simulated"] == [] and PREDICTED_LABEL not in throughput["legend"]
    pareto = pareto_figure(results, tmp_path / "p.png")
    assert pareto is not None and not pareto["has_predicted"]
    assert pareto["curves"][0]["predicted"] == []
    assert PREDICTED_LABEL not in pareto["legend"]


def test_one_rate_is_no_curve() -> None:
    results = rate_sweep()
    for r in results:
        r["scenario"]["workload"]["rate"] = 4.0
    assert latency_rate_data(results) is None
    assert latency_rate_data(engine_run()) is None  # batches, no rate


def test_goodput_figure_draws_simulated_latency_goodput_and_max_rate(tmp_path: Path) -> None:
    results = simulated_sweep()
    drawn = goodput_rate_figure(results, tmp_path / "g.png")
    assert drawn is not None
    (line,) = drawn["lines"]
    predicted = line["predicted"]
    for metric in ("ttft", "tpot"):
        for stat in ("p50", "p99"):
            assert predicted[f"{metric}_{stat}_ms"] == pytest.approx(
                [sim_ms(r, f"{metric}_s", stat) for r in results])
    assert predicted["goodput"] == pytest.approx([10.0, 6.0, 2.0])
    assert predicted["slo_attainment"] == pytest.approx([1.0, 0.6, 0.2])
    assert line["max_rate"] == 8.0  # measured: 1.0 and 0.95 meet the 0.9 target
    assert line["predicted_max_rate"] == 2.0  # simulated: 0.6 misses at rate 8
    ax_lat, ax_good, ax_frac = drawn["axes"]
    assert len(predicted_lines(ax_lat)) == 4  # TTFT and TPOT, p50 and p99
    (good,) = predicted_lines(ax_good)
    assert list(good.get_ydata()) == pytest.approx([10.0, 6.0, 2.0])
    (frac,) = predicted_lines(ax_frac)
    assert list(frac.get_ydata()) == pytest.approx([1.0, 0.6, 0.2])
    assert PREDICTED_LABEL in drawn["legend"]
    gap = goodput_rate_figure(simulated_sweep(skip=1), tmp_path / "gap.png")
    assert gap is not None
    (line,) = gap["lines"]
    assert line["predicted"]["goodput"] == pytest.approx([10.0, None, 2.0])
    assert line["predicted_max_rate"] is None  # a walk with a hole is no verdict


def test_latency_throughput_and_pareto_draw_the_simulated_points(tmp_path: Path) -> None:
    results = engine_run()  # batch 1 and 4: the roofline's batch and the simulation
    simulate(results[0], speed=3.0)
    drawn = latency_throughput_figure(results, tmp_path / "lt.png")
    (point,) = drawn["simulated"]
    sim = results[0]["prediction"]["metrics"]
    assert point["x"] == pytest.approx(sim["output_tokens_per_s"])
    assert point["y"] == pytest.approx(sim["tpot_s"]["p50"] * 1e3)
    assert point["ttft_ms"] == pytest.approx(sim["ttft_s"]["p50"] * 1e3)
    assert len(drawn["predicted"]) == 2  # the roofline's, unchanged
    (ax,) = drawn["figure"].axes
    dashed = predicted_lines(ax)
    assert sorted(y for ln in dashed for y in ln.get_ydata()) == pytest.approx(
        sorted([point["y"], point["ttft_ms"]]))
    assert {PREDICTED_LABEL, "predicted (roofline)", "measured"} <= set(drawn["legend"])
    pareto = pareto_figure(results, tmp_path / "p.png")
    assert pareto is not None and pareto["has_predicted"]
    (curve,) = pareto["curves"]
    (twin,) = curve["predicted"]
    assert twin["x"] == pytest.approx(sim["output_tokens_per_s"])
    assert twin["y"] == pytest.approx(1.0 / sim["tpot_s"]["p50"])
    (front,) = predicted_lines(pareto["figure"].axes[0])
    assert list(front.get_xdata()) == pytest.approx([twin["x"]])
    assert PREDICTED_LABEL in pareto["legend"]


def _traces(fig: figures.Figure | None) -> dict[str, dict[str, Any]]:
    assert fig is not None
    return {t["name"]: t for t in fig.data["data"]}


def test_the_html_page_draws_the_same_predicted_series() -> None:
    results = simulated_sweep(skip=1)
    by_rate = _traces(figures.latency_rate(results))
    ttft = by_rate[f"TTFT p50 {PREDICTED_LABEL}"]
    assert ttft["x"] == pytest.approx([2.0, 32.0])
    assert ttft["y"] == pytest.approx([sim_ms(results[i], "ttft_s", "p50") for i in (0, 2)])
    assert ttft["line"]["dash"] == "dash" and ttft["marker"]["symbol"].endswith("-open")
    assert by_rate["TTFT p50 measured"]["line"]["dash"] == "solid"
    goodput = _traces(figures.goodput_rate(results))
    assert goodput[f"goodput {PREDICTED_LABEL}"]["y"] == pytest.approx([10.0, 2.0])
    assert goodput[f"TPOT p99 {PREDICTED_LABEL}"]["y"] == pytest.approx(
        [sim_ms(results[i], "tpot_s", "p99") for i in (0, 2)])
    throughput = _traces(figures.latency_throughput(results))
    sim = throughput[f"TPOT p50 {PREDICTED_LABEL}"]
    assert sorted(sim["y"]) == pytest.approx(
        sorted(sim_ms(results[i], "tpot_s", "p50") for i in (0, 2)))
    bare = rate_sweep()
    for fig in (figures.latency_rate(bare), figures.goodput_rate(bare),
                figures.latency_throughput(bare)):
        assert not [name for name in _traces(fig) if PREDICTED_LABEL in name]


@pytest.mark.parametrize("simulated", [True, False], ids=["simulated", "not-simulated"])
def test_infbench_plots_writes_the_rate_figures(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                simulated: bool) -> None:
    run = write_run(tmp_path / "run", simulated_sweep() if simulated else rate_sweep())
    code, out, err = run_args(["plots", str(run), "--out", str(tmp_path / "fig"), "--json"],
                              capsys)
    assert code == 0, err
    paths = json.loads(out)
    assert {"latency_vs_rate", "goodput_rate", "pareto", "latency_throughput"} <= set(paths)
    for name in ("latency_vs_rate", "goodput_rate", "pareto"):
        assert Path(paths[name]).read_bytes()[:4] == b"\x89PNG"
