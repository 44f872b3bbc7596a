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
  (timestamps as `2023-11-16 18:15:46.6805900` or as seconds); prompts of ContextTokens
  tokens, outputs of GeneratedTokens (0 is read as 1: a request makes at least one token),
  arrivals at the timestamps relative to the first request drawn.

`sample_indices` draws the entries of one run: a seeded permutation (cycled with a fresh
permutation when more requests than entries are asked for) for prompt files, a seeded
window of consecutive rows for a trace, so the timestamps keep their spacing.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from infbench.core.errors import DamagedFileError, UserError

PACKAGED_PREFIX = "infbench:"
TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
JSONL_KEYS = ("prompt", "output_len")
_MAX_TOKENS = 2**24  # the scenario's sanity limit on every count


@dataclass(frozen=True)
class DatasetEntry:
    """One request of a dataset: a text prompt (sharegpt, jsonl) or a prompt length (trace)."""

    prompt: str | None = None
    prompt_len: int | None = None  # trace: ContextTokens
    output_len: int | None = None  # jsonl output_len, trace GeneratedTokens; None: not given
    reference: str | None = None  # sharegpt: the gpt reply (its token count is the output)
    timestamp_s: float | None = None  # trace: seconds since the trace's first row


def resolve_path(path: str) -> Path:
    """`infbench:samples/NAME` -> the shipped sample file; anything else as a path."""
    if path.startswith(PACKAGED_PREFIX):
        name = path[len(PACKAGED_PREFIX):]
        file = Path(str(resources.files("infbench").joinpath("data", name)))
        if not file.is_file():
            shipped = ", ".join(f"{PACKAGED_PREFIX}samples/{n}" for n in sample_names())
            raise UserError(f"workload.dataset.path: {path}: no such packaged file; "
                            f"allowed: {shipped}")
        return file
    file = Path(path).expanduser()
    if not file.exists():
        raise UserError(f"workload.dataset.path: {path}: no such file")
    if not file.is_file():
        raise UserError(f"workload.dataset.path: {path}: not a file")
    return file


def sample_names() -> list[str]:
    folder = resources.files("infbench").joinpath("data", "samples")
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def load_dataset(kind: str, path: str) -> list[DatasetEntry]:
    """The entries of one dataset file (cached per file, size and modification time)."""
    file = resolve_path(path)
    stat = file.stat()
    return list(_load_cached(kind, str(file), path, stat.st_size, stat.st_mtime_ns))


@lru_cache(maxsize=8)
def _load_cached(kind: str, file: str, shown: str, _size: int,
                 _mtime: int) -> tuple[DatasetEntry, ...]:
    try:
        text = Path(file).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DamagedFileError(f"{shown}: not UTF-8 text (workload.dataset.kind {kind})") from None
    except OSError as exc:
        raise UserError(f"{shown}: cannot be read ({exc.strerror})") from None
    readers = {"sharegpt": _read_sharegpt, "jsonl": _read_jsonl, "trace": _read_trace}
    if kind not in readers:
        raise UserError(f"workload.dataset.kind: unknown value {kind!r}; "
                        f"allowed: {', '.join(readers)}")
    entries = readers[kind](text, shown)
    if not entries:
        raise DamagedFileError(f"{shown}: no usable {kind} entries"
                               + (" (each needs a human turn followed by a gpt turn)"
                                  if kind == "sharegpt" else ""))
    return tuple(entries)


# ------------------------------------------------------------------ sharegpt
def _read_sharegpt(text: str, shown: str) -> list[DatasetEntry]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DamagedFileError(f"{shown}:{exc.lineno}: not valid JSON ({exc.msg}); "
                               "a sharegpt dataset is a JSON list of conversations") from None
    if not isinstance(data, list):
        raise DamagedFileError(f"{shown}: expected a JSON list of {{\"conversations\": [...]}} "
                               f"entries (got {type(data).__name__})")
    entries = []
    for i, item in enumerate(data):
        where = f"{shown}: entry {i}"
        if not isinstance(item, dict) or "conversations" not in item:
            raise DamagedFileError(f"{where}: expected an object with a 'conversations' list")
        turns = item["conversations"]
        if not isinstance(turns, list):
            raise DamagedFileError(f"{where}: conversations: must be a list of turns")
        for j, turn in enumerate(turns):
            if (not isinstance(turn, dict) or not isinstance(turn.get("from"), str)
                    or not isinstance(turn.get("value"), str)):
                raise DamagedFileError(f"{where}: conversations[{j}]: must be an object with "
                                       "string 'from' (human, gpt, ...) and 'value'")
        first = next((j for j, t in enumerate(turns) if t["from"] == "human"), None)
        if first is None or first + 1 >= len(turns) or turns[first + 1]["from"] != "gpt":
            continue  # no prompt with a reference reply: skipped, as vLLM's sampler does
        prompt, reply = turns[first]["value"], turns[first + 1]["value"]
        if prompt.strip() and reply.strip():
            entries.append(DatasetEntry(prompt=prompt, reference=reply))
    return entries


# ------------------------------------------------------------------ jsonl
def _read_jsonl(text: str, shown: str) -> list[DatasetEntry]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{shown}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DamagedFileError(f"{where}: not valid JSON ({exc.msg}); each line is "
                                   "{\"prompt\": \"...\", \"output_len\": N}") from None
        if not isinstance(item, dict):
            raise DamagedFileError(f"{where}: expected an object {{\"prompt\": ...}} "
                                   f"(got {type(item).__name__})")
        unknown = [k for k in item if k not in JSONL_KEYS]
        if unknown:
            raise DamagedFileError(f"{where}: unknown key {unknown[0]!r}; allowed: "
                                   f"{', '.join(JSONL_KEYS)}")
        prompt = item.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DamagedFileError(f"{where}: prompt: required, a non-empty string")
        out = item.get("output_len")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int)
                                or not 0 < out <= _MAX_TOKENS):
            raise DamagedFileError(f"{where}: output_len: must be an integer in "
                                   f"1..{_MAX_TOKENS} (got {out!r})")
        entries.append(DatasetEntry(prompt=prompt, output_len=out))
    return entries


# ------------------------------------------------------------------ trace
_FRACTION = re.compile(r"^(.*?\d{2}:\d{2}:\d{2})\.(\d+)$")


def _timestamp(text: str) -> float:
    """Seconds: a plain number, or an ISO-like date-time with up to 9 fraction digits."""
    value = text.strip()
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if math.isfinite(number):
            return number
        raise ValueError(value)
    match = _FRACTION.match(value)
    fraction = 0.0
    if match:  # the trace writes 7 digits (.NET ticks); datetime takes at most 6
        value, fraction = match.group(1), float("0." + match.group(2))
    return datetime.fromisoformat(value).timestamp() + fraction


def _read_trace(text: str, shown: str) -> list[DatasetEntry]:
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in reader.fieldnames or []]
    unknown = [h for h in header if h not in TRACE_COLUMNS]
    if unknown:
        raise DamagedFileError(f"{shown}: unknown column {unknown[0]!r}; allowed: "
                               f"{', '.join(TRACE_COLUMNS)}")
    missing = [c for c in TRACE_COLUMNS if c not in header]
    if missing:
        raise DamagedFileError(f"{shown}: column {missing[0]!r} is missing; a trace has the "
                               f"columns {', '.join(TRACE_COLUMNS)}")
    rows: list[tuple[float, int, int]] = []
    for number, raw in enumerate(reader, start=2):  # line 1 is the header
        row = {(k or "").strip(): v for k, v in raw.items()}
        if None in raw or any(row.get(c) is None for c in TRACE_COLUMNS):
            raise DamagedFileError(f"{shown}:{number}: expected {len(TRACE_COLUMNS)} values "
                                   f"({', '.join(TRACE_COLUMNS)})")
        try:
            stamp = _timestamp(row["TIMESTAMP"])
        except ValueError:
            raise DamagedFileError(f"{shown}:{number}: TIMESTAMP: {row['TIMESTAMP']!r} is not a "
                                   "date-time (2023-11-16 18:15:46.6805900) or seconds") from None
        counts = []
        for column, low in (("ContextTokens", 1), ("GeneratedTokens", 0)):
            value = row[column].strip()
            if not value.isdigit() or not low <= int(value) <= _MAX_TOKENS:
                raise DamagedFileError(f"{shown}:{number}: {column}: must be an integer in "
                                       f"{low}..{_MAX_TOKENS} (got {value!r})")
            counts.append(int(value))
        rows.append((stamp, counts[0], max(counts[1], 1)))
    rows.sort(key=lambda r: r[0])  # a trace is in time order; a shuffled file is read as one
    start = rows[0][0] if rows else 0.0
    return [DatasetEntry(prompt_len=c, output_len=g, timestamp_s=t - start) for t, c, g in rows]


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

