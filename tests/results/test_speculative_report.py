"""The speculative-decoding table of `infbench report` and the speed-up figure of
`infbench plots` (results/speculative.py, plots/measured.py `speculative_figure`), on
real results: a tiny scenario with two proposers (n-gram lookup, the target as its own
draft) x k in {1, 2} x batch 1 and 2, run once through the CLI for the whole module."""

from __future__ import annotations

import io
import json
import random
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli

from infbench import cli
from infbench.plots.measured import speculative_figure
from infbench.results.gate import load_results
from infbench.results.speculative import SPEC_COLUMNS, spec_rows, spec_table

SCENARIO = """
name: spec
device: cpu
dtype: float32
hardware: cpu
model: {preset: tiny, weights: random, overrides: {max_seq_len: 64}}
workload: {kind: static, batch_size: [1, 2], prompt_len: 8, gen_len: 6, seed: 0}
engine: {block_size: 4, max_num_batched_tokens: 32}
measure: {warmup: 0, repeats: 1}
sweep:
  speculative.num_tokens: [1, 2]
variants:
  - {label: ngram, speculative.method: ngram}
  - {label: self, speculative: {method: draft}}
"""

# (variant, k, batch) in the table's order: variant as first seen, then batch, then k
ORDER = [(v, k, b) for v in ("ngram", "self") for b in (1, 2) for k in (1, 2)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spec")
    (root / "spec.yaml").write_text(SCENARIO)
    out = root / "out"
    sink = io.StringIO()
    with redirect_stdout(sink), redirect_stderr(sink), pytest.raises(SystemExit) as exc:
        cli.main(["run", str(root / "spec.yaml"), "--out", str(out)])
    assert exc.value.code in (0, None), sink.getvalue()[-2000:]
    return out


@pytest.fixture(scope="module")
def by_point(run_dir: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The result JSONs as written, keyed by (variant, k, batch)."""
    points = {}
    for path in sorted(run_dir.glob("spec_*.json")):
        r = json.loads(path.read_text())
        swept = r["scenario"]["swept"]
        points[(swept["variant"], swept["speculative.num_tokens"],
                r["scenario"]["workload"]["batch_size"])] = r
    assert sorted(points) == sorted(ORDER)
    return points


def _short(value: float | None) -> str:  # the table's three significant digits
    if value is None:
        return "-"
    return (f"{value:.0f}" if abs(value) >= 100 else
            f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}")


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def test_rows_hold_the_json_numbers_in_order(by_point):
    results = list(by_point.values())
    random.Random(1).shuffle(results)
    first = results[0]["scenario"]["swept"]["variant"]
    rows = spec_rows(results + [{"name": "plain", "metrics": {"output_tokens_per_s": 1.0}}])
    variants = [first] + [v for v in ("ngram", "self") if v != first]
    assert [(r["variant"], r["num_tokens"], r["batch_size"]) for r in rows] == [
        (v, k, b) for v in variants for b in (1, 2) for k in (1, 2)]
    for row in rows:
        r = by_point[(row["variant"], row["num_tokens"], row["batch_size"])]
        m, spec = r["metrics"], r["metrics"]["speculative"]
        assert row["method"] == spec["method"]
        for key in ("acceptance_rate", "acceptance_per_token", "mean_accepted_tokens",
                    "draft_cost_ratio", "baseline_output_tokens_per_s", "speedup_measured",
                    "throughput_ratio", "speedup_predicted"):
            assert row[key] == spec.get(key), key
        assert row["output_tokens_per_s"] == m["output_tokens_per_s"]
        assert row["tpot_ms"] == pytest.approx(m["tpot_s"]["mean"] * 1e3, rel=1e-12)
        assert row["baseline_tpot_ms"] == pytest.approx(spec["baseline_tpot_s"] * 1e3, rel=1e-12)
    # the target as its own draft is always verified (the n-gram may find no match in the
    # random model's text: then it has no acceptance and no prediction, shown `-`)
    assert all(r["acceptance_rate"] is not None and r["speedup_predicted"] is not None
               for r in rows if r["variant"] == "self")
    assert all(r["speedup_measured"] is not None for r in rows)
    assert spec_table(rows).row_count == 8
    assert spec_rows([{"metrics": {}}]) == []


def _table_cells(out: str) -> list[list[str]]:
    """The body rows of the speculative table in `report`'s output (wide terminal)."""
    tail = out[out.index("speculative decoding: speed-up over plain decoding"):]
    cells = []
    for line in tail.splitlines():
        if line.startswith("│"):
            cells.append([c.strip() for c in line.strip("│").split("│")])
    return cells


def test_report_prints_the_table(run_dir, by_point, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(monkeypatch, capsys, "report", str(run_dir))
    assert code == 0, err
    header = next(line for line in out[out.index("speculative decoding"):].splitlines()
                  if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == list(SPEC_COLUMNS)
    cells = _table_cells(out)
    assert len(cells) == len(ORDER)
    for got, (variant, k, batch) in zip(cells, ORDER, strict=True):
        r = by_point[(variant, k, batch)]
        m, spec = r["metrics"], r["metrics"]["speculative"]
        assert got == [
            variant, str(k), str(batch),
            _fmt(spec.get("acceptance_rate"), ".2f"),
            _fmt(spec.get("mean_accepted_tokens"), ".2f"),
            _fmt(spec.get("draft_cost_ratio"), ".3g"),
            f"{_short(m['output_tokens_per_s'])} / "
            f"{_short(spec['baseline_output_tokens_per_s'])}",
            f"{_short(m['tpot_s']['mean'] * 1e3)} / {_short(spec['baseline_tpot_s'] * 1e3)}",
            f"{_fmt(spec['speedup_measured'], '.2f')} / "
            f"{_fmt(spec.get('speedup_predicted'), '.2f')}",
        ]


def test_report_narrow_terminal_keeps_every_number(run_dir, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(monkeypatch, capsys, "report", str(run_dir))
    assert code == 0, err
    tail = out[out.index("speculative decoding"):]
    assert all(len(line) <= 80 for line in tail.splitlines())
    assert tail.count("│ self") == 4 and tail.count("│ ngram") == 4


def test_report_json_and_markdown_carry_spec_columns(run_dir, by_point, monkeypatch, capsys,
                                                     tmp_path):
    md = tmp_path / "r.md"
    code, out, err = run_cli(monkeypatch, capsys, "report", str(run_dir), "--json",
                             "--markdown", str(md))
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 8
    for row in rows:
        r = json.loads(Path(row["file"]).read_text())
        spec = r["metrics"]["speculative"]
        assert row["spec_method"] == spec["method"]
        assert row["spec_num_tokens"] == r["scenario"]["swept"]["speculative.num_tokens"]
        assert row["spec_speedup_measured"] == spec["speedup_measured"]
        assert row["spec_speedup_predicted"] == spec.get("speedup_predicted")
        assert row["spec_acceptance_rate"] == spec.get("acceptance_rate")
        assert row["spec_baseline_tpot_ms"] == pytest.approx(spec["baseline_tpot_s"] * 1e3)
    header = md.read_text().splitlines()[0]
    assert "spec_speedup_measured" in header and "spec_method" in header


def test_plots_writes_the_speedup_figure(run_dir, by_point, monkeypatch, capsys, tmp_path):
    code, out, err = run_cli(monkeypatch, capsys, "plots", str(run_dir), "--out",
                             str(tmp_path / "fig"), "--json")
    assert code == 0, err
    path = Path(json.loads(out)["speculative_speedup"])
    assert path.name == "speculative_speedup.png" and path.read_bytes()[:4] == b"\x89PNG"

    drawn = speculative_figure(load_results([run_dir]), tmp_path / "s.svg")
    assert drawn is not None and drawn["batch_sizes"] == [1, 2]
    assert drawn["legend"] == ["ngram", "self", "measured", "predicted"]
    lines = {(d["variant"], d["batch_size"], d["kind"]): d for d in drawn["lines"]}
    # a predicted line where the run predicted (no acceptance, as an n-gram without a
    # match, gives none); every point has a measured speed-up
    predicted = {(v, b, "predicted") for (v, k, b), r in by_point.items()
                 if r["metrics"]["speculative"].get("speedup_predicted") is not None}
    assert {("self", 1, "predicted"), ("self", 2, "predicted")} <= predicted
    assert set(lines) == {(v, b, "measured") for v in ("ngram", "self")
                          for b in (1, 2)} | predicted
    for (variant, batch, kind), line in lines.items():
        assert line["k"] == [1, 2]
        key = "speedup_measured" if kind == "measured" else "speedup_predicted"
        assert line["speedup"] == [
            by_point[(variant, k, batch)]["metrics"]["speculative"][key] for k in (1, 2)]
    axes = drawn["figure"].axes
    assert [ax.get_title() for ax in axes] == ["batch 1", "batch 2"]
    for ax, batch in zip(axes, (1, 2), strict=True):
        styles = {}
        for artist in ax.get_lines():
            ys = [float(y) for y in artist.get_ydata()]
            if ys == [1.0, 1.0]:
                styles["no gain"] = artist.get_linestyle()
                continue
            styles[tuple(ys)] = artist.get_linestyle()
        assert "no gain" in styles
        for (_variant, b, kind), line in lines.items():
            if b == batch:
                assert styles[tuple(line["speedup"])] == ("-" if kind == "measured" else "--")


def test_no_figure_without_speculative_metrics(tmp_path):
    plain = {"name": "p", "scenario": {"workload": {"batch_size": 1}},
             "metrics": {"output_tokens_per_s": 10.0}}
    assert speculative_figure([plain], tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()
    assert spec_rows([plain]) == []
