"""benchmarks/client_workers: one small pass per worker count, bad options in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infbench.benchmarks import client_workers


def test_small_run_writes_rows_per_worker_count(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cw.json"
    code = client_workers.main(["--workers", "1,2", "--servers", "1", "--requests", "24",
                                "--rate", "400", "--tokens", "4", "--repeats", "1",
                                "--out", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [r["workers"] for r in rows] == [1, 2] and rows[0]["speedup"] == 1.0
    for r in rows:  # every request streamed all its tokens, send errors measured
        assert r["requests"] == 24 and r["tokens"] == 96
        assert 0 <= r["send_error_p50_ms"] <= r["send_error_p99_ms"] <= r["send_error_max_ms"]
        assert r["client_cpu_s"] > 0
    assert "speed-up" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--workers", "1,x"], "error: --workers: not a comma-separated list of ints: '1,x'"),
    (["--workers", "0"], "error: --workers: each must be 1 .. 256 (got [0])"),
    (["--requests", "0"], "error: --requests: must be >= 1 (got 0)"),
])
def test_bad_option_is_one_line(argv: list[str], message: str, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert client_workers.main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "x.json").exists()
