"""Outputs written whole or not at all, and checked before the work (infbench/core/io.py).

A kill is simulated by raising mid-write (KeyboardInterrupt: a BaseException, as SIGINT
is): the previous output must be intact and no temporary left.  A SIGKILL cannot clean
up, so the temporaries it leaves are written here by hand (named as the writer names them,
with a process id that no process has) and must be gone after the next start.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infbench.core import io
from infbench.core.errors import UserError

DEAD_PID = 999_999_999  # above any pid_max: no such process


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _interrupt(*_args: object, **_kw: object) -> None:
    raise KeyboardInterrupt


def test_a_write_interrupted_midway_keeps_the_old_file(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "result.json"
    io.write_text_atomic(target, "old\n")
    monkeypatch.setattr(io.os, "fsync", _interrupt)  # after the bytes, before the rename
    with pytest.raises(KeyboardInterrupt):
        io.write_text_atomic(target, "new\n" * 1000)
    assert target.read_text() == "old\n"
    assert _entries(tmp_path) == ["result.json"]  # no temporary left


def test_a_directory_interrupted_midway_keeps_the_old_one(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with io.atomic_directory(target) as tmp:
        (tmp / "model.safetensors").write_text("old")
    with pytest.raises(KeyboardInterrupt), io.atomic_directory(target, overwrite=True) as tmp:
        (tmp / "model.safetensors").write_text("half")
        raise KeyboardInterrupt
    assert (target / "model.safetensors").read_text() == "old"
    assert _entries(tmp_path) == ["ckpt"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "move-aside"])
def test_a_directory_replaced_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    exchange: bool) -> None:
    if not exchange:  # systems without RENAME_EXCHANGE: old moved aside, new renamed in
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "stale.bin").write_text("x")
    with io.atomic_directory(target, overwrite=True) as tmp:
        (tmp / "config.json").write_text("{}")
    assert _entries(target) == ["config.json"]
    assert _entries(tmp_path) == ["ckpt"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o755)


def test_a_non_empty_directory_needs_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(UserError, match="not empty; pass --overwrite"), \
            io.atomic_directory(target):
        raise AssertionError("the block must not run")
    assert _entries(target) == ["keep"]


def test_stale_temporaries_of_a_killed_write_are_removed_by_the_next_start(tmp_path: Path) -> None:
    target = tmp_path / "heads.safetensors"
    target.write_text("previous")
    killed = tmp_path / f".heads.safetensors.{DEAD_PID}.abcd1234.tmp"
    legacy = tmp_path / ".heads.safetensors.k3j4h5g6.tmp"  # an older infbench's: no pid
    live = tmp_path / f".heads.safetensors.{os.getpid()}.zzzz9999.tmp"  # a writer running now
    other = tmp_path / f".other.json.{DEAD_PID}.abcd1234.tmp"  # another target's
    for path in (killed, legacy, live, other):
        path.write_text("half a file")
    assert io.stale_temps(target) == sorted([killed, legacy])
    assert io.check_output_file(target) == sorted([killed, legacy])
    io.write_text_atomic(target, "new")
    assert target.read_text() == "new"
    assert _entries(tmp_path) == sorted([target.name, live.name, other.name])


def test_a_stale_temporary_directory_is_removed_before_the_work(tmp_path: Path) -> None:
    target = tmp_path / "pruned"
    stale = tmp_path / f".pruned.{DEAD_PID}.q1w2e3r4.tmp"  # a whole loadable model, killed
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    (stale / "model.safetensors").write_bytes(b"\0" * 64)
    assert io.check_output_dir(target) == [stale]
    assert _entries(tmp_path) == []


def test_a_previous_directory_moved_aside_is_put_back(tmp_path: Path) -> None:
    """Killed between the two renames of the move-aside path: the previous output is at
    .NAME.PID.old and NAME is missing; the next start makes it the output again."""
    target = tmp_path / "pruned"
    aside = tmp_path / f".pruned.{DEAD_PID}.old"
    aside.mkdir()
    (aside / "config.json").write_text("previous")
    new = tmp_path / f".pruned.{DEAD_PID}.a1b2c3d4.tmp"
    new.mkdir()
    io.check_output_dir(target, overwrite=True)
    assert (target / "config.json").read_text() == "previous"
    assert _entries(tmp_path) == ["pruned"]


@pytest.mark.parametrize("case", ["directory", "parent-file", "too-long", "nul", "no-name"])
def test_unusable_file_outputs_are_refused(tmp_path: Path, case: str) -> None:
    (tmp_path / "file").write_text("x")
    path, says = {
        "directory": (tmp_path, "is a directory"),
        "parent-file": (tmp_path / "file" / "out.json", "is a file, not a directory"),
        "too-long": (tmp_path / ("n" * 300), "the file name is 300 bytes; allowed: at most"),
        "nul": (tmp_path / "a\0b", "NUL"),
        "no-name": (Path("/"), "is a directory"),
    }[case]
    with pytest.raises(UserError, match=says) as exc:
        io.check_output_file(path, "--out")
    assert str(exc.value).startswith("--out ") and "\n" not in str(exc.value)
    assert len(str(exc.value)) < 300  # a 300-character name is shortened, not echoed whole


def test_a_missing_parent_is_fine_and_is_not_created_by_the_check(tmp_path: Path) -> None:
    io.check_output_file(tmp_path / "a" / "b" / "out.json")
    assert _entries(tmp_path) == []  # the probe file is gone, nothing created


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_an_unwritable_parent_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(UserError, match="cannot write in .*permission denied"):
            io.check_output_file(locked / "out.json")
        with pytest.raises(UserError, match="cannot write in .*permission denied"):
            io.check_output_dir(locked / "ckpt")
    finally:
        locked.chmod(0o700)


def test_an_existing_file_where_a_directory_goes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("x")
    with pytest.raises(UserError, match="exists and is not a directory"):
        io.check_output_dir(tmp_path / "ckpt")


@pytest.mark.parametrize("error, says", [
    (PermissionError(13, "Permission denied"), "permission denied"),
    (OSError(30, "Read-only file system"), "Read-only file system"),
    (OSError(28, "No space left on device"), "No space left on device"),
], ids=["permission", "read-only", "full"])
def test_a_directory_that_takes_no_new_file_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       error: OSError, says: str) -> None:
    """As the probe sees it (the test may run as root, whom permissions do not stop)."""
    def refuse(*_args: object, **_kw: object) -> None:
        raise error

    monkeypatch.setattr(io.tempfile, "mkstemp", refuse)
    with pytest.raises(UserError, match=f"--out .*: cannot write in {tmp_path} \\({says}\\)"):
        io.check_output_file(tmp_path / "out.json")
