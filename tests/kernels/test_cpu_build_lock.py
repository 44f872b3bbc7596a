"""The C++ kernels' build lock: a build killed mid-way must not hang every later load.

torch's cpp_extension leaves its plain `lock` file behind when the building process dies;
`kernels.cpu_ops._build_lock` serializes builders with an flock (released by the kernel on
death) and, holding it, removes such a stale file.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from kernels.cpu_ops import _build_lock


def test_stale_torch_lock_is_removed(tmp_path: Path) -> None:
    (tmp_path / "lock").write_text("")  # what a killed build leaves
    with _build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_the_flock_excludes_a_second_builder(tmp_path: Path) -> None:
    probe = ("import fcntl, sys\n"
             f"h = open({str(tmp_path / 'build.flock')!r}, 'a')\n"
             "try:\n    fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError:\n    sys.exit(3)\n")
    with _build_lock(tmp_path):
        held = subprocess.run([sys.executable, "-c", probe], check=False)
    free = subprocess.run([sys.executable, "-c", probe], check=False)
    assert (held.returncode, free.returncode) == (3, 0)
    with open(tmp_path / "build.flock", "a") as handle:  # released after the block
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
