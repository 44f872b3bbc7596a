"""`predict --efficiency ENGINE|FRACTION`: the fraction of the peaks a serving engine reaches.

A fraction in (0, 1] derates the bandwidth and every compute peak by it.  An engine name
(`published.ENGINES`) derates them by the two fractions fitted on that engine's published
rows (`infbench/data/published/measurements.yaml`, the rows infbench prices):

- Each row's predicted time (a wave's end-to-end time for output tokens/s, one decode step
  for an inter-token latency or a decode-only rate, the prefill step for a prefill-only
  rate) is split by what bounds it: the
  prefill and decode steps whose roofline is memory-bound scale as 1 / bandwidth
  fraction, the compute-bound ones as 1 / compute fraction, the communication not at all
  (`TimeParts`; exact at fractions 1, the split kept as they change).
- The fit is least squares on the log ratio of that time to the measured one, over a grid
  of fractions (0.05 steps, then 0.005 around the best), each fraction in (0, 1].  A
  fraction no row's time depends on (every row memory-bound, say) stays 1 and is marked
  undetermined.
- Its error is the leave-one-out error: each row priced exactly (the one prediction path,
  derated hardware) with the fractions fitted on the other rows, |predicted - measured| /
  measured in the row's own metric; `EngineFit` keeps each row's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from infbench.core.errors import UserError
from infbench.measure.prediction import Efficiency
from infbench.measure.published import (
    ENGINES,
    PublishedRow,
    RowPrice,
    load_rows,
    price_row,
    priceable,
)
from infbench.roofline.analysis import StagePrediction

_COARSE = [i / 20 for i in range(1, 21)]  # 0.05 .. 1.0
_MIN_SHARE = 1e-3  # a fraction whose share of every row's time is below this is undetermined


@dataclass(frozen=True)
class TimeParts:
    """A row's predicted time split by what bounds it, and the same time measured."""

    memory: float
    compute: float
    fixed: float
    measured: float

    def at(self, bandwidth: float, compute: float) -> float:
        return self.memory / bandwidth + self.compute / compute + self.fixed


def _stage_parts(stage: StagePrediction, comm: float, weight: float) -> tuple[float, ...]:
    core = max(stage.time_s - comm, 0.0) * weight
    memory = core if stage.bound == "memory" else 0.0
    return memory, core - memory, comm * weight


def time_parts(rp: RowPrice) -> TimeParts:
    """The surrogate of one priced row (module docstring)."""
    p = rp.price.prediction
    assert p is not None
    row = rp.row
    steps = {"output_tokens_per_s": p.gen_len - 1, "prefill_tokens_per_s": 0}
    decode = _stage_parts(p.decode, p.decode_comm.total_s, steps.get(row.metric, 1))
    prefill = (_stage_parts(p.prefill, p.prefill_comm.total_s, 1.0)
               if row.metric in steps else (0.0, 0.0, 0.0))
    memory, compute, fixed = (a + b for a, b in zip(decode, prefill, strict=True))
    if row.metric == "itl_ms":
        measured = row.value / 1e3
    elif row.metric == "decode_tokens_per_s":  # one step makes batch x replicas tokens
        measured = rp.batch * p.parallel.replicas / rp.measured
    elif row.metric == "prefill_tokens_per_s":  # one prefill reads batch x replicas prompts
        measured = rp.batch * p.parallel.replicas * p.prompt_len / rp.measured
    else:  # one wave makes batch x replicas x gen tokens
        measured = rp.batch * p.parallel.replicas * p.gen_len / rp.measured
    return TimeParts(memory, compute, fixed, measured)


def _loss(parts: list[TimeParts], bandwidth: float, compute: float) -> float:
    return sum(math.log(t.at(bandwidth, compute) / t.measured) ** 2 for t in parts)


def _grid(parts: list[TimeParts], bws: list[float], cps: list[float]) -> tuple[float, float]:
    best = min((_loss(parts, b, c), -b, -c) for b in bws for c in cps)  # ties: the larger
    return -best[1], -best[2]


def _around(x: float, fixed: bool) -> list[float]:
    if fixed:
        return [1.0]
    return sorted({min(1.0, max(0.005, round(x + k * 0.005, 3))) for k in range(-10, 11)})


def fit_fractions(parts: list[TimeParts]) -> tuple[float, float, bool, bool]:
    """(bandwidth, compute, bandwidth determined, compute determined) of `parts`."""
    total = sum(t.at(1.0, 1.0) for t in parts) or 1.0
    has_bw = sum(t.memory for t in parts) / total >= _MIN_SHARE
    has_cp = sum(t.compute for t in parts) / total >= _MIN_SHARE
    bw, cp = _grid(parts, _COARSE if has_bw else [1.0], _COARSE if has_cp else [1.0])
    bw, cp = _grid(parts, _around(bw, not has_bw), _around(cp, not has_cp))
    return bw, cp, has_bw, has_cp


@dataclass(frozen=True)
class EngineFit:
    """An engine's fitted fractions, the rows they rest on and their errors."""

    engine: str
    efficiency: Efficiency
    rows: tuple[str, ...]
    bandwidth_determined: bool
    compute_determined: bool
    fit_errors: tuple[float, ...]  # each row priced at the fit of all rows
    loo_errors: tuple[float, ...]  # each row priced at the fit of the other rows

    @property
    def loo_median(self) -> float:
        return statistics.median(self.loo_errors)

    @property
    def loo_max(self) -> float:
        return max(self.loo_errors)

    def summary(self) -> str:
        """One line: the fractions, what they rest on and the leave-one-out error."""
        e = self.efficiency

        def frac(value: float, known: bool) -> str:
            return f"{value:.0%}" if known else "100% (not determined by these rows)"

        return (f"efficiency {self.engine}: {frac(e.bandwidth, self.bandwidth_determined)} "
                f"of the bandwidth, {frac(e.compute, self.compute_determined)} of the compute "
                f"peaks (least squares on log time ratios over {len(self.rows)} published "
                f"rows; leave-one-out error: median {self.loo_median:.0%}, max "
                f"{self.loo_max:.0%})")


def _efficiency(engine: str, parts: list[TimeParts]) -> tuple[Efficiency, bool, bool]:
    bw, cp, has_bw, has_cp = fit_fractions(parts)
    return Efficiency(bw, cp, f"{engine} fit"), has_bw, has_cp


def _engine_rows(engine: str, rows: list[PublishedRow] | None) -> list[PublishedRow]:
    rows = load_rows() if rows is None else rows
    mine = [r for r in priceable(rows) if r.engine == engine]
    if len(mine) < 2:
        usable = fittable_engines(rows)
        raise UserError(f"--efficiency {engine}: {len(mine)} published row(s) of {engine} are "
                        "priced (a fit needs 2); allowed: "
                        f"{', '.join(usable) or 'no engine yet'}, or a fraction in (0, 1]")
    return mine


def engine_efficiency(engine: str, rows: list[PublishedRow] | None = None) -> Efficiency:
    """The fractions `--efficiency ENGINE` derates by, without `fit_engine`'s leave-one-out
    errors (which price every row once more per row held out)."""
    mine = _engine_rows(engine, rows)
    return _efficiency(engine, [time_parts(price_row(r)) for r in mine])[0]


def fit_engine(engine: str, rows: list[PublishedRow] | None = None) -> EngineFit:
    """The fit of `engine` on its priceable rows (at least 2, for a leave-one-out error)."""
    mine = _engine_rows(engine, rows)
    priced = [price_row(r) for r in mine]
    parts = [time_parts(rp) for rp in priced]
    eff, has_bw, has_cp = _efficiency(engine, parts)
    fit_errors = tuple(price_row(r, eff).error for r in mine)
    loo = []
    for i, row in enumerate(mine):
        held_out, _, _ = _efficiency(engine, parts[:i] + parts[i + 1:])
        loo.append(price_row(row, held_out).error)
    return EngineFit(engine, eff, tuple(r.id for r in mine), has_bw, has_cp, fit_errors,
                     tuple(loo))


def fittable_engines(rows: list[PublishedRow] | None = None) -> list[str]:
    """The engines with at least 2 priceable rows."""
    rows = load_rows() if rows is None else rows
    ready = priceable(rows)
    return [e for e in ENGINES if sum(r.engine == e for r in ready) >= 2]


def parse_efficiency(text: str) -> tuple[Efficiency, EngineFit | None]:
    """`--efficiency` -> the fractions (and the fit, for an engine name)."""
    value = text.strip()
    try:
        number = float(value)
    except ValueError:
        number = None
    if number is not None:
        if not (math.isfinite(number) and 0.0 < number <= 1.0):
            raise UserError(f"--efficiency {text}: a fraction must be in (0, 1]; allowed: a "
                            f"number in (0, 1] or an engine: {', '.join(ENGINES)}")
        return Efficiency(number, number, f"{number:g} of the peaks"), None
    if value.lower() not in ENGINES:
        raise UserError(f"--efficiency {text!r}: unknown engine; allowed: "
                        f"{', '.join(ENGINES)}, or a fraction in (0, 1]")
    fit = fit_engine(value.lower())
    return fit.efficiency, fit
