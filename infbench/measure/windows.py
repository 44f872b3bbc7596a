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


def _steady_interval(rows: Sequence[Mapping[str, Any]], target: int) -> tuple[float, float]:
    """[first time the outstanding rows reach `target`, last time they fall below it]."""
    change: dict[float, int] = {}
    done = [r for r in rows if r.get("finish_s") is not None]
    for r in done:
        change[float(r["arrival_s"])] = change.get(float(r["arrival_s"]), 0) + 1
        change[float(r["finish_s"])] = change.get(float(r["finish_s"]), 0) - 1
    goal = min(target, len(done))
    level, reached, left, peak = 0, None, None, 0
    for time in sorted(change):  # what one instant submits and finishes, together
        was = level
        level += change[time]
        peak = max(peak, level)
        if reached is None and level >= goal:
            reached = time
        if was >= goal > level:
            left = time
    if reached is None or left is None or goal <= 0:
        raise UserError(f"measure.window.steady_state: the outstanding requests never reached "
                        f"their target {target} (at most {peak}); allowed: a workload whose "
                        "requests fill the cap (more requests than workload.max_concurrency)")
    return reached, left


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
        if target is None:  # the scenario refuses steady_state without a cap
            raise ConfigError("measure.window.steady_state: needs a concurrency target")
        low, high = _steady_interval(done, target)
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
