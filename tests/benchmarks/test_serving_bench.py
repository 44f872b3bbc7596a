"""`make bench`'s serving benchmark (infbench.benchmarks.serving): a quick real run on the
tiny model (in-process engine against infbench serve), and bad options as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from infbench.benchmarks import serving


def test_quick_overhead_run_writes_figures(tmp_path: Path) -> None:
    out = tmp_path / "serving.json"
    assert serving.main(["--quick", "--model", "tiny", "--skip-replicas", "--out",
                         str(out)]) == 0
    data = json.loads(out.read_text())
    o = data["overhead"]
    assert o["failures"] == 0
    for side in ("in_process", "served"):
        s = o[side]
        assert s["num_requests"] == 2 and s["output_tokens"] == 2 * 6
        # Tokens that reach the client in one read share a timestamp (a loaded machine
        # coalesces SSE chunks), so a TPOT of 0 is a measurement, not a failure.
        assert s["ttft_p50_s"] > 0 and s["tpot_mean_s"] is not None and s["tpot_mean_s"] >= 0
    assert o["added_ttft_p50_s"] == pytest.approx(o["served"]["ttft_p50_s"]
                                                  - o["in_process"]["ttft_p50_s"])
    assert {t["status"] for t in o["targets"]} <= {"PASS", "NOT MET"}
    assert data["replicas"] is None
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for item in serving.render(data):
        console.print(item)
    text = console.export_text()
    assert "in-process Engine.run" in text and "infbench serve + client" in text


@pytest.mark.parametrize(("argv", "word"), [(["--requests", "0"], "--requests"),
                                            (["--gen", "1"], "--gen"),
                                            (["--concurrency", "0"], "--concurrency")])
def test_bad_options_are_one_error_line(argv: list[str], word: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert serving.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and word in err
