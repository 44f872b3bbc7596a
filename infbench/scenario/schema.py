"""Scenario YAML -> validated `Scenario` -> a list of `ScenarioPoint`s (one per sweep point).

User input is validated once, here, with pydantic (extra keys forbidden at every
level).  Every problem becomes a one-line `UserError` that names the file, the
dotted key and what is allowed, e.g.
`scenarios/x.yaml: workload.batch_size: must be > 0 (got -1)`.

Values are strict: a count is a plain integer (`true`, `2.5` and `"8"` are refused, not
coerced), a real number is finite, and every count or rate is at most
`MAX_VALUE` (2**24); a scenario expands to at most `MAX_POINTS` points.

Sweeps: any list value of a sweepable workload key (batch_size, prompt_len, ...)
and every entry of the `sweep:` block (dotted key -> list of values) multiply
into a cartesian product; the sweep block is the outer loop.  Points are plain
frozen dataclasses, so the engine and the analytic model never see pydantic.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import math
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from infbench.checkpoint.metadata import weights_kind
from infbench.core.config import (
    PRESETS,
    ActivationQuant,
    AttentionKind,
    Backend,
    Device,
    Dtype,
    EngineConfig,
    FeatureMap,
    HeadQuant,
    KvQuant,
    ModelConfig,
    ModelWeights,
    QuantMethod,
    WeightQuant,
)
from infbench.core.device import auto_dtype, guess_device
from infbench.core.errors import ConfigError, DamagedFileError, UserError
from infbench.core.io import read_text
from infbench.core.metric_names import (
    DEFAULT_PERCENTILES,
    GATE_METRICS,
    LATENCY_METRICS,
    SCALAR_METRICS,
    is_gate_metric,
    percentile_key,
)
from infbench.core.speculative import SpeculativeConfig, SpeculativeMethod
from infbench.hardware.spec import default_hardware
from infbench.scenario.decoding import DecodingSection
from infbench.scenario.parallel import ParallelSection
from infbench.scenario.point import (
    DEFAULT_MAX_DURATION_S,
    MAX_DURATION_S,
    DatasetKind,
    GateConfig,
    LengthDist,
    MeasureConfig,
    ModelPoint,
    NormalizeMode,
    OverContext,
    PromptSource,
    ScenarioPoint,
    WorkloadKind,
    WorkloadPoint,
    point_label,
)
from infbench.scenario.target import TargetSection

_ENGINE = EngineConfig()
# Workload keys whose list values sweep, in the order they nest in the product.
SWEEPABLE_WORKLOAD = (
    "batch_size", "prompt_len", "gen_len", "num_requests", "rate", "shared_prefix_len",
    "samples_per_prompt",
)
_SECTIONS = ("device", "dtype", "hardware", "model", "workload", "engine", "speculative",
             "measure", "gate", "decoding")


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) or value is None else [value]


def parse_fraction(value: Any) -> float:
    """The one parser of regression thresholds: '5%' -> 0.05, 0.05 -> 0.05, in [0, 1).

    A bare number of 1 or more is refused as ambiguous (is 5 meant as 5% or 500%?), and a
    threshold of 100% or more would pass any regression.  Raises ValueError with the reason.
    """
    if isinstance(value, bool):
        raise ValueError(f"must be a fraction like 0.05 or a percentage like '5%' (got {value!r})")
    text = str(value).strip()
    try:
        frac = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"must be a fraction like 0.05 or a percentage like '5%' "
                         f"(got {value!r})") from None
    if not 0 <= frac < 1:  # also refuses NaN
        raise ValueError(f"must be in [0, 1) as a fraction or [0%, 100%) as a percentage "
                         f"(got {value!r})")
    return frac


# Sanity limits: larger values are typos or overflows, not workloads (same bound as the
# engine's and the analytic model's MAX_TOKENS / MAX_BATCH).
MAX_VALUE = 2**24
MAX_POINTS = 10_000  # sweep points of one scenario
MAX_SEED = 2**63 - 1
MAX_BYTES = 2.0**50  # engine.kv_cache_memory given in bytes

# strict: YAML `true`, `2.5` or `"8"` is an error, never silently a count of 1, 2 or 8.
PosInt = Annotated[int, Field(gt=0, le=MAX_VALUE, strict=True)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_VALUE, strict=True)]
PosFloat = Annotated[float, Field(gt=0, le=MAX_VALUE, strict=True, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, le=MAX_VALUE, strict=True, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, strict=True, allow_inf_nan=False)]
StrictBool = Annotated[bool, Field(strict=True)]
_SweepPosInt = Annotated[list[PosInt], Field(min_length=1), BeforeValidator(
    _as_list, json_schema_input_type=Union[PosInt, list[PosInt]])]
_SweepNonNegInt = Annotated[list[NonNegInt], Field(min_length=1), BeforeValidator(
    _as_list, json_schema_input_type=Union[NonNegInt, list[NonNegInt]])]
_SweepPosFloat = Annotated[list[PosFloat] | None, Field(min_length=1), BeforeValidator(
    _as_list, json_schema_input_type=Union[PosFloat, list[PosFloat], None])]
_OptSweepPosInt = Annotated[list[PosInt] | None, Field(min_length=1), BeforeValidator(
    _as_list, json_schema_input_type=Union[PosInt, list[PosInt], None])]


def _rate_value(value: Any) -> Any:
    """`inf`, `.inf` or "inf" (vLLM's --request-rate inf: every request at t=0) -> math.inf."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", ".inf", "infinity"):
        return math.inf
    return value


def _rate_check(value: Any) -> Any:
    """A rate is a finite number in (0, 2**24] or inf (PosFloat's checks, inf let through)."""
    if isinstance(value, float) and value == math.inf:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number > 0 or inf (got {_short_repr(value)})")
    if not math.isfinite(value) or not value > 0:
        raise ValueError(f"must be a number > 0 or inf (got {_short_repr(value)})")
    if value > MAX_VALUE:
        raise ValueError(f"must be <= {MAX_VALUE} (2**24, infbench's sanity limit) or inf "
                         f"(got {_short_repr(value)})")
    return float(value)


Rate = Annotated[Any, BeforeValidator(_rate_check), BeforeValidator(_rate_value)]
_SweepRate = Annotated[list[Rate] | None, Field(min_length=1), BeforeValidator(
    _as_list, json_schema_input_type=Union[float, str, list[Union[float, str]], None])]

_CONFIG = ConfigDict(extra="forbid", coerce_numbers_to_str=True, use_attribute_docstrings=True)


class _Section(BaseModel):
    model_config = _CONFIG


class QuantSection(_Section):
    weights: WeightQuant = "none"
    """none | int8 (per output channel) | int4 (groups of group_size) | native (a GGUF file's
    own Q4_0/Q4_1/Q8_0 tensors)."""
    group_size: PosInt = 128
    """int4: input columns per group (32, 64 or 128)."""
    kv: KvQuant = "none"
    """KV cache: none (model dtype) | int8 | fp8 (CUDA only)."""
    method: QuantMethod = "rtn"
    """rtn (round to nearest) | awq (int4) | llm_int8 (int8 with outlier columns)."""
    outlier_threshold: PosFloat = 6.0
    """llm_int8: activation magnitude above which an input column stays in the model dtype."""
    calibration_tokens: PosInt = 1024
    """awq / llm_int8: calibration tokens (held-out from the eval text's test split)."""
    head: HeadQuant = "model"
    """The LM head: model (the model dtype) | int8 (per-row scales, as llama.cpp stores it;
    a tied head gets an int8 copy, the embedding gather stays in the model dtype)."""
    activations: ActivationQuant = "float"
    """What quantized projections multiply: float (exact) | int8 (32-column blocks rounded
    to int8, llama.cpp's arithmetic; integer dot products at batch 1 on AVX512-VNNI CPUs)."""


class PruneSection(_Section):
    layers: Annotated[int, Field(ge=0, le=MAX_VALUE, strict=True)] = 0
    """Whole decoder layers to drop, the least important first (importance measured on
    calibration text)."""
    mlp_fraction: Annotated[float, Field(ge=0, lt=1, strict=True, allow_inf_nan=False)] = 0.0
    """Fraction of every MLP's intermediate width to remove, the channels with the smallest
    activation magnitude on calibration text first."""
    calibration_tokens: PosInt = 1024
    """Calibration tokens (from the eval text's calibration split)."""


class AttentionSection(_Section):
    """Attention/mixer settings; unset fields keep the model's own (see config.AttentionConfig)."""

    kind: AttentionKind | None = None
    kv_heads: PosInt | None = None
    window: PosInt | None = None
    global_every: PosInt | None = None
    cla_group: PosInt | None = None
    kv_lora_rank: PosInt | None = None
    q_lora_rank: PosInt | None = None
    qk_rope_head_dim: PosInt | None = None
    qk_nope_head_dim: PosInt | None = None
    v_head_dim: PosInt | None = None
    feature_map: FeatureMap | None = None
    feature_dim: PosInt | None = None
    d_state: PosInt | None = None
    d_conv: PosInt | None = None
    expand: PosInt | None = None
    dt_rank: PosInt | None = None
    attn_every: PosInt | None = None


def _strict_hint(hint: Any) -> Any:
    """int -> PosInt, float -> a finite positive float, bool -> strict, also in `X | None`."""
    if hint is int:
        return PosInt
    if hint is float:
        return Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
    if hint is bool:
        return StrictBool
    if typing.get_origin(hint) in (Union, types.UnionType):
        return Union[tuple(_strict_hint(a) for a in typing.get_args(hint))]
    return hint


def _overrides_section() -> Any:
    """A pydantic model with every ModelConfig field (optional), typed like the dataclass."""
    hints = typing.get_type_hints(ModelConfig)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(ModelConfig):
        if f.name == "attention":  # model.attention has its own section
            continue
        hint = dict[str, Any] if f.name in ("moe", "rope_scaling") else _strict_hint(hints[f.name])
        fields[f.name] = (Union[hint, None], None)
    return create_model("OverridesSection", __base__=_Section, **fields)


if typing.TYPE_CHECKING:
    OverridesSection = _Section
else:
    OverridesSection = _overrides_section()


class ModelSection(_Section):
    preset: str | None = None
    """A preset name from infbench.core.config.PRESETS."""
    path: str | None = None
    """A Hugging Face model directory (config.json + safetensors)."""
    gguf: str | None = None
    """A .gguf file, or `smollm2-135m` for the packaged SmolLM2-135M-Instruct."""
    overrides: OverridesSection = Field(default_factory=OverridesSection)
    """ModelConfig fields to replace, e.g. {num_layers: 2}."""
    attention: AttentionSection = Field(default_factory=AttentionSection)
    quant: QuantSection = Field(default_factory=QuantSection)
    prune: PruneSection = Field(default_factory=PruneSection)
    weights: ModelWeights = "auto"
    """auto: a preset naming a released model (smollm2-135m) runs its real weights when they are
    installed; random: seeded random weights, enough for benchmarks of shapes."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value.lower() not in PRESETS:
            raise ValueError(f"unknown value {value!r}; allowed: {', '.join(PRESETS)}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        given = [k for k in ("preset", "path", "gguf") if getattr(self, k) is not None]
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ValueError(f"give exactly one of preset, path, gguf (got {got})")
        return self


class DatasetSection(_Section):
    kind: DatasetKind
    """sharegpt: a JSON list of {conversations: [{from: human, value}, {from: gpt, value}]};
    jsonl: one {prompt, optional output_len} per line; trace: an Azure LLM inference trace
    CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    path: Annotated[str, Field(min_length=1)]
    """The file (relative to the working directory), or `infbench:samples/NAME` for the
    small sample files shipped with infbench."""
    time_scale: PosFloat = 1.0
    """trace: multiplies the gaps between the trace's timestamps (0.1 replays 10x faster)."""
    over_context: OverContext = "drop"
    """Text entries whose prompt + output exceed the model context: drop (skipped before
    sampling, with a note counting them, as vLLM's ShareGPT sampler skips them) or refuse
    (the first is a one-line error naming its line or entry)."""


class WorkloadSection(_Section):
    kind: WorkloadKind = "static"
    """static: num_requests (default batch_size) requests, batch_size at a time; offline:
    num_requests at t=0; poisson: arrivals at `rate`; trace: the dataset trace's timestamps."""
    batch_size: _SweepPosInt = [1]
    prompt_len: _SweepPosInt = [128]
    gen_len: _SweepPosInt = [32]
    num_requests: _OptSweepPosInt = None
    """Requests per run; unset: batch_size for kind static, 64 for the other kinds."""
    rate: _SweepRate = None
    """Arrival rate in requests per second (required for kind poisson); inf: all at t=0."""
    burstiness: PosFloat = 1.0
    """kind poisson: gamma-distributed gaps of shape `burstiness` and mean 1/rate (1: a
    Poisson process; < 1 burstier, > 1 more regular), as vLLM's --burstiness."""
    max_concurrency: PosInt | None = None
    """Client-side cap on outstanding requests: a request is submitted only when fewer are
    in flight (its TTFT counts from that submission); null: no cap."""
    max_duration_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S, strict=True,
                                           allow_inf_nan=False)] = DEFAULT_MAX_DURATION_S
    """The longest a run's arrivals may span (poisson: (requests - 1) / rate expected; trace:
    its drawn rows' span times time_scale); longer is refused before the run (24 h unless
    raised, at most 365 days)."""
    dataset: DatasetSection | None = None
    """Prompts (and output lengths, and for a trace arrival times) from a file."""
    shared_prefix_len: _SweepNonNegInt = [0]
    """The first N tokens of every prompt are identical (a shared system prompt)."""
    samples_per_prompt: _SweepPosInt = [1]
    seed: Annotated[int, Field(ge=0, le=MAX_SEED, strict=True)] = 0
    prompt_source: PromptSource = "random"
    """random token ids, or windows of the shipped public-domain text (needs a tokenizer)."""
    prompt_len_dist: LengthDist = "fixed"
    gen_len_dist: LengthDist = "fixed"
    len_spread: Annotated[float, Field(ge=0, le=100, strict=True, allow_inf_nan=False)] = 0.5
    """Relative spread of the length distributions (uniform: L*(1-s)..L*(1+s))."""
    chat: StrictBool = False
    """Wrap text prompts in the model's chat template."""
    temperature: NonNegFloat = 0.0
    top_k: NonNegInt = 0
    top_p: Annotated[float, Field(gt=0, le=1, strict=True, allow_inf_nan=False)] = 1.0
    ignore_eos: StrictBool = True


class EngineSection(_Section):
    block_size: PosInt = _ENGINE.block_size
    max_num_seqs: PosInt = _ENGINE.max_num_seqs
    max_num_batched_tokens: PosInt = _ENGINE.max_num_batched_tokens
    backend: Backend = "auto"
    kv_cache_memory: Annotated[float, Field(gt=0, le=MAX_BYTES, strict=True,
                                            allow_inf_nan=False)] = _ENGINE.kv_cache_memory
    """KV budget: bytes if > 1, else a fraction of the memory left after the weights."""
    enable_prefix_caching: StrictBool = _ENGINE.enable_prefix_caching
    enable_chunked_prefill: StrictBool = _ENGINE.enable_chunked_prefill
    cuda_graphs: StrictBool = _ENGINE.cuda_graphs
    num_threads: PosInt | None = None


class SpeculativeSection(_Section):
    method: SpeculativeMethod = "none"
    """ngram: prompt lookup; draft: a draft model (by default the target itself, cut by
    draft_layers or quantized by draft_quant); medusa / eagle: heads trained by
    `infbench train-draft` (checkpoint in `heads`)."""
    num_tokens: PosInt = 4
    """Draft tokens proposed per step (k)."""
    draft_model: str | None = None
    """method draft: a preset, HF directory or .gguf sharing the target's vocabulary;
    unset: the target's own weights."""
    draft_layers: PosInt | None = None
    """method draft: keep only the draft's first N layers (the layer-skipping self-draft
    when the draft is the target)."""
    draft_quant: Literal["none", "int8", "int4"] = "none"
    """method draft: quantize the draft's projections (int4 in groups of draft_group_size)
    and its LM head (int8): the quantized target as its own draft."""
    draft_group_size: Literal[32, 64, 128] = 64
    heads: str | None = None
    """method medusa / eagle: the head checkpoint written by `infbench train-draft`."""
    ngram_max: PosInt = 4
    """method ngram: the longest suffix looked up."""
    ngram_min: PosInt = 1
    acceptance: Fraction = 0.7
    """`infbench predict` only: per-token acceptance probability a (a run measures it)."""
    draft_cost_ratio: NonNegFloat | None = None
    """`infbench predict` only: cost of one draft step relative to one target step
    (default: ngram 0, draft 0.1; a run measures it)."""

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeSection:
        m = self.method
        draft_only = {"draft_model": self.draft_model, "draft_layers": self.draft_layers,
                      "draft_quant": None if self.draft_quant == "none" else self.draft_quant}
        for key, value in draft_only.items():
            if value is not None and m != "draft":
                raise ValueError(f"{key} is a setting of method draft (method is {m!r})")
        if m in ("medusa", "eagle") and not self.heads:
            raise ValueError(f"method {m} needs heads: the checkpoint of "
                             f"`infbench train-draft --method {m}`")
        if self.heads is not None and m not in ("medusa", "eagle"):
            raise ValueError(f"heads is a setting of methods medusa and eagle (method is {m!r})")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must be <= ngram_max "
                             f"({self.ngram_max})")
        return self


Percentile = Annotated[float, Field(gt=0, le=100, strict=True, allow_inf_nan=False)]


class SloSection(_Section):
    ttft_ms: PosFloat | None = None
    """Time to first token, milliseconds."""
    tpot_ms: PosFloat | None = None
    """Time per output token, (E2E - TTFT) / (output tokens - 1), milliseconds."""
    e2e_ms: PosFloat | None = None
    """End-to-end latency, milliseconds."""
    target: Annotated[float, Field(gt=0, le=1, strict=True, allow_inf_nan=False)] = 0.9
    """A rate sweep reports the highest rate at which at least this fraction meets them."""

    @model_validator(mode="after")
    def _some_objective(self) -> SloSection:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("give at least one of ttft_ms, tpot_ms, e2e_ms")
        return self


class MeasureSection(_Section):
    warmup: NonNegInt = 1
    repeats: PosInt = 3
    profile: Literal["none", "ncu"] = "none"
    percentiles: Annotated[list[Percentile], Field(min_length=1, max_length=100)] = Field(
        default_factory=lambda: list(DEFAULT_PERCENTILES))
    """Latency percentiles in (0, 100] reported next to the mean, keyed p50, p99.9."""
    torch_reference: StrictBool = False
    """Time a plain-torch forward of the same model shape between the repeats (the
    `torch_reference` gate; measure/torch_reference.py).  About doubles the run time."""
    eval_tokens: Annotated[int, Field(ge=2, le=MAX_VALUE, strict=True)] | None = None
    """Tokens of held-out text scored for the result's `accuracy` (perplexity, and greedy
    agreement with the unquantized model; docs/accuracy.md).  Unset: 2048 on a point with
    model.quant or model.prune, none on a plain point (set it to measure that one too)."""
    slo: SloSection | None = None
    """Service-level objectives: each request meeting every given one counts towards
    `goodput_requests_per_s` and `slo_attainment` (docs/goodput.md)."""

    @field_validator("percentiles")
    @classmethod
    def _distinct_percentiles(cls, value: list[float]) -> list[float]:
        keys = [percentile_key(q) for q in value]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"each percentile once; repeated: {', '.join(twice)}")
        return [float(q) for q in value]


class GateSection(_Section):
    metric: str = "output_tokens_per_s"
    baseline: str | None = None
    """Result file (JSON) to compare with."""
    max_regression: Annotated[float, BeforeValidator(parse_fraction)] = 0.05
    """Largest tolerated regression as a fraction (0.05) or a percentage string ("5%")."""
    normalize: NormalizeMode = "none"

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        head, dot, _ = value.partition(".")
        # Nested paths under other heads ("decode.mbu") come from the traffic accounting.
        is_nested = bool(dot) and head not in SCALAR_METRICS + LATENCY_METRICS
        if is_gate_metric(value) or is_nested:
            return value
        raise ValueError(f"unknown value {value!r}; allowed: {', '.join(GATE_METRICS)}, "
                         "another measure.percentiles key (ttft_s.p99.9), "
                         "or a dotted path into the metrics (decode.mbu)")


class Scenario(_Section):
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
        if self.measure.torch_reference and self.workload.kind in ("poisson", "trace"):
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
            if key.split(".")[0] not in _SECTIONS:
                raise ValueError(f"{key}: unknown key; allowed: keys under {', '.join(_SECTIONS)}")
            if not values:
                raise ValueError(f"{key}: needs at least one value")
        return value

    @field_validator("variants")
    @classmethod
    def _variant_keys(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        labels: set[str] = set()
        for i, variant in enumerate(value):
            for key, item in variant.items():
                if key == "label":
                    if not isinstance(item, str) or not item:
                        raise ValueError(f"[{i}].label: must be a non-empty string")
                    if item in labels:
                        raise ValueError(f"[{i}].label: {item!r} is used twice")
                    labels.add(item)
                elif key.split(".")[0] not in _SECTIONS:
                    raise ValueError(f"[{i}].{key}: unknown key; allowed: label, keys under "
                                     f"{', '.join(_SECTIONS)}")
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
                        _set_dotted(vdata, key, value, self._source,
                                    what=f"variants[{i}].{key}")
            vsub = _validate(vdata, self._source) if variant else self
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
                        _set_dotted(data, key, value, self._source, what="sweep." + key)
                    sub = _validate(data, self._source, sweep_keys=keys)
                swept = {**label, **{_short(k): v for k, v in zip(keys, combo, strict=True)}}
                raw_wl = sub._raw.get("workload") or {}
                lists = [k for k in SWEEPABLE_WORKLOAD if isinstance(raw_wl.get(k), list)]
                values = [getattr(sub.workload, k) for k in lists]
                for wl_combo in itertools.product(*values):
                    point_swept = {**swept, **dict(zip(lists, wl_combo, strict=True))}
                    out.append(sub._point(len(out), point_swept))
        return out

    def _model_source(self) -> dict[str, str]:
        m = self.model
        if m is None:  # a target without a model section
            return {}
        return {k: v for k, v in (("preset", m.preset), ("path", m.path), ("gguf", m.gguf))
                if v is not None}

    def _point(self, index: int, swept: dict[str, Any]) -> ScenarioPoint:
        wl = self.workload.model_dump()
        for key in SWEEPABLE_WORKLOAD:
            values = wl[key]
            wl[key] = swept.get(key, values[0] if values else None)
        device = guess_device(self.device)
        dtype: str = self.dtype
        dtype_reason = ""
        if dtype == "auto":
            dtype, why = auto_dtype(device)
            # a target's dtype is the server's business: no note about this machine's
            dtype_reason = f"dtype auto -> {dtype} ({why})" if self.target is None else ""
        spec = self.speculative
        ratio = spec.draft_cost_ratio
        if ratio is None:
            ratio = 0.1 if spec.method == "draft" else 0.0
        try:
            return ScenarioPoint(
                name=self.name,
                index=index,
                device=self.device,
                dtype=dtype,
                dtype_reason=dtype_reason,
                hardware=self.hardware or default_hardware(device)
                if self.target is None else self.hardware or "unknown",
                model=None if self.model is None else ModelPoint(
                    **self._model_source(),
                    overrides=self.model.overrides.model_dump(exclude_unset=True),
                    attention=self.model.attention.model_dump(exclude_unset=True),
                    quant=self.model.quant.model_dump(),
                    prune=self.model.prune.model_dump(),
                    # which weights run (real | random), resolved as the loader will
                    weights=weights_kind(
                        self._model_source(), self.model.weights,
                        self.model.overrides.model_dump(exclude_unset=True))),
                workload=WorkloadPoint(**wl),
                engine=EngineConfig(**self.engine.model_dump()),
                speculative=SpeculativeConfig(
                    spec.method, spec.num_tokens, spec.acceptance, ratio,
                    draft_model=spec.draft_model, draft_layers=spec.draft_layers,
                    draft_quant=spec.draft_quant, draft_group_size=spec.draft_group_size,
                    heads=spec.heads, ngram_max=spec.ngram_max, ngram_min=spec.ngram_min),
                measure=MeasureConfig(**self.measure.model_dump()),
                parallel=self.parallel.config(),
                gate=GateConfig(**self.gate.model_dump()) if self.gate is not None else None,
                swept=swept,
                source=self._source,
                target=self.target,
                decoding=self.decoding.resolved(wl["gen_len"], self._model_source()),
            )
        except ConfigError as exc:
            where = f" (at {point_label(swept)})" if swept else ""
            raise UserError(f"{self._source}: {exc}{where}") from None


# ------------------------------------------------------------------ loading
def load_scenario(path: str | os.PathLike[str], sets: Sequence[str] = ()) -> Scenario:
    """Read, override (`--set key=value`), validate and expand-check one scenario file."""
    source = str(path)
    file = Path(path)
    if not file.exists():
        raise UserError(f"{source}: no such scenario file")
    if not file.is_file():
        raise UserError(f"{source}: not a file")
    data = _read_yaml(file, source)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise DamagedFileError(
            f"{source}: expected a mapping of keys at the top level (got {got})")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise UserError(f"{source}: top-level key {_short_repr(bad_keys[0])} is not a name; "
                        f"allowed: {', '.join(sorted(Scenario.model_fields))}")
    apply_sets(data, sets, source)
    return scenario_from_document(data, source)


def scenario_from_document(data: dict[str, Any], source: str) -> Scenario:
    """Validate a scenario-shaped document (a file's, or one `predict` built from its flags).

    Presets and quantization are checked for every point here, at load time, not halfway
    through a sweep; checkpoint configs are read later, once per point, by the caller.
    """
    scenario = _validate(data, source)
    for point in scenario.points():
        if point.model is not None and point.model.preset is not None:
            point.model_config()
        point.quant_config()
    return scenario


def apply_sets(data: dict[str, Any], sets: Sequence[str], source: str) -> None:
    """Apply `--set KEY=VALUE` items to a scenario document, in place.

    The one `--set` parser of every command: KEY is a dotted scenario key
    (`workload.batch_size`, `model.overrides.hidden_size`, `model.attention.kind`,
    `engine.block_size`, `sweep.workload.prompt_len`), VALUE is YAML (`8`, `mla`, `[1, 8]`,
    `null`).  The document is validated afterwards, by the caller, with the scenario schema.
    """
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. workload.batch_size=8")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise UserError(f"--set {item!r}: the value is not valid YAML") from None
        key = key.strip()
        head = key.split(".")[0]
        if head not in Scenario.model_fields and _old_form_hint(key):
            raise UserError(f"--set {item!r}: unknown key {head!r}{_old_form_hint(key)}")
        if key.startswith("sweep."):
            data.setdefault("sweep", {})
            if not isinstance(data["sweep"], dict):
                raise UserError(f"{source}: sweep: must be a mapping of dotted keys to lists")
            data["sweep"][key[len("sweep."):]] = value
        else:
            _set_dotted(data, key, value, source, what="--set " + key)


def _old_form_hint(key: str) -> str:
    """`num_layers` -> ' (did you mean model.overrides.num_layers?)' for the old predict form."""
    head = key.split(".")[0]
    if head in ("attention", "quant"):
        return f" (did you mean model.{key}?)"
    if head in {f.name for f in dataclasses.fields(ModelConfig)}:
        return f" (did you mean model.overrides.{key}?)"
    return ""


def _read_yaml(file: Path, source: str) -> Any:
    """Parse one YAML file; every way it can fail is one DamagedFileError naming the file."""
    text = read_text(file, "scenario file", DamagedFileError)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        if "\t" in problem or "'\\t'" in problem:
            problem += " (YAML indents with spaces; replace the tab)"
        raise DamagedFileError(f"{source}{line}: invalid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        first = (str(exc).splitlines() or ["syntax error"])[0]
        raise DamagedFileError(f"{source}: invalid YAML: {first}") from exc
    except RecursionError as exc:
        raise DamagedFileError(f"{source}: invalid YAML: nested too deeply") from exc


def scenario_json_schema() -> dict[str, Any]:
    return Scenario.model_json_schema()


def _validate(data: dict[str, Any], source: str, sweep_keys: Sequence[str] = ()) -> Scenario:
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise UserError(f"{source}: {_format_error(errors[0], data, sweep_keys)}{more}") from None
    scenario._source = source
    return scenario


def _set_dotted(data: dict[str, Any], key: str, value: Any, source: str, what: str) -> None:
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


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            hash(key)
        except TypeError:
            raise yaml.MarkedYAMLError(problem=f"a key must be a name, not {type(key).__name__}",
                                       problem_mark=key_node.start_mark) from None
        if key in seen:
            raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}",
                                       problem_mark=key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


# ------------------------------------------------------------------ error translation
def _format_error(err: Any, raw: Any, sweep_keys: Sequence[str] = ()) -> str:
    """One pydantic error -> `dotted.key: what is wrong (got X)`."""
    parts: list[str] = []
    node = raw
    for part in err["loc"]:
        if isinstance(part, int):
            if isinstance(node, list):  # a real list index; a scalar wrapped by _as_list has none
                parts[-1] += f"[{part}]"
                node = node[part] if part < len(node) else None
            continue
        parts.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
    key = ".".join(parts)
    if any(key == k or key.startswith(k + ".") for k in sweep_keys):
        key = "sweep." + key
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys([p for p in err["loc"] if isinstance(p, str)][:-1])
        hint = difflib.get_close_matches(parts[-1], allowed, n=1)
        mean = f" (did you mean {hint[0]}?)" if hint else ""
        msg = f"unknown key{mean}; allowed: {', '.join(allowed)}"
    elif kind == "missing":
        msg = "required key is missing"
    elif kind == "literal_error":
        allowed = [a.strip("'") for a in str(ctx.get("expected", "")).replace(" or ", ", ")
                   .split(", ")]
        msg = f"unknown value {_short_repr(got)}; allowed: {', '.join(allowed)}"
    elif kind in _BOUNDS:
        op, bound = _BOUNDS[kind]
        limit = ctx.get(bound)
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        sane = " (2**24, infbench's sanity limit)" if limit == MAX_VALUE else ""
        msg = f"must be {op} {limit}{sane} (got {_short_repr(got)})"
    elif kind in _TYPES:
        msg = f"must be {_TYPES[kind]} (got {_short_repr(got)})"
    elif kind == "too_short":
        msg = "needs at least one value"
    elif kind in ("value_error", "assertion_error"):
        msg = str(ctx.get("error", err["msg"]))
    else:
        msg = f"{err['msg'][:1].lower()}{err['msg'][1:]} (got {_short_repr(got)})"
    return f"{key}: {msg}" if key else msg


def _short_repr(value: Any) -> str:
    """repr on one line, at most 80 characters (a fuzzed value can be a huge nested list)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."


_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
           "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}
_TYPES = {
    "int_parsing": "an integer", "int_type": "an integer", "int_from_float": "an integer",
    "float_parsing": "a number", "float_type": "a number", "finite_number": "a finite number",
    "bool_parsing": "true or false",
    "bool_type": "true or false", "string_type": "a string", "model_type": "a mapping of keys",
    "dict_type": "a mapping", "list_type": "a list", "model_attributes_type": "a mapping of keys",
}


def _allowed_keys(loc: list[str]) -> list[str]:
    cls: Any = Scenario
    for part in loc:
        fields = cls.model_fields
        if part not in fields:
            return []
        cls = _model_class(fields[part].annotation)
        if cls is None:
            return []
    return sorted(cls.model_fields)


def _model_class(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType, Annotated):
        for arg in typing.get_args(annotation):
            found = _model_class(arg)
            if found is not None:
                return found
    return None
