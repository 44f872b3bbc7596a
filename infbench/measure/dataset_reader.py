"""The one bounded path every dataset file (and every streamed JSON event) is read through.

A dataset file is the user's, but it may be a download nobody has looked at, so nothing in
it may reach a traceback: JSON is parsed with limits on nesting depth, integer digits and
string length and without NaN / Infinity; lines are split on LF alone (a U+2028 or U+2029
inside a JSONL string is text, not a line end, which `str.splitlines` gets wrong); numbers
are ASCII digits only (a superscript two passes `str.isdigit()` and fails `int()`); CSV
headers must name each column once.  Every problem is a `DamagedFileError` of one line
naming the file, the line (or entry) and the field; values from the file are shown
`repr`-quoted and cut short, never whole.

The streaming client (`infbench.client`) parses each SSE event with the same `loads`, so a
hostile server's 5000-digit integer or 100k-deep array is a failed request, not a crash.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from infbench.core.errors import DamagedFileError, UserError

MAX_JSON_DEPTH = 64  # a ShareGPT file nests 4 deep; json's own parser fails near 1000
MAX_INT_DIGITS = 19  # every count and id fits in an int64
MAX_STRING_CHARS = 16 * 2**20  # one prompt or reply (far beyond any model context)
MAX_LINE_CHARS = 32 * 2**20  # one JSONL line: a prompt plus its escapes
MAX_CSV_FIELD_CHARS = 64  # a trace's fields are counts and date-times
MAX_SHOWN_CHARS = 40  # a value quoted in an error message, cut to this

_SURROGATE = re.compile("[\ud800-\udfff]")
# Tokens of a JSON text, for locating a limit violation: strings whole (so brackets and
# digits inside them are skipped), brackets, and numbers.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]|-?[0-9][0-9.eE+-]*|NaN|-?Infinity',
                         re.DOTALL)
_ASCII_INT = re.compile(r"[0-9]+")
_ASCII_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class JSONLimitError(ValueError):
    """A JSON text within the grammar but past one of the limits (or NaN / Infinity).

    `line` is the 1-based line of the offending value when it could be located, `path`
    the field inside the document (`[3].conversations[0].value`) when it is known.
    """

    def __init__(self, message: str, line: int | None = None, path: str = "") -> None:
        super().__init__(message)
        self.line = line
        self.path = path


def shown(value: Any) -> str:
    """A value from a file as an error quotes it: repr, cut to MAX_SHOWN_CHARS."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


# ------------------------------------------------------------------ JSON
def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise JSONLimitError(f"an integer of {len(text.lstrip('-'))} digits (at most "
                             f"{MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONLimitError(f"the number {text[:MAX_SHOWN_CHARS]} is beyond a float's range")
    return value


def _parse_constant(text: str) -> Any:
    raise JSONLimitError(f"{text} is not JSON (allowed numbers are finite)")


def loads(text: str, *, max_depth: int = MAX_JSON_DEPTH,
          max_string_chars: int = MAX_STRING_CHARS) -> Any:
    """`json.loads` within limits: nesting depth, integer digits, string length, finite
    numbers, no lone surrogates in strings.  Raises json.JSONDecodeError for a text outside
    the grammar and JSONLimitError for one past a limit; nothing else."""
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                           parse_constant=_parse_constant)
    except JSONLimitError as exc:
        exc.line = _locate(text, max_depth)
        raise
    except RecursionError:
        raise JSONLimitError(f"nested deeper than {max_depth} levels",
                             _locate(text, max_depth)) from None
    try:
        _check_tree(value, max_depth, max_string_chars)
    except JSONLimitError as exc:
        if exc.args[0].startswith("nested"):
            exc.line = _locate(text, max_depth)
        raise
    return value


def _check_tree(value: Any, max_depth: int, max_string_chars: int) -> None:
    """Depth, string sizes and lone surrogates of a parsed value, without recursion."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            _check_string(item, path, max_string_chars)
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth > max_depth:
            raise JSONLimitError(f"nested deeper than {max_depth} levels")
        children: list[tuple[Any, int, str]] = []
        if isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}.{key[:MAX_SHOWN_CHARS]}" if path else key[:MAX_SHOWN_CHARS]
                _check_string(key, where, max_string_chars)
                children.append((child, depth + 1, where))
        else:
            children = [(child, depth + 1, f"{path}[{i}]") for i, child in enumerate(item)]
        stack.extend(reversed(children))  # popped in document order: the first problem


def _check_string(text: str, path: str, max_chars: int) -> None:
    if len(text) > max_chars:
        raise JSONLimitError(f"a string of {len(text)} characters (at most {max_chars})",
                             path=path)
    if not text.isascii() and _SURROGATE.search(text):
        bad = _SURROGATE.search(text)
        assert bad is not None
        raise JSONLimitError(f"a lone surrogate \\u{ord(bad.group()):04x} (an escape that "
                             "is half of a UTF-16 pair, not a character)", path=path)


def _locate(text: str, max_depth: int) -> int | None:
    """The line of the first value past a limit (the error path only: a Python-level scan)."""
    depth = 0
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                return text.count("\n", 0, match.start()) + 1
        elif token in "]}":
            depth -= 1
        elif token in ("NaN", "Infinity", "-Infinity"):
            return text.count("\n", 0, match.start()) + 1
        elif token[0] != '"':
            digits = len(re.split(r"[.eE]", token.lstrip("-"), maxsplit=1)[0])
            if digits > MAX_INT_DIGITS or not math.isfinite(float(_numeric(token))):
                return text.count("\n", 0, match.start()) + 1
    return None


def _numeric(token: str) -> str:
    return token if _ASCII_DECIMAL.fullmatch(token) else "0"


def json_problem(exc: ValueError) -> str:
    """One line for a JSONDecodeError or JSONLimitError (the caller adds file and line)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg})"
    where = f"{exc.path}: " if isinstance(exc, JSONLimitError) and exc.path else ""
    return f"{where}{exc}"


# ------------------------------------------------------------------ text and lines
def read_text(file: Path, shown_as: str, kind: str) -> str:
    """A dataset file's text (UTF-8, a leading byte-order mark dropped); one-line errors."""
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise UserError(f"{shown_as}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DamagedFileError(f"{shown_as}:{line}: not UTF-8 text (byte "
                               f"0x{raw[exc.start]:02x} at offset {exc.start}; "
                               f"workload.dataset.kind {kind})") from None
    return text[1:] if text.startswith("\ufeff") else text


def numbered_lines(text: str, shown_as: str) -> Iterator[tuple[int, str]]:
    """(line number, line) split on LF alone, a CR before it dropped; over-long lines refused.

    U+2028, U+2029, U+0085, form feeds and the other characters `str.splitlines` also
    breaks on are text inside a line here, as JSON allows them unescaped in strings.
    """
    start, number = 0, 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        number += 1
        if end - start > MAX_LINE_CHARS:
            raise DamagedFileError(f"{shown_as}:{number}: a line of {end - start} characters "
                                   f"(at most {MAX_LINE_CHARS})")
        line = text[start:end]
        yield number, line[:-1] if line.endswith("\r") else line
        start = end + 1


# ------------------------------------------------------------------ numbers
def strict_int(text: str, low: int, high: int) -> int | None:
    """`text` as an int in low..high when it is ASCII digits only (no sign, no spaces inside,
    no superscripts, no other scripts' digits), else None."""
    value = text.strip()
    if not _ASCII_INT.fullmatch(value) or len(value) > MAX_INT_DIGITS:
        return None
    number = int(value)
    return number if low <= number <= high else None


def strict_float(text: str) -> float | None:
    """`text` as a finite float when it is an ASCII decimal (`12`, `-1.5`, `3e2`), else None
    (no `inf`, `nan`, `1_000`, or digits of other scripts, all of which `float` takes)."""
    value = text.strip()
    if not _ASCII_DECIMAL.fullmatch(value):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


# ------------------------------------------------------------------ CSV
def csv_rows(text: str, shown_as: str, columns: Sequence[str]
             ) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, {column: value}) of a CSV with exactly `columns` (any order, each once),
    fields at most MAX_CSV_FIELD_CHARS; blank lines skipped."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise DamagedFileError(f"{shown_as}:1: header: {_csv_problem(exc)}") from None
    names = [h.strip() for h in header or []]
    seen: set[str] = set()
    for name in names:
        if name not in columns:
            raise DamagedFileError(f"{shown_as}:1: unknown column {shown(name)}; allowed: "
                                   f"{', '.join(columns)}")
        if name in seen:
            raise DamagedFileError(f"{shown_as}:1: column {name!r} appears twice; each column "
                                   "once")
        seen.add(name)
    missing = [c for c in columns if c not in seen]
    if missing:
        raise DamagedFileError(f"{shown_as}: column {missing[0]!r} is missing; the columns "
                               f"are {', '.join(columns)}")
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DamagedFileError(f"{shown_as}:{reader.line_num}: {_csv_problem(exc)}") from None
        if not values or (len(values) == 1 and not values[0].strip()):
            continue
        number = reader.line_num
        if len(values) != len(names):
            raise DamagedFileError(f"{shown_as}:{number}: expected {len(names)} values "
                                   f"({', '.join(names)}), got {len(values)}")
        for name, value in zip(names, values, strict=True):
            if len(value) > MAX_CSV_FIELD_CHARS:
                raise DamagedFileError(f"{shown_as}:{number}: {name}: a value of {len(value)} "
                                       f"characters (at most {MAX_CSV_FIELD_CHARS})")
        yield number, dict(zip(names, values, strict=True))


def _csv_problem(exc: csv.Error) -> str:
    text = str(exc)
    if "field larger than field limit" in text:
        return (f"a field longer than {csv.field_size_limit()} characters (the csv module's "
                f"limit; a trace's fields are at most {MAX_CSV_FIELD_CHARS})")
    return f"not valid CSV ({' '.join(text.split())[:80]})"
