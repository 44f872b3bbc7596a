"""Published GPU measurements (`infbench/data/published/measurements.yaml`) priced by the roofline.

Each row is one number a serving engine's authors published (gpt-fast, vLLM, SGLang,
TensorRT-LLM): the model, GPU, layout, precision, lengths, concurrency, the metric and its
source.  `price_row` prices it as published through the one prediction path
(`measure.prediction.price`): the same preset, hardware entry, layout, precision and
lengths, and

- `batch: N`: N requests at once per replica (one stream for N = 1);
- `batch: max` (a maximum-load run): the most requests the memory holds when each keeps
  its mean context, prompt_len + gen_len / 2: the steady state of continuous batching
  with uniform lengths, where requests are at every point of their generation (a wave of
  requests that all end at prompt_len + gen_len holds about half as many).  That is the
  highest throughput the roofline allows at those lengths, so it is the bound.

The comparison is in the direction of time: `ratio` is how many times the roofline is
faster than the measurement (measured time per token / predicted, or predicted
throughput / measured).  The roofline is a bound when ratio >= 1 and a useful one when
ratio <= `USEFUL_TIME` (2: batch-1 tokens/s and inter-token latency, time per token) or
`USEFUL_THROUGHPUT` (3: throughput under load).

A row whose model, format or layout infbench does not price yet names it under `needs`
(`preset:NAME`, `weights:FMT`, `activations:FMT`, `kv:FMT`, `hardware:NAME`,
`peak:HW/DTYPE`, `layout:KEY`); `missing_features` computes that list from the code as
it is, so the test holds the file to it.  A priced row that misses the bar names what
was found under `gap`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, TypeVar

from infbench.checkpoint.metadata import native_quant
from infbench.core.config import ACTIVATION_QUANT, KV_QUANT, PRESETS, ModelConfig, make_quant
from infbench.core.errors import ConfigError
from infbench.core.formats import WEIGHT_QUANT
from infbench.core.parallel import ParallelConfig
from infbench.hardware.spec import HARDWARE, HardwareSpec, get_hardware
from infbench.measure.prediction import (
    Efficiency,
    PointPrice,
    PricedWorkload,
    derate,
    price,
)
from infbench.roofline.analysis import DEFAULT_RESERVE, max_batch


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


RowT = TypeVar("RowT", bound=_Identified)

METRICS = ("output_tokens_per_s", "itl_ms", "decode_tokens_per_s", "prefill_tokens_per_s")
SCOPES = ("total", "per_gpu", "per_node")
ENGINES = ("gpt-fast", "vllm", "sglang", "tensorrt-llm")
USEFUL_TIME = 2.0
USEFUL_THROUGHPUT = 3.0
# activations -> the peak key their matmuls run at
ACTIVATION_PEAK = {"fp8": "float8", "fp4": "float4"}
_REQUIRED = ("id", "engine", "model", "gpu", "gpus", "prompt_len", "gen_len", "batch",
             "metric", "scope", "value", "source")
_OPTIONAL = ("published_model", "parallel", "dtype", "weights", "group_size", "activations",
             "kv", "needs", "gap", "notes")
_LAYOUT_KEYS = ("tp", "pp", "ep", "attention_dp", "dense_dp", "redundant_experts")
_FLAGS = ("dense_dp",)  # layout keys that are on or off (true / false in the file)


def data_path() -> Path:
    """The packaged measurements file."""
    return Path(str(resources.files("infbench").joinpath("data", "published",
                                                          "measurements.yaml")))


@dataclass(frozen=True)
class PublishedRow:
    """One published measurement, as its source states it."""

    id: str
    engine: str
    model: str  # the infbench preset priced
    gpu: str  # the hardware entry
    gpus: int
    prompt_len: int
    gen_len: int
    batch: int | None  # None: max (maximum load)
    metric: str
    scope: str
    value: float
    source: str
    published_model: str = ""
    parallel: tuple[tuple[str, int], ...] = ()
    dtype: str = "bfloat16"
    weights: str = "none"
    group_size: int = 128
    activations: str = "float"
    kv: str = "none"
    needs: tuple[str, ...] = ()
    gap: str = ""
    notes: str = ""

    @property
    def layout(self) -> dict[str, int]:
        return dict(self.parallel)

    @property
    def is_time(self) -> bool:
        """A time-per-token row (bar 2x): inter-token latency, or tokens/s of one stream."""
        return self.metric == "itl_ms" or (self.metric == "output_tokens_per_s"
                                           and self.batch == 1)

    @property
    def bar(self) -> float:
        return USEFUL_TIME if self.is_time else USEFUL_THROUGHPUT

    @property
    def setup(self) -> str:
        """'8 x h200 tp8, fp8/fp8/fp8, 128/2048, max': the row in one phrase."""
        layout = " ".join(k.replace("_", "-") if k in _FLAGS else f"{k}{v}"
                          for k, v in self.parallel if v > (0 if k in _FLAGS else 1))
        precision = "/".join((self.weights if self.weights != "none" else self.dtype,
                              self.activations, self.kv))
        batch = "max" if self.batch is None else f"b{self.batch}"
        return (f"{self.gpus} x {self.gpu}{' ' + layout if layout else ''}, {precision}, "
                f"{self.prompt_len}/{self.gen_len}, {batch}")


def _row(item: Any, where: str) -> PublishedRow:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: a row must be a mapping, got {type(item).__name__}")
    unknown = sorted(set(item) - set(_REQUIRED) - set(_OPTIONAL))
    missing = [k for k in _REQUIRED if k not in item]
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise ConfigError(f"{where}: {what}; allowed: {', '.join(_REQUIRED + _OPTIONAL)}")
    values = dict(item)
    for key, allowed in (("engine", ENGINES), ("metric", METRICS), ("scope", SCOPES)):
        if values[key] not in allowed:
            raise ConfigError(f"{where}/{key}: {values[key]!r}; allowed: {', '.join(allowed)}")
    layout = values.pop("parallel", None) or {}
    bad = sorted(set(layout) - set(_LAYOUT_KEYS))
    if bad:
        raise ConfigError(f"{where}/parallel: unknown key {bad[0]!r}; allowed: "
                          f"{', '.join(_LAYOUT_KEYS)}")
    flag = next((k for k in _FLAGS if k in layout and not isinstance(layout[k], bool)), None)
    if flag is not None:
        raise ConfigError(f"{where}/parallel/{flag}: {layout[flag]!r}; allowed: true, false")
    batch = values.pop("batch")
    if batch != "max" and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ConfigError(f"{where}/batch: {batch!r}; allowed: a whole number >= 1, or max")
    value = values["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{where}/value: {value!r}; allowed: a number > 0")
    return PublishedRow(
        **{k: v for k, v in values.items() if k not in ("needs", "value")},
        value=float(value), batch=None if batch == "max" else batch,
        parallel=tuple((k, int(layout[k])) for k in _LAYOUT_KEYS if k in layout),
        needs=tuple(values.get("needs") or ()))


def load_rows(path: Path | None = None) -> list[PublishedRow]:
    """The rows of the measurements file (default: the packaged one), checked."""
    return read_rows(path or data_path(), _row)


def read_rows(path: Path, parse: Callable[[Any, str], RowT]) -> list[RowT]:
    """A YAML list of rows, each through `parse(item, "FILE[i]")`, ids unique: the reader
    of both published files (this one and measure/published_load.py's); a malformed file
    is one ConfigError naming it and the line."""
    import yaml

    try:
        items = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} not valid YAML "
                          f"({getattr(exc, 'problem', None) or 'unreadable'})") from None
    if not isinstance(items, list):
        raise ConfigError(f"{path}: expected a list of rows")
    rows = [parse(item, f"{path.name}[{i}]") for i, item in enumerate(items)]
    ids = [r.id for r in rows]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"{path.name}: duplicate id {dupes[0]!r}")
    return rows


def missing_features(row: PublishedRow) -> tuple[str, ...]:
    """What infbench lacks to price `row`, in the `needs` vocabulary (empty: priceable)."""
    needs = []
    if row.model not in PRESETS:
        needs.append(f"preset:{row.model}")
    for key, allowed in (("weights", WEIGHT_QUANT), ("activations", ACTIVATION_QUANT),
                         ("kv", KV_QUANT)):
        if getattr(row, key) not in allowed:
            needs.append(f"{key}:{getattr(row, key)}")
    if row.gpu not in HARDWARE:
        needs.append(f"hardware:{row.gpu}")
    else:
        peak = ACTIVATION_PEAK.get(row.activations)
        if peak is not None and peak not in HARDWARE[row.gpu].peak_flops:
            needs.append(f"peak:{row.gpu}/{peak}")
    fields = {f.name for f in dataclasses.fields(ParallelConfig)}
    needs += [f"layout:{k}" for k, v in row.parallel
              if v > (0 if k == "redundant_experts" else 1) and k not in fields]
    return tuple(needs)


@dataclass(frozen=True)
class RowPrice:
    """A row priced: the measured and predicted values in the row's metric (all GPUs)."""

    row: PublishedRow
    measured: float
    predicted: float
    batch: int  # requests at once per replica, as priced
    price: PointPrice

    @property
    def ratio(self) -> float:
        """How many times faster than measured the roofline is (>= 1: a bound)."""
        if self.row.metric == "itl_ms":
            return self.measured / self.predicted
        return self.predicted / self.measured

    @property
    def predicted_as_published(self) -> float:
        """The prediction in the row's own scope (per GPU, per node or total)."""
        return self.predicted * self.row.value / self.measured

    @property
    def is_bound(self) -> bool:
        return self.ratio >= 1.0

    @property
    def is_useful(self) -> bool:
        return self.ratio <= self.row.bar

    @property
    def error(self) -> float:
        """|predicted - measured| / measured: the relative error in the row's metric."""
        return abs(self.predicted - self.measured) / self.measured


def row_parallel(row: PublishedRow) -> ParallelConfig:
    """The row's layout; GPUs beyond tp x pp are data-parallel replicas."""
    layout = row.layout
    per_replica = layout.get("tp", 1) * layout.get("pp", 1)
    if row.gpus % per_replica:
        raise ConfigError(f"{row.id}: gpus={row.gpus} is not a multiple of tp x pp = "
                          f"{per_replica}")
    values: dict[str, Any] = {"replicas": row.gpus // per_replica, **layout}
    for key in _FLAGS:
        if key in values:
            values[key] = bool(values[key])
    return ParallelConfig(**values)


def measured_total(row: PublishedRow, hw: HardwareSpec) -> float:
    """The measured value over all the row's GPUs (an inter-token latency is per stream)."""
    if row.scope == "per_gpu":
        return row.value * row.gpus
    if row.scope == "per_node":
        node = hw.interconnect.devices_per_node if hw.interconnect else 1
        return row.value * row.gpus / node
    return row.value


def priced_batch(row: PublishedRow, cfg: ModelConfig, hw: HardwareSpec, quant: Any,
                 par: ParallelConfig) -> int:
    """The row's batch, or for `batch: max` the most requests that fit at the mean context
    prompt_len + gen_len / 2 (module docstring)."""
    if row.batch is not None:
        return row.batch
    mean_context = row.prompt_len + math.ceil(row.gen_len / 2)
    fit = max_batch(cfg, hw, row.dtype, quant, mean_context, par, DEFAULT_RESERVE)
    if fit < 1:
        raise ConfigError(f"{row.id}: the weights of {cfg.name} do not fit {row.gpus} x "
                          f"{hw.name} in this layout")
    return fit


def price_row(row: PublishedRow, efficiency: Efficiency | None = None) -> RowPrice:
    """Price `row` as published (a row with `needs` cannot be priced: ConfigError)."""
    lacking = missing_features(row)
    if lacking:
        raise ConfigError(f"{row.id}: not priced yet: needs {', '.join(lacking)}")
    cfg = ModelConfig.from_name(row.model)
    hw = get_hardware(row.gpu)
    if efficiency is not None:
        hw = derate(hw, efficiency)
    quant = make_quant({"weights": row.weights, "group_size": row.group_size, "kv": row.kv,
                        "activations": row.activations})
    if row.weights == "native":  # the formats the released checkpoint stores (a preset's)
        quant = native_quant(quant, {"preset": row.model})
    par = row_parallel(row)
    batch = priced_batch(row, cfg, hw, quant, par)
    pp = price(cfg, hw, PricedWorkload(batch, batch, row.prompt_len, row.gen_len, row.dtype,
                                       quant, None, par))
    p = pp.prediction
    assert p is not None  # price() always predicts
    predicted = {"output_tokens_per_s": batch * par.replicas * row.gen_len / p.e2e_s,
                 "itl_ms": p.time_per_token_s * 1e3,
                 "decode_tokens_per_s": p.tokens_per_s,
                 "prefill_tokens_per_s": batch * par.replicas * row.prompt_len / p.ttft_s,
                 }[row.metric]
    return RowPrice(row, measured_total(row, hw), predicted, batch, pp)


def priceable(rows: list[PublishedRow]) -> list[PublishedRow]:
    """The rows infbench can price now (no missing feature)."""
    return [r for r in rows if not missing_features(r)]
