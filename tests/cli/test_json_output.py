"""`--json` on run, report, compare and plots: stdout is one JSON document, nothing else;
and `run` without a terminal prints one line per finished point on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_cli, tiny_scenario

# the version-1 CI baseline (fixed numbers the assertions name)
BASELINES = Path(__file__).resolve().parents[1] / "results" / "data" / "v1_ci_baseline"
TINY = tiny_scenario("tiny_json", batch_size="[1, 2]", prompt_len=8, gen_len=4)


def test_report_json_is_the_rows(monkeypatch, capsys, tmp_path):
    md = tmp_path / "r.md"
    code, out, _ = run_cli(monkeypatch, capsys, "report", str(BASELINES), "--json",
                           "--markdown", str(md))
    assert code == 0
    rows = json.loads(out)
    assert [r["label"] for r in rows] == ["batch_size=1", "batch_size=8"]
    assert rows[1]["batch_size"] == 8
    assert rows[0]["output_tok_s_measured"] > 0 and rows[0]["output_tok_s_predicted"] > 0
    assert md.read_text().startswith("| label")  # the other outputs are still written


def test_compare_json_keeps_the_exit_code(monkeypatch, capsys, tmp_path):
    code, out, _ = run_cli(monkeypatch, capsys, "compare", str(BASELINES), str(BASELINES),
                           "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["passed"] is True and doc["exit_code"] == 0
    assert doc["metric"] == "output_tokens_per_s" and len(doc["rows"]) == 2
    assert {r["status"] for r in doc["rows"]} == {"ok"}
    # a slower copy: exit 1, and stdout still one JSON document saying why
    slow = json.loads((BASELINES / "ci_gate_000.json").read_text())
    for metrics in [slow["metrics"], *slow["repeats"]]:  # the gate reads the repeats' median
        metrics["output_tokens_per_s"] *= 0.5
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(slow))
    code, out, _ = run_cli(monkeypatch, capsys, "compare", str(BASELINES / "ci_gate_000.json"),
                           str(path), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["passed"] is False
    assert doc["rows"][0]["status"] == "regression"
    assert doc["rows"][0]["change_pct"] == pytest.approx(-50.0)


def test_plots_json_and_size_and_format(monkeypatch, capsys, tmp_path):
    code, out, _ = run_cli(monkeypatch, capsys, "plots", str(BASELINES), "--out",
                           str(tmp_path / "f"), "--format", "svg", "--size", "slide", "--json")
    assert code == 0
    paths = json.loads(out)
    assert set(paths) == {"latency_throughput", "distributions", "roofline_measured", "pareto"}
    for path in paths.values():
        assert path.endswith(".svg") and Path(path).read_text().startswith("<?xml")
    code, _, err = run_cli(monkeypatch, capsys, "plots", str(BASELINES), "--out",
                           str(tmp_path / "g"), "--size", "poster")
    assert code == 2 and err.startswith("error: --size")


def test_run_json_and_one_line_per_point_without_a_terminal(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TINY)
    out_dir = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "infbench.cli", "run", str(scenario), "--out",
                          str(out_dir), "--json"], capture_output=True, text=True, check=False,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # the whole of stdout: no table, no progress
    assert doc["status"] == "done" and doc["out_dir"] == str(out_dir)
    assert [p["label"] for p in doc["points"]] == ["batch_size=1", "batch_size=2"]
    for p in doc["points"]:
        assert p["output_tokens_per_s"] > 0 and p["ttft_s.p50"] > 0
        assert Path(p["file"]).is_file()
    # stderr is not a terminal here: one line per finished point, with headline figures
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("[")]
    assert len(lines) == 2, res.stderr
    assert lines[0].startswith("[1/2] batch_size=1: ")
    for line in lines:
        assert "output tok/s" in line and "TTFT p50" in line and "TPOT p50" in line
        assert line.endswith("s total)")


def test_run_table_folds_long_labels_instead_of_cutting_them():
    import io

    from rich.console import Console

    from infbench.results.gate import load_results
    from infbench.results.report import run_table

    results = load_results([BASELINES])
    label = "workload.batch_size=1,engine.max_num_batched_tokens=2048,workload.prompt_len=1024"
    results[0]["label"] = label
    out = io.StringIO()
    Console(file=out, width=80).print(run_table(results))
    text = out.getvalue()
    assert "…" not in text
    first_cells = [line.split("│")[1].strip() for line in text.splitlines()
                   if line.startswith("│")]
    assert label in "".join(first_cells)
    assert "1,786.9" in text  # numbers keep their width too
