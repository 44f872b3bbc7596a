"""Calibrated figures with their repeats, and the checks a calibrated profile must pass.

No torch: `load_profile` runs the same checks as `infbench calibrate`, and the analytic
commands start without torch.

A calibrated figure is one round of timed repeats (`Figure`).  For a throughput the chosen
value is the best repeat: on a shared machine other processes only ever slow a repeat
down, so the fastest one is the least disturbed; for a time (a decode step) it is the
shortest, for the same reason.  The relative spread is 1 - min / max over the round's
repeats (0.2: the slowest repeat ran at 80% of the fastest's rate).  A round whose spread
is above `SPREAD_LIMIT` is measured again, at most `MAX_ROUNDS` rounds in all; the
calmest round is kept, and when even that one is above the limit the figure is flagged.

`check_profile` then compares related figures (thresholds below):

- the GEMV bandwidths against the streaming read: a GEMV streams the same kind of bytes,
  so one below `GEMV_MIN_FRACTION` of the read is not credible and the profile is refused;
- the engine's decode attention against the streaming read: below
  `ATTENTION_MIN_FRACTION` of it the profile is refused (a paged kernel reads scattered
  rows slower than a stream, measured at 40-50% of it, but not ten times slower), above
  `ATTENTION_MAX_FRACTION` it is flagged (the KV sat in a cache);
- the matmul throughput against size (the engine's curve by rows, the square GEMM
  ladder): a point more than `DIP_FLAG` below the best smaller size is flagged, more
  than `DIP_REFUSE` below it refused;
- the fixed costs: a fit that is negative beyond `FIT_TOLERANCE` (8 layers faster than 2)
  is refused; a per-step or per-layer cost of zero, or any above `FIXED_COST_BOUNDS`, is
  flagged.

Flags are one line each, `check: what`; errors are one line each too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

SPREAD_LIMIT = 0.20  # relative spread above which a round is measured again
MAX_ROUNDS = 3  # the first round and at most two re-measurements
GEMV_MIN_FRACTION = 0.25
ATTENTION_MIN_FRACTION = 0.10
ATTENTION_MAX_FRACTION = 2.0
DIP_FLAG = 0.15
DIP_REFUSE = 0.50
FIT_TOLERANCE = 0.05  # of the step time the fit is taken from
FIXED_COST_BOUNDS = {"step_overhead_s": 50e-3, "layer_overhead_s": 5e-3,
                     "seq_layer_overhead_s": 1e-3}
# The decode step times the fixed costs are fitted from: (layers, batch) -> figure name.
STEP_FIGURES = {(2, 1): "decode_step_s.2x1", (8, 1): "decode_step_s.8x1",
                (8, 16): "decode_step_s.8x16"}
CHOICES = ("best", "min")  # best: the highest (a throughput); min: the lowest (a time)


def relative_spread(values: Iterable[float]) -> float:
    """1 - min / max: 0 for identical repeats, 0.5 when the slowest ran at half the rate."""
    vals = list(values)
    top = max(vals)
    return 0.0 if top <= 0 else 1.0 - min(vals) / top


@dataclass(frozen=True)
class Figure:
    """One calibrated figure: the repeats of the round kept and how it was chosen."""

    repeats: tuple[float, ...]
    choice: str  # best | min
    rounds: int = 1  # rounds measured (re-measurements included)
    limit: float = SPREAD_LIMIT

    def __post_init__(self) -> None:
        if self.choice not in CHOICES:
            raise ValueError(f"figure choice {self.choice!r}; allowed: {', '.join(CHOICES)}")
        if not self.repeats:
            raise ValueError("a figure needs at least one repeat")

    @property
    def value(self) -> float:
        return max(self.repeats) if self.choice == "best" else min(self.repeats)

    @property
    def spread(self) -> float:
        return relative_spread(self.repeats)

    @property
    def flagged(self) -> bool:
        return self.spread > self.limit

    def to_dict(self) -> dict[str, Any]:
        return {"repeats": list(self.repeats), "choice": self.choice, "value": self.value,
                "spread": self.spread, "rounds": self.rounds, "flagged": self.flagged}


def measure_figure(sample: Callable[[], list[float]], choice: str = "best",
                   limit: float = SPREAD_LIMIT, max_rounds: int = MAX_ROUNDS) -> Figure:
    """Rounds of `sample()` (one value per repeat) until one's spread is within `limit`, at
    most `max_rounds`; the calmest round is kept (flagged when it is still above)."""
    best: tuple[float, ...] | None = None
    rounds = 0
    while rounds < max_rounds:
        values = tuple(float(v) for v in sample())
        rounds += 1
        if best is None or relative_spread(values) < relative_spread(best):
            best = values
        if relative_spread(best) <= limit:
            break
    assert best is not None  # max_rounds >= 1
    return Figure(best, choice, rounds, limit)


def fit_fixed_costs(t2: float, t8: float, t8x16: float) -> tuple[float, float, float]:
    """(per step, per layer, per sequence per layer) seconds, unclamped, from the decode step
    times of 2 and 8 layers at batch 1 and 8 layers at batch 16."""
    per_layer = (t8 - t2) / 6
    per_seq_layer = (t8x16 - t8) / (15 * 8)
    return t2 - 2 * per_layer, per_layer, per_seq_layer


@dataclass
class ProfileCheck:
    flags: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB/s"


def _check_gemv(extra: dict[str, Any], out: ProfileCheck) -> None:
    read = extra.get("read_bytes_per_s")
    if not read:
        return
    for key, what in (("gemv_bytes_per_s", "GEMV"), ("engine_gemv_bytes_per_s", "engine GEMV")):
        gemv = extra.get(key)
        if gemv is not None and gemv < GEMV_MIN_FRACTION * read:
            out.errors.append(
                f"gemv: {what} {_gb(gemv)} is {gemv / read:.0%} of the streaming read "
                f"{_gb(read)} (below {GEMV_MIN_FRACTION:.0%}): not credible, the machine was "
                "busy")


def _check_attention(extra: dict[str, Any], out: ProfileCheck) -> None:
    read, attention = extra.get("read_bytes_per_s"), extra.get("decode_attention_bytes_per_s")
    if not read or attention is None:
        return
    line = (f"attention: the engine's decode attention read {_gb(attention)}, "
            f"{attention / read:.0%} of the streaming read {_gb(read)}")
    if attention < ATTENTION_MIN_FRACTION * read:
        out.errors.append(f"{line} (below {ATTENTION_MIN_FRACTION:.0%}): not credible, the "
                          "machine was busy")
    elif attention > ATTENTION_MAX_FRACTION * read:
        out.flags.append(f"{line} (above {ATTENTION_MAX_FRACTION:.0%}): the KV cache was "
                         "served from a cache, attention will be priced too fast")


def _check_monotonic(name: str, points: list[tuple[float, float]], out: ProfileCheck) -> None:
    best_size, best = 0.0, 0.0
    for size, rate in sorted(points):
        if best > 0 and rate < (1 - DIP_FLAG) * best:
            line = (f"{name} at {size:g} is {rate / best:.0%} of the {best / 1e9:,.1f} GFLOP/s "
                    f"at {best_size:g}")
            if rate < (1 - DIP_REFUSE) * best:
                out.errors.append(f"matmul curve: {line} (a larger matmul at under half the "
                                  "rate): not credible, the machine was busy")
            else:
                out.flags.append(f"matmul curve: {line} (tolerance {DIP_FLAG:.0%})")
        if rate > best:
            best_size, best = size, rate


def _check_fixed_costs(extra: dict[str, Any], figures: dict[str, Any], out: ProfileCheck) -> None:
    times = {k: (figures.get(name) or {}).get("value") for k, name in STEP_FIGURES.items()}
    if all(isinstance(t, (int, float)) for t in times.values()):
        t2, t8, t16 = (float(times[k]) for k in STEP_FIGURES)  # type: ignore[arg-type]
        step, layer, seq = fit_fixed_costs(t2, t8, t16)
        for what, value, ref in (("per-step", step, t2), ("per-layer", layer * 6, t2),
                                 ("per-sequence-per-layer", seq * 120, t8)):
            if value < -FIT_TOLERANCE * ref:
                out.errors.append(
                    f"fixed cost: the {what} fit is negative ({value / 1e-3:+.3f} ms over "
                    f"{ref / 1e-3:.3f} ms steps: decode steps of 2/8 layers at batch 1/16 took "
                    f"{t2 / 1e-3:.3f}/{t8 / 1e-3:.3f}/{t16 / 1e-3:.3f} ms), the machine was busy")
    for key, bound in FIXED_COST_BOUNDS.items():
        cost = extra.get(key)
        if cost is None:
            continue
        if cost > bound:
            out.flags.append(f"fixed cost: {key} {cost / 1e-3:.3f} ms is above the plausible "
                             f"{bound / 1e-3:g} ms")
        elif cost <= 0 and key != "seq_layer_overhead_s":  # dispatch is never free
            out.flags.append(f"fixed cost: {key} is {cost:g} s; an engine step and layer "
                             "always cost some dispatch time")


def check_profile(extra: dict[str, Any]) -> ProfileCheck:
    """The flags and errors of a calibrated profile's `extra` (see the module docstring)."""
    out = ProfileCheck()
    figures = extra.get("figures") or {}
    for name, fig in figures.items():
        if fig.get("flagged"):
            out.flags.append(
                f"spread: {name} repeats spread {fig['spread']:.0%} after {fig['rounds']} "
                f"round{'s' if fig['rounds'] != 1 else ''} (limit "
                f"{extra.get('spread_limit', SPREAD_LIMIT):.0%}), the machine was busy")
    _check_gemv(extra, out)
    _check_attention(extra, out)
    for dtype, curve in (extra.get("matmul_flops_by_tokens") or {}).items():
        _check_monotonic(f"{dtype} engine matmul by rows",
                         [(float(m), float(f)) for m, f in curve], out)
    for dtype, by_size in (extra.get("gemm_flops_per_s") or {}).items():
        _check_monotonic(f"{dtype} GEMM by size",
                         [(float(n), float(f)) for n, f in by_size.items()], out)
    _check_fixed_costs(extra, figures, out)
    return out


def merge_flags(stored: Iterable[str], found: Iterable[str]) -> list[str]:
    """The stored flags, then the newly found ones not already among them."""
    merged = list(stored)
    merged += [f for f in found if f not in merged]
    return merged
