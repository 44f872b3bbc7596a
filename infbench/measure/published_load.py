"""Published GPU serving measurements at a stated load (`infbench/data/published/under_load.yaml`)
beside the simulation's prediction of the same load.

Each row is what a serving engine's authors measured at a stated request rate or client
concurrency: the model, GPU, layout, precision, lengths, load, and the latencies (TTFT,
TPOT, ITL, E2E; medians or means) and throughput.  `price_under_load` builds the scenario
point of that run (the preset, the hardware entry, `parallel.tp`, the precision, the
lengths; `workload.kind: poisson` at the rate, `offline` with `max_concurrency` for a
concurrency-capped client, or `offline` alone for MLPerf's Offline scenario: every request
at t=0, the engine's batch limit the only cap; `max_batch` as the engine's max_num_seqs;
`priced_replicas` of the run's identical replicas, each at its share of a rate) and prices
it with `measure.simulation.simulate_point`: the engine's own scheduler, each step priced by
the cost model at the datasheet peaks, the metrics from the code that summarizes a
measured run (a throughput scaled from the priced replicas to the run's).

The comparison is in the direction of time, as in `measure.published`: `ratio` is how many
times faster than measured the prediction is (measured / predicted for a latency,
predicted / measured for a throughput), so at 100% of the peaks the simulation is a bound
when the ratio is >= 1.  A measured metric it does not bound names what was found under
the row's `gap`.  Beside the raw price, `price_under_load(row, efficiency)` prices the same
run on hardware derated by the fractions `predict --efficiency ENGINE` fits on the
engine's rows of measurements.yaml (`measure.efficiency`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from infbench.core.errors import ConfigError
from infbench.hardware.spec import get_hardware
from infbench.measure.prediction import Efficiency, derate
from infbench.measure.published import ENGINES, read_rows
from infbench.measure.simulation import simulate_point
from infbench.scenario.schema import scenario_from_document

LOAD_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_tokens_per_s")
TIME_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
STATISTICS = ("median", "mean")
LOAD_KEYS = ("rate", "concurrency", "offline")
LENGTH_DISTS = ("uniform", "lognormal")
_REQUIRED = ("id", "engine", "model", "gpu", "gpus", "prompt_len", "gen_len", "load",
             "statistic", "measured", "source")
_OPTIONAL = ("published_model", "parallel", "dtype", "weights", "activations", "kv",
             "len_spread", "len_dist", "max_batch", "num_requests", "priced_requests",
             "priced_replicas", "gap", "notes")
_LAYOUT_KEYS = ("tp",)
# the simulation's metric (seconds, or a rate) behind each published one
_SIM_KEY = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "itl_ms": "itl_s", "e2e_ms": "e2e_s"}


def data_path() -> Path:
    """The packaged under-load measurements file."""
    return Path(str(resources.files("infbench").joinpath("data", "published",
                                                          "under_load.yaml")))


@dataclass(frozen=True)
class UnderLoadRow:
    """One published serving run at a stated load, as its source states it."""

    id: str
    engine: str
    model: str  # the infbench preset priced
    gpu: str  # the hardware entry
    gpus: int
    prompt_len: int
    gen_len: int
    rate: float | None  # requests/s (Poisson arrivals), or None
    concurrency: int | None  # requests the client keeps in flight, or None
    statistic: str
    measured: tuple[tuple[str, float], ...]  # (metric, value) in LOAD_METRICS order
    source: str
    published_model: str = ""
    tp: int = 1
    dtype: str = "bfloat16"
    weights: str = "none"
    activations: str = "float"
    kv: str = "none"
    len_spread: float = 0.0
    len_dist: str = "uniform"  # how lengths spread around their means (LENGTH_DISTS)
    max_batch: int | None = None  # the engine's batch limit as published (None: the default)
    num_requests: int | None = None  # None: the source does not say
    priced_requests: int | None = None  # None: num_requests
    priced_replicas: int | None = None  # None: all gpus // tp
    gap: tuple[tuple[str, str], ...] = ()  # (metric, why the simulation does not bound it)
    notes: str = ""

    @property
    def requests(self) -> int:
        """How many requests the simulation prices."""
        count = self.priced_requests or self.num_requests
        assert count is not None  # the loader requires one of the two
        return count

    @property
    def offline(self) -> bool:
        """MLPerf's Offline scenario: every request submitted at t=0, no client cap."""
        return self.rate is None and self.concurrency is None

    @property
    def replicas(self) -> int:
        """The engine copies of the run: the GPUs beyond tensor parallelism."""
        return self.gpus // self.tp

    @property
    def priced(self) -> int:
        """How many of the replicas the simulation runs (they are identical and independent:
        each serves every R-th request, so fewer priced see the same load per replica)."""
        return self.priced_replicas or self.replicas

    @property
    def load(self) -> str:
        """'8 in flight', '4 req/s' or 'all at t=0'."""
        if self.offline:
            return "all at t=0"
        return f"{self.concurrency} in flight" if self.concurrency else f"{self.rate:g} req/s"

    @property
    def setup(self) -> str:
        """'2 x h100-sxm tp2, fp8/fp8/none, 5000/500': the row in one phrase."""
        precision = "/".join((self.weights if self.weights != "none" else self.dtype,
                              self.activations, self.kv))
        spread = ""
        if self.len_spread:
            spread = (f" +-{self.len_spread:.0%}" if self.len_dist == "uniform"
                      else f" {self.len_dist} sigma {self.len_spread:g}")
        layout = f" tp{self.tp}" if self.tp > 1 else ""
        batch = f", batch {self.max_batch}" if self.max_batch else ""
        return (f"{self.gpus} x {self.gpu}{layout}, {precision}, "
                f"{self.prompt_len}/{self.gen_len}{spread}{batch}")


def _number(value: Any, where: str, *, whole: bool = False, positive: bool = True) -> Any:
    ok = not isinstance(value, bool) and isinstance(value, int if whole else (int, float))
    if not ok or not math.isfinite(value) or (value <= 0 if positive else value < 0):
        what = "a whole number >= 1" if whole else ("a number > 0" if positive
                                                    else "a number >= 0")
        raise ConfigError(f"{where}: {value!r}; allowed: {what}")
    return value


def _mapping(value: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{where}: expected a mapping of {', '.join(allowed)}")
    bad = sorted(set(value) - set(allowed))
    if bad:
        raise ConfigError(f"{where}: unknown key {bad[0]!r}; allowed: {', '.join(allowed)}")
    return value


def _row(item: Any, where: str) -> UnderLoadRow:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: a row must be a mapping, got {type(item).__name__}")
    unknown = sorted(set(item) - set(_REQUIRED) - set(_OPTIONAL))
    missing = [k for k in _REQUIRED if k not in item]
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise ConfigError(f"{where}: {what}; allowed: {', '.join(_REQUIRED + _OPTIONAL)}")
    values = dict(item)
    for key, allowed in (("engine", ENGINES), ("statistic", STATISTICS)):
        if values[key] not in allowed:
            raise ConfigError(f"{where}/{key}: {values[key]!r}; allowed: {', '.join(allowed)}")
    for key in ("gpus", "prompt_len", "gen_len", "num_requests", "priced_requests",
                "max_batch", "priced_replicas"):
        if values.get(key) is not None:
            _number(values[key], f"{where}/{key}", whole=True)
    if values.get("num_requests") is None and values.get("priced_requests") is None:
        raise ConfigError(f"{where}: num_requests or priced_requests is required (the "
                          "requests the simulation prices)")
    load = _mapping(values.pop("load"), f"{where}/load", LOAD_KEYS)
    if len(load) != 1:
        raise ConfigError(f"{where}/load: one of {', '.join(LOAD_KEYS)}, not two")
    rate = load.get("rate")
    concurrency = load.get("concurrency")
    if rate is not None:
        _number(rate, f"{where}/load/rate")
    elif concurrency is not None:
        _number(concurrency, f"{where}/load/concurrency", whole=True)
    elif load["offline"] is not True:
        raise ConfigError(f"{where}/load/offline: {load['offline']!r}; allowed: true (every "
                          "request at t=0)")
    if values.get("len_dist", "uniform") not in LENGTH_DISTS:
        raise ConfigError(f"{where}/len_dist: {values['len_dist']!r}; allowed: "
                          f"{', '.join(LENGTH_DISTS)}")
    measured = _mapping(values.pop("measured"), f"{where}/measured", LOAD_METRICS)
    for metric, value in measured.items():
        _number(value, f"{where}/measured/{metric}")
    gap = values.pop("gap", None)
    gap = {} if gap is None else _mapping(gap, f"{where}/gap", LOAD_METRICS)
    stray = sorted(set(gap) - set(measured))
    if stray:
        raise ConfigError(f"{where}/gap/{stray[0]}: not a measured metric of the row; "
                          f"allowed: {', '.join(measured)}")
    _number(values.get("len_spread", 0.0), f"{where}/len_spread", positive=False)
    layout = _mapping(values.pop("parallel", None) or {"tp": 1}, f"{where}/parallel",
                      _LAYOUT_KEYS)
    tp = _number(layout["tp"], f"{where}/parallel/tp", whole=True)
    if values["gpus"] % tp:
        raise ConfigError(f"{where}/gpus: {values['gpus']} is not a multiple of "
                          f"parallel.tp = {tp}")
    if values.get("priced_replicas", 1) > values["gpus"] // tp:
        raise ConfigError(f"{where}/priced_replicas: {values['priced_replicas']}; allowed: "
                          f"1..{values['gpus'] // tp} (gpus / parallel.tp)")
    return UnderLoadRow(
        **values, tp=tp, rate=None if rate is None else float(rate), concurrency=concurrency,
        measured=tuple((m, float(measured[m])) for m in LOAD_METRICS if m in measured),
        gap=tuple((m, str(gap[m])) for m in LOAD_METRICS if m in gap))


def load_rows(path: Path | None = None) -> list[UnderLoadRow]:
    """The rows of the under-load file (default: the packaged one), checked."""
    return read_rows(path or data_path(), _row)


def scenario_document(row: UnderLoadRow) -> dict[str, Any]:
    """The scenario of the row's run, as `infbench predict SCENARIO` would read it: its
    priced replicas, each at the load one replica of the run saw (a rate split evenly)."""
    workload: dict[str, Any] = {"num_requests": row.requests, "prompt_len": row.prompt_len,
                                "gen_len": row.gen_len, "seed": 0}
    if row.concurrency is not None:  # all submitted at t=0, the client keeps C in flight
        workload.update(kind="offline", max_concurrency=row.concurrency)
    elif row.offline:  # all submitted at t=0, the engine's batch the only cap
        workload.update(kind="offline")
    else:
        assert row.rate is not None
        workload.update(kind="poisson", rate=row.rate * row.priced / row.replicas)
    if row.len_spread:
        workload.update(prompt_len_dist=row.len_dist, gen_len_dist=row.len_dist,
                        len_spread=row.len_spread)
    quant = {"weights": row.weights, "activations": row.activations, "kv": row.kv}
    doc = {"name": row.id, "device": "cuda", "dtype": row.dtype, "hardware": row.gpu,
           "model": {"preset": row.model, "quant": quant}, "workload": workload,
           "parallel": {"tp": row.tp, "replicas": row.priced},
           "measure": {"percentiles": [50]}}
    if row.max_batch is not None:
        doc["engine"] = {"max_num_seqs": row.max_batch}
    return doc


@dataclass(frozen=True)
class LoadPrice:
    """A row priced: each measured metric beside the simulation's (same unit)."""

    row: UnderLoadRow
    predicted: tuple[tuple[str, float], ...]  # (metric, value) for each measured metric
    efficiency: Efficiency | None = None

    def value(self, metric: str) -> float:
        return dict(self.predicted)[metric]

    def ratio(self, metric: str) -> float:
        """How many times faster than measured the prediction is (>= 1: a bound)."""
        measured, predicted = dict(self.row.measured)[metric], self.value(metric)
        if metric in TIME_METRICS:
            return measured / predicted
        return predicted / measured

    def is_bound(self, metric: str) -> bool:
        return self.ratio(metric) >= 1.0


def price_under_load(row: UnderLoadRow, efficiency: Efficiency | None = None) -> LoadPrice:
    """Simulate `row`'s run (on hardware derated to `efficiency`, if given)."""
    scenario = scenario_from_document(scenario_document(row), f"under_load.yaml/{row.id}")
    point = scenario.points()[0]
    hw = get_hardware(row.gpu)
    if efficiency is not None:
        hw = derate(hw, efficiency)
    metrics = simulate_point(point, point.model_config(), hw).metrics
    stat = "p50" if row.statistic == "median" else "mean"
    predicted = []
    for metric, _ in row.measured:
        if metric == "output_tokens_per_s":  # the run's replicas: the priced ones' times R/P
            value = float(metrics["output_tokens_per_s"]) * row.replicas / row.priced
        else:
            seconds = metrics[_SIM_KEY[metric]]
            if seconds is None:  # one output token has no inter-token gap
                raise ConfigError(f"{row.id}: measured {metric} but gen_len "
                                  f"{row.gen_len} has no token after the first")
            value = float(seconds[stat]) * 1e3
        predicted.append((metric, value))
    return LoadPrice(row, tuple(predicted), efficiency)
