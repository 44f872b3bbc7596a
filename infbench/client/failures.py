"""Why a request failed: the reasons a client run records, counts per reason and reports.

A request counts as a success only when its response is an SSE stream of completion chunks,
every field of every chunk has the type and range the OpenAI API gives it, the stream ends
with a finish_reason and `data: [DONE]`, and the server's usage agrees with the tokens that
arrived.  Anything else is a failure with one of the reasons below, recorded per request in
the result (`telemetry.client.failed_requests`, `failures_by_reason`) and shown by
`infbench report`.  This module imports nothing heavy, so `report` can use it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

REASONS: dict[str, str] = {
    "http_status": "the server answered with a status other than 200",
    "connection": "the connection could not be made or broke",
    "read_timeout": "no bytes arrived for target.timeout_s",
    "deadline": "no complete answer within target.request_timeout_s",
    "not_sse": "the answer is not an event stream (an empty body, an HTML page, a "
               "non-streamed JSON answer)",
    "bad_json": "an event's data is not JSON within the limits (depth, number size, length)",
    "bad_chunk": "a chunk field has the wrong type or is out of range",
    "server_error": "the stream carried an error object",
    "truncated": "the stream closed before data: [DONE]",
    "no_finish_reason": "the stream ended without a finish_reason",
    "count_mismatch": "the server's token counts disagree with the tokens received",
    "no_tokens": "the completion carried no tokens",
    "no_token_ids": "a session turn's reply carried no token ids for the next turn's token "
                    "prompt, and no target.tokenizer was set to encode its text",
}


class RequestFailed(Exception):
    """One request's failure: a reason from REASONS and the one-line message the run keeps."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown failure reason {reason!r}; allowed: {', '.join(REASONS)}")
        super().__init__(message)
        self.reason = reason


def count_reasons(reasons: Iterable[str]) -> dict[str, int]:
    """{reason: count}, most frequent first (ties in REASONS order)."""
    counts = Counter(reasons)
    order = list(REASONS)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], order.index(kv[0])
                                                       if kv[0] in order else len(order))))


def failure_notes(results: Iterable[dict[str, Any]]) -> list[str]:
    """One line per client result with failed requests: how many, by reason, the first error
    (what `infbench report` prints under its table)."""
    notes = []
    for result in results:
        client = ((result.get("telemetry") or {}).get("client")) or {}
        if not isinstance(client, dict) or not client.get("num_failed"):
            continue
        by_reason = client.get("failures_by_reason") or {}
        reasons = ", ".join(f"{reason} {count}" for reason, count in by_reason.items()) \
            if isinstance(by_reason, dict) else ""
        label = result.get("label")
        name = f"{result.get('name', '?')}" + (f" [{label}]" if label not in (None, "default")
                                               else "")
        notes.append(f"client failures: {name}: {client['num_failed']} of "
                     f"{client.get('num_sent', '?')} request(s) failed"
                     + (f" ({reasons})" if reasons else "")
                     + (f"; first {client['first_error']}" if client.get("first_error") else ""))
    return notes
