"""Capacity search: the highest rate (or concurrency) at which the SLO holds.

Pure logic over a `measure(value) -> attainment` callback, so the rule is tested with fake
measurements and `infbench search` (commands/search.py) hands it real points.  A value
*passes* when the median of its tries' SLO attainments (the fraction of requests meeting
every objective; a try whose point measured none counts 0) is at least the target; with a
single try that is the try itself.  The search then

1. **brackets**: tries `lo`, then `hi` when given, else doubles from `lo` until a value
   fails (or the points run out);
2. **bisects**: between the *last pass* and the *first fail* (the values walked upwards,
   stopped at the first that fails, as the SLO max rate of a rate sweep is judged:
   results/goodput.py) tries the midpoint (a concurrency: the integer midpoint) until
   (first fail - last pass) <= tolerance x last pass, or a width of 1 for a concurrency;
3. **confirms**: tries each end of that bracket until it has `boundary_repeats` tries.
   A repeat that flips an end's verdict moves the bracket (a last pass that now fails
   becomes the first fail) and step 2 resumes, so the reported bracket is always judged by
   medians.  A `lo` that fails is confirmed the same way before the search reports none.

The answer is the last pass, with its uncertainty the bracket's width: the threshold lies in
[last pass, first fail).  `max_points` bounds every try, repeats included; a search that
stops on it says so (`status`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# How a search ended.
CONVERGED = "converged"        # bracket within tolerance, both ends confirmed
MAX_POINTS = "max_points"      # stopped by max_points before converging or confirming
BELOW_LO = "below_lo"          # lo itself misses the SLO (confirmed): no value found
ABOVE_HI = "above_hi"          # hi (the given top) passes: the threshold is above it
STATUSES = (CONVERGED, MAX_POINTS, BELOW_LO, ABOVE_HI)
MAX_VALUE = 2.0**24  # the scenario's sanity limit on a rate or a concurrency
SIGNIFICANT = 4  # a rate's midpoint is rounded to this many digits (labels stay readable)


@dataclass(frozen=True)
class SearchSpec:
    """What to search: the bracket, the stopping rules, the target attainment."""

    lo: float
    hi: float | None
    tolerance: float
    max_points: int
    boundary_repeats: int
    target: float
    integer: bool = False  # a concurrency: whole values, a width of 1 at the finest


@dataclass(frozen=True)
class Try:
    """One point the search ran: its value, attainment and the verdict of its value then."""

    index: int
    value: float
    attainment: float | None
    passed: bool  # this try alone reached the target
    phase: str  # bracket | bisect | repeat
    info: dict[str, Any] = field(default_factory=dict)  # what measure returned beside it


@dataclass
class SearchOutcome:
    """The answer: the last pass with its bracket, each value's verdict and every try."""

    status: str
    value: float | None  # the highest value that passes (None: lo fails)
    first_fail: float | None  # the lowest failing value above it (None: none found)
    tries: list[Try]
    verdicts: dict[float, bool]  # per value tried: the median attainment >= target

    @property
    def uncertainty(self) -> float | None:
        """first fail - last pass: the threshold lies in [value, value + uncertainty)."""
        if self.value is None or self.first_fail is None:
            return None
        return self.first_fail - self.value

    @property
    def relative_uncertainty(self) -> float | None:
        u = self.uncertainty
        return None if u is None or not self.value else u / self.value


Measure = Callable[[float, int, str], tuple[float | None, dict[str, Any]]]
"""(value, try index, phase) -> (SLO attainment or None, anything to keep with the try)."""


class _State:
    def __init__(self, spec: SearchSpec) -> None:
        self.spec = spec
        self.attainments: dict[float, list[float]] = {}

    def record(self, value: float, attainment: float | None) -> None:
        self.attainments.setdefault(value, []).append(0.0 if attainment is None
                                                       else attainment)

    def passes(self, value: float) -> bool:
        return statistics.median(self.attainments[value]) >= self.spec.target

    def bracket(self) -> tuple[float | None, float | None]:
        """(last pass, first fail), walking the tried values upwards."""
        last: float | None = None
        for value in sorted(self.attainments):
            if not self.passes(value):
                return last, value
            last = value
        return last, None

    def narrow(self, last: float, fail: float) -> bool:
        if self.spec.integer and fail - last <= 1:
            return True
        return fail - last <= self.spec.tolerance * last

    def midpoint(self, last: float, fail: float) -> float | None:
        """The next value to bisect at, or None when none lies strictly between."""
        if self.spec.integer:
            mid: float = float((int(last) + int(fail)) // 2)
        else:
            mid = (last + fail) / 2
            digits = SIGNIFICANT - 1 - math.floor(math.log10(abs(mid)))
            mid = round(mid, max(digits, 0))
        return mid if last < mid < fail else None

    def repeats(self, value: float) -> int:
        return len(self.attainments.get(value, []))


def search(spec: SearchSpec, measure: Measure) -> SearchOutcome:
    """Run the search (module docstring), calling `measure` once per try."""
    state = _State(spec)
    tries: list[Try] = []

    def run(value: float, phase: str) -> bool:
        attainment, info = measure(value, len(tries), phase)
        state.record(value, attainment)
        tries.append(Try(len(tries), value, attainment,
                         attainment is not None and attainment >= spec.target, phase, info))
        return len(tries) < spec.max_points

    def done(status: str) -> SearchOutcome:
        last, fail = state.bracket()
        return SearchOutcome(status, last, fail, tries,
                             {v: state.passes(v) for v in sorted(state.attainments)})

    room = run(spec.lo, "bracket")
    if spec.hi is not None:
        if room and state.passes(spec.lo):
            room = run(spec.hi, "bracket")
    else:
        value = spec.lo
        while room and state.bracket()[1] is None and value * 2 <= MAX_VALUE:
            value *= 2
            room = run(value, "bracket")
    while True:
        last, fail = state.bracket()
        if last is None:  # lo fails: confirmed by repeats before saying so
            assert fail is not None
            if state.repeats(fail) >= spec.boundary_repeats:
                return done(BELOW_LO)
            if not room:
                return done(MAX_POINTS)
            room = run(fail, "repeat")
            continue
        if fail is None:  # everything tried passes
            top = spec.hi if spec.hi is not None else None
            if top is not None and last == top:
                if state.repeats(top) >= spec.boundary_repeats:
                    return done(ABOVE_HI)
                if room:
                    room = run(top, "repeat")
                    continue
            return done(MAX_POINTS)
        if not room:
            return done(MAX_POINTS)
        mid = None if state.narrow(last, fail) else state.midpoint(last, fail)
        if mid is not None:
            room = run(mid, "bisect")
            continue
        pending = [v for v in (last, fail) if state.repeats(v) < spec.boundary_repeats]
        if not pending:
            return done(CONVERGED)
        room = run(pending[0], "repeat")


SEARCH_KIND = "infbench.search"
SEARCH_VERSION = 1


def summary_doc(outcome: SearchOutcome, spec: SearchSpec, *, over: str, key: str,
                slo: dict[str, Any], **about: Any) -> dict[str, Any]:
    """The search's summary as JSON data (`search.json`; `infbench search --json`): the
    answer, its bracket and uncertainty, each value's verdict and every try.  `about`
    adds identifying keys (name, scenario, out_dir)."""
    def num(value: float | None) -> float | int | None:  # a concurrency as an integer
        return int(value) if spec.integer and value is not None else value

    by_value: dict[float, list[Try]] = {}
    for t in outcome.tries:
        by_value.setdefault(t.value, []).append(t)
    values = []
    for value, tries in sorted(by_value.items()):
        attained = [0.0 if t.attainment is None else t.attainment for t in tries]
        values.append({"value": num(value), "tries": [t.index for t in tries],
                       "attainments": attained, "median_attainment": statistics.median(attained),
                       "passed": outcome.verdicts[value]})
    return {
        "kind": SEARCH_KIND, "schema_version": SEARCH_VERSION, **about,
        "over": over, "key": key, "lo": num(spec.lo), "hi": num(spec.hi),
        "tolerance": spec.tolerance,
        "max_points": spec.max_points, "boundary_repeats": spec.boundary_repeats,
        "slo": slo, "target": spec.target, "status": outcome.status, "value": num(outcome.value),
        "bracket": [num(outcome.value), num(outcome.first_fail)],
        "uncertainty": num(outcome.uncertainty),
        "relative_uncertainty": outcome.relative_uncertainty, "num_points": len(outcome.tries),
        "values": values,
        "tries": [{"index": t.index, "value": num(t.value), "phase": t.phase,
                   "attainment": t.attainment, "passed": t.passed, **t.info}
                  for t in outcome.tries],
    }
