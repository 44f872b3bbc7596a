"""Confidence intervals over a result's repeats (report, compare and the gate's decision).

A result's `metrics` are the median of its repeats; the repeats themselves are kept
(`repeats`), so an interval can be taken for any metric at any level when the result is
read, not only the one chosen at run time.  The interval is Student's t over the repeats,
as AIPerf's multi-run mode reports it:

    mean ± t(1 - (1 - level) / 2, n - 1) * s / sqrt(n)

with s the sample standard deviation of the n repeats' values.  One repeat has no
interval (None, shown as "-").  The t quantile is computed here (scipy is not a
dependency): the t distribution's CDF is a regularized incomplete beta function,
evaluated by its continued fraction (Numerical Recipes' betacf, Lentz's method), and
inverted by bisection; tests hold it to the tables' values.

No numpy and no torch: `report` and `compare` import this.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infbench.core.errors import UserError
from infbench.results.accessor import section_metric
from infbench.scenario.values import parse_fraction

DEFAULT_CONFIDENCE = 0.95
_CF_MAX_ITER = 300
_CF_EPS = 1e-15
_TINY = 1e-300


def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Lentz's method)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _CF_MAX_ITER + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _CF_EPS:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1), to about 1e-12 relative."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * high:
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Interval:
    """A t interval of the mean of n values at `level`."""

    mean: float
    low: float
    high: float
    half_width: float
    n: int
    level: float

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def to_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high,
                "half_width": self.half_width, "n": self.n, "level": self.level}


def interval(values: Sequence[float], level: float = DEFAULT_CONFIDENCE) -> Interval | None:
    """The t interval of the mean of `values`; None for fewer than two."""
    nums = [float(v) for v in values]
    if len(nums) < 2:
        return None
    mean = statistics.fmean(nums)
    half = t_quantile(1.0 - (1.0 - level) / 2.0, len(nums) - 1) * statistics.stdev(nums) / \
        math.sqrt(len(nums))
    return Interval(mean, mean - half, mean + half, half, len(nums), level)


def parse_confidence(value: Any, key: str = "--confidence") -> float:
    """A level in (0, 1): 0.95 or "95%" (a UserError naming `key` otherwise)."""
    try:
        level = parse_fraction(value)
    except ValueError as exc:
        raise UserError(f"{key}: {exc}; allowed: a level in (0, 1), 0.95 or 95%") from None
    if not 0.0 < level < 1.0:
        raise UserError(f"{key}: {value!r} is not a level in (0, 1); allowed: 0.95 or 95%")
    return level


def repeat_values(result: Mapping[str, Any], name: str) -> list[float]:
    """The value of metric `name` in each repeat that has it (finite numbers only)."""
    out = []
    for rep in result.get("repeats") or []:
        if isinstance(rep, Mapping):
            value = section_metric(rep, name)
            if value is not None and math.isfinite(value):
                out.append(value)
    return out


def result_interval(result: Mapping[str, Any], name: str,
                    level: float = DEFAULT_CONFIDENCE) -> Interval | None:
    """The t interval of metric `name` over a result's repeats (None: fewer than two)."""
    return interval(repeat_values(result, name), level)


def format_interval(ci: Interval | None, scale: float = 1.0) -> str:
    """`12.3 ± 0.4` (about three significant digits), or `-` without an interval."""
    if ci is None:
        return "-"
    mean, half = ci.mean * scale, ci.half_width * scale
    digits = max(0, 2 - int(math.floor(math.log10(abs(mean))))) if mean else 2
    return f"{mean:.{min(digits, 6)}f} ± {half:.{min(digits, 6)}f}"
