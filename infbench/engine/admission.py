"""The benchmark client's submission rule, shared by `Engine.run` and the simulation of
`infbench/sim` (which replays it on a virtual clock), so both admit the same requests at the
same moments.

Requests are submitted in arrival order once due (all at t=0 without real-time arrivals)
while fewer than `max_concurrency` are outstanding (a request with n samples is one request
until its last sample finishes).  One held back by a full cap is submitted when a slot
frees, and its arrival (TTFT, E2E) counts from that submission, as vLLM's benchmark client
counts it.  With `submit_until_s` (measure.duration_s) nothing is submitted once that many
seconds have passed.  Torch-free: the analytic half imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from infbench.core.errors import ConfigError
from infbench.engine.request import Request


class ClientAdmission:
    """Pending requests, the outstanding ones and each submitted request's arrival time."""

    def __init__(self, requests: Sequence[Request], *, realtime_arrivals: bool = True,
                 max_concurrency: int | None = None,
                 submit_until_s: float | None = None) -> None:
        if max_concurrency is not None and max_concurrency <= 0:
            raise ConfigError(f"max_concurrency must be > 0 or None, got {max_concurrency}")
        self.pending = sorted(requests, key=lambda r: r.arrival_s)
        self.num_samples = {r.request_id: r.n for r in requests}
        self.cap = max_concurrency if max_concurrency is not None else len(self.pending) + 1
        self.realtime = realtime_arrivals
        self.submit_until_s = submit_until_s
        self.arrivals: dict[str, float] = {}
        self.samples_left: dict[str, int] = {}  # outstanding requests -> samples not finished
        self.last_blocked = -math.inf  # the last pass at which a due request met a full cap
        self.next = 0  # index of the first pending request not submitted

    @property
    def has_pending(self) -> bool:
        return self.next < len(self.pending)

    @property
    def is_full(self) -> bool:
        """`max_concurrency` requests are outstanding: the next one waits for a finish."""
        return len(self.samples_left) >= self.cap

    def _due(self, now: float) -> bool:
        return self.pending[self.next].arrival_s <= now or not self.realtime

    def admit(self, now: float, add: Callable[[Request], object]) -> None:
        """Submit (through `add`) every request due at `now` that the cap lets in."""
        if self.submit_until_s is not None and now >= self.submit_until_s:
            self.next = len(self.pending)  # the duration is over: nothing more is submitted
        while self.has_pending and not self.is_full and self._due(now):
            req = self.pending[self.next]
            due = req.arrival_s if self.realtime else 0.0
            # Due while the cap was full: held back, it is submitted now, as a slot frees.
            self.arrivals[req.request_id] = now if due <= self.last_blocked else due
            self.samples_left[req.request_id] = req.n
            add(req)
            self.next += 1
        if self.has_pending and self.is_full and self._due(now):
            self.last_blocked = now

    def next_due_s(self) -> float:
        """When the next pending request is due (or the submissions stop, if sooner)."""
        due = self.pending[self.next].arrival_s
        return due if self.submit_until_s is None else min(due, self.submit_until_s)

    def finished(self, request_id: str, sample_index: int) -> tuple[str, float]:
        """One sample finished: (its record's id, `id/sample` for n > 1; its arrival)."""
        left = self.samples_left[request_id] - 1
        if left:
            self.samples_left[request_id] = left
        else:
            del self.samples_left[request_id]
        key = request_id if self.num_samples[request_id] == 1 else \
            f"{request_id}/{sample_index}"
        return key, self.arrivals[request_id]
