"""Test-wide setup: run Triton kernels through the interpreter when CUDA is absent.

Triton reads TRITON_INTERPRET when `@triton.jit` decorates a function, so this
must happen before any kernel module is imported.
"""

from __future__ import annotations

import os

try:
    import torch

    _has_cuda = torch.cuda.is_available()
except ImportError:  # the torch-free parts of the suite still run
    _has_cuda = False

if not _has_cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")
