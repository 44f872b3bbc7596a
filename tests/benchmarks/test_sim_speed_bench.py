"""`python -m infbench.benchmarks.sim_speed`: a small run writes its figures; bad options are
one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infbench.benchmarks import sim_speed


def test_small_run_writes_figures(tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    assert sim_speed.main(["--requests", "200", "--rate", "100", "--max-num-seqs", "32",
                           "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["requests"] == 200 and data["steps"] > 0
    assert 1 <= data["max_batch"] <= 32
    assert data["status"] in ("PASS", "NOT MET")
    assert data["total_wall_s"] == pytest.approx(sum(w for w, _ in data["parts"].values()))


@pytest.mark.parametrize("argv,word", [(["--requests", "0"], "--requests"),
                                       (["--rate", "0"], "--rate"),
                                       (["--max-num-seqs", "0"], "--max-num-seqs")])
def test_bad_options(argv: list[str], word: str, tmp_path: Path,
                     capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_speed.main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and word in err[0]
    assert not (tmp_path / "x.json").exists()
