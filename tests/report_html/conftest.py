"""The `runs` fixture: run directories of fake results (report_data.py makes them)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from report_data import engine_run, rate_sweep, variants_sweep, write_run


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    """Run directories of fake results: an engine run, variants, a rate sweep, and the
    engine run again 20% slower (a regression for `compare`)."""
    slow = copy.deepcopy(engine_run())
    for r in slow:
        for section in [r["metrics"], *r["repeats"]]:
            section["output_tokens_per_s"] *= 0.8
    return {"engine": write_run(tmp_path / "engine", engine_run()),
            "variants": write_run(tmp_path / "variants", variants_sweep()),
            "rates": write_run(tmp_path / "rates", rate_sweep()),
            "slow": write_run(tmp_path / "slow", slow)}
