"""The HTML reports opened in a real headless Chromium (the Debian package; `.ci/run`
installs it with `make browser`): an engine run through the real engine, a sweep with
variants and speculative points, a rate sweep of an MoE model with objectives, a client run
against `infbench serve`, and a comparison.  Each page must draw every figure, log no
console error, request nothing but its own file and hold the sections its data calls for;
with JavaScript off its tables are still there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from browser import chromium_path, open_pages
from cli_helpers import run_args, tiny_scenario

# Skipped only on a machine without Chromium; under CI (CI=true) a missing browser fails.
pytestmark = pytest.mark.skipif(
    chromium_path() is None and not os.environ.get("CI"),
    reason="no chromium on PATH: the browser test needs the Debian package "
           "(`make browser`, or apt-get install chromium); CI installs it")

BASE = ["run", "points", "latency-throughput", "distributions", "timeline"]


def _client_run(out: Path) -> Path:
    """A Poisson client run against the tiny preset served by `infbench serve` in-process."""
    from serve_helpers import MODEL_NAME, start_server

    from infbench import cli

    server = start_server()
    try:
        scenario = out.parent / "client.yaml"
        scenario.write_text(f"""
name: client_serve
model: {{preset: tiny}}
hardware: cpu
target: {{kind: openai, base_url: '{server.url}/v1', model: {MODEL_NAME},
          return_token_ids: true}}
workload: {{kind: poisson, rate: 50, num_requests: 8, prompt_len: 12, gen_len: 8, seed: 0}}
measure: {{warmup: 0, repeats: 2}}
""")
        try:
            cli.main(["run", str(scenario), "--out", str(out)])
        except SystemExit as exc:
            assert not exc.code, exc
    finally:
        server.stop()
    return out


@pytest.fixture
def pages(runs: dict[str, Path], tmp_path: Path,
          capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[Path, list[str]]]:
    """name -> (the written page, the sections it must have)."""
    engine_yaml = tmp_path / "tiny.yaml"
    engine_yaml.write_text(tiny_scenario(warmup=0, repeats=2))
    proc = subprocess.run([sys.executable, "-m", "infbench.cli", "run", str(engine_yaml),
                           "--out", str(tmp_path / "tiny")], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    client = _client_run(tmp_path / "client")
    reports = {
        "engine": (["report", str(tmp_path / "tiny")], BASE + ["roofline", "load"]),
        "variants": (["report", str(runs["variants"])],
                     BASE + ["roofline", "variants", "speculative", "load"]),
        "rates": (["report", str(runs["rates"])],
                  [*BASE[:3], "latency-rate", *BASE[3:], "roofline", "moe", "goodput", "load"]),
        "client": (["report", str(client)], BASE + ["load"]),
        "compare": (["compare", str(runs["engine"]), str(runs["slow"])],
                    ["verdict", "baseline", "new", "latency-throughput"]),
    }
    out = {}
    for name, (args, sections) in reports.items():
        page = tmp_path / f"{name}.html"
        code, _, err = run_args([*args, "--html", str(page)], capsys)
        assert code == (1 if name == "compare" else 0), err
        out[name] = (page, sections)
    return out


def test_reports_in_chromium(pages: dict[str, tuple[Path, list[str]]]) -> None:
    names = list(pages)
    seen = open_pages([pages[n][0] for n in names])
    for name, page in zip(names, seen, strict=True):
        path, sections = pages[name]
        assert page.console_errors == [], (name, page.console_errors)
        assert page.requests == [path.resolve().as_uri()], (name, page.requests)
        assert page.sections == sections, name
        assert page.figures, name
        for fig_id, fig in page.figures.items():
            assert fig["drawn"] and fig["marks"] > 0, (name, fig_id, fig)
            assert fig["width"] > 300 and fig["height"] > 150, (name, fig_id, fig)
    (noscript,) = open_pages([pages["compare"][0]], javascript=False)
    assert noscript.console_errors == [] and noscript.requests == [
        pages["compare"][0].resolve().as_uri()]
    assert "gate FAIL" in noscript.noscript_text and "<table" in noscript.noscript_text
    assert 'class="main-svg"' not in noscript.noscript_text  # nothing drawn: tables only
