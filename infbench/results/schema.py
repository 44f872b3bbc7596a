"""The result file's schema: pydantic models of one scenario point's JSON, and its upgrades.

`RunResult` is the contract between the writers (`measure.bench` via
`store.build_result`) and every reader (`report`, `compare`, the gate, the plots,
`kv --results`): `store.load_result` and `store.build_result` both validate
against it, so a renamed or mistyped field fails loudly with its path instead of
reading back as None.  `RunResult.model_json_schema()` is what `infbench schema
--results` prints.

Known sections refuse unknown keys (`extra="forbid"`); a few sections are open by
design and say so where they are declared.  Values that a run may not have (a
percentile of no samples, a stage that never ran, Poisson traffic that is not
predicted) are optional, and None in the file, never NaN.

Versions:

- 1: the untyped result of infbench 0.1 (keys were whatever the writers put in).
- 2: this schema.  Every top-level key is declared; `engine_disabled`, `telemetry` and
  `requests` are always present.  `upgrade()` turns a version 1 file into version 2 in
  memory (those three keys default to empty), so committed baselines and older results
  still load; any other version is refused.  Optional fields, None where a point has no
  such data (`metrics.torch_reference`, `normalized.output_tokens_per_s_over_torch_reference`,
  `accuracy`, and `metrics.goodput_requests_per_s`, `slo_attainment`, `num_slo_met` of a
  point run with `measure.slo`, and `prediction.profile_flags`, the flags of the calibrated
  profile the point was priced on, and `metrics.diffusion`, `prediction.diffusion` and
  `diffusion` of a `decoding.kind: diffusion` point, and `prediction.overlap`, the operator
  overlap the prediction used, and `prefix`, the prefix groups' intended and measured hit
  rates, and `metrics.by_turn` and `metrics.sessions` and the request rows' `session_id`
  and `turn` of a `workload.kind: sessions` point, and `metrics.window`, a point run with
  `measure.window`, and `prediction.metrics` / `prediction.simulation_note`, the point
  simulated under its load), so every version 2 file loads whichever of them it has.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infbench.roofline.analysis import OverlapMode

SCHEMA_VERSION = 2
RESULT_KIND = "infbench.run"
UPGRADABLE_VERSIONS = (1,)
# A latency statistic: the mean or a percentile p50, p90, p99.9 (the set is configurable).
PERCENTILE_KEY = re.compile(r"^p\d+(\.\d+)?$")

Number = float  # strict mode accepts ints for floats and refuses strings and bools


class _Closed(BaseModel):
    """Unknown keys are refused; "1.5" is not a number (strict: no str -> float coercion)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class LatencyStats(_Open):
    """mean and percentiles of one latency in seconds; None when there were no samples.

    Open for percentile keys only: `p<number>` (p50, p90, p95, p99, p99.9), each a
    number or None; any other key is refused.
    """

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={
        "propertyNames": {"pattern": r"^(mean|p\d+(\.\d+)?)$"}})
    __pydantic_extra__: dict[str, Number | None] = Field(init=False)  # type: ignore[assignment]

    mean: Number | None = None

    @model_validator(mode="before")
    @classmethod
    def _percentile_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            bad = [k for k in data if k != "mean" and not PERCENTILE_KEY.match(str(k))]
            if bad:
                raise ValueError(f"unknown statistic {bad[0]!r}; allowed: mean and "
                                 "percentiles p<number> (p50, p90, p99)")
        return data


class StageTraffic(_Closed):
    """Measured prefill / decode / mixed stage: totals, achieved rates, MBU, MFU."""

    flops: Number | None = None
    bytes: Number | None = None
    time_s: Number | None = None
    num_steps: int | None = None
    num_tokens: int | None = None
    intensity: Number | None = None
    achieved_flops_per_s: Number | None = None
    achieved_bytes_per_s: Number | None = None
    mbu: Number | None = None
    mfu: Number | None = None
    time_per_token_s: Number | None = None


class Normalized(_Closed):
    """Measured rates over a same-run reference: the read-bandwidth probe (the `reference`
    gate) or the plain-torch forward (the `torch_reference` gate; None when not timed)."""

    output_tokens_per_s_per_gbs: Number | None = None
    decode_bytes_per_s_over_reference: Number | None = None
    output_tokens_per_s_over_torch_reference: Number | None = None


class TorchReference(_Closed):
    """The plain-torch forward of the same model shape timed next to a repeat
    (measure/torch_reference.py): the mean of the passes before and after it."""

    output_tokens_per_s: Number | None = None
    wall_s: Number | None = None
    num_output_tokens: int | None = None
    num_threads: int | None = None


class Noise(_Closed):
    """Coefficient of variation over the repeats per metric, and the warnings it raised."""

    cv: dict[str, Number | None] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


class Speculative(_Closed):
    """Speculative decoding measured in a run (measure/speculative.py, docs/speculative.md):
    acceptance, and the speed-up against the same workload decoded plainly right after."""

    method: str | None = None
    num_tokens: int | None = None
    num_verifications: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    acceptance_rate: Number | None = None  # accepted / proposed drafts
    acceptance_per_token: Number | None = None  # the a of the prediction
    acceptance_by_position: list[Number | None] = Field(default_factory=list)
    mean_draft_tokens: Number | None = None
    mean_accepted_tokens: Number | None = None  # tokens emitted per verification
    draft_time_s: Number | None = None
    num_draft_steps: int | None = None
    baseline_tpot_s: Number | None = None
    baseline_output_tokens_per_s: Number | None = None
    baseline_decode_step_s: Number | None = None
    speedup_measured: Number | None = None  # baseline TPOT / speculative TPOT
    throughput_ratio: Number | None = None  # output tokens/s over the baseline's
    draft_cost_ratio: Number | None = None  # c
    speedup_predicted: Number | None = None


class MoEStage(_Closed):
    """MoE routing over a set of steps (measure/moe_routing.py, docs/moe.md): routed
    experts touched per step (summed over the MoE layers) and the bytes of their weights,
    measured and as the roofline expects them under uniform routing."""

    steps: int | None = None
    experts_touched_per_step: Number | None = None
    expected_experts_per_step: Number | None = None
    expert_bytes: Number | None = None
    expected_expert_bytes: Number | None = None
    expert_bytes_error_pct: Number | None = None  # (measured - expected) / expected, %


class MoERouting(MoEStage):
    """`metrics.moe`: all steps, the routing skew, and the decode steps apart."""

    max_over_mean: Number | None = None  # max / mean tokens per expert (layer mean)
    cv: Number | None = None  # coefficient of variation of tokens per expert
    decode: MoEStage | None = None


class MoEStepRow(_Closed):
    """`steps[].moe`: one step's routing (engine.records.MoEStep)."""

    num_tokens: int | None = None
    experts_touched: int | None = None
    expert_bytes: int | None = None
    expected_experts: Number | None = None
    expected_bytes: Number | None = None
    max_over_mean: Number | None = None
    cv: Number | None = None


class TurnMetrics(_Closed):
    """`metrics.by_turn[]`: the requests of one turn index of a sessions run."""

    turn: int
    num_requests: int
    mean_prompt_tokens: Number | None = None
    mean_output_tokens: Number | None = None
    ttft_s: LatencyStats | None = None
    tpot_s: LatencyStats | None = None
    e2e_s: LatencyStats | None = None


class SessionMetrics(_Closed):
    """`metrics.sessions`: the conversations of a sessions run (measure/sessions.py)."""

    num_sessions: int | None = None
    num_completed: int | None = None  # every turn answered
    num_turns: int | None = None  # planned
    num_turns_done: int | None = None
    num_turns_skipped: int | None = None  # after a failed turn of their session
    mean_turns: Number | None = None
    duration_s: LatencyStats | None = None  # a completed session's first send to last token
    sessions_per_s: Number | None = None  # completed sessions per second of the run


class WindowMetrics(_Closed):
    """`metrics.window`: the run's metrics for the interval [start_s, end_s] of each repeat
    that measure.window keeps (measure/windows.py, docs/windows.md); latencies of the
    requests that arrived and finished inside it, throughputs of the work done inside it."""

    ttft_s: LatencyStats | None = None
    tpot_s: LatencyStats | None = None
    itl_s: LatencyStats | None = None
    e2e_s: LatencyStats | None = None
    ttfo_s: LatencyStats | None = None
    output_tokens_per_s: Number | None = None
    total_tokens_per_s: Number | None = None
    requests_per_s: Number | None = None
    num_requests: int | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    wall_s: Number | None = None  # end_s - start_s
    start_s: Number | None = None
    end_s: Number | None = None
    goodput_requests_per_s: Number | None = None
    slo_attainment: Number | None = None
    num_slo_met: Number | None = None


class Metrics(_Closed):
    """One measured run's metrics (a result's `metrics` is the median of its repeats)."""

    ttft_s: LatencyStats | None = None
    tpot_s: LatencyStats | None = None
    itl_s: LatencyStats | None = None
    e2e_s: LatencyStats | None = None
    # a reasoning model's client run: time to the first content token, and the reasoning
    # tokens among num_output_tokens (absent otherwise; TTFO is then TTFT)
    ttfo_s: LatencyStats | None = None
    num_reasoning_tokens: int | None = None
    output_tokens_per_s: Number | None = None
    total_tokens_per_s: Number | None = None
    requests_per_s: Number | None = None
    prefill_tokens_per_s: Number | None = None
    kv_bytes_per_token: int | None = None
    peak_kv_bytes: int | None = None
    kv_fragmentation: Number | None = None
    weight_bytes: int | None = None
    peak_memory_bytes: int | None = None
    num_requests: int | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    num_steps: int | None = None
    wall_s: Number | None = None
    num_preemptions: int | None = None
    prefix_cache_hit_rate: Number | None = None
    state_bytes_per_seq: int | None = None
    prefill: StageTraffic | None = None
    decode: StageTraffic | None = None
    mixed: StageTraffic | None = None
    reference_bytes_per_s: Number | None = None
    torch_reference: TorchReference | None = None
    normalized: Normalized | None = None
    noise: Noise | None = None
    speculative: Speculative | None = None
    # measure.slo (measure/goodput.py): requests meeting every objective, per second of the
    # run and as a fraction of the requests; None on a point run without objectives
    goodput_requests_per_s: Number | None = None
    slo_attainment: Number | None = None
    num_slo_met: Number | None = None  # the median over repeats may fall between two counts
    diffusion: StageTraffic | None = None  # decoding.kind diffusion: its refinement steps
    moe: MoERouting | None = None  # MoE models: routing measured vs uniform (docs/moe.md)
    # workload.kind sessions (docs/sessions.md): per turn index and per session
    by_turn: list[TurnMetrics] | None = None
    sessions: SessionMetrics | None = None
    window: WindowMetrics | None = None  # measure.window: the window's figures (windows.md)


class Accuracy(_Closed):
    """Perplexity on the held-out evaluation text and greedy agreement with the unquantized
    model of the same dtype (measure/accuracy.py, docs/accuracy.md).  The reference fields
    are None on a point without one (a plain point with measure.eval_tokens set)."""

    perplexity: Number | None = None
    reference_perplexity: Number | None = None
    perplexity_change: Number | None = None  # perplexity / reference_perplexity - 1
    greedy_agreement: Number | None = None  # fraction of matching greedy tokens
    tokens: int | None = None
    window: int | None = None
    agreement_prompts: int | None = None
    agreement_tokens: int | None = None
    text_id: str | None = None  # the evaluation text, with its CPython version
    seconds: Number | None = None


class Spread(_Closed):
    """min, max and sample stdev of one metric over the repeats."""

    min: Number | None = None
    max: Number | None = None
    stdev: Number | None = None


class PredictedStage(_Closed):
    """The roofline's prefill or decode stage (decode: one step, and per token)."""

    flops: Number | None = None
    bytes: Number | None = None
    intensity: Number | None = None
    time_s: Number | None = None
    step_time_s: Number | None = None
    time_per_token_s: Number | None = None
    tokens_per_s: Number | None = None
    bound: str | None = None
    weight_bytes: Number | None = None
    kv_read_bytes: Number | None = None
    kv_write_bytes: Number | None = None
    state_bytes: Number | None = None
    act_bytes: Number | None = None


class PredictedOp(_Closed):
    """One operator of the predicted step (roofline.ops.OpRecord.to_dict)."""

    name: str
    kind: str | None = None
    stage: str | None = None
    flops: Number | None = None
    bytes: Number | None = None
    intensity: Number | None = None
    weight_bytes: Number | None = None
    kv_read_bytes: Number | None = None
    kv_write_bytes: Number | None = None
    state_bytes: Number | None = None
    act_bytes: Number | None = None
    time_s: Number | None = None
    bound: str | None = None


class Prediction(_Closed):
    """The analytic prediction of the same point; Poisson traffic has only hardware + note."""

    model: str | None = None
    hardware: str | None = None
    note: str | None = None
    dtype: str | None = None
    quant: dict[str, Any] | None = None  # open: an echo of core.config.QuantConfig
    batch: int | None = None
    prompt_len: int | None = None
    gen_len: int | None = None
    params: int | None = None
    active_params: int | None = None
    mtp_params: int | None = None  # DeepSeek-V3's MTP modules as stored (not in params)
    weight_bytes: Number | None = None
    kv_bytes_per_token: Number | None = None
    kv_cache_bytes: Number | None = None
    state_bytes: Number | None = None
    memory_bytes: Number | None = None
    memory_capacity_bytes: Number | None = None
    fits: bool | None = None
    max_batch: int | None = None
    ttft_s: Number | None = None
    tpot_s: Number | None = None
    e2e_s: Number | None = None
    prefill: PredictedStage | None = None
    decode: PredictedStage | None = None
    # open: the speculative config echo plus its derived times
    speculative: dict[str, Any] | None = None
    ops: list[PredictedOp] = Field(default_factory=list)
    output_tokens_per_s: Number | None = None  # end to end, waves included
    decode_tokens_per_s: Number | None = None  # batch / TPOT, decode only
    total_tokens_per_s: Number | None = None
    waves: int | None = None
    diffusion: PredictedStage | None = None  # decoding.kind diffusion (roofline/diffusion.py)
    # the flags of the calibrated profile it was priced on ([] none; None: a datasheet entry
    # or a result written before profiles had flags)
    profile_flags: list[str] | None = None
    # how the step's operators shared the roofline: full | none (None: written before the
    # choice was recorded, when it was always full)
    overlap: OverlapMode | None = None
    # the point under its load: the engine's scheduler over priced steps (measure/
    # simulation.py), the same keys as the measured `metrics`; None in files written before
    # it or for a point it does not run (simulation_note says why, or what it assumed)
    metrics: Metrics | None = None
    simulation_note: str | None = None
    # a client point's target.request_overhead_s, included in metrics' token times (TTFT,
    # E2E); None: no such term (an engine point, or 0)
    request_overhead_s: Number | None = None


class Step(_Closed):
    """One engine step: engine.records.StepRecord plus its measure.traffic accounting."""

    index: int
    start_s: Number | None = None
    duration_s: Number | None = None
    num_prefill_tokens: int | None = None
    num_decode_tokens: int | None = None
    num_prefill_seqs: int | None = None
    num_decode_seqs: int | None = None
    num_running: int | None = None
    num_waiting: int | None = None
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    kv_slots_used: int | None = None
    num_preempted: int | None = None
    context_lens: list[int] = Field(default_factory=list)
    query_lens: list[int] = Field(default_factory=list)
    logits_lens: list[int] = Field(default_factory=list)
    device_time_s: Number | None = None
    kv_bytes_used: int | None = None
    spec_drafts: list[int] = Field(default_factory=list)
    spec_accepted: list[int] = Field(default_factory=list)
    draft_time_s: Number | None = None
    stage: str | None = None
    flops: Number | None = None
    bytes: Number | None = None
    weight_bytes_read: Number | None = None
    kv_bytes: Number | None = None
    intensity: Number | None = None
    achieved_flops_per_s: Number | None = None
    achieved_bytes_per_s: Number | None = None
    mbu: Number | None = None
    mfu: Number | None = None
    moe: MoEStepRow | None = None  # MoE models: the step's routing


class RequestRow(_Closed):
    """One finished request (engine.records.RequestRecord, times on the run's clock)."""

    id: str
    arrival_s: Number
    first_token_s: Number | None = None
    finish_s: Number | None = None
    itl_s: list[Number] = Field(default_factory=list)
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: str
    # only on a request that streamed reasoning: its reasoning tokens (the first of
    # num_output_tokens) and when its first content token came (None: none came)
    num_reasoning_tokens: int = 0
    first_output_s: Number | None = None
    # only on a turn of a multi-turn session (workload.kind sessions): which, 0-based turn
    session_id: str | None = None
    turn: int | None = None
    # a target point's client: when the request went out minus its scheduled arrival, and
    # which of target.workers processes sent it (client/workers.py; absent with one)
    send_error_s: Number | None = None
    worker: int | None = None


class Hardware(_Closed):
    """The roofline hardware the point was priced on (hardware.spec.HardwareSpec.to_dict)."""

    name: str
    description: str | None = None
    peak_flops: dict[str, Number] = Field(default_factory=dict)  # dtype -> FLOP/s
    bandwidth: Number | None = None
    memory_bytes: Number | None = None
    source: str | None = None
    kind: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)  # open: calibration details


class Env(_Open):
    """Where the result was produced.  Open: the engine adds run facts (backend, KV budget,
    model source) and newer versions may record more; the known keys are typed."""

    device: str | None = None
    device_name: str | None = None
    python: str | None = None
    platform: str | None = None
    host: str | None = None
    cpu_count: int | None = None
    packages: dict[str, str | None] = Field(default_factory=dict)
    infbench_version: str | None = None
    git_sha: str | None = None
    git_dirty: bool | None = None
    timestamp: str | None = None
    backend: str | None = None
    kv_budget_bytes: int | None = None
    kv_num_blocks: int | None = None


class EngineDisabled(_Closed):
    """A feature the scenario asked for that this model ran without, and why."""

    feature: str
    reason: str


class PrefixSharing(_Closed):
    """The point's prefix groups (workload.prefix or shared_prefix_len, measure/prefix.py):
    the hit rate the drawn requests mean beside the one measured (results/prefix.py)."""

    num_groups: int
    lengths: list[int] = Field(default_factory=list)  # tokens of each group's prefix
    num_requests: list[int] = Field(default_factory=list)  # requests of each group
    target_hit_rate: Number | None = None  # workload.prefix.target_hit_rate, if given
    num_hit_tokens: int | None = None  # what an ideal cache of every group would serve
    num_prompt_tokens: int | None = None
    intended_hit_rate: Number | None = None  # num_hit_tokens / num_prompt_tokens
    measured_hit_rate: Number | None = None
    measured_from: str | None = None  # the result path the measured rate was read from


class RunResult(_Closed):
    """One scenario point's result file (`<name>_<index>.json`)."""

    schema_version: Literal[2]
    kind: Literal["infbench.run"]
    name: str | None
    label: str
    point_index: int
    # open: the resolved scenario point as scenario.schema wrote it (validated there)
    scenario: dict[str, Any]
    env: Env
    seed: int
    # None only in hand-made files: the plots then price the point on scenario.hardware
    hardware: Hardware | None = None
    metrics: Metrics
    prediction: Prediction
    repeats: list[Metrics]
    spread: dict[str, Spread]  # keyed by metric name: output_tokens_per_s, ttft_s.p50
    steps: list[Step]
    requests: list[RequestRow] = Field(default_factory=list)
    model_config_: dict[str, Any] | None = Field(default=None, alias="model_config")
    telemetry: dict[str, Any] = Field(default_factory=dict)  # open: nvml / ncu samples
    engine_disabled: list[EngineDisabled] = Field(default_factory=list)
    accuracy: Accuracy | None = None  # quantized / pruned points, or measure.eval_tokens
    # open: decoding.kind diffusion's settings, the analytic detail (step kinds, the
    # autoregressive twin) and the first sequence's tokens (measure/diffusion_point.py)
    diffusion: dict[str, Any] | None = None
    prefix: PrefixSharing | None = None  # prefix groups: intended vs measured hit rate
    # open: a point of `infbench search` (measure/search.py): what it searched, the value,
    # the try and its phase (bracket, bisect, repeat)
    search: dict[str, Any] | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A result of an older schema_version as the current one (a new dict; `data` is kept).

    1 -> 2: the keys version 2 always writes are added empty: `engine_disabled` (version 1
    writers recorded no disabled features), `telemetry` and `requests`; and
    `scenario.model.weights` says which weights ran, as version 1 ran them: random for a
    preset (version 1 had no real-weight presets), real for an HF directory or a GGUF file.
    Numbers are not touched, so report, compare and the gate read a version 1 file exactly
    as before.
    Other versions are returned unchanged: `validate` then refuses them.
    """
    if data.get("schema_version") == 1:
        data = {**data, "schema_version": 2}
        data.setdefault("engine_disabled", [])
        data.setdefault("telemetry", {})
        data.setdefault("requests", [])
        model = (data.get("scenario") or {}).get("model")
        if isinstance(model, dict) and "weights" not in model:
            weights = "random" if "preset" in model else "real"
            data["scenario"] = {**data["scenario"], "model": {**model, "weights": weights}}
    return data


def format_errors(where: str, exc: ValidationError, limit: int = 3) -> str:
    """`x.json: metrics.ttft_s.p50: input should be a valid number` (first few errors)."""
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (renamed or misspelled?)"
        parts.append(f"{loc}: {msg[:1].lower()}{msg[1:]}")
    more = exc.error_count() - limit
    return f"{where}: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def validate(data: dict[str, Any]) -> RunResult:
    """The typed result; raises pydantic's ValidationError (callers name the file)."""
    return RunResult.model_validate(data)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a result file (`infbench schema --results`)."""
    return RunResult.model_json_schema(by_alias=True)
