"""A run owns its output directory: a manifest, a lock and safe file names.

`infbench run` claims its `--out` directory with `RunDir.claim`:

- `.lock` is held with `fcntl.flock` for the run's lifetime (the kernel drops it
  when the process dies, even by SIGKILL), so a second run into the same directory
  is refused instead of silently overwriting the first one's points;
- `manifest.json` lists every point (index, label, file, status pending | running |
  done | failed, start and finish times) with a hash of the normalized scenario, and
  is rewritten atomically after every state change, so a killed run can be resumed
  (`--resume`: only the points not done) and readers know which files are complete;
- a directory that already holds a run is refused unless `--resume` or
  `--overwrite` (which removes only the files infbench wrote there).

`infbench search` decides each point from the last: it claims the directory with its first
point, lists each later one as it is chosen (`RunDir.add_point`) and writes its summary,
`search.json`, beside the manifest.

Readers (`report`, `compare`, `plots`, `roofline`) expand a directory through
`result_files`: the manifest's done points, or every `*.json` of an older run
without a manifest.  This module never imports torch.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from infbench.core.errors import DamagedFileError, ResultSchemaError, UserError
from infbench.results import store as results_mod
from infbench.results.store import RESULT_KIND, load_result, to_jsonable, write_json_atomic
from infbench.scenario.point import ScenarioPoint

MANIFEST_NAME = "manifest.json"
SEARCH_NAME = "search.json"  # `infbench search`'s summary, beside the manifest
LOCK_NAME = ".lock"
MANIFEST_KIND = "infbench.run_manifest"
MANIFEST_VERSION = 1
MAX_NAME_LEN = 64
STATUSES = ("pending", "running", "done", "failed")


# ------------------------------------------------------------------ names and paths
def safe_name(name: str) -> str:
    """A file-name stem from a scenario name: [A-Za-z0-9._-], no leading dot, bounded."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    stem = re.sub(r"\.{2,}", ".", stem).lstrip("._-")[:MAX_NAME_LEN].rstrip(".")
    return stem or "run"


def point_file_name(name: str, index: int) -> str:
    return f"{safe_name(name)}_{index:03d}.json"


def csv_file_name(name: str) -> str:
    return f"{safe_name(name)}.csv"


def default_out_dir(name: str, stamp: str) -> Path:
    return Path("results") / "runs" / f"{safe_name(name)}-{stamp}"


def inside(directory: Path, file_name: str) -> Path:
    """`directory / file_name`, refused unless it resolves inside `directory`."""
    path = directory / file_name
    root = directory.resolve()
    if path.resolve().parent != root or Path(file_name).name != file_name:
        raise UserError(f"{directory}: file name {file_name!r} would be written outside the "
                        "output directory")
    return path


def is_writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def check_writable(out_dir: Path) -> None:
    """One-line error unless `out_dir` is (or can be created as) a writable directory."""
    if out_dir.exists():
        if not out_dir.is_dir():
            raise UserError(f"{out_dir}: --out is a file, not a directory; give a directory")
        if not is_writable(out_dir):
            raise UserError(f"{out_dir}: --out directory is not writable (permission denied)")
        return
    parent = out_dir.absolute().parent
    while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{out_dir}: --out lies under {parent}, which is a file, not a directory")
    if not is_writable(parent):
        raise UserError(f"{out_dir}: cannot create --out: {parent} is not writable "
                        "(permission denied)")


# ------------------------------------------------------------------ the manifest
@dataclass
class PointEntry:
    """One point of a run as the manifest records it."""

    index: int
    label: str
    file: str
    status: str = "pending"  # pending | running | done | failed
    started: str | None = None
    finished: str | None = None
    error: str | None = None


@dataclass
class Manifest:
    """What a run directory holds and how far the run got (manifest.json)."""

    name: str
    scenario_path: str
    scenario_hash: str
    scenario_points: list[dict[str, Any]]  # normalized point dicts (to name a difference)
    device: str | None  # the --device override, part of the hash
    csv: str
    points: list[PointEntry]
    status: str = "running"  # running | done | failed | interrupted
    started: str = ""
    finished: str | None = None
    pid: int = 0
    host: str = ""
    infbench_version: str = ""
    git_sha: str | None = None
    resumed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["scenario_points"] = data.pop("scenario_points")  # the long part goes last
        return {"kind": MANIFEST_KIND, "schema_version": MANIFEST_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        kwargs["points"] = [PointEntry(**p) for p in data.get("points") or []]
        manifest = cls(**kwargs)
        for p in manifest.points:
            if not (isinstance(p.file, str) and isinstance(p.index, int)
                    and p.status in STATUSES):
                raise ValueError(f"point entry {dataclasses.asdict(p)} is malformed")
        if not isinstance(manifest.scenario_points, list):
            raise ValueError("scenario_points is not a list")
        return manifest

    def done(self) -> list[PointEntry]:
        return [p for p in self.points if p.status == "done"]


def read_manifest(directory: Path) -> Manifest | None:
    """The directory's manifest, None when it has none; a damaged one is a one-line error."""
    path = directory / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        text = path.read_bytes()  # json.loads decodes it, and names bad UTF-8 as a ValueError
    except OSError as exc:
        raise ResultSchemaError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # not JSON, a huge number, nesting too deep
        raise DamagedFileError(f"{path}: damaged run manifest, not JSON ({exc}); remove it or "
                               "use --overwrite") from None
    try:
        if not isinstance(data, dict) or data.get("kind") != MANIFEST_KIND:
            raise ValueError(f"expected kind {MANIFEST_KIND!r}")
        if data.get("schema_version") != MANIFEST_VERSION:
            raise ValueError(f"schema_version {data.get('schema_version')}, expected "
                             f"{MANIFEST_VERSION}")
        return Manifest.from_dict(data)
    except (OSError, ValueError, TypeError) as exc:
        raise ResultSchemaError(f"{path}: not a usable infbench run manifest ({exc})") from None


def result_files(directory: Path) -> list[Path]:
    """The result files of a run directory: its manifest's done points, or (an older run
    without a manifest) every *.json inside, sorted."""
    manifest = read_manifest(directory)
    if manifest is None:
        found = sorted(directory.glob("*.json"))
        if not found:
            raise ResultSchemaError(f"{directory}: directory holds no result .json files")
        return found
    done = manifest.done()
    if not done:
        raise ResultSchemaError(f"{directory}: the run in this directory has no finished point "
                                f"({len(manifest.points)} listed in {MANIFEST_NAME}, none done)")
    return [inside(directory, p.file) for p in done]


def normalized_points(points: list[ScenarioPoint]) -> list[dict[str, Any]]:
    """The points as JSON data (as a result file stores them), without what does not change
    a measurement: the scenario file's path and the gate block (judged after the run)."""
    out = []
    for p in points:
        d = json.loads(json.dumps(to_jsonable(p.to_dict()), sort_keys=True))
        d.pop("source", None)
        d.pop("gate", None)
        out.append(d)
    return out


def scenario_hash(points: list[dict[str, Any]], device: str | None) -> str:
    text = json.dumps({"points": points, "device": device}, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _first_difference(a: Any, b: Any, path: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return sub, a.get(key, "<unset>"), b.get(key, "<unset>")
            found = _first_difference(a[key], b[key], sub)
            if found:
                return found
        return None
    return None if a == b else (path, a, b)


def describe_difference(old: Manifest, points: list[dict[str, Any]], device: str | None) -> str:
    """What differs between the run recorded in `old` and the scenario about to run."""
    if old.device != device:
        return f"--device (run: {old.device}, now: {device})"
    if len(old.scenario_points) != len(points):
        return f"number of sweep points (run: {len(old.scenario_points)}, now: {len(points)})"
    for i, (a, b) in enumerate(zip(old.scenario_points, points, strict=True)):
        found = _first_difference(a, b, "")
        if found:
            key, was, now = found
            return f"point {i}: {key} (run: {was!r}, now: {now!r})"
    return "the scenario hash"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _is_result_json(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("kind") == RESULT_KIND


# ------------------------------------------------------------------ the lock
def _lock(out_dir: Path) -> int:
    """An exclusive flock on out_dir/.lock (held until the fd closes or the process dies)."""
    path = out_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"{out_dir}: cannot create {LOCK_NAME} ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise UserError(f"{out_dir}: another infbench run (pid {holder}) is writing this "
                            "directory") from None
        raise UserError(f"{out_dir}: cannot lock {LOCK_NAME} ({exc.strerror})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


# ------------------------------------------------------------------ the run directory
class RunDir:
    """An output directory claimed by one run: lock held, manifest kept current."""

    def __init__(self, path: Path, manifest: Manifest, lock_fd: int) -> None:
        self.path = path
        self.manifest = manifest
        self._lock_fd: int | None = lock_fd

    @classmethod
    def claim(cls, out_dir: Path, points: list[ScenarioPoint], *, scenario_path: str,
              device: str | None, resume: bool = False, overwrite: bool = False) -> RunDir:
        """Lock `out_dir` and start (or, with `resume`, continue) a run of `points` there."""
        if resume and overwrite:
            raise UserError("--resume and --overwrite are mutually exclusive; give one")
        check_writable(out_dir)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{out_dir}: cannot create --out ({exc.strerror})") from None
        fd = _lock(out_dir)
        try:
            manifest = cls._plan(out_dir, points, scenario_path, device, resume, overwrite)
            run = cls(out_dir, manifest, fd)
            run.save()
            run.remove_temp_files()
        except BaseException:
            os.close(fd)
            raise
        return run

    @staticmethod
    def _plan(out_dir: Path, points: list[ScenarioPoint], scenario_path: str, device: str | None,
              resume: bool, overwrite: bool) -> Manifest:
        normalized = normalized_points(points)
        digest = scenario_hash(normalized, device)
        try:
            old = read_manifest(out_dir)
        except UserError:
            if not overwrite:
                raise
            old = None  # a damaged manifest: --overwrite removes it below
        old_results = [] if old else [p for p in sorted(out_dir.glob("*.json"))
                                      if _is_result_json(p)]
        if old is not None and resume:
            if old.scenario_hash != digest:
                raise UserError(
                    f"{out_dir}: --resume: the scenario differs from the run in this directory: "
                    f"{describe_difference(old, normalized, device)}; resume with the same "
                    "scenario and --set values, or use --overwrite")
            for entry in old.points:  # a done point whose file is gone or damaged runs again
                if entry.status != "done" or not _is_result_json(inside(out_dir, entry.file)):
                    entry.status, entry.started, entry.finished, entry.error = (
                        "pending", None, None, None)
            old.status, old.finished, old.pid = "running", None, os.getpid()
            old.scenario_path = scenario_path
            old.resumed.append(_now())
            return old
        if old is None and old_results and resume:
            raise UserError(f"{out_dir}: --resume: the directory holds result files but no "
                            f"{MANIFEST_NAME} (a run of an older infbench); use --overwrite")
        if (old is not None or old_results) and not overwrite:
            # We hold the lock, so a manifest still "running" belongs to a process that died.
            ended = "stopped before the end" if old and old.status == "running" else (
                old.status if old else "")
            what = (f"a run of {old.name!r} ({len(old.done())}/{len(old.points)} points done, "
                    f"{ended})" if old is not None
                    else f"{len(old_results)} result file(s)")
            raise UserError(f"{out_dir}: holds {what}; use --resume to finish it, --overwrite "
                            "to replace it, or another --out")
        if overwrite:
            clear_run_files(out_dir, old, old_results)
        name = points[0].name
        env = results_mod.env_info(device or "cpu")
        return Manifest(
            name=name, scenario_path=scenario_path, scenario_hash=digest,
            scenario_points=normalized, device=device, csv=csv_file_name(name),
            points=[PointEntry(p.index, p.label, point_file_name(p.name, p.index))
                    for p in points],
            started=_now(), pid=os.getpid(), host=socket.gethostname(),
            infbench_version=str(env.get("infbench_version")), git_sha=env.get("git_sha"))

    # -------------------------------------------------------------- state changes
    def save(self) -> None:
        write_json_atomic(self.path / MANIFEST_NAME, self.manifest.to_dict())

    def entry(self, index: int) -> PointEntry:
        return next(p for p in self.manifest.points if p.index == index)

    def file_for(self, index: int) -> Path:
        return inside(self.path, self.entry(index).file)

    @property
    def csv_path(self) -> Path:
        return inside(self.path, self.manifest.csv)

    def remove_temp_files(self) -> None:
        """Temp files of atomic writes a killed run left (we hold the lock: none is live)."""
        names = [MANIFEST_NAME, SEARCH_NAME, self.manifest.csv,
                 *(p.file for p in self.manifest.points)]
        for tmp in self.path.glob(".*.tmp"):
            if any(tmp.name.startswith(f".{n}.") for n in names):
                tmp.unlink(missing_ok=True)

    def add_point(self, point: ScenarioPoint) -> None:
        """List a point decided while the run goes (`infbench search` picks each value from
        the last): pending, with its file name, and in the scenario hash."""
        if any(p.index == point.index for p in self.manifest.points):
            raise ValueError(f"point {point.index} is already in the manifest")
        self.manifest.points.append(
            PointEntry(point.index, point.label, point_file_name(point.name, point.index)))
        self.manifest.scenario_points.extend(normalized_points([point]))
        self.manifest.scenario_hash = scenario_hash(self.manifest.scenario_points,
                                                    self.manifest.device)
        self.save()

    def pending(self) -> list[int]:
        return [p.index for p in self.manifest.points if p.status != "done"]

    def done_results(self) -> list[dict[str, Any]]:
        """Results of points already done (a resumed run), in point order."""
        out = []
        for p in self.manifest.done():
            path = self.file_for(p.index)
            result = load_result(path)
            result["_path"] = str(path)
            out.append(result)
        return out

    def mark(self, index: int, status: str, error: str | None = None) -> None:
        assert status in STATUSES, status
        entry = self.entry(index)
        entry.status, entry.error = status, error
        if status == "running":
            entry.started, entry.finished = _now(), None
        elif status in ("done", "failed"):
            entry.finished = _now()
        else:
            entry.started = entry.finished = None
        self.save()

    def close(self, status: str) -> None:
        """Record how the run ended and release the lock (the .lock file stays: see _lock)."""
        if self._lock_fd is None:
            return
        try:
            self.manifest.status, self.manifest.finished = status, _now()
            self.save()
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None


def clear_run_files(out_dir: Path, manifest: Manifest | None, results: list[Path]) -> None:
    """Remove what infbench wrote in `out_dir` (manifest, search summary, point files, CSV,
    temp files)."""
    names = {MANIFEST_NAME, SEARCH_NAME}
    if manifest is not None:
        names.update(p.file for p in manifest.points)
        names.add(manifest.csv)
    for path in results:
        names.add(path.name)
        try:
            stored = json.loads(path.read_text()).get("name")
        except (OSError, ValueError, RecursionError, AttributeError):
            stored = None
        if isinstance(stored, str):
            names.add(csv_file_name(stored))
    # Temp files of an atomic write that was killed: .<name>.<random>.tmp
    names.update(p.name for p in out_dir.glob(".*.tmp")
                 if any(p.name.startswith(f".{n}.") for n in names))
    for name in sorted(names):
        inside(out_dir, name).unlink(missing_ok=True)
