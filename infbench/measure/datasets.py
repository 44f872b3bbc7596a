"""Prompts from local files: ShareGPT JSON, JSONL prompts and Azure LLM inference traces.

Pure functions over files and plain data (no torch, no engine), shared by the in-process
benchmark (`workload.generate_requests`) and any client that sends the same requests
elsewhere.  `load_dataset` parses and checks one file; every problem is one line naming
the file, the entry (index or line) and the key, with what is allowed:

- sharegpt: a JSON list of `{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}`.  The first human turn is the prompt; the gpt turn
  right after it is the reference reply, whose token count is the output length.  An entry
  without such a pair is skipped (vLLM's sampler skips them too); other keys of an entry
  (`id`, ...) are ignored, as ShareGPT dumps carry several.
- jsonl: one `{"prompt": "...", "output_len": N}` object per line (`output_len` optional:
  `workload.gen_len` when absent); blank lines are skipped, any other key is an error.
- trace: the Azure LLM inference trace CSV, columns `TIMESTAMP,ContextTokens,GeneratedTokens`
  (timestamps as `2023-11-16 18:15:46.6805900` or as seconds, each column once, rows in
  time order); prompts of ContextTokens tokens, outputs of GeneratedTokens (0 is read as 1:
  a request makes at least one token), arrivals at the timestamps relative to the first
  request drawn.

Every file goes through `dataset_reader` (bounded JSON, LF-only lines, ASCII-only numbers,
strict CSV headers), so a damaged or hostile file is a DamagedFileError, never a traceback.

`sample_indices` draws the entries of one run: a seeded permutation (cycled with a fresh
permutation when more requests than entries are asked for) for prompt files, a seeded
window of consecutive rows for a trace, so the timestamps keep their spacing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from infbench.core.errors import DamagedFileError, UserError
from infbench.measure.dataset_reader import (
    JSONLimitError,
    csv_rows,
    json_problem,
    loads,
    numbered_lines,
    read_text,
    shown,
    strict_float,
    strict_int,
)

PACKAGED_PREFIX = "infbench:"
TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
JSONL_KEYS = ("prompt", "output_len")
_MAX_TOKENS = 2**24  # the scenario's sanity limit on every count
MAX_TIMESTAMP_S = 1e11  # seconds, about the year 5100: every gap stays a finite float


@dataclass(frozen=True)
class DatasetEntry:
    """One request of a dataset: a text prompt (sharegpt, jsonl) or a prompt length (trace)."""

    prompt: str | None = None
    prompt_len: int | None = None  # trace: ContextTokens
    output_len: int | None = None  # jsonl output_len, trace GeneratedTokens; None: not given
    reference: str | None = None  # sharegpt: the gpt reply (its token count is the output)
    timestamp_s: float | None = None  # trace: seconds since the trace's first row
    where: str = ""  # where in its file: "line 7" (jsonl, trace) or "entry 3" (sharegpt)


def resolve_path(path: str, key: str = "workload.dataset.path") -> Path:
    """`infbench:samples/NAME` -> the shipped sample file; anything else as a path (`key`:
    the scenario key its errors name).

    A packaged name is looked up among the shipped samples, never joined onto the package
    directory, so `infbench:samples/../../etc/passwd` is refused before anything is read.
    """
    if path.startswith(PACKAGED_PREFIX):
        name = path[len(PACKAGED_PREFIX):]
        folder, _, base = name.partition("/")
        if folder != "samples" or base not in sample_names():
            shipped = ", ".join(f"{PACKAGED_PREFIX}samples/{n}" for n in sample_names())
            raise UserError(f"{key}: {shown(path)}: no such packaged file; "
                            f"allowed: {shipped}")
        return Path(str(resources.files("infbench").joinpath("data", "samples", base)))
    file = Path(path).expanduser()
    if not file.exists():
        raise UserError(f"{key}: {path}: no such file")
    if not file.is_file():
        raise UserError(f"{key}: {path}: not a file")
    return file


def sample_names() -> list[str]:
    folder = resources.files("infbench").joinpath("data", "samples")
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def load_dataset(kind: str, path: str) -> list[DatasetEntry]:
    """The entries of one dataset file (cached per file, size and modification time)."""
    return read_entries(kind, path, "workload.dataset",
                        {"sharegpt": _read_sharegpt, "jsonl": _read_jsonl, "trace": _read_trace},
                        "entries", {"sharegpt": " (each needs a human turn followed by a gpt "
                                                "turn)"})


def read_entries(kind: str, path: str, key: str, readers: Mapping[str, Callable[[str, str], Any]],
                 noun: str, hints: Mapping[str, str] | None = None) -> list[Any]:
    """What `readers[kind]` parses from the file `path` names (the scenario section `key`
    names it: `key.kind`, `key.path` in errors), cached per file, size and modification
    time; a file that yields nothing is a DamagedFileError ending in `hints[kind]`."""
    file = resolve_path(path, f"{key}.path")
    if kind not in readers:
        raise UserError(f"{key}.kind: unknown value {kind!r}; allowed: {', '.join(readers)}")
    stat = file.stat()
    found = _parsed(readers[kind], str(file), path, kind, stat.st_size, stat.st_mtime_ns)
    if not found:
        raise DamagedFileError(f"{path}: no usable {kind} {noun}{(hints or {}).get(kind, '')}")
    return list(found)


@lru_cache(maxsize=16)
def _parsed(reader: Callable[[str, str], Any], file: str, where: str, kind: str, _size: int,
            _mtime: int) -> tuple[Any, ...]:
    return tuple(reader(read_text(Path(file), where, kind), where))


def fit_entries(entries: list[DatasetEntry], fits: Callable[[DatasetEntry], bool],
                refuse: bool, path: str, context: str) -> tuple[list[DatasetEntry], int]:
    """(entries that fit the model context, how many were dropped): the others are skipped,
    or with `refuse` (workload.dataset.over_context: refuse) the first is a one-line error
    naming it."""
    kept = []
    for entry in entries:
        if fits(entry):
            kept.append(entry)
        elif refuse:
            raise UserError(f"{path}: {entry.where}: prompt + output tokens exceed the model "
                            f"context ({context}); allowed: workload.dataset.over_context: "
                            "drop to skip such entries")
    if not kept:
        raise UserError(f"workload.dataset: {path}: no entry fits the model context "
                        f"({context}: prompt + output tokens); use a model with a longer "
                        "context or shorter prompts")
    return kept, len(entries) - len(kept)


def _damaged(where: str, exc: ValueError) -> DamagedFileError:
    """A JSON problem of a dataset as one line: file, line (when known), field."""
    line = exc.lineno if isinstance(exc, json.JSONDecodeError) else getattr(exc, "line", None)
    return DamagedFileError(f"{where}{f':{line}' if line else ''}: {json_problem(exc)}")


# ------------------------------------------------------------------ sharegpt
def _read_sharegpt(text: str, where: str) -> list[DatasetEntry]:
    try:
        data = loads(text)
    except JSONLimitError as exc:  # the path [3].conversations... reads as entry 3: ...
        exc.path = re.sub(r"^\[(\d+)\]\.?", r"entry \1: ", exc.path).rstrip(": ")
        raise _damaged(where, exc) from None
    except json.JSONDecodeError as exc:
        raise DamagedFileError(f"{where}:{exc.lineno}: not valid JSON ({exc.msg}); "
                               "a sharegpt dataset is a JSON list of conversations") from None
    if not isinstance(data, list):
        raise DamagedFileError(f"{where}: expected a JSON list of {{\"conversations\": [...]}} "
                               f"entries (got {type(data).__name__})")
    entries = []
    for i, item in enumerate(data):
        at = f"{where}: entry {i}"
        if not isinstance(item, dict) or "conversations" not in item:
            raise DamagedFileError(f"{at}: expected an object with a 'conversations' list")
        turns = item["conversations"]
        if not isinstance(turns, list):
            raise DamagedFileError(f"{at}: conversations: must be a list of turns")
        for j, turn in enumerate(turns):
            if (not isinstance(turn, dict) or not isinstance(turn.get("from"), str)
                    or not isinstance(turn.get("value"), str)):
                raise DamagedFileError(f"{at}: conversations[{j}]: must be an object with "
                                       "string 'from' (human, gpt, ...) and 'value'")
        first = next((j for j, t in enumerate(turns) if t["from"] == "human"), None)
        if first is None or first + 1 >= len(turns) or turns[first + 1]["from"] != "gpt":
            continue  # no prompt with a reference reply: skipped, as vLLM's sampler does
        prompt, reply = turns[first]["value"], turns[first + 1]["value"]
        if prompt.strip() and reply.strip():
            entries.append(DatasetEntry(prompt=prompt, reference=reply, where=f"entry {i}"))
    return entries


# ------------------------------------------------------------------ jsonl
def _read_jsonl(text: str, where: str) -> list[DatasetEntry]:
    entries = []
    for number, line in numbered_lines(text, where):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        try:
            item = loads(line)
        except json.JSONDecodeError as exc:
            raise DamagedFileError(f"{at}: not valid JSON ({exc.msg}); each line is "
                                   "{\"prompt\": \"...\", \"output_len\": N}") from None
        except JSONLimitError as exc:
            exc.line = None  # the line is the file's, not the one-line document's
            raise _damaged(at, exc) from None
        if not isinstance(item, dict):
            raise DamagedFileError(f"{at}: expected an object {{\"prompt\": ...}} "
                                   f"(got {type(item).__name__})")
        unknown = [k for k in item if k not in JSONL_KEYS]
        if unknown:
            raise DamagedFileError(f"{at}: unknown key {shown(unknown[0])}; allowed: "
                                   f"{', '.join(JSONL_KEYS)}")
        prompt = item.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DamagedFileError(f"{at}: prompt: required, a non-empty string")
        out = item.get("output_len")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int)
                                or not 0 < out <= _MAX_TOKENS):
            raise DamagedFileError(f"{at}: output_len: must be an integer in "
                                   f"1..{_MAX_TOKENS} (got {shown(out)})")
        entries.append(DatasetEntry(prompt=prompt, output_len=out, where=f"line {number}"))
    return entries


# ------------------------------------------------------------------ trace
_DATE_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})"
                        r"(?:\.([0-9]{1,9}))?(Z|[+-][0-9]{2}:?[0-9]{2})?")


def _timestamp(text: str) -> float:
    """Seconds: a plain ASCII number, or a date-time `2023-11-16 18:15:46.6805900` (up to 9
    fraction digits, an optional Z or +HH:MM offset; without one, UTC, so a daylight-saving
    change inside a trace does not move its arrivals)."""
    value = text.strip()
    number = strict_float(value)
    if number is not None:
        if abs(number) > MAX_TIMESTAMP_S:
            raise ValueError(value)
        return number
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        raise ValueError(value)
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zone = match.group(7), match.group(8)
    offset = timezone.utc
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    # The trace writes 7 fraction digits (.NET ticks); datetime takes at most 6.
    stamp = datetime(year, month, day, hour, minute, second, tzinfo=offset).timestamp()
    if abs(stamp) > MAX_TIMESTAMP_S:
        raise ValueError(value)
    return stamp + (float("0." + fraction) if fraction else 0.0)


def _read_trace(text: str, where: str) -> list[DatasetEntry]:
    rows: list[tuple[float, int, int, int]] = []
    previous: tuple[float, int] | None = None
    for number, row in csv_rows(text, where, TRACE_COLUMNS):
        try:
            stamp = _timestamp(row["TIMESTAMP"])
        except (ValueError, OverflowError):  # OverflowError: a year datetime cannot hold
            raise DamagedFileError(
                f"{where}:{number}: TIMESTAMP: {shown(row['TIMESTAMP'])} is not a date-time "
                f"(2023-11-16 18:15:46.6805900) or seconds (at most {MAX_TIMESTAMP_S:.0e})"
            ) from None
        if previous is not None and stamp < previous[0]:
            raise DamagedFileError(f"{where}:{number}: TIMESTAMP: {shown(row['TIMESTAMP'])} is "
                                   f"before the previous row's (line {previous[1]}); a trace "
                                   "is in time order")
        previous = (stamp, number)
        counts = []
        for column, low in (("ContextTokens", 1), ("GeneratedTokens", 0)):
            value = strict_int(row[column], low, _MAX_TOKENS)
            if value is None:
                raise DamagedFileError(f"{where}:{number}: {column}: must be an integer in "
                                       f"{low}..{_MAX_TOKENS} (got {shown(row[column])})")
            counts.append(value)
        rows.append((stamp, counts[0], max(counts[1], 1), number))
    start = rows[0][0] if rows else 0.0
    return [DatasetEntry(prompt_len=c, output_len=g, timestamp_s=t - start, where=f"line {n}")
            for t, c, g, n in rows]


# ------------------------------------------------------------------ sampling
def sample_indices(num_entries: int, n: int, rng: np.random.Generator,
                   contiguous: bool) -> np.ndarray:
    """`n` entry indices, seeded: a window of consecutive rows (a trace) or a permutation,
    cycled with a fresh permutation per pass when `n` exceeds the entries."""
    if num_entries <= 0:
        raise ValueError("no entries to sample from")
    if contiguous:
        if n > num_entries:
            raise UserError(f"workload.num_requests: {n} requests from a trace of "
                            f"{num_entries} rows; allowed: at most {num_entries}")
        start = int(rng.integers(0, num_entries - n + 1))
        return np.arange(start, start + n)
    passes = [rng.permutation(num_entries) for _ in range(-(-n // num_entries))]
    return np.concatenate(passes)[:n]


def trace_arrivals(entries: list[DatasetEntry], time_scale: float = 1.0) -> np.ndarray:
    """Arrival seconds of trace entries relative to the first of them, gaps scaled."""
    stamps = np.asarray([e.timestamp_s or 0.0 for e in entries], dtype=np.float64)
    if stamps.size == 0:
        return stamps
    return (stamps - stamps[0]) * time_scale


def word_count(text: str) -> int:
    """Whitespace words: the token estimate `request_lengths` uses before a tokenizer is
    loaded (subword tokenizers give at least as many tokens, so a context check on it
    never refuses a prompt that fits)."""
    return max(len(text.split()), 1)

