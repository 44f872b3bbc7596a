"""A scenario's resolved points: typed, frozen, all scalars: what `run`, `predict` and
`serve` consume (the sections of `scenario.schema` say what each key means)."""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from infbench.checkpoint.metadata import native_quant
from infbench.core.config import (
    EngineConfig,
    ModelConfig,
    PruneConfig,
    QuantConfig,
    make_prune,
    make_quant,
)
from infbench.core.decoding import DiffusionConfig
from infbench.core.errors import ConfigError, UserError
from infbench.core.metric_names import DEFAULT_PERCENTILES
from infbench.core.parallel import ParallelConfig
from infbench.core.speculative import SpeculativeConfig
from infbench.scenario.target import TargetSection

# Allowed values of the scenario-only keys, defined once (the model's are in core/config.py);
# the sections of scenario/schema.py are typed by them.
WorkloadKind = Literal["static", "offline", "poisson", "trace"]
DatasetKind = Literal["sharegpt", "jsonl", "trace"]
PromptSource = Literal["random", "text"]
LengthDist = Literal["fixed", "uniform", "normal", "lognormal"]
NormalizeMode = Literal["none", "mbu", "roofline_fraction", "reference", "torch_reference"]
OverContext = Literal["drop", "refuse"]
WORKLOAD_KINDS: tuple[str, ...] = typing.get_args(WorkloadKind)
DATASET_KINDS: tuple[str, ...] = typing.get_args(DatasetKind)
# Without workload.num_requests: static runs batch_size requests, the other kinds this many.
DEFAULT_NUM_REQUESTS = 64
PROMPT_SOURCES: tuple[str, ...] = typing.get_args(PromptSource)
LENGTH_DISTS: tuple[str, ...] = typing.get_args(LengthDist)
NORMALIZE_MODES: tuple[str, ...] = typing.get_args(NormalizeMode)
OVER_CONTEXT: tuple[str, ...] = typing.get_args(OverContext)
# workload.max_duration_s: a run's expected arrivals span at most this by default (a rate of
# 1e-9 would wait for decades), and at most MAX_DURATION_S when raised.
DEFAULT_MAX_DURATION_S = 24 * 3600.0
MAX_DURATION_S = 365 * 24 * 3600.0


@dataclass(frozen=True)
class WorkloadPoint:
    """One workload shape, all scalars (see WorkloadSection for the meaning of each key)."""

    kind: str = "static"
    batch_size: int = 1
    prompt_len: int = 128
    gen_len: int = 32
    num_requests: int | None = None  # None: by kind (num_prompts: static batch_size, else 64)
    rate: float | None = None  # math.inf: every request at t=0
    shared_prefix_len: int = 0
    samples_per_prompt: int = 1
    seed: int = 0
    prompt_source: str = "random"
    prompt_len_dist: str = "fixed"
    gen_len_dist: str = "fixed"
    len_spread: float = 0.5
    chat: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    ignore_eos: bool = True
    burstiness: float = 1.0
    max_concurrency: int | None = None
    dataset: DatasetConfig | None = None
    max_duration_s: float = DEFAULT_MAX_DURATION_S

    def __post_init__(self) -> None:
        if isinstance(self.dataset, dict):  # from the section's model_dump
            object.__setattr__(self, "dataset", DatasetConfig(**self.dataset))
        if self.kind not in WORKLOAD_KINDS:
            raise ConfigError(f"workload.kind: unknown value {self.kind!r}; "
                              f"allowed: {', '.join(WORKLOAD_KINDS)}")
        for key, value, allowed in (
            ("prompt_source", self.prompt_source, PROMPT_SOURCES),
            ("prompt_len_dist", self.prompt_len_dist, LENGTH_DISTS),
            ("gen_len_dist", self.gen_len_dist, LENGTH_DISTS),
        ):
            if value not in allowed:
                raise ConfigError(f"workload.{key}: unknown value {value!r}; "
                                  f"allowed: {', '.join(allowed)}")
        for key in ("batch_size", "prompt_len", "gen_len", "num_requests", "samples_per_prompt"):
            if getattr(self, key) is not None and getattr(self, key) <= 0:
                raise ConfigError(f"workload.{key}: must be > 0 (got {getattr(self, key)})")
        if self.kind == "poisson" and (self.rate is None or not self.rate > 0):
            raise ConfigError(f"workload.rate: required for kind 'poisson' as requests per "
                              f"second > 0 or inf (got {self.rate})")
        if not 0 <= self.shared_prefix_len <= self.prompt_len:
            raise ConfigError(f"workload.shared_prefix_len: must be in 0..workload.prompt_len "
                              f"({self.prompt_len}) (got {self.shared_prefix_len})")
        if self.chat and self.prompt_source != "text":
            raise ConfigError("workload.chat: applies to text prompts; set "
                              "workload.prompt_source: text (got random)")
        self._check_arrivals()

    def _check_arrivals(self) -> None:
        """The keys of this module's workload additions that only make sense together."""
        if not self.burstiness > 0 or not math.isfinite(self.burstiness):
            raise ConfigError(f"workload.burstiness: must be a finite number > 0 (1.0: Poisson, "
                              f"< 1 burstier) (got {self.burstiness})")
        if self.max_concurrency is not None and self.max_concurrency <= 0:
            raise ConfigError(f"workload.max_concurrency: must be > 0 or null "
                              f"(got {self.max_concurrency})")
        if self.max_concurrency is not None and self.kind == "static":
            raise ConfigError("workload.max_concurrency: kind static already runs batch_size "
                              "requests at a time; allowed with kind offline, poisson, trace")
        if self.kind == "static" and self.num_prompts < self.batch_size:
            raise ConfigError(f"workload.num_requests: kind static runs batch_size "
                              f"({self.batch_size}) requests at a time; allowed: at least "
                              f"batch_size, or unset (got {self.num_requests})")
        if self.burstiness != 1.0 and self.kind != "poisson":
            raise ConfigError(f"workload.burstiness: shapes poisson arrivals; allowed with "
                              f"workload.kind poisson (got kind {self.kind})")
        trace = self.dataset is not None and self.dataset.kind == "trace"
        if self.kind == "trace" and not trace:
            raise ConfigError("workload.kind: 'trace' replays a trace's timestamps and needs "
                              "workload.dataset: {kind: trace, path: FILE.csv}")
        if self.kind == "trace" and self.rate is not None:
            raise ConfigError("workload.rate: kind trace takes its arrivals from the trace; "
                              "remove rate (or use kind poisson for the trace's lengths at a "
                              "rate)")
        self._check_duration()
        if self.dataset is not None:
            # A trace gives lengths only: its prompts are random ids or windows of text.
            text_source = "random" if trace else self.prompt_source
            for key, value, default in (("shared_prefix_len", self.shared_prefix_len, 0),
                                        ("prompt_source", text_source, "random"),
                                        ("chat", self.chat, False)):
                if value != default:
                    raise ConfigError(f"workload.{key}: the prompts come from "
                                      f"workload.dataset ({self.dataset.path}); remove {key}")

    def _check_duration(self) -> None:
        """Poisson arrivals expected to span more than max_duration_s are refused here, at
        load (a trace's span is known once its file is read: measure/workload.py)."""
        if not 0 < self.max_duration_s <= MAX_DURATION_S:
            raise ConfigError(f"workload.max_duration_s: must be in (0, {MAX_DURATION_S:.0f}] "
                              f"seconds (got {self.max_duration_s})")
        if self.kind != "poisson" or self.rate is None or not math.isfinite(self.rate):
            return
        expected = (self.num_prompts - 1) / self.rate  # the first arrives at t=0
        if expected > self.max_duration_s:
            raise ConfigError(
                f"workload.rate: {self.num_prompts} requests at {self.rate:g}/s arrive over "
                f"about {expected:.3g} s ({_readable_s(expected)}), beyond "
                f"workload.max_duration_s {self.max_duration_s:g} "
                f"({_readable_s(self.max_duration_s)}); allowed: a higher rate, fewer "
                f"requests, or max_duration_s up to {MAX_DURATION_S:.0f} when a run that long "
                "is meant")

    @property
    def is_realtime(self) -> bool:
        """Arrivals replayed on the wall clock (poisson, trace), not all at t=0."""
        return self.kind in ("poisson", "trace")

    @property
    def num_prompts(self) -> int:
        """Requests (distinct prompts) of a run: num_requests, or when unset batch_size for
        kind static and DEFAULT_NUM_REQUESTS for the other kinds."""
        if self.num_requests is not None:
            return self.num_requests
        return self.batch_size if self.kind == "static" else DEFAULT_NUM_REQUESTS

    @property
    def num_sequences(self) -> int:
        return self.num_prompts * self.samples_per_prompt


def _readable_s(seconds: float) -> str:
    for unit, size, above in (("years", 365 * 86400.0, 1.0), ("days", 86400.0, 2.0),
                              ("h", 3600.0, 1.0)):
        if seconds >= size * above:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


@dataclass(frozen=True)
class DatasetConfig:
    """workload.dataset (DatasetSection documents the keys; measure/datasets.py reads it)."""

    kind: str  # sharegpt | jsonl | trace
    path: str
    time_scale: float = 1.0
    over_context: str = "drop"  # drop | refuse

    def __post_init__(self) -> None:
        if self.kind not in DATASET_KINDS:
            raise ConfigError(f"workload.dataset.kind: unknown value {self.kind!r}; "
                              f"allowed: {', '.join(DATASET_KINDS)}")
        if self.over_context not in OVER_CONTEXT:
            raise ConfigError(f"workload.dataset.over_context: unknown value "
                              f"{self.over_context!r}; allowed: {', '.join(OVER_CONTEXT)}")


@dataclass(frozen=True)
class SloConfig:
    """measure.slo: latency objectives in milliseconds (None: not an objective)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    target: float = 0.9


@dataclass(frozen=True)
class MeasureConfig:
    warmup: int = 1
    repeats: int = 3
    profile: str = "none"  # none | ncu
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES  # latency stats: mean + these
    torch_reference: bool = False  # time measure/torch_reference.py between the repeats
    eval_tokens: int | None = None  # accuracy tokens (None: 2048 when quantized or pruned)
    slo: SloConfig | None = None  # goodput objectives (measure/goodput.py)

    def __post_init__(self) -> None:
        # The section hands over a list; a tuple keeps the frozen point hashable.
        object.__setattr__(self, "percentiles", tuple(float(q) for q in self.percentiles))
        if isinstance(self.slo, dict):  # from the section's model_dump
            object.__setattr__(self, "slo", SloConfig(**self.slo))


@dataclass(frozen=True)
class GateConfig:
    metric: str = "output_tokens_per_s"
    baseline: str | None = None
    max_regression: float = 0.05
    normalize: str = "none"  # none | mbu | roofline_fraction | reference | torch_reference


@dataclass(frozen=True)
class ModelPoint:
    """The point's model: one source (preset | path | gguf), the keys the scenario set in
    model.overrides and model.attention, the quant and prune sections, and which weights run."""

    preset: str | None = None
    path: str | None = None
    gguf: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # only the keys the user set
    attention: dict[str, Any] = field(default_factory=dict)  # only the keys the user set
    quant: dict[str, Any] = field(default_factory=dict)  # the quant section, every key
    prune: dict[str, Any] = field(default_factory=dict)  # the prune section, every key
    # real | random, resolved as the loader will (the gate compares it between runs)
    weights: str = "auto"

    def source(self) -> dict[str, str]:
        """{"preset" | "path" | "gguf": value}: what the loader and the readers take."""
        return {k: v for k, v in (("preset", self.preset), ("path", self.path),
                                  ("gguf", self.gguf)) if v is not None}

    def changes(self) -> dict[str, Any]:
        """overrides + attention as `ModelConfig.with_overrides` and `load_model` take them."""
        out = dict(self.overrides)
        if self.attention:
            out["attention"] = dict(self.attention)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The stored form inside a result (the keys results have always had)."""
        return {**self.source(), "overrides": copy.deepcopy(self.overrides),
                "attention": copy.deepcopy(self.attention), "quant": copy.deepcopy(self.quant),
                "prune": copy.deepcopy(self.prune), "weights": self.weights}


@dataclass(frozen=True)
class ScenarioPoint:
    """One fully resolved point of a scenario: what `bench.run_point` and `predict` consume."""

    name: str
    index: int
    device: str  # auto | cpu | cuda (as written; the runner resolves auto)
    dtype: str  # resolved: float32 | float16 | bfloat16
    hardware: str  # resolved: cpu on a CPU, else the entry of the GPU NVML names
    model: ModelPoint | None  # None: a target scenario without a model section
    workload: WorkloadPoint
    engine: EngineConfig
    speculative: SpeculativeConfig
    measure: MeasureConfig
    gate: GateConfig | None
    swept: dict[str, Any] = field(default_factory=dict)  # swept keys -> values at this point
    source: str = "<scenario>"  # the scenario file, for error messages
    dtype_reason: str = ""  # with dtype: auto, what it resolved to and why (else empty)
    target: TargetSection | None = None  # the `target:` section: a server measured instead
    parallel: ParallelConfig = ParallelConfig()  # the `parallel:` section
    decoding: DiffusionConfig | None = None  # the `decoding:` section; None: autoregressive

    @property
    def label(self) -> str:
        """`batch_size=8,prompt_len=128` from the swept keys, or `default`."""
        return point_label(self.swept)

    def model_source(self) -> dict[str, str]:
        return {} if self.model is None else self.model.source()

    def model_config(self) -> ModelConfig:
        """The ModelConfig of this point: preset or loaded config, then overrides + attention."""
        m = self.model
        if m is None:
            raise UserError(f"{self.source}: model: no model section; this target scenario "
                            "names no model shape (add model: to price it)")
        try:
            if m.preset is not None:
                cfg = ModelConfig.from_name(m.preset)
            else:
                from infbench.checkpoint import metadata as configs

                if m.path is not None:
                    cfg = configs.config_from_hf_dir(m.path)
                else:
                    cfg = configs.config_from_gguf(configs.resolve_gguf(str(m.gguf)))
            changes = m.changes()
            cfg = cfg.with_overrides(**changes) if changes else cfg
            prune = self.prune_config()
            return prune.pruned_shape(cfg) if prune.active else cfg  # the shape that runs
        except UserError as exc:
            raise UserError(f"{self.source}: {self._where()}{exc}") from None

    def quant_config(self) -> QuantConfig:
        """model.quant; with native weights, priced by the GGUF file's own tensor types."""
        m = self.model or ModelPoint()
        try:
            quant = make_quant(dict(m.quant))
            if quant.weights != "native":
                return quant
            return native_quant(quant, m.source(), m.weights, m.overrides or None)
        except UserError as exc:
            raise UserError(f"{self.source}: {self._where()}{exc}") from None

    def prune_config(self) -> PruneConfig:
        try:
            return make_prune(dict((self.model or ModelPoint()).prune))
        except ConfigError as exc:
            raise UserError(f"{self.source}: {self._where()}{exc}") from None

    def _where(self) -> str:
        return f"point {self.index} ({self.label}): " if self.swept else ""

    def to_dict(self) -> dict[str, Any]:
        """The resolved point as JSON-able data (stored inside every result file)."""
        return {
            "name": self.name, "index": self.index, "label": self.label, "source": self.source,
            "device": self.device, "dtype": self.dtype, "hardware": self.hardware,
            "model": {} if self.model is None else self.model.to_dict(),
            "workload": _workload_dict(self.workload),
            "engine": dataclasses.asdict(self.engine),
            "speculative": dataclasses.asdict(self.speculative),
            "measure": dataclasses.asdict(self.measure),
            "gate": dataclasses.asdict(self.gate) if self.gate is not None else None,
            "swept": dict(self.swept),
            **({"target": self.target.model_dump()} if self.target is not None else {}),
            **({"decoding": self.decoding.to_dict()} if self.decoding is not None else {}),
        }


def _workload_dict(workload: WorkloadPoint) -> dict[str, Any]:
    """The workload as strict JSON: num_requests as run (resolved when unset), a rate of
    inf as the string "inf"."""
    out = dataclasses.asdict(workload)
    out["num_requests"] = workload.num_prompts
    if out["rate"] == math.inf:
        out["rate"] = "inf"
    return out


def point_label(swept: dict[str, Any]) -> str:
    """`batch_size=8,prompt_len=128`; a swept mapping reads `model.attention=gqa(kv_heads=8)`."""
    return ",".join(f"{k}={_label_value(v)}" for k, v in swept.items()) or "default"


def _label_value(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("kind")
        rest = ",".join(f"{k}={v}" for k, v in value.items() if k != "kind")
        if kind is None:
            return "{" + rest + "}"
        return f"{kind}({rest})" if rest else str(kind)
    return str(value)


