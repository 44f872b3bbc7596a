"""Test-wide setup: run Triton kernels through the interpreter when CUDA is absent.

Triton reads TRITON_INTERPRET when `@triton.jit` decorates a function, so this
must happen before any kernel module is imported.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

try:
    import torch

    _has_cuda = torch.cuda.is_available()
except ImportError:  # the torch-free parts of the suite still run
    _has_cuda = False

if not _has_cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# `hardware: auto`, a CPU scenario's default, is this machine (infbench/measure/machine.py):
# the suite gets a profile store of its own, never the user's, seeded with a probe that
# carries the `cpu` entry's figures, so no test measures the machine it runs on and every
# result is priced as before (tests/hardware_helpers.py).  Tests of the store set their own.
# Imported after TRITON_INTERPRET is set (it imports infbench).
from hardware_helpers import seed_probe  # noqa: E402

_HOME = tempfile.mkdtemp(prefix="infbench-tests-home-")
os.environ["INFBENCH_HOME"] = _HOME
seed_probe(Path(_HOME))
atexit.register(shutil.rmtree, _HOME, True)
