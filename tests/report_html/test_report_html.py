"""`report --html` and `compare --html` without a browser: the sections a page has, the
numbers its tables and figures carry (the same as `infbench plots` draws), that it loads
nothing from outside, reads without JavaScript, and that bad input is one `error:` line."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cli_helpers import run_args
from report_data import engine_run, rate_sweep, variants_sweep

from infbench.plots.html import figures
from infbench.plots.html.page import render, run_sections
from infbench.plots.html.tables import fmt
from infbench.plots.measured import latency_throughput_data, speculative_speedup_data
from infbench.results.gate import compare_many


def _ids(results: list[dict]) -> list[str]:
    return [s.id for s in run_sections(results)]


def test_sections_only_where_the_results_have_data() -> None:
    base = ["run", "points", "latency-throughput", "distributions", "timeline", "roofline"]
    assert _ids(engine_run()) == base + ["load"]
    assert _ids(variants_sweep()) == base + ["variants", "speculative", "load"]
    by_rate = [*base[:3], "latency-rate", *base[3:]]  # a rate sweep: latency against rate
    assert _ids(rate_sweep()) == by_rate + ["moe", "goodput", "load"]


def test_client_run_has_no_roofline_without_hardware() -> None:
    results = engine_run()
    for r in results:
        r["scenario"]["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:1/v1",
                                   "model": "m"}
        r["hardware"], r["steps"] = None, []
    ids = _ids(results)
    assert "roofline" not in ids and {"timeline", "load", "distributions"} <= set(ids)


def test_figures_draw_the_data_of_infbench_plots() -> None:
    results = variants_sweep()
    fig = figures.latency_throughput(results)
    assert fig is not None
    shared = latency_throughput_data(results)
    traces = {t["name"]: t for t in fig.data["data"]}
    tpot = traces["TPOT p50 measured"]
    assert tpot["x"] == pytest.approx([d["x"] for d in shared["measured"]])
    assert tpot["y"] == pytest.approx([d["y"] for d in shared["measured"]])
    spec = figures.speculative_speedup(results)
    data = speculative_speedup_data(results)
    assert spec is not None and data is not None
    measured = next(t for t in spec.data["data"] if t["name"] == "ngram measured")
    line = next(x for x in data["lines"] if x["kind"] == "measured")
    assert measured["x"] == line["k"] and measured["y"] == pytest.approx(line["speedup"])


def test_timeline_and_cdfs_from_the_request_rows() -> None:
    r = variants_sweep()[1]  # batch 4, request 1 preempted
    fig = figures.request_timeline(r, "b4", 0)
    assert fig is not None
    bars = {t["name"]: t for t in fig.data["data"]}
    prefill = bars["queued + prefill (arrival → first token)"]
    first = r["requests"][0]
    assert prefill["x"][0] == pytest.approx((first["first_token_s"] - first["arrival_s"]) * 1e3)
    assert bars["preempted (at least once)"]["y"] == ["r0001"]
    cdfs = figures.latency_cdfs([r])
    assert cdfs is not None
    ttft = cdfs.data["data"][0]
    assert len(ttft["x"]) == 4 and ttft["y"][-1] == 1.0


def _page(results: list[dict]) -> str:
    return render("t", run_sections(results), plotly_js=lambda: "/* plotly.js */")


class _Tables(HTMLParser):
    """The text of every table cell as parsed, before any script runs."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.sources: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_cell = tag in ("td", "th")
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.sources.append(value)
        if tag == "link":
            self.sources.append(str(dict(attrs).get("href")))

    def handle_data(self, data: str) -> None:
        if self._in_cell and data.strip():
            self.cells.append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        self._in_cell = False


def test_tables_read_without_javascript_and_nothing_is_loaded() -> None:
    results = rate_sweep()
    page = _Tables()
    page.feed(_page(results))
    assert all(s.startswith("#") for s in page.sources), page.sources  # anchors only
    ttft = results[0]["metrics"]["ttft_s"]["p50"] * 1e3
    assert fmt(ttft) in page.cells and "," in fmt(ttft)  # 3,457: thousands separated
    assert "rate=2" in page.cells and "-6.2%" in page.cells  # goodput and MoE rows
    assert "avx2" not in page.cells


def test_script_data_cannot_close_its_element() -> None:
    results = engine_run()
    results[0]["label"] = results[0]["scenario"]["label"] = "</script><b>x"
    text = _page(results)
    assert "</script><b>" not in text.split('id="infbench-figures">')[1].split("</script>")[0]


def test_report_html_cli(runs: dict[str, Path], tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    code, stdout, err = run_args(["report", str(runs["variants"]), "--json", "--html",
                                  str(out)], capsys)
    assert code == 0, err
    assert stdout.lstrip().startswith("[")  # stdout keeps the JSON
    assert re.search(rf"wrote {re.escape(str(out))} \(\d+\.\d MB", err)
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "Plotly.newPlot" in text
    assert len(text) > 1_000_000  # plotly.js inline


def test_compare_html_keeps_the_exit_code(runs: dict[str, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.html"
    code, _, err = run_args(["compare", str(runs["engine"]), str(runs["slow"]), "--html",
                             str(out)], capsys)
    assert code == 1, err
    text = out.read_text()
    assert "gate FAIL: regression beyond threshold (exit 1)" in text
    assert "output_tokens_per_s (gated)" in text and "-20.0%" in text


def test_comparison_rows_carry_both_spreads() -> None:
    from infbench.results.changes import metric_changes

    base, new = engine_run(), engine_run()
    gate = compare_many(base, new)
    rows, notes = metric_changes(base, new, gate)
    gated = [r for r in rows if r["gated"]]
    assert len(gated) == 2 and all(r["status"] == "ok" for r in gated)
    assert gated[0]["baseline_range"][0] < gated[0]["baseline_range"][1]
    assert gated[0]["noise_pct"] > 0
    assert {r["metric"] for r in rows} >= {"ttft_s.p50", "tpot_s.p50", "decode.mbu"}
    assert any("accuracy.perplexity" in n for n in notes)  # not in these runs


@pytest.mark.parametrize("case", ["no run", "parent is a file", "a directory"])
def test_bad_input_is_one_error_line(case: str, runs: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "file").write_text("x")
    run_dir, html = {"no run": (empty, tmp_path / "r.html"),
                     "parent is a file": (runs["engine"], tmp_path / "file" / "r.html"),
                     "a directory": (runs["engine"], tmp_path)}[case]
    code, _, err = run_args(["report", str(run_dir), "--html", str(html)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    code, _, err = run_args(["compare", str(run_dir), str(runs["engine"]), "--html",
                             str(html)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
