"""The Triton kernels compile for sm_90 (front end through ptxas) even without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_kernels_compile_for_h100():
    pytest.importorskip("triton.backends.nvidia.compiler")
    script = Path(__file__).with_name("compile_sm90.py")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, str(script), "bf16", "fp16"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 2 * 29 and "FAIL" not in proc.stdout, proc.stdout
