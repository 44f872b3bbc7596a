"""The one atomic writer: every result, manifest, report, figure caption, calibrated
profile, checkpoint directory and draft-head file infbench writes goes through
`write_bytes_atomic` (a file) or `atomic_directory` (a directory).

The output is complete in a temporary file (or directory) in the target's directory,
fsynced, then renamed over the target (the rename is the commit point) and the directory
fsynced so the rename itself survives a crash.  A reader therefore sees the old output or
the new one, never half of either.  Problems the user can fix (a target that is a
directory, a parent that is a file, no permission) are one-line `UserError`s naming the
path.

Temporaries are hidden and carry the writer's process id: `.NAME.PID.XXXXXXXX.tmp` (a file
or a directory) and, where a directory cannot be swapped in one step, `.NAME.PID.old` for
the previous one while it is moved aside.  A process killed mid-write (SIGKILL, a power
cut) leaves them behind; `remove_stale_temps` removes those whose process is gone (and
puts a moved-aside previous directory back when the new one never arrived), and every
`check_output_*` (so every `atomic_directory`) runs it, so the next start into the same
target cleans up and nothing half-written is ever loaded.  A plain file write does not scan
its directory (a run directory of 10,000 points would pay for it on every write): long jobs
check their outputs first, and a run directory removes its own (`results/rundir.py`).
Long jobs call `check_output_file` / `check_output_dir` before their work: an unusable path
is refused in a second, not after the hours it would have taken to produce the output.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from infbench.core.errors import UserError

# `.NAME.` + a pid (7 digits on Linux) + `.` + mkstemp's 8 random characters + `.tmp`
TEMP_AFFIX_BYTES = 1 + 1 + 7 + 1 + 8 + 4
_DEFAULT_NAME_MAX = 255
_DEFAULT_PATH_MAX = 4096


def _temp_prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}."


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` whole or not at all (see the module docstring)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` whole or not at all: a temporary file beside it, fsync,
    rename over it, fsync of the directory."""
    target = Path(path)
    try:
        is_dir = target.is_dir()
    except OSError as exc:  # a name too long, a parent that cannot be searched
        raise UserError(f"{_short(target)}: cannot write ({exc.strerror or exc})") from None
    if is_dir:
        raise UserError(f"{target}: is a directory; give a file path to write")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_temp_prefix(target), suffix=".tmp")
    except (NotADirectoryError, FileExistsError) as exc:
        raise UserError(f"{target}: cannot write: a parent of it is a file") from exc
    except PermissionError as exc:
        raise UserError(f"{target}: cannot write: permission denied") from exc
    except OSError as exc:  # a read-only file system, a name too long, no space
        raise UserError(f"{target}: cannot write ({exc.strerror or exc})") from exc
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


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], *, overwrite: bool = False,
                     option: str = "--out") -> Iterator[Path]:
    """A temporary directory beside `path` to fill; when the block ends normally it is
    fsynced and takes the place of `path` (an existing one is replaced only with
    `overwrite`, or when it is empty); when it raises, the temporary is removed and `path`
    is as it was."""
    target = Path(path)
    check_output_dir(target, overwrite, option)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=_temp_prefix(target),
                                    suffix=".tmp"))
    except OSError as exc:
        raise UserError(f"{option} {target}: cannot write ({exc.strerror or exc})") from None
    try:
        yield tmp
        for root, _dirs, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(root, name), "rb") as fh:
                    os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        fsync_dir(tmp)
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE); False where
    the system or the file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _replace_dir(tmp: Path, target: Path) -> None:
    """Put the complete directory `tmp` at `target`.  An existing `target` is swapped with
    it in one step where the system can (then `tmp` holds the old one, removed after), else
    moved aside to `.NAME.PID.old` first; a kill between the two renames leaves the old one
    there, and `remove_stale_temps` puts it back."""
    if not target.exists():
        os.replace(tmp, target)
    elif _exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        old = target.with_name(f".{target.name}.{os.getpid()}.old")
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)


def _is_running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:  # no process has such an id
        return False
    except OSError:  # EPERM: another user's live process
        return True
    return True


def stale_temps(target: str | os.PathLike[str]) -> list[Path]:
    """Temporaries of writes into `target` whose writer is gone: `.NAME[.PID].XXXXXXXX.tmp`
    (a name without a pid comes from an older infbench and is always stale) and
    `.NAME.PID.old`."""
    target = Path(target)
    name = re.escape(target.name)
    temp = re.compile(rf"\.{name}\.(?:(?P<pid>\d+)\.)?[a-z0-9_]{{8}}\.tmp")
    old = re.compile(rf"\.{name}\.(?:(?P<pid>\d+)\.old|old-(?P<legacy>\d+))")
    found = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:  # no directory yet, or unreadable: nothing to clean
        return []
    for entry in entries:
        match = temp.fullmatch(entry.name) or old.fullmatch(entry.name)
        if match is None:
            continue
        pid = match.groupdict().get("pid") or match.groupdict().get("legacy")
        if pid is None or not _is_running(int(pid)):
            found.append(target.parent / entry.name)
    return sorted(found)


def remove_stale_temps(target: str | os.PathLike[str]) -> list[Path]:
    """Remove the stale temporaries of `target` (`stale_temps`); a previous directory a
    killed writer had moved aside is first put back when `target` itself is missing.
    Returns what was removed (or restored); what cannot be removed is left, silently."""
    target = Path(target)
    done = []
    for path in stale_temps(target):
        if not path.name.endswith(".tmp") and not target.exists():
            # the previous directory, moved aside by a writer killed before the new one
            # arrived: it is the output again (left alone if that fails: the only copy)
            with contextlib.suppress(OSError):
                os.replace(path, target)
                done.append(path)
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        done.append(path)
    return done


def _name_max(directory: Path) -> tuple[int, int]:
    try:
        return (os.pathconf(directory, "PC_NAME_MAX"), os.pathconf(directory, "PC_PATH_MAX"))
    except (OSError, ValueError):
        return _DEFAULT_NAME_MAX, _DEFAULT_PATH_MAX


def _existing_ancestor(target: Path, label: str) -> Path:
    """The nearest ancestor of `target` that exists; it must be a directory."""
    parent = target.absolute().parent
    try:
        while not parent.exists():
            parent = parent.parent
    except OSError as exc:  # EACCES on a directory along the way
        raise UserError(f"{label}: cannot reach {parent} ({exc.strerror or exc})") from None
    if not parent.is_dir():
        raise UserError(f"{label}: cannot write: {parent} is a file, not a directory")
    return parent


def _short(path: Path, limit: int = 80) -> str:
    """A path as an error names it: a long one shortened in the middle."""
    text = str(path).replace("\0", "\\0")
    return text if len(text) <= limit else f"{text[:limit - 24]}...{text[-20:]}"


def _check_name(target: Path, label: str) -> Path:
    """A file name the file system takes with room for the temporary's affixes, under a
    nearest existing ancestor that is a directory (returned).  Runs before anything stats
    `target` itself, which a name too long would make fail."""
    if "\0" in str(target):
        raise UserError(f"{label}: a path cannot contain a NUL character")
    if target.name in ("", ".", ".."):
        raise UserError(f"{label}: names no file; give a path such as out/result.json")
    ancestor = _existing_ancestor(target, label)
    name_max, path_max = _name_max(ancestor)
    size = len(os.fsencode(target.name))
    if size + TEMP_AFFIX_BYTES > name_max:
        raise UserError(f"{label}: the file name is {size} bytes; allowed: at most "
                        f"{name_max - TEMP_AFFIX_BYTES} (the file system's {name_max} less "
                        f"{TEMP_AFFIX_BYTES} for the temporary file written first)")
    full = len(os.fsencode(str(target.absolute())))
    if full + TEMP_AFFIX_BYTES > path_max:
        raise UserError(f"{label}: the path is {full} bytes; allowed: at most "
                        f"{path_max - TEMP_AFFIX_BYTES}")
    return ancestor


def _probe(ancestor: Path, target: Path, label: str) -> None:
    """The directory accepts a new entry: a probe file named as the temporary will be,
    removed at once (catches permissions, read-only file systems, a full disk)."""
    try:
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=_temp_prefix(target), suffix=".tmp")
    except OSError as exc:
        why = "permission denied" if isinstance(exc, PermissionError) else exc.strerror or exc
        raise UserError(f"{label}: cannot write in {ancestor} ({why})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | os.PathLike[str], option: str = "--out") -> list[Path]:
    """Refuse, before any work, a file output that cannot be written (a directory, a parent
    that is a file or unwritable, a name too long for the file system); removes the stale
    temporaries of an earlier killed write to it and returns them."""
    target = Path(path)
    label = f"{option} {_short(target)}"
    if target.name in ("", ".", "..") and target.is_dir():  # `--out .`, `--out /`
        raise UserError(f"{label}: is a directory; give a file path to write")
    ancestor = _check_name(target, label)
    if target.is_dir():
        raise UserError(f"{label}: is a directory; give a file path to write")
    _probe(ancestor, target, label)
    return remove_stale_temps(target)


def check_output_dir(path: str | os.PathLike[str], overwrite: bool = False,
                     option: str = "--out") -> list[Path]:
    """Refuse, before any work, a directory output that cannot be written: an existing
    file, a non-empty directory without `overwrite`, or the file checks of
    `check_output_file`.  Stale temporaries of a killed write are removed first (a previous
    directory moved aside is put back), and returned."""
    target = Path(path)
    label = f"{option} {_short(target)}"
    ancestor = _check_name(target, label)
    removed = remove_stale_temps(target)
    if target.exists() and not target.is_dir():
        raise UserError(f"{label}: exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise UserError(f"{label}: directory exists and is not empty; pass --overwrite to "
                        "replace it")
    _probe(ancestor, target, label)
    return removed


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
