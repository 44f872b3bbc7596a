"""The scenario document: the top-level model, the checks between its sections, and its
expansion into points.

Sweeps: any list value of a sweepable workload key (batch_size, prompt_len, ...) and every
entry of the `sweep:` block (dotted key -> list of values) multiply into a cartesian
product; the sweep block is the outer loop, `variants:` (named configurations, one after
another) outside it.  A scenario expands to at most `MAX_POINTS` points.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from infbench.checkpoint.metadata import weights_kind
from infbench.core.config import Device, Dtype, EngineConfig
from infbench.core.device import auto_dtype, guess_device
from infbench.core.errors import ConfigError, UserError
from infbench.core.formats import INT4_GROUP_SIZES
from infbench.core.metric_names import LATENCY_METRICS, percentile_key
from infbench.hardware.spec import default_hardware
from infbench.roofline.shapes import largest_int4_group
from infbench.scenario.decoding import DecodingSection
from infbench.scenario.engine import EngineSection, SpeculativeSection
from infbench.scenario.errors import format_error
from infbench.scenario.measure import GateSection, MeasureSection
from infbench.scenario.model import ModelSection
from infbench.scenario.parallel import ParallelSection
from infbench.scenario.point import ScenarioPoint, point_label
from infbench.scenario.search import SearchSection
from infbench.scenario.target import TargetSection
from infbench.scenario.values import MAX_POINTS, Section
from infbench.scenario.workload import (
    DEFAULT_NUM_REQUESTS,
    SWEEPABLE_WORKLOAD,
    WorkloadPoint,
    WorkloadSection,
)

# The sections a `sweep:` or `variants:` key may start with.
SECTIONS = ("device", "dtype", "hardware", "model", "workload", "engine", "speculative",
            "measure", "gate", "decoding")


class Scenario(Section):
    """A scenario file: one model, one workload shape, optional sweeps and a CI gate."""

    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    device: Device = "auto"
    dtype: Literal["auto", Dtype] = "auto"
    """auto: float32 on CPU (bf16 is emulated there), bfloat16 on CUDA."""
    hardware: str | None = None
    """A hardware name, `local` (calibrated profile) or a profile .json (default: by device)."""
    model: ModelSection | None = None
    """Required, except with `target:` (there it only names the shape that `prediction`
    prices, with `hardware`)."""
    target: TargetSection | None = None
    """Measure an OpenAI-compatible server instead of the in-process engine
    (docs/client.md); loads no weights locally."""
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    speculative: SpeculativeSection = Field(default_factory=SpeculativeSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    """Tensor / pipeline / expert parallel degrees and replicas (the analytic model)."""
    decoding: DecodingSection = Field(default_factory=DecodingSection)
    """autoregressive (default) or masked diffusion (scenario/decoding.py, docs/diffusion.md)."""
    measure: MeasureSection = Field(default_factory=MeasureSection)
    gate: GateSection | None = None
    search: SearchSection | None = None
    """The capacity search of `infbench search` (docs/search.md); `run` does not read it."""
    sweep: dict[str, list[Any]] = Field(default_factory=dict)
    """Dotted key -> list of values, e.g. {model.attention.kind: [mha, gqa]}."""
    variants: list[dict[str, Any]] = Field(default_factory=list)
    """Named configurations, one after another (not multiplied with each other): each maps
    dotted keys to values, plus an optional `label`; the sweep and the workload lists run
    inside each.  For comparing unlike settings in one table (a dtype in one row, a
    quantization method in the next)."""

    _raw: dict[str, Any] = {}
    _source: str = "<scenario>"

    @model_validator(mode="wrap")
    @classmethod
    def _keep_raw(cls, data: Any, handler: Any) -> Scenario:
        scenario: Scenario = handler(data)
        if isinstance(data, dict):
            scenario._raw = copy.deepcopy(data)
        return scenario

    @model_validator(mode="after")
    def _model_or_target(self) -> Scenario:
        if self.model is None and self.target is None:
            raise ValueError("model: required key is missing (or give target: to measure a "
                             "server)")
        return self

    @model_validator(mode="after")
    def _torch_reference_is_measured(self) -> Scenario:
        # The reference is timed during the run: without it the gate has nothing to divide by.
        if self.measure.torch_reference and self.workload.kind in ("poisson", "trace",
                                                                   "sessions"):
            raise ValueError(
                f"measure.torch_reference: a {self.workload.kind} run's tokens/s follows its "
                "arrivals, not the engine's speed; allowed with workload.kind static or offline")
        if (self.gate is not None and self.gate.normalize == "torch_reference"
                and not self.measure.torch_reference):
            raise ValueError("gate.normalize: torch_reference needs measure.torch_reference: "
                             "true (the run times the reference only when asked)")
        if (self.gate is not None and self.gate.normalize == "torch_reference"
                and self.gate.metric != "output_tokens_per_s"):
            raise ValueError(f"gate.metric: {self.gate.metric} cannot be normalized by the torch "
                             "reference, which measures output tokens/s; allowed with "
                             "normalize: torch_reference: output_tokens_per_s")
        return self

    @model_validator(mode="after")
    def _search_is_runnable(self) -> Scenario:
        # Refused at load time, not after the first point of a search.
        search = self.search
        if search is None:
            return self
        key = f"workload.{search.workload_key}"
        if self.measure.slo is None:
            raise ValueError("search: needs measure.slo (the objectives whose attainment it "
                             "searches; docs/goodput.md)")
        if search.over == "rate" and self.workload.kind != "poisson":
            raise ValueError(f"search.over: rate needs workload.kind poisson (got "
                             f"{self.workload.kind}); allowed with other kinds: concurrency")
        if search.over == "concurrency" and self.workload.kind == "static":
            raise ValueError("search.over: concurrency sets workload.max_concurrency, which "
                             "kind static does not take (its batch_size is its concurrency); "
                             "allowed kinds: offline, poisson, trace")
        given = getattr(self.workload, search.workload_key)
        swept = [f"sweep.{key}" for k in self.sweep if k == key] + [
            f"variants[{i}].{key}" for i, v in enumerate(self.variants) if key in v]
        if isinstance(given, (list, tuple)) and len(given) > 1:
            swept.append(key)
        if swept:
            raise ValueError(f"search.over: {search.over} is what the search sets; remove it "
                             f"from {swept[0]} (a list there sweeps it)")
        return self

    @model_validator(mode="after")
    def _gated_percentile_is_measured(self) -> Scenario:
        # Refused here rather than after the whole run, when the gate finds no such key.
        if self.gate is None or self.gate.normalize == "mbu":
            return self
        head, _, stat = self.gate.metric.partition(".")
        measured = [percentile_key(q) for q in self.measure.percentiles]
        if head in LATENCY_METRICS and (stat or "p50") not in ("mean", *measured):
            raise ValueError(
                f"gate.metric: {self.gate.metric} needs {stat or 'p50'} in "
                f"measure.percentiles (got {[float(q) for q in self.measure.percentiles]}); "
                f"allowed statistics: mean, {', '.join(measured)}")
        return self

    @model_validator(mode="after")
    def _windows_fit_the_workload(self) -> Scenario:
        # measure.duration_s and measure.window against the workload (docs/windows.md).
        m, w = self.measure, self.workload
        capped = w.kind == "static" or w.max_concurrency is not None
        if (m.duration_s is not None or m.window is not None) and self.decoding.kind != \
                "autoregressive":
            key = "duration_s" if m.duration_s is not None else "window"
            raise ValueError(f"measure.{key}: a decoding.kind {self.decoding.kind} point runs "
                             "its own loop, not timed requests; allowed with decoding.kind "
                             "autoregressive")
        if m.duration_s is not None:
            if w.kind == "sessions":
                raise ValueError("measure.duration_s: kind sessions plays each conversation to "
                                 "its last turn; allowed with kind poisson or trace, kind "
                                 "static, or offline with workload.max_concurrency")
            if w.kind == "offline" and w.max_concurrency is None:
                raise ValueError("measure.duration_s: kind offline without max_concurrency "
                                 "submits every request at t=0; allowed with kind poisson or "
                                 "trace, kind static, or offline with workload.max_concurrency")
            if capped and w.num_requests is None:
                raise ValueError(f"measure.duration_s: kind {w.kind} sends requests as slots "
                                 "free up, so workload.num_requests must say the most it may "
                                 "send (the run stops at duration_s or when all are sent)")
            if m.duration_s > w.max_duration_s:
                raise ValueError(f"measure.duration_s: {m.duration_s:g} s is beyond "
                                 f"workload.max_duration_s {w.max_duration_s:g}; allowed: at "
                                 "most that (raise max_duration_s if a run that long is meant)")
        window = m.window
        if window is None:
            return self
        if window.steady_state and not capped and w.kind not in ("poisson", "trace"):
            raise ValueError(f"measure.window.steady_state: kind {w.kind} without "
                             "max_concurrency has neither a concurrency target nor arrivals "
                             "over time; allowed with workload.max_concurrency set, kind static "
                             "(batch_size), or an open loop (kind poisson or trace)")
        excluded_s = window.warmup_s + window.cooldown_s
        if m.duration_s is not None and excluded_s >= m.duration_s:
            raise ValueError(f"measure.window: warmup_s + cooldown_s ({excluded_s:g} s) leave "
                             f"nothing of measure.duration_s {m.duration_s:g} s; allowed: less "
                             "than duration_s")
        excluded = window.warmup_requests + window.cooldown_requests
        counts = [n for n in (w.num_requests or []) if n is not None]
        if w.kind == "sessions":  # a row per turn: the count is known once drawn
            counts = []
        elif not counts and not (w.kind == "poisson" and m.duration_s is not None):
            counts = list(w.batch_size) if w.kind == "static" else [DEFAULT_NUM_REQUESTS]
        if excluded and counts and excluded >= min(counts):
            raise ValueError(f"measure.window: warmup_requests + cooldown_requests ({excluded}) "
                             f"leave none of the {min(counts)} requests of a run; allowed: "
                             "fewer than workload.num_requests")
        return self

    @field_validator("hardware")
    @classmethod
    def _known_hardware(cls, value: str | None) -> str | None:
        from infbench.hardware.spec import HARDWARE, profile_path

        if value is None or value == "auto":
            return None
        if (value.lower() in HARDWARE or value.lower() == "local" or value.endswith(".json")
                or profile_path(value.lower()).exists()):
            return value
        raise ValueError(f"unknown value {value!r}; allowed: {', '.join(HARDWARE)}, local, "
                         "or a calibrated profile .json")

    @field_validator("sweep")
    @classmethod
    def _sweep_keys(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in value.items():
            if key.split(".")[0] not in SECTIONS:
                raise ValueError(f"{key}: unknown key; allowed: keys under {', '.join(SECTIONS)}")
            if not values:
                raise ValueError(f"{key}: needs at least one value")
        return value

    @field_validator("variants")
    @classmethod
    def _variant_keys(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not value:  # `variants: []` would run as if absent: say so instead
            raise ValueError("needs at least one variant (remove the key for none)")
        labels: set[str] = set()
        for i, variant in enumerate(value):
            for key, item in variant.items():
                if key == "label":
                    if not isinstance(item, str) or not item:
                        raise ValueError(f"[{i}].label: must be a non-empty string")
                    if item in labels:
                        raise ValueError(f"[{i}].label: {item!r} is used twice")
                    labels.add(item)
                elif key.split(".")[0] not in SECTIONS:
                    raise ValueError(f"[{i}].{key}: unknown key; allowed: label, keys under "
                                     f"{', '.join(SECTIONS)}")
        return value

    @property
    def source(self) -> str:
        return self._source

    def points(self) -> list[ScenarioPoint]:
        """Expand the variants (outermost), the sweep block and the workload lists (inner)
        into points."""
        base = {k: v for k, v in self._raw.items() if k not in ("sweep", "variants")}
        keys = list(self.sweep)
        variants = self.variants or [{}]
        out: list[ScenarioPoint] = []
        total = 0
        for i, variant in enumerate(variants):
            vdata = base
            if variant:
                vdata = copy.deepcopy(base)
                for key, value in variant.items():
                    if key != "label":
                        set_dotted(vdata, key, value, self._source,
                                   what=f"variants[{i}].{key}")
            vsub = validate(vdata, self._source) if variant else self
            raw_lists = [v for k, v in (vsub._raw.get("workload") or {}).items()
                         if k in SWEEPABLE_WORKLOAD and isinstance(v, list)]
            total += math.prod(len(v) for v in [*self.sweep.values(), *raw_lists])
            if total > MAX_POINTS:
                raise UserError(f"{self._source}: the sweeps expand to {total} points; at "
                                f"most {MAX_POINTS} per scenario (split it into several files)")
            label = {"variant": variant.get("label") or point_label(
                {k: v for k, v in variant.items() if k != "label"})} if variant else {}
            for combo in itertools.product(*self.sweep.values()):
                sub: Scenario = vsub
                if keys:
                    data = copy.deepcopy(vdata)
                    for key, value in zip(keys, combo, strict=True):
                        set_dotted(data, key, value, self._source, what="sweep." + key)
                    sub = validate(data, self._source, sweep_keys=keys)
                swept = {**label, **{_short(k): v for k, v in zip(keys, combo, strict=True)}}
                raw_wl = sub._raw.get("workload") or {}
                lists = [k for k in SWEEPABLE_WORKLOAD if isinstance(raw_wl.get(k), list)]
                values = [getattr(sub.workload, k) for k in lists]
                for wl_combo in itertools.product(*values):
                    point_swept = {**swept, **dict(zip(lists, wl_combo, strict=True))}
                    out.append(sub._point(len(out), point_swept))
        return out

    def _workload(self, swept: dict[str, Any]) -> WorkloadPoint:
        """The section's values at this point: a swept key's value, else its first (only)."""
        values = {f.name: getattr(self.workload, f.name)
                  for f in dataclasses.fields(WorkloadPoint)}
        for key in SWEEPABLE_WORKLOAD:
            given = values[key]
            values[key] = swept.get(key, given[0] if given else None)
        return WorkloadPoint(**values)

    def _point(self, index: int, swept: dict[str, Any]) -> ScenarioPoint:
        device = guess_device(self.device)
        dtype: str = self.dtype
        dtype_reason = ""
        if dtype == "auto":
            dtype, why = auto_dtype(device)
            # a target's dtype is the server's business: no note about this machine's
            dtype_reason = f"dtype auto -> {dtype} ({why})" if self.target is None else ""
        model = self.model
        try:
            if model is not None:  # which weights run (real | random), as the loader will
                model = model.model_copy(update={"weights": weights_kind(
                    model.source(), model.weights,
                    model.overrides.model_dump(exclude_unset=True))})
            workload = self._workload(swept)
            point = ScenarioPoint(
                name=self.name,
                index=index,
                device=self.device,
                dtype=dtype,
                dtype_reason=dtype_reason,
                hardware=self.hardware or default_hardware(device)
                if self.target is None else self.hardware or "unknown",
                model=model,
                workload=workload,
                engine=EngineConfig(**self.engine.model_dump()),
                speculative=self.speculative.config(),
                measure=self.measure,
                parallel=self.parallel.config(),
                gate=self.gate,
                swept=swept,
                source=self._source,
                target=self.target,
                decoding=self.decoding.resolved(workload.gen_len,
                                                {} if model is None else model.source()),
            )
        except ConfigError as exc:
            where = f" (at {point_label(swept)})" if swept else ""
            raise UserError(f"{self._source}: {exc}{where}") from None
        return _with_int4_group(point)


def validate(data: dict[str, Any], source: str, sweep_keys: Sequence[str] = ()) -> Scenario:
    """`data` as a Scenario of file `source`; the first problem is one UserError line."""
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        first = format_error(errors[0], data, Scenario, sweep_keys)
        raise UserError(f"{source}: {first}{more}") from None
    scenario._source = source
    return scenario


def set_dotted(data: dict[str, Any], key: str, value: Any, source: str, what: str) -> None:
    """data[a][b][c] = value for key `a.b.c`, creating the mappings on the way."""
    node = data
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UserError(f"{source}: {what}: {'.'.join(parts[:i + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def _short(key: str) -> str:
    return key[len("workload."):] if key.startswith("workload.") else key


def _with_int4_group(point: ScenarioPoint) -> ScenarioPoint:
    """int4 weights without model.quant.group_size: the largest group that divides the
    model's projections (SmolLM2's 576 columns are 4.5 x 128), said in the point's notes.
    A group the scenario sets is kept, and a bad one is refused by the quantizer as before."""
    model = point.model
    if model is None or model.quant_config().weights != "int4" or (
            "group_size" in model.quant.model_fields_set):
        return point
    group, widths = largest_int4_group(point.model_config())
    if group is None or group == model.quant_config().group_size:
        return point
    quant = model.quant.model_copy(update={"group_size": group})
    note = (f"model.quant.group_size not set: int4 groups of {group}, the largest of "
            f"{', '.join(map(str, INT4_GROUP_SIZES))} that divides every projection's input "
            f"width ({', '.join(map(str, widths))})")
    return dataclasses.replace(point, model=model.model_copy(update={"quant": quant}),
                               notes=(*point.notes, note))
