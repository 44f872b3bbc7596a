"""Every KV scheme end to end from a scenario file: `infbench run` then `infbench kv --results`.

The engine's allocated KV bytes per token and state bytes per sequence must equal the
analytic model's exactly, and the measured peak KV must equal the predicted KV at the
run's context (block-aligned lengths, so no rounding) for every scheme without global
layers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infbench.plots.analytic import kv_measured_figure

SCENARIO = """
name: kv_all
device: cpu
dtype: float32
hardware: cpu
model:
  preset: tiny
  overrides: {num_layers: 4, num_heads: 4, num_kv_heads: 4, max_seq_len: 256}
workload: {kind: static, batch_size: 2, prompt_len: 12, gen_len: 4, seed: 0}
engine: {block_size: 4, max_num_seqs: 4, max_num_batched_tokens: 64}
measure: {warmup: 0, repeats: 1}
sweep:
  model.attention:
    - {kind: mha}
    - {kind: gqa, kv_heads: 2}
    - {kind: mqa}
    - {kind: mla, kv_lora_rank: 16, qk_rope_head_dim: 8, qk_nope_head_dim: 8, v_head_dim: 8}
    - {kind: cla, cla_group: 2}
    - {kind: sliding, window: 8}
    - {kind: linear, feature_map: elu}
    - {kind: ssm, d_state: 4}
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infbench.cli", *args], capture_output=True,
                          text=True, check=False)


@pytest.fixture(scope="module")
def kv_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("kv")
    (tmp / "kv_all.yaml").write_text(SCENARIO)
    run = _cli("run", str(tmp / "kv_all.yaml"), "--out", str(tmp / "out"))
    assert run.returncode == 0, run.stderr
    kv = _cli("kv", "--results", str(tmp / "out"), "--hardware", "cpu", "--json")
    assert kv.returncode == 0, kv.stderr
    return json.loads(kv.stdout)


def test_every_scheme_allocates_exactly_the_predicted_bytes(kv_rows: list[dict]) -> None:
    kinds = [r["attention"] for r in kv_rows]
    assert kinds == ["mha", "gqa", "mqa", "mla", "cla", "sliding", "linear", "ssm"]
    for r in kv_rows:
        assert r["kv_bytes_per_token_measured"] == r["kv_bytes_per_token_predicted"], r
        assert r["state_bytes_per_seq_measured"] == r["state_bytes_per_seq_predicted"], r
    by_kind = {r["attention"]: r for r in kv_rows}
    assert by_kind["linear"]["kv_bytes_per_token_measured"] == 0
    assert by_kind["ssm"]["state_bytes_per_seq_measured"] > 0
    assert by_kind["mla"]["kv_bytes_per_token_measured"] < by_kind["mqa"][
        "kv_bytes_per_token_measured"] * 4


def test_measured_peak_kv_equals_the_prediction(kv_rows: list[dict]) -> None:
    # 12 + 4 = 16 tokens = 4 whole blocks per sequence: no rounding anywhere.
    for r in kv_rows:
        if r["attention"] == "sliding":
            # the window (8) frees blocks behind it: bounded below the full context
            assert r["peak_kv_bytes_measured"] < 2 * 16 * r["kv_bytes_per_token_measured"]
            continue
        assert r["peak_kv_bytes_measured"] == r["kv_cache_bytes_predicted"], r


def test_measured_kv_plot_coordinates(kv_rows: list[dict], tmp_path: Path) -> None:
    drawn = kv_measured_figure(kv_rows, tmp_path / "kv.png")
    assert (tmp_path / "kv.png").stat().st_size > 0
    assert drawn["schemes"][0] == "mha" and len(drawn["measured_mb"]) == len(kv_rows)
    for r, mb in zip(kv_rows, drawn["measured_mb"], strict=True):
        expected = (r["peak_kv_bytes_measured"] + r["state_bytes_per_seq_measured"]
                    * r["batch"]) / 1e6
        assert mb == pytest.approx(expected)
