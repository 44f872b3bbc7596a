"""The capacity search's rule (measure/search.py) against fake measurements: deterministic
thresholds, a flaky boundary, seeded noise, the stopping rules, and the summary's line."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any

import pytest

from infbench.measure.search import (
    ABOVE_HI,
    BELOW_LO,
    CONVERGED,
    MAX_POINTS,
    SearchOutcome,
    SearchSpec,
    search,
    summary_doc,
)
from infbench.results.search import search_line

SLO = {"ttft_ms": 250.0, "tpot_ms": None, "e2e_ms": None, "target": 0.9}


def spec(**kw: Any) -> SearchSpec:
    base: dict[str, Any] = {"lo": 1.0, "hi": None, "tolerance": 0.05, "max_points": 30,
                            "boundary_repeats": 3, "target": 0.9}
    return SearchSpec(**{**base, **kw})


def threshold(at: float) -> Callable[[float, int, str], tuple[float | None, dict[str, Any]]]:
    """The SLO holds (attainment 1) up to `at`, and half the requests miss it above."""
    def measure(value: float, index: int, phase: str) -> tuple[float | None, dict[str, Any]]:
        return (1.0 if value <= at else 0.5), {"phase_seen": phase}
    return measure


def check_invariants(out: SearchOutcome, s: SearchSpec) -> None:
    assert 1 <= len(out.tries) <= s.max_points
    assert [t.index for t in out.tries] == list(range(len(out.tries)))
    if out.value is not None:
        assert out.verdicts[out.value] is True
    if out.first_fail is not None:
        assert out.verdicts[out.first_fail] is False
        if out.value is not None:
            assert out.value < out.first_fail
            # nothing tried lies strictly inside the reported bracket
            assert not [v for v in out.verdicts if out.value < v < out.first_fail]


def test_doubling_then_bisection_finds_a_deterministic_threshold() -> None:
    s = spec()
    out = search(s, threshold(10.0))
    check_invariants(out, s)
    assert out.status == CONVERGED
    assert [t.value for t in out.tries[:5]] == [1, 2, 4, 8, 16]  # doubled until 16 fails
    assert out.value is not None and out.first_fail is not None
    assert out.value <= 10.0 < out.first_fail
    assert out.first_fail - out.value <= s.tolerance * out.value
    assert out.uncertainty == pytest.approx(out.first_fail - out.value)
    # both ends tried boundary_repeats times, the last tries are those repeats
    counts = {v: sum(t.value == v for t in out.tries) for v in (out.value, out.first_fail)}
    assert counts == {out.value: 3, out.first_fail: 3}
    assert {t.phase for t in out.tries[-4:]} == {"repeat"}


def test_hi_brackets_directly_and_a_passing_hi_is_reported_as_a_floor() -> None:
    s = spec(hi=64.0)
    out = search(s, threshold(10.0))
    assert [t.value for t in out.tries[:2]] == [1, 64]
    assert out.status == CONVERGED and out.value is not None and out.value <= 10 < 10.5
    above = search(spec(hi=8.0), threshold(10.0))
    assert above.status == ABOVE_HI and above.value == 8.0 and above.first_fail is None
    assert [t.value for t in above.tries] == [1, 8, 8, 8]  # hi confirmed by repeats


def test_lo_that_fails_is_confirmed_then_none() -> None:
    out = search(spec(lo=20.0), threshold(10.0))
    assert out.status == BELOW_LO and out.value is None and out.first_fail == 20.0
    assert [t.value for t in out.tries] == [20.0, 20.0, 20.0]
    assert out.uncertainty is None


def test_concurrency_is_searched_in_whole_numbers_to_a_width_of_one() -> None:
    s = spec(integer=True, tolerance=0.01)
    out = search(s, threshold(5.0))
    check_invariants(out, s)
    assert out.status == CONVERGED and (out.value, out.first_fail) == (5.0, 6.0)
    assert all(float(t.value).is_integer() for t in out.tries)


def test_a_flaky_pass_at_the_boundary_is_overruled_by_its_repeats() -> None:
    """6.0 passes once, then fails: the median of its tries fails, the bracket moves below it and
    the bisection resumes there."""
    seen: dict[float, int] = {}

    def measure(value: float, index: int, phase: str) -> tuple[float, dict[str, Any]]:
        seen[value] = seen.get(value, 0) + 1
        if value == 6.0:
            return (0.95 if seen[value] == 1 else 0.6), {}
        return (1.0 if value <= 5.0 else 0.5), {}

    s = spec(lo=4.0, hi=8.0, tolerance=0.01)
    out = search(s, measure)
    check_invariants(out, s)
    assert out.verdicts[6.0] is False and seen[6.0] >= 2  # median of 0.95, 0.6: a fail
    assert out.status == CONVERGED and out.value is not None and out.first_fail is not None
    assert 5.0 - 0.06 <= out.value <= 5.0 < out.first_fail <= 6.0
    flip = max(i for i, t in enumerate(out.tries) if t.value == 6.0)
    assert any(t.phase == "bisect" for t in out.tries[flip + 1:])  # bisection resumed


@pytest.mark.parametrize("seed", range(5))
def test_noisy_attainment_keeps_the_reported_bracket_judged_by_medians(seed: int) -> None:
    """Attainment falls through the target at 11 with noise of sd 0.03: each reported end
    is judged by the median of its repeats, and the answer lands near the threshold."""
    rng = random.Random(seed)
    tries: dict[float, list[float]] = {}

    def measure(value: float, index: int, phase: str) -> tuple[float, dict[str, Any]]:
        a = min(1.0, max(0.0, 1.0 - 0.1 * (value - 10.0) + rng.gauss(0, 0.03)))
        tries.setdefault(value, []).append(a)
        return a, {}

    s = spec(lo=2.0, tolerance=0.05, max_points=40, boundary_repeats=5)
    out = search(s, measure)
    check_invariants(out, s)
    assert out.status == CONVERGED and out.value is not None and out.first_fail is not None
    assert statistics.median(tries[out.value]) >= 0.9 > statistics.median(tries[out.first_fail])
    assert len(tries[out.value]) == len(tries[out.first_fail]) == 5
    assert 9.0 <= out.value <= 12.0


def test_max_points_stops_the_search_and_says_so() -> None:
    out = search(spec(max_points=4), threshold(1000.0))
    assert out.status == MAX_POINTS and len(out.tries) == 4
    assert out.value == 8.0 and out.first_fail is None
    mid = search(spec(max_points=7, boundary_repeats=3), threshold(10.0))
    assert mid.status == MAX_POINTS and len(mid.tries) == 7 and mid.first_fail is not None


def test_a_failed_measurement_counts_as_no_attainment() -> None:
    def measure(value: float, index: int, phase: str) -> tuple[float | None, dict[str, Any]]:
        return (None if value > 3 else 1.0), {}

    out = search(spec(integer=True, boundary_repeats=1), measure)
    assert (out.value, out.first_fail) == (3.0, 4.0) and out.status == CONVERGED


def test_summary_and_its_line_for_each_ending() -> None:
    s = spec(integer=True, boundary_repeats=2)
    out = search(s, threshold(5.0))
    doc = summary_doc(out, s, over="concurrency", key="workload.max_concurrency", slo=SLO,
                      name="x")
    assert doc["value"] == 5 and isinstance(doc["value"], int) and doc["bracket"] == [5, 6]
    assert doc["status"] == "converged" and doc["num_points"] == len(doc["tries"])
    assert {v["value"]: v["passed"] for v in doc["values"]}[6] is False
    assert search_line(doc) == (
        "search: highest concurrency with >= 90% of requests within SLO (ttft <= 250 ms): "
        f"5 in flight (threshold in [5, 6) in flight, +20%; {len(out.tries)} points)")
    rate = spec(lo=20.0)
    low = summary_doc(search(rate, threshold(10.0)), rate, over="rate", key="workload.rate",
                      slo=SLO)
    assert search_line(low).endswith(": none; lo 20 req/s misses it (3 points)")
    top = spec(hi=8.0)
    high = summary_doc(search(top, threshold(10.0)), top, over="rate", key="workload.rate",
                       slo=SLO)
    assert "at least hi 8 req/s, where it still holds" in search_line(high)
