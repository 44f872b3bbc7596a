"""Bad MLA shapes on the command line: one line on stderr, exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _predict(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run([sys.executable, "-m", "infbench.cli", "predict", "--model", "tiny-mla",
                           *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("sets", "message"), [
    (["model.attention.kv_lora_rank=128"],
     "error: command line: attention.kv_lora_rank (128) exceeds model.hidden_size (64)"),
    (["model.attention.qk_rope_head_dim=7"],
     "error: command line: attention.qk_rope_head_dim must be even"),
], ids=["kv-lora-rank-too-large", "odd-rope-dim"])
def test_bad_mla_config_is_one_line_exit_2(sets: list[str], message: str) -> None:
    proc = _predict(*sets)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_valid_mla_override_predicts() -> None:
    proc = _predict("model.attention.kv_lora_rank=64")  # equal to the hidden size: allowed
    assert proc.returncode == 0, proc.stderr
    assert "tiny-mla" in proc.stdout
