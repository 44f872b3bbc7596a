"""`infbench run` with `model.quant.kv` through the real CLI entry point: int8 runs and its
results price the cache the engine allocated; fp8 on a CPU is one error line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_helpers import tiny_scenario


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infbench.cli", *args], capture_output=True,
                          text=True, check=False)


def test_int8_kv_runs_and_its_bytes_per_token_are_the_predicted_ones(tmp_path: Path) -> None:
    scenario = tmp_path / "kv.yaml"
    scenario.write_text(tiny_scenario(name="kv", batch_size="3")
                        + "sweep: {model.quant.kv: [none, int8]}\n")
    res = _cli("run", str(scenario), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    docs = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("kv_*.json"))]
    assert [d["scenario"]["model"]["quant"]["kv"] for d in docs] == ["none", "int8"]
    per_token = [d["metrics"]["kv_bytes_per_token"] for d in docs]
    assert per_token == [d["prediction"]["kv_bytes_per_token"] for d in docs]
    # tiny: 2 layers x K and V x 2 KV heads x (16 float32 values | 16 int8 values + a scale)
    assert per_token == [2 * 2 * 2 * 16 * 4, 2 * 2 * 2 * (16 + 4)]
    peak = [d["metrics"]["peak_kv_bytes"] for d in docs]
    assert peak[1] * per_token[0] == peak[0] * per_token[1]  # same blocks, fewer bytes each
    assert all(d["metrics"]["num_output_tokens"] == 18 for d in docs)


def test_fp8_kv_on_a_cpu_is_one_error_line(tmp_path: Path) -> None:
    scenario = tmp_path / "fp8.yaml"
    scenario.write_text(tiny_scenario(name="fp8", batch_size="1"))
    res = _cli("run", str(scenario), "--set", "model.quant.kv=fp8", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    assert "model.quant.kv='fp8'" in errors[0] and "allowed here: none, int8" in errors[0]
