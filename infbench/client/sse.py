"""An incremental parser of server-sent events (the `text/event-stream` of streamed completions).

Bytes arrive in network-sized pieces that cut lines, JSON and even UTF-8 characters
anywhere, and one piece can hold many events.  `SSEParser.feed(piece)` returns the `data`
of every event completed by that piece, in order; the rest waits for the next piece.

The rules are the WHATWG event-stream ones that OpenAI-compatible servers rely on: lines end
with LF, CRLF or CR; a blank line ends an event; `data:` lines of one event join with LF
(one optional space after the colon is dropped); lines starting with `:` are comments
(keep-alives); other fields (`event:`, `id:`, `retry:`) are ignored.  The terminating
`data: [DONE]` of the OpenAI API is an ordinary event here; the caller recognizes it.

A line or an event longer than `max_event_bytes` raises `SSEError`, so a server that never
ends a line cannot make the client buffer without bound.
"""

from __future__ import annotations

DONE = "[DONE]"
MAX_EVENT_BYTES = 2**20  # a completion chunk is a few hundred bytes


class SSEError(ValueError):
    """A stream past the parser's limits."""


class SSEParser:
    """Feed bytes, get complete events' data strings."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._data_size = 0
        self._skip_lf = False  # the last piece ended with CR: a following LF is its pair
        self.max_event_bytes = max_event_bytes

    def feed(self, piece: bytes) -> list[str]:
        """The data of each event that `piece` completes (possibly none)."""
        if self._skip_lf and piece[:1] == b"\n":
            piece = piece[1:]
        self._skip_lf = False
        buffer = self._buffer + piece if self._buffer else piece
        if b"\r" in buffer:
            if buffer.endswith(b"\r"):
                self._skip_lf = True  # CRLF may be split over two pieces
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()  # an unfinished line (b"" after a line end)
        if len(self._buffer) > self.max_event_bytes:
            raise SSEError(f"a line of more than {self.max_event_bytes} bytes without a line "
                           "end")
        events: list[str] = []
        for raw in lines:
            self._line(raw, events)
        return events

    def close(self) -> list[str]:
        """End of stream: an event the server did not close with a blank line still counts."""
        events: list[str] = []
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = b""
        if self._data:
            events.append("\n".join(self._data))
            self._data, self._data_size = [], 0
        return events

    def _line(self, raw: bytes, events: list[str]) -> None:
        if not raw:  # a blank line dispatches the event
            if self._data:
                events.append("\n".join(self._data))
                self._data, self._data_size = [], 0
            return
        if raw[:1] == b":":
            return  # a comment: keep-alive
        name, colon, value = raw.partition(b":")
        if name != b"data":
            return  # event:, id:, retry: carry nothing the completions API uses
        if colon and value[:1] == b" ":
            value = value[1:]
        self._data_size += len(value) + 1
        if self._data_size > self.max_event_bytes:
            raise SSEError(f"an event of more than {self.max_event_bytes} bytes")
        self._data.append(value.decode("utf-8", errors="replace"))
