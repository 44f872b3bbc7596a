"""The bounded dataset reader: limits, strict numbers, CSV headers, LF-only lines, packaged
names; and fuzzed files, each a one-line UserError naming the file or a clean load."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infbench.core.errors import DamagedFileError, UserError
from infbench.measure import dataset_reader
from infbench.measure.datasets import load_dataset, resolve_path

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
_names = itertools.count()


def write(tmp: Path, text: str | bytes, suffix: str = "txt") -> Path:
    file = tmp / f"d{next(_names)}.{suffix}"  # a new name: load_dataset caches per file
    if isinstance(text, bytes):
        file.write_bytes(text)
    else:
        file.write_text(text, encoding="utf-8", errors="surrogatepass")
    return file


def refused(kind: str, file: Path) -> str:
    with pytest.raises(UserError) as exc:
        load_dataset(kind, str(file))
    message = str(exc.value)
    assert "\n" not in message and message.startswith(str(file)), message
    return message[len(str(file)):]


@pytest.mark.parametrize(("kind", "text", "expected"), [
    ("trace", HEADER + "1,\u00b2,3\n", ":2: ContextTokens: must be an integer in 1..16777216 "
                                        "(got '²')"),
    ("trace", HEADER + "1,\u0661\u0662,3\n", ":2: ContextTokens: must be an integer"),
    ("trace", HEADER + "1,12 ,3\n0x10,4,4\n", ":3: TIMESTAMP: '0x10' is not a date-time"),
    ("trace", HEADER + "0,4,2\n1e300,4,2\n", ":3: TIMESTAMP: '1e300' is not a date-time"),
    ("trace", HEADER + "0,4,2\ninf,4,2\n", ":3: TIMESTAMP: 'inf'"),
    ("trace", HEADER + "0,4,2\n1_000,4,2\n", ":3: TIMESTAMP: '1_000'"),
    ("trace", HEADER + "9999-12-31 23:59:59+23:59,4,2\n", ":2: TIMESTAMP"),
    ("trace", HEADER + "5,4,2\n3,4,2\n", ":3: TIMESTAMP: '3' is before the previous row's "
                                         "(line 2); a trace is in time order"),
    ("trace", "TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n1,2,2,3\n",
     ":1: column 'ContextTokens' appears twice; each column once"),
    ("trace", HEADER + "1,2," + "9" * 200_000 + "\n",
     ":2: a field longer than 131072 characters (the csv module's limit"),
    ("trace", HEADER + "1,2," + "9" * 100 + "\n", ":2: GeneratedTokens: a value of 100 "
                                                  "characters (at most 64)"),
    ("trace", HEADER + '1,2,"3\n', ":2: not valid CSV"),
    ("jsonl", '{"prompt": "hi", "output_len": ' + "9" * 5000 + "}\n",
     ":1: an integer of 5000 digits (at most 19)"),
    ("jsonl", '{"prompt": "x"}\n' + "[" * 100_000 + "]" * 100_000 + "\n",
     ":2: nested deeper than 64 levels"),
    ("jsonl", '{"prompt": "x", "output_len": 1e400}\n', ":1: the number 1e400 is beyond"),
    ("jsonl", '{"prompt": "x", "output_len": NaN}\n', ":1: NaN is not JSON"),
    ("jsonl", '{"prompt": "a \\ud800 b"}\n', ":1: prompt: a lone surrogate \\ud800"),
    ("jsonl", '{"prompt": "x", "output_len": 3.0}\n', ":1: output_len: must be an integer"),
    ("jsonl", b'{"prompt": "caf\xe9"}\n', ":1: not UTF-8 text (byte 0xe9"),
    ("sharegpt", "[\n" + "[" * 5000 + "]" * 5000 + "\n]", ":2: nested deeper than 64 levels"),
    ("sharegpt", '[{"conversations": [{"from": "human", "value": "\\udc00"}]}]',
     ": entry 0: conversations[0].value: a lone surrogate"),
    ("sharegpt", '[\n{"conversations": [],\n "id": ' + "1" * 400 + "}]",
     ":3: an integer of 400 digits"),
])
def test_bad_values_are_one_line_naming_file_line_and_field(
        tmp_path: Path, kind: str, text: str | bytes, expected: str) -> None:
    assert refused(kind, write(tmp_path, text)).startswith(expected)


def test_u2028_and_other_unicode_line_breaks_are_text_inside_a_jsonl_line(
        tmp_path: Path) -> None:
    # str.splitlines breaks on all three; JSON allows them unescaped inside a string.
    prompts = ["a\u2028b", "c\u2029d", "e\u0085f"]
    lines = "".join(f'{{"prompt": "{p}"}}\r\n' for p in prompts)  # CRLF line ends too
    entries = load_dataset("jsonl", str(write(tmp_path, lines + '{"prompt": "g\\fh"}')))
    assert [e.prompt for e in entries] == [*prompts, "g\fh"]
    assert [e.where for e in entries] == [f"line {i}" for i in range(1, 5)]


def test_a_byte_order_mark_and_iso_offsets_are_read(tmp_path: Path) -> None:
    text = "\ufeff" + HEADER + "2024-05-10 00:00:00.5+00:00,4,2\n2024-05-10T02:00:01Z,5,0\n"
    entries = load_dataset("trace", str(write(tmp_path, text)))
    assert [e.timestamp_s for e in entries] == [0.0, pytest.approx(7200.5)]
    assert [(e.prompt_len, e.output_len) for e in entries] == [(4, 2), (5, 1)]


@pytest.mark.parametrize("name", ["samples/../../etc/passwd", "/etc/passwd",
                                  "samples//etc/passwd", "samples/../samples/prompts_small.jsonl",
                                  "../data/samples/prompts_small.jsonl", "prose.txt",
                                  "samples/", "samples/.hidden"])
def test_packaged_names_that_leave_the_samples_are_refused_unread(name: str) -> None:
    with pytest.raises(UserError) as exc:
        resolve_path(f"infbench:{name}")
    message = str(exc.value)
    assert message.startswith("workload.dataset.path: ") and "no such packaged file" in message
    assert "root:" not in message and "\n" not in message


def test_strict_numbers() -> None:
    assert dataset_reader.strict_int("42", 1, 100) == 42
    for text in ("\u00b2", "\u0664\u0662", "+4", "4.0", "1_0", "", "99999999999999999999"):
        assert dataset_reader.strict_int(text, 0, 10**30) is None, text
    assert dataset_reader.strict_float("-1.5e2") == -150.0
    for text in ("inf", "nan", "1e400", "1_0", "\u0661", "0x1p3", "1.5.2"):
        assert dataset_reader.strict_float(text) is None, text


def test_the_json_limits_locate_the_line() -> None:
    with pytest.raises(dataset_reader.JSONLimitError) as exc:
        dataset_reader.loads('{"a": "[[[[ 1234567890123456789012 in a string",\n"b": '
                             + "7" * 30 + "}")
    assert exc.value.line == 2 and "30 digits" in str(exc.value)
    assert dataset_reader.loads('{"a": "\\u2028", "b": [1, -2, 3.5]}') == {
        "a": "\u2028", "b": [1, -2, 3.5]}


# ------------------------------------------------------------------ fuzzed files
SAMPLES = {kind: resolve_path(f"infbench:samples/{name}").read_text(encoding="utf-8")
           for kind, name in (("sharegpt", "sharegpt_small.json"),
                              ("jsonl", "prompts_small.jsonl"),
                              ("trace", "azure_trace_small.csv"))}
NASTY = ["\u00b2", "\u0661", "\u2028", "\u2029", "\ufeff", "\x00", "\r", "\n", '"', ",", "[",
         "{", "]", "}", "\\", "\\ud800", "\\u0000", "9" * 5000, "1e400", "NaN", "-", ".",
         "[" * 3000, "\t", "é", "\U0001f600", "x" * 140_000, "2023-13-45 25:61:61.1234567"]


NUMBERS = ["9" * 5000, "1e400", "-1e400", "NaN", "Infinity", "\u00b2", "\u0663", "-1", "1.5",
           "0", "1e300", "18446744073709551616", "true", "null", '"7"', "[]"]


@st.composite
def mutated(draw: st.DrawFn, kind: str) -> str:
    """A sample file with a few edits: nasty pieces inserted, ranges deleted or repeated, a
    number replaced by a hostile one, a value wrapped in thousands of brackets."""
    text = SAMPLES[kind][:4000] if kind != "sharegpt" else SAMPLES[kind]
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "delete", "repeat", "text", "number", "deep"]))
        numbers = [m.span() for m in re.finditer(r"[0-9]+(?:\.[0-9]+)?", text)]
        values = [m.end() for m in re.finditer(r":\s*|^", text, re.MULTILINE)]
        if edit == "number" and numbers:
            start, end = numbers[draw(st.integers(0, len(numbers) - 1))]
            text = text[:start] + draw(st.sampled_from(NUMBERS)) + text[end:]
        elif edit == "deep" and values:
            at = values[draw(st.integers(0, len(values) - 1))]
            depth = draw(st.sampled_from([65, 999, 3000]))
            text = text[:at] + "[" * depth + text[at:]
            end = text.find("\n", at)
            end = len(text) if end < 0 else end
            if draw(st.booleans()):  # balanced: valid JSON past the depth limit
                text = text[:end] + "]" * depth + text[end:]
        elif edit == "insert":
            text = text[:at] + draw(st.sampled_from(NASTY)) + text[at:]
        elif edit == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 200)):]
        elif edit == "repeat":
            text = text[:at] + text[at:at + 50] * draw(st.integers(2, 5)) + text[at:]
        else:
            text = text[:at] + draw(st.text(max_size=20)) + text[at:]
    return text


@pytest.mark.parametrize("kind", sorted(SAMPLES))
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_files_load_or_are_one_line_user_errors(tmp_path: Path, kind: str,
                                                       data: st.DataObject) -> None:
    text = data.draw(mutated(kind))
    file = write(tmp_path, text)
    try:
        entries = load_dataset(kind, str(file))
    except UserError as exc:  # DamagedFileError included; any other exception fails the test
        message = str(exc)
        assert "\n" not in message and message.startswith(str(file)), message
        assert len(message) < len(str(file)) + 400, message
    else:
        assert entries
        for entry in entries:
            if kind == "trace":
                assert entry.prompt_len is not None and entry.prompt_len >= 1
                assert entry.timestamp_s is not None and entry.timestamp_s >= 0
            else:
                assert isinstance(entry.prompt, str) and entry.prompt.strip()


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300), kind=st.sampled_from(sorted(SAMPLES)))
def test_random_bytes_are_one_line_user_errors(tmp_path: Path, raw: bytes, kind: str) -> None:
    file = write(tmp_path, raw)
    try:
        load_dataset(kind, str(file))
    except UserError as exc:
        assert isinstance(exc, DamagedFileError), exc  # the file exists: damaged, not missing
        assert "\n" not in str(exc) and str(exc).startswith(str(file))
