"""The incremental SSE parser: events cut anywhere, merged pieces, comments, usage, [DONE]."""

from __future__ import annotations

import json

import pytest

from infbench.client.sse import DONE, SSEParser


def feed_all(pieces: list[bytes]) -> list[str]:
    parser = SSEParser()
    events = [e for p in pieces for e in parser.feed(p)]
    return events + parser.close()


STREAM = (b'data: {"choices":[{"text":" the"}]}\n\n'
          b': keep-alive\n\n'
          b'data: {"choices":[{"text":" caf\xc3\xa9"}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
          b"data: [DONE]\n\n")
EXPECTED = ['{"choices":[{"text":" the"}]}', '{"choices":[{"text":" café"}]}',
            '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}', DONE]


def test_whole_stream_in_one_piece() -> None:
    events = feed_all([STREAM])
    assert events == EXPECTED
    assert json.loads(events[2])["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 41])
def test_any_split_gives_the_same_events(size: int) -> None:
    # Cuts through "data:", JSON, the two-byte UTF-8 "é" and the blank lines.
    pieces = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    assert feed_all(pieces) == EXPECTED


def test_crlf_and_cr_line_ends_also_split_between_pieces() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    assert feed_all([crlf]) == EXPECTED
    cut = crlf.index(b"\r\n") + 1  # piece ends with CR, the next starts with LF
    assert feed_all([crlf[:cut], crlf[cut:]]) == EXPECTED
    assert feed_all([STREAM.replace(b"\n", b"\r")]) == EXPECTED


def test_events_are_returned_as_soon_as_they_complete() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n') == []  # no blank line yet
    assert parser.feed(b"\ndata: [DO") == ['{"a": 1}']
    assert parser.feed(b"NE]\n\n") == [DONE]


def test_comments_other_fields_and_multiline_data() -> None:
    events = feed_all([b": ping\nevent: message\nid: 7\nretry: 100\ndata: line one\n"
                       b"data:line two\n\n:only a comment\n\n"])
    assert events == ["line one\nline two"]  # one optional space dropped; comments skipped


def test_unterminated_last_event_counts_at_close() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"x": 2}') == []
    assert parser.close() == ['{"x": 2}']
    assert parser.close() == []
