"""report and compare check every file they will write before printing anything: an
unwritable --html / --csv / --markdown is one error line with nothing on stdout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BASELINE = str(Path(__file__).resolve().parents[2] / "results/baselines/ci/ci_gate_000.json")


@pytest.mark.parametrize("args", [
    ["report", BASELINE, "--html", "{bad}"],
    ["report", BASELINE, "--csv", "{bad}"],
    ["report", BASELINE, "--markdown", "{bad}"],
    ["compare", BASELINE, BASELINE, "--html", "{bad}"],
])
def test_an_unwritable_output_stops_before_any_table(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "file").write_text("x")
    bad = str(tmp_path / "file" / "out.x")  # its parent is a file
    proc = subprocess.run([sys.executable, "-m", "infbench.cli",
                           *[a.format(bad=bad) for a in args]], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --") and bad in lines[0], lines
