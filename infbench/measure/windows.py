"""Measurement windows: time-based runs (`measure.duration_s`) and `measure.window`.

A repeat is a ramp-up (the first requests meet an idle server, caches and queues still
empty), a body, and a drain (the last requests run while fewer and fewer others do).  The
whole-run `metrics` mix all three; `metrics.window` holds the same metrics for one time
interval [start_s, end_s] of each repeat, with the ramp and the drain left out
(docs/windows.md).

The interval is the intersection of every bound `measure.window` gives:

- `warmup_s` / `cooldown_s`: [warmup_s, wall_s - cooldown_s] of the repeat's clock
  (wall_s ends at the last finished request);
- `warmup_requests` / `cooldown_requests`: the first / last N requests in arrival order
  (ties by id) are left out, and the interval starts no earlier than the first kept
  request's arrival and ends no later than the last kept request's finish;
- `steady_state`: from the first time the client's outstanding requests reach their
  target (the concurrency cap) to the last time they fall below it.  Outstanding counts
  each request from its arrival (its submission, with a cap) to its finish, as the rows
  record them; what one instant submits and finishes counts together, so a hand-over at
  one instant from a finished request to the next neither ends nor starts the window.
  Without a cap (an open loop: poisson, gamma, trace) the target is the low edge of a band
  around the outstanding requests' median: the time-weighted median m over the arrival
  span (first to last arrival), the band m -+ max(25% of m, 2 sqrt(m), 1 request); an open
  loop's outstanding requests are Poisson distributed with mean rate x latency (M/G/inf),
  so 2 sqrt(m) is two of their standard deviations and a steady load stays inside.  The
  window runs from the first time they reach the band's low edge (the ramp is over) to the
  last time they fall below it or the last arrival, whichever is first (after the last
  arrival the load only drains); it is refused when the mean outstanding over its second
  half differs from its first half's by more than the band's half-width: a server that
  falls behind the rate has a queue that keeps growing, and no steady state.

Inside the interval, latencies (TTFT, TPOT, ITL, E2E, TTFO) are those of the requests that
arrived and finished inside it (and were not left out by count), as GuideLLM and AIPerf
summarize a steady state.  Throughputs count the work done inside it, by every request:
output tokens whose time falls in [start_s, end_s] (token times rebuilt from a row's first
token and its ITL gaps), plus, for total tokens/s, the prompt tokens of requests whose
first token came inside, and requests/s the requests that finished inside, each divided by
end_s - start_s.  A window that holds no request is a one-line error naming
`measure.window`, never an empty result.

`measure.duration_s` (vLLM's and GuideLLM's time-based mode): each repeat submits requests
until duration_s has passed on its clock and then submits no more; requests in flight
finish (none is cancelled, so every record is complete, and the drain is what
`cooldown_s` or `steady_state` leaves out).  A poisson workload draws its arrivals until
they pass duration_s (`timed_workload`: the seeded arrival stream, so the same seed gives
the same requests, at most workload.num_requests when that is set); a capped closed loop
(kind static, offline with max_concurrency) sends from workload.num_requests requests until
duration_s; a trace's rows after duration_s are never sent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from infbench.core.errors import ConfigError, UserError
from infbench.measure.goodput import goodput_metrics
from infbench.measure.metrics import from_request_rows
from infbench.measure.workload import arrivals_before
from infbench.scenario.measure import SloSection, WindowSection
from infbench.scenario.point import ScenarioPoint
from infbench.scenario.workload import WorkloadPoint

# A time-based poisson run draws at most this many requests (a rate of 1e6/s for an hour
# would otherwise build billions before the run starts).
MAX_TIMED_REQUESTS = 1_000_000
# Instants this close count as equal (row times are floats of one clock).
_EPS_S = 1e-9
# An open loop's steady state: the band around the median outstanding requests is at
# least this fraction of the median either side (and at least two Poisson deviations).
STEADY_BAND = 0.25


def timed_workload(point: ScenarioPoint) -> WorkloadPoint:
    """The point's workload, for a poisson point with measure.duration_s with num_requests
    set to the arrivals drawn before duration_s (capped by a num_requests given); any other
    point's workload as it is."""
    workload, duration = point.workload, point.measure.duration_s
    if duration is None or workload.kind != "poisson":
        return workload
    assert workload.rate is not None  # a poisson point has a rate (WorkloadPoint checks)
    if math.isinf(workload.rate):
        raise UserError(f"{point.source}: measure.duration_s: workload.rate inf sends every "
                        "request at t=0, so a duration cannot bound it; allowed: a finite "
                        "rate, or kind offline with max_concurrency")
    limit = workload.num_requests or MAX_TIMED_REQUESTS
    count = arrivals_before(workload, duration, limit + 1)
    if count > limit and workload.num_requests is None:
        raise UserError(f"{point.source}: measure.duration_s: {duration:g} s at rate "
                        f"{workload.rate:g}/s draws more than {MAX_TIMED_REQUESTS} requests; "
                        "allowed: a shorter duration_s or a lower rate")
    try:
        return dataclasses.replace(workload, num_requests=min(count, limit))
    except ConfigError as exc:
        raise UserError(f"{point.source}: {exc}") from None


def duration_note(point: ScenarioPoint, num_sent: int, num_planned: int) -> str | None:
    """A closed-loop time-based run that sent every planned request: num_requests, not
    measure.duration_s, ended it (said in a note; None otherwise)."""
    if point.measure.duration_s is None or point.workload.kind == "poisson" or \
            num_sent < num_planned:
        return None
    return (f"measure.duration_s: all {num_planned} requests were sent before "
            f"{point.measure.duration_s:g} s, so workload.num_requests ended the run, not the "
            "duration; raise num_requests for a time-bounded run")


def concurrency_target(workload: WorkloadPoint) -> int | None:
    """Outstanding rows at the client's cap: batch_size for kind static, else
    max_concurrency (None: no cap), times samples_per_prompt (each sample is a row)."""
    cap = workload.batch_size if workload.kind == "static" else workload.max_concurrency
    return None if cap is None else cap * workload.samples_per_prompt


def token_times(row: Mapping[str, Any]) -> list[float]:
    """When each output token of a request row came: the ones without an ITL sample with
    the first token, the others one ITL gap after the previous."""
    count = int(row["num_output_tokens"])
    if count <= 0 or row.get("first_token_s") is None:
        return []
    gaps = list(row.get("itl_s") or [])
    first = float(row["first_token_s"])
    lead = max(count - len(gaps), 0)
    return [first] * lead + [float(t) for t in first + np.cumsum(gaps[:count - lead])]


def _outstanding(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, int]]:
    """(instant, outstanding rows from then on) at every instant a row arrives or finishes,
    in time order; what one instant submits and finishes counts together."""
    change: dict[float, int] = {}
    for r in rows:
        change[float(r["arrival_s"])] = change.get(float(r["arrival_s"]), 0) + 1
        change[float(r["finish_s"])] = change.get(float(r["finish_s"]), 0) - 1
    steps, level = [], 0
    for time in sorted(change):
        level += change[time]
        steps.append((time, level))
    return steps


def _crossings(steps: Sequence[tuple[float, int]], goal: float) -> tuple[float | None,
                                                                          float | None]:
    """(the first instant the level reaches `goal`, the last instant it falls below it)."""
    reached = next((t for t, level in steps if level >= goal), None)
    left = None
    for (_, was), (time, level) in zip(steps, steps[1:], strict=False):
        if was >= goal > level:
            left = time
    return reached, left


def _steady_interval(rows: Sequence[Mapping[str, Any]], target: int) -> tuple[float, float]:
    """[first time the outstanding rows reach `target`, last time they fall below it]."""
    done = [r for r in rows if r.get("finish_s") is not None]
    steps = _outstanding(done)
    goal = min(target, len(done))
    reached, left = _crossings(steps, goal)
    if reached is None or left is None or goal <= 0:
        peak = max((level for _, level in steps), default=0)
        raise UserError(f"measure.window.steady_state: the outstanding requests never reached "
                        f"their target {target} (at most {peak}); allowed: a workload whose "
                        "requests fill the cap (more requests than workload.max_concurrency)")
    return reached, left


def _time_at_levels(steps: Sequence[tuple[float, int]], start: float,
                    end: float) -> dict[int, float]:
    """Seconds of [start, end] spent at each level of the outstanding-rows step function."""
    spent: dict[int, float] = {}
    for (time, level), (after, _) in zip(steps, steps[1:], strict=False):
        span = min(after, end) - max(time, start)
        if span > 0:
            spent[level] = spent.get(level, 0.0) + span
    return spent


def steady_band(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, float]:
    """(median, low, high) of an open loop's outstanding rows: the time-weighted median over
    the arrival span (first to last arrival; after it the load only drains), and the band
    median -+ max(STEADY_BAND x median, 2 sqrt(median), 1) (the module docstring)."""
    done = [r for r in rows if r.get("finish_s") is not None]
    arrivals = [float(r["arrival_s"]) for r in done]
    if not arrivals or max(arrivals) - min(arrivals) <= _EPS_S:
        raise UserError("measure.window.steady_state: every request arrived at one instant, so "
                        "an open loop has no steady state; allowed: a workload with arrivals "
                        "over time (kind poisson or trace) or a concurrency cap")
    spent = _time_at_levels(_outstanding(done), min(arrivals), max(arrivals))
    half, total, median = sum(spent.values()) / 2, 0.0, 0
    for level in sorted(spent):
        total += spent[level]
        if total >= half:
            median = level
            break
    slack = max(STEADY_BAND * median, 2 * math.sqrt(median), 1.0)
    return float(median), max(median - slack, 0.0), median + slack


def _mean_level(steps: Sequence[tuple[float, int]], start: float, end: float) -> float:
    spent = _time_at_levels(steps, start, end)
    return sum(level * t for level, t in spent.items()) / max(end - start, _EPS_S)


def _open_loop_interval(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """An uncapped workload's steady state (the module docstring): from the first time the
    outstanding rows reach the band around their median to the last time they fall below
    it or the last arrival, whichever is first; refused when the mean outstanding of its
    second half differs from its first half's by more than the band's half-width."""
    done = [r for r in rows if r.get("finish_s") is not None]
    median, low, high = steady_band(done)
    steps = _outstanding(done)
    start, left = _crossings(steps, low)
    last_arrival = max(float(r["arrival_s"]) for r in done)
    end = last_arrival if left is None else min(left, last_arrival)
    if start is None or end - start <= _EPS_S:
        raise UserError(f"measure.window.steady_state: the outstanding requests never held "
                        f"the band [{low:.3g}, {high:.3g}] around their median {median:g} "
                        "before the last arrival; allowed: a longer run (more requests, "
                        "measure.duration_s) or a concurrency cap")
    middle = (start + end) / 2
    first, second = _mean_level(steps, start, middle), _mean_level(steps, middle, end)
    if abs(second - first) > high - median:
        raise UserError(f"measure.window.steady_state: the outstanding requests never settled: "
                        f"{first:.3g} on average over the first half of [{start:.4g}, "
                        f"{end:.4g}] s, {second:.3g} over the second, more apart than the band "
                        f"around their median {median:g} is wide (-+{high - median:.3g}), as "
                        "when a server falls behind the rate and its queue keeps growing; "
                        "allowed: a lower workload.rate, a longer run, or a concurrency cap")
    return start, end


def window_interval(rows: Sequence[Mapping[str, Any]], wall_s: float, window: WindowSection,
                    target: int | None) -> tuple[float, float, list[Mapping[str, Any]]]:
    """(start_s, end_s, the rows kept by count) of one repeat's window."""
    done = [r for r in rows if r["num_output_tokens"] > 0 and r.get("finish_s") is not None]
    ranked = sorted(done, key=lambda r: (float(r["arrival_s"]), str(r["id"])))
    kept = ranked[window.warmup_requests:len(ranked) - window.cooldown_requests]
    start, end = window.warmup_s, wall_s - window.cooldown_s
    if kept and window.warmup_requests:
        start = max(start, min(float(r["arrival_s"]) for r in kept))
    if kept and window.cooldown_requests:
        end = min(end, max(float(r["finish_s"]) for r in kept))
    if window.steady_state:
        low, high = _open_loop_interval(done) if target is None else \
            _steady_interval(done, target)
        start, end = max(start, low), min(end, high)
    return start, end, kept


def window_metrics(rows: Sequence[Mapping[str, Any]], wall_s: float, window: WindowSection, *,
                   target: int | None, percentiles: Sequence[float],
                   slo: SloSection | None = None) -> dict[str, Any]:
    """`metrics.window` of one repeat: the whole run's metrics for its window (see the
    module docstring), with the interval's start_s and end_s."""
    start, end, kept = window_interval(rows, wall_s, window, target)
    inside = [r for r in kept if float(r["arrival_s"]) >= start - _EPS_S
              and float(r["finish_s"]) <= end + _EPS_S]
    if end - start <= 0 or not inside:
        raise UserError(f"measure.window: the window [{start:.4g}, {end:.4g}] s of a repeat "
                        f"holds no request that arrived and finished inside it (the repeat "
                        f"ran {wall_s:.4g} s, {len(rows)} requests); allowed: smaller warmup / "
                        "cooldown bounds, or a longer run (more requests, measure.duration_s)")
    span = end - start
    tokens = sum(1 for r in rows for t in token_times(r) if start - _EPS_S <= t <= end + _EPS_S)
    prompt = sum(int(r["num_prompt_tokens"]) for r in rows if r.get("first_token_s") is not None
                 and start - _EPS_S <= float(r["first_token_s"]) <= end + _EPS_S)
    finished = sum(1 for r in rows if r.get("finish_s") is not None
                   and start - _EPS_S <= float(r["finish_s"]) <= end + _EPS_S)
    out = from_request_rows(inside, percentiles)
    out.update({
        "output_tokens_per_s": tokens / span,
        "total_tokens_per_s": (tokens + prompt) / span,
        "requests_per_s": finished / span,
        "num_requests": len(inside),
        "num_prompt_tokens": sum(int(r["num_prompt_tokens"]) for r in inside),
        "num_output_tokens": sum(int(r["num_output_tokens"]) for r in inside),
        "wall_s": float(span),
        "start_s": float(start),
        "end_s": float(end),
    })
    if slo is not None:
        out.update(goodput_metrics(inside, slo, span))
    return out


def add_window(m: dict[str, Any], rows: Sequence[Mapping[str, Any]], wall_s: float,
               point: ScenarioPoint) -> None:
    """`m["window"]` for a point with measure.window (engine and client repeats alike)."""
    window = point.measure.window
    if window is None:
        return
    m["window"] = window_metrics(rows, wall_s, window,
                                 target=concurrency_target(point.workload),
                                 percentiles=point.measure.percentiles, slo=point.measure.slo)
