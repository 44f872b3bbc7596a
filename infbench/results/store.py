"""Self-describing result files: one JSON per scenario point (+ one CSV row each).

A result carries the resolved scenario point, the environment (versions, git sha,
device), the seed, the hardware spec, the measured metrics (median of the
repeats, each repeat and their spread) next to the roofline prediction, and the
per-step records.  Files are written atomically (temp file in the same
directory, fsync, os.replace): a crash never leaves half a result behind, and a
serialization error leaves an existing file untouched.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import importlib.metadata
import io
import json
import math
import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from infbench.core.device import perf_flags
from infbench.core.errors import ResultSchemaError
from infbench.core.io import read_text, write_text_atomic
from infbench.core.version import __version__
from infbench.results.schema import (
    RESULT_KIND,
    SCHEMA_VERSION,
    UPGRADABLE_VERSIONS,
    ValidationError,
    format_errors,
    upgrade,
    validate,
)

_CORE_KEYS = ("schema_version", "kind", "name", "label", "point_index", "scenario", "env",
              "seed", "hardware", "metrics", "prediction", "repeats", "spread", "steps")
__all__ = ["RESULT_KIND", "SCHEMA_VERSION", "build_result", "load_result", "validate_result"]
_PACKAGES = ("torch", "triton", "transformers", "numpy")
_REPO = Path(__file__).resolve().parents[2]  # infbench/results/store.py -> the checkout
# Predicted values copied into a CSV row (prediction key -> column).
_PREDICTED = ("ttft_s", "tpot_s", "output_tokens_per_s")


# ------------------------------------------------------------------ environment
def env_info(device: str) -> dict[str, Any]:
    """Where and with what a result was produced (never imports torch itself)."""
    return {
        "device": device,
        "device_name": device_name(device),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_flags": perf_flags(),  # what CPU kernels and speed depend on
        "packages": {name: _version(name) for name in _PACKAGES},
        "infbench_version": __version__,
        **_git_info(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_name(device: str) -> str:
    """The GPU model (without importing torch when it is not loaded yet) or the CPU model."""
    if device.startswith("cuda"):
        torch = sys.modules.get("torch")  # only if the engine already imported it
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name())
        for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
            for line in Path(info).read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        return "cuda"
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # no /proc: the platform module's (coarser) name below
    return platform.processor() or platform.machine() or "cpu"


def _git_info() -> dict[str, Any]:
    """sha (with a -dirty suffix when tracked files changed) of the checkout infbench runs from."""
    if not (_REPO / ".git").exists():  # an installed wheel: no repository of our own
        return {"git_sha": None, "git_dirty": None}
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=_REPO, capture_output=True, text=True, timeout=10,
                                check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}
    dirty = bool(status.strip())
    return {"git_sha": sha + ("-dirty" if dirty else ""), "git_dirty": dirty}


# ------------------------------------------------------------------ building and reading
def build_result(
    point_dict: dict[str, Any],
    *,
    metrics: dict[str, Any],
    prediction: dict[str, Any],
    steps: list[dict[str, Any]],
    env: dict[str, Any],
    seed: int,
    hardware: dict[str, Any] | None,
    repeats: list[dict[str, Any]],
    spread: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble one result file's content, validated against `schema.RunResult`.

    `extra` adds keys but may not replace core ones.  A writer bug (a renamed metric, a
    string where a number belongs) raises here, before any file is replaced.
    """
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": RESULT_KIND,
        "name": point_dict.get("name"),
        "label": point_dict.get("label", "default"),
        "point_index": point_dict.get("index", 0),
        "scenario": point_dict,
        "env": env,
        "seed": seed,
        "hardware": hardware,
        "metrics": metrics,
        "prediction": prediction,
        "repeats": repeats,
        "spread": spread,
        "steps": steps,
    }
    clash = sorted(set(extra or {}) & set(_CORE_KEYS))
    if clash:
        raise ValueError(f"build_result: extra keys {clash} would replace core result keys")
    result.update(extra or {})
    validate_result(to_jsonable(result), "build_result")
    return result


def validate_result(data: dict[str, Any], where: str) -> None:
    """Raise ResultSchemaError naming `where` and the field path when `data` is not valid."""
    try:
        validate(data)
    except ValidationError as exc:
        raise ResultSchemaError(format_errors(where, exc)) from None


def load_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read, upgrade and validate one result file; every reader of results goes through here.

    Returns the validated dict (upgraded in memory to the current schema_version); a
    damaged file, another kind of file, an unknown version or a field that does not
    match the schema is a ResultSchemaError naming the file (and the field path).
    """
    text = read_text(path, "result file", ResultSchemaError)
    if not text.strip():
        raise ResultSchemaError(f"{path}: empty file, not a result (a run cut short?)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        cut = " (truncated?)" if exc.pos >= len(text.rstrip()) else ""
        raise ResultSchemaError(
            f"{path}: not JSON ({exc.msg} at line {exc.lineno}){cut}") from exc
    except (ValueError, RecursionError) as exc:  # a 5000-digit number, nesting too deep
        raise ResultSchemaError(f"{path}: not a usable JSON document ({exc})") from exc
    if not isinstance(data, dict):
        raise ResultSchemaError(f"{path}: not an infbench result (a JSON {type(data).__name__}, "
                                "expected an object)")
    if data.get("kind") != RESULT_KIND:
        raise ResultSchemaError(f"{path}: not an infbench result (expected kind {RESULT_KIND!r})")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION and version not in UPGRADABLE_VERSIONS:
        raise ResultSchemaError(
            f"{path}: result schema_version {version}, expected {SCHEMA_VERSION}; "
            "re-run the scenario with this infbench to regenerate it")
    data = upgrade(data)
    validate_result(data, str(path))
    return data


def flatten_for_csv(result: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: identity, swept keys, scalar metrics, latency p50/p99, predictions."""
    scenario = result.get("scenario") or {}
    row: dict[str, Any] = {
        "name": result.get("name"),
        "label": result.get("label"),
        "point_index": result.get("point_index"),
        "device": (result.get("env") or {}).get("device", scenario.get("device")),
        "dtype": scenario.get("dtype"),
        "hardware": scenario.get("hardware"),
    }
    for key, value in (scenario.get("swept") or {}).items():
        row[key] = value
    for key, value in (result.get("metrics") or {}).items():
        if isinstance(value, dict):
            if "p50" in value:
                row[f"{key}_p50"] = value.get("p50")
                row[f"{key}_p99"] = value.get("p99")
        elif value is None or isinstance(value, (int, float, str)):
            row[key] = value
    prediction = result.get("prediction") or {}
    for key in _PREDICTED:
        value = prediction.get(key)
        row[f"pred_{key}"] = value if isinstance(value, (int, float)) else None
    accuracy = result.get("accuracy") or {}
    for key in ("perplexity", "perplexity_change", "greedy_agreement"):
        if key in accuracy:
            row[key] = accuracy[key]
    row["git_sha"] = (result.get("env") or {}).get("git_sha")
    return row


# ------------------------------------------------------------------ atomic writes
def to_jsonable(obj: Any) -> Any:
    """numpy scalars/arrays, dataclasses, paths and tuples -> JSON types; NaN/inf -> None."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist"):  # numpy scalar or array (duck-typed: no numpy import here)
        return to_jsonable(obj.tolist())
    raise TypeError(f"cannot store a {type(obj).__name__} in a result file")


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    text = json.dumps(to_jsonable(obj), indent=1, allow_nan=False) + "\n"
    write_text_atomic(path, text)


def write_csv_atomic(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Rows may have different keys: the header is their union, in first-seen order."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    if columns:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_cell(v) for k, v in row.items()})
    write_text_atomic(path, buf.getvalue())


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(to_jsonable(value))
    return value
