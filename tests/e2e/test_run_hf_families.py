"""`infbench run` on tiny Gemma-2 (soft-capped, alternating windows), Gemma-3 and Qwen3
checkpoints: the run succeeds and the engine allocates exactly the analytic KV bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = """
name: families
device: cpu
dtype: float32
hardware: cpu
model: {{path: {first}}}
workload: {{kind: static, batch_size: 2, prompt_len: 12, gen_len: 4, seed: 0}}
engine: {{block_size: 4, max_num_seqs: 4, max_num_batched_tokens: 64, backend: cpu}}
measure: {{warmup: 0, repeats: 1}}
sweep:
  model.path: [{paths}]
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infbench.cli", *args], capture_output=True,
                          text=True, check=False, timeout=600)


@pytest.fixture(scope="module")
def kv_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).parents[1] / "model"))
    from test_hf_families import write_hf

    tmp = tmp_path_factory.mktemp("families")
    paths = []
    for case in ("gemma2", "gemma3", "qwen3"):
        write_hf(tmp / case, case)
        paths.append(str(tmp / case))
    (tmp / "s.yaml").write_text(SCENARIO.format(first=paths[0], paths=", ".join(paths)))
    run = _cli("run", str(tmp / "s.yaml"), "--out", str(tmp / "out"))
    assert run.returncode == 0, run.stderr
    kv = _cli("kv", "--results", str(tmp / "out"), "--hardware", "cpu", "--json")
    assert kv.returncode == 0, kv.stderr
    return json.loads(kv.stdout)


def test_allocated_kv_equals_the_prediction(kv_rows: list[dict]) -> None:
    assert [r["attention"] for r in kv_rows] == ["sliding", "sliding", "gqa"]
    for r in kv_rows:
        assert r["kv_bytes_per_token_measured"] == r["kv_bytes_per_token_predicted"], r
