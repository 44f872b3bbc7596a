"""The one atomic file writer: every result, manifest, report, figure caption and
calibrated profile infbench writes goes through `write_text_atomic`.

The text is complete in a temporary file in the target's directory, fsynced, then
renamed over the target (the rename is the commit point) and the directory fsynced so
the rename itself survives a crash.  A reader therefore sees the old file or the new
one, never half of either.  Problems the user can fix (a target that is a directory,
a parent that is a file, no permission) are one-line `UserError`s naming the path.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from infbench.core.errors import UserError


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` whole or not at all (see the module docstring)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` whole or not at all: a temporary file beside it, fsync,
    rename over it, fsync of the directory."""
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{target}: is a directory; give a file path to write")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except (NotADirectoryError, FileExistsError) as exc:
        raise UserError(f"{target}: cannot write: a parent of it is a file") from exc
    except PermissionError as exc:
        raise UserError(f"{target}: cannot write: permission denied") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            # mkstemp makes the file 0600; keep the old file's mode, or the usual 0644.
            os.fchmod(fh.fileno(), target.stat().st_mode & 0o777 if target.exists() else 0o644)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, sort_keys: bool = False) -> None:
    """`obj` as indented strict JSON (no NaN), atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=sort_keys, allow_nan=False) + "\n")


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable; not every file system allows it."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # e.g. some network file systems refuse fsync on a directory
    finally:
        os.close(dir_fd)


def read_text(path: str | os.PathLike[str], what: str,
              error: type[UserError] = UserError) -> str:
    """The UTF-8 text of a file every reader of user files starts from (scenarios, results,
    hardware profiles): a missing, unreadable or non-UTF-8 file is one `error` naming the
    file, what it should have been, and where the first bad byte is."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise error(f"{file}: no such {what}") from None
    except OSError as exc:  # a directory, no permission, an I/O error
        raise error(f"{file}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(f"{file}:{line}: not a {what}: not UTF-8 text (byte "
                    f"0x{raw[exc.start]:02x} at offset {exc.start})") from None
