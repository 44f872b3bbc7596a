"""A scenario point predicted under load: its requests through the simulated engine, its
metrics from the same code as a measured run's.

`simulate_point` is what `measure.prediction` records as `prediction.metrics` (and what
`infbench predict SCENARIO` prints): the point's requests, drawn by
`measure.workload.generate_requests` exactly as `run` draws them (or the very requests a
run served, when given), released as `run` releases them (`workload.client_concurrency`,
real-time arrivals for poisson and trace), served by `sim.engine_sim` (the engine's own
scheduler and block manager, each step priced by the cost model on the point's hardware),
and summarized by `measure.metrics.summarize` and `measure.goodput` into a dict of the
result schema's `metrics` shape.  Replicas (`parallel.replicas` R) each serve every R-th
request, as `serve --replicas`' round-robin router sends them.

A client point (`target:`) measures what the server and the client add around the engine's
steps too; `target.request_overhead_s` prices it: every simulated token time of every
request moves later by that many seconds (a request reaches the engine that much after it
was sent, or its tokens reach the client that much after the step, or both: the same
shift), so TTFT and E2E grow by it and TPOT and ITL do not.  It is applied once, to the
simulated records before they are summarized; an engine point has no target and no term.

The KV pool is sized as the engine sizes it for a known workload: room for every request
at once, capped by `engine.kv_cache_memory` (bytes, or a fraction of the device memory left
after the weights).  Text prompts need the model's tokenizer; without one (a preset) the
prompts are random ids of the lengths `workload.request_lengths` gives (a dataset's text is
counted in words), and the note says so.  Multi-turn sessions (`workload.kind: sessions`)
are the point's conversations (`measure.sessions.plan_sessions`, or the very ones a run
played) through `sim.sessions_sim`, the engine's closed loop on the virtual clock, the KV
pool sized for every session's longest turn as the engine sizes it; their metrics carry
`by_turn` and `sessions` as a measured sessions run's do, and replicas each serve every
R-th session (its turns stay on one replica, with its prefix cache).  Pipeline parallelism
(`pp > 1`) runs `pp` virtual engines over the stages (`sim.pipeline_sim`, as vLLM does).
Not simulated, with the reason: disaggregated pools, diffusion decoding, and sessions or
speculative decoding with pp > 1.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.errors import ConfigError, UserError
from infbench.engine.kv_groups import kv_group_windows
from infbench.engine.records import RequestRecord, StepRecord
from infbench.engine.request import Request, SamplingParams
from infbench.engine.session_loop import Conversation, Turn, sizing_requests
from infbench.hardware.spec import HardwareSpec
from infbench.measure import metrics as metrics_mod
from infbench.measure.goodput import goodput_metrics
from infbench.measure.model_steps import point_step_key, step_scale
from infbench.measure.sessions import plan_sessions, sessions_metrics, tag_rows, turn_sampling
from infbench.measure.workload import client_concurrency, generate_requests, request_lengths
from infbench.roofline.shapes import kv_bytes_per_token, state_bytes_per_seq, weight_bytes
from infbench.sim.engine_sim import SimConfig, SimOutput, simulate
from infbench.sim.pipeline_sim import simulate_pipeline
from infbench.sim.sessions_sim import simulate_sessions
from infbench.sim.step_cost import make_pricer

if TYPE_CHECKING:
    from infbench.scenario.point import ScenarioPoint


@dataclass(frozen=True)
class Simulated:
    """A point's simulated run: its metrics (the result's `metrics` shape), its request
    rows, and what the simulation assumed (`note`)."""

    metrics: dict[str, Any]
    rows: list[dict[str, Any]]
    note: str = ""
    request_overhead_s: float = 0.0  # the client point's term added (module docstring)


def unsimulated(point: ScenarioPoint) -> str:
    """Why the simulation does not run this point; '' when it does."""
    par = point.parallel
    if point.decoding is not None:
        return "not simulated: diffusion decoding (its own loop)"
    if par.disaggregated is not None:
        return "not simulated: disaggregated prefill and decode pools"
    if par.pp > 1 and point.workload.kind == "sessions":
        return "not simulated: multi-turn sessions with pipeline parallelism (pp > 1)"
    if par.pp > 1 and point.speculative.enabled:
        return "not simulated: speculative decoding with pipeline parallelism (pp > 1)"
    return ""


def point_tokenizer(point: ScenarioPoint) -> Any:
    """The model's tokenizer when the point's prompts are text and its checkpoint has one
    (read without torch); None otherwise (a preset, random prompts, a trace)."""
    w = point.workload
    needs_text = w.prompt_source == "text" or (w.dataset is not None
                                               and w.dataset.kind != "trace") or (
        w.kind == "sessions" and w.session_config.dataset is not None)
    source = point.model_source()
    if not needs_text or not source or "preset" in source:
        return None
    from pathlib import Path

    from infbench.model.tokenizer import Tokenizer

    if "path" in source:
        root = Path(source["path"])
        return Tokenizer.from_hf_dir(root) if (root / "tokenizer.json").is_file() else None
    try:
        return Tokenizer.from_gguf(source["gguf"])
    except UserError:
        return None  # a GGUF without a vocabulary: lengths only


def point_requests(point: ScenarioPoint, cfg: ModelConfig, tokenizer: Any = None,
                   eos_token_id: int | None = None) -> tuple[list[Request], str]:
    """The point's requests as `run` draws them, and a note when they are an estimate."""
    w = point.workload
    try:
        return generate_requests(w, cfg.vocab_size, tokenizer=tokenizer, eos_token_id=eos_token_id,
                                 max_model_len=cfg.max_seq_len), ""
    except UserError as exc:
        if tokenizer is not None or "tokenizer" not in str(exc):
            raise
    prompts, outs = request_lengths(w)
    rng = np.random.default_rng(w.seed)
    prefix = [int(t) for t in rng.integers(10, cfg.vocab_size, size=w.shared_prefix_len)]
    arrivals = _arrivals(point, len(prompts))
    requests = []
    for i, (p, g) in enumerate(zip(prompts, outs, strict=True)):
        body = rng.integers(10, cfg.vocab_size, size=max(int(p) - len(prefix), 0))
        requests.append(Request(
            f"r{i:04d}", tuple(prefix + [int(t) for t in body]) or (10,),
            SamplingParams(max_tokens=int(g), ignore_eos=w.ignore_eos),
            arrival_s=float(arrivals[i]), n=w.samples_per_prompt))
    return requests, ("text prompts without the model's tokenizer: random prompts of the "
                      "drawn lengths (dataset text counted in words)")


class _WordIds:
    """Stands in for a tokenizer the point has not (a preset): one id per whitespace word,
    the word's CRC-32 in the vocabulary, so a message counts its words and a repeated word
    repeats its id."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        del add_special_tokens  # the tokenizer's signature; a word has no special tokens
        span = max(self.vocab_size - 10, 1)  # ids below 10 left free, as random prompts do
        return [10 + zlib.crc32(word.encode()) % span for word in text.split()]


def sim_conversations(point: ScenarioPoint, cfg: ModelConfig, tokenizer: Any = None,
                        eos_token_id: int | None = None) -> tuple[list[Conversation], str]:
    """A sessions point's conversations as `run` plans them, and a note when they are an
    estimate (a conversation file's text without the model's tokenizer)."""
    try:
        return plan_sessions(point.workload, cfg.vocab_size, tokenizer=tokenizer,
                             eos_token_id=eos_token_id), ""
    except UserError as exc:
        if tokenizer is not None or "tokenizer" not in str(exc):
            raise
    return (plan_sessions(point.workload, cfg.vocab_size, tokenizer=_WordIds(cfg.vocab_size),
                          eos_token_id=eos_token_id),
            "conversation text without the model's tokenizer: one token per word")


def _arrivals(point: ScenarioPoint, n: int) -> np.ndarray:
    from infbench.measure.workload import _streams, arrival_times

    w = point.workload
    if w.kind == "trace":  # the trace's own timestamps need its rows: lengths only here
        raise UserError(f"{point.source}: workload.dataset kind trace with text prompts needs "
                        "the model's tokenizer to be simulated")
    return arrival_times(_streams(w)[2], w.kind, w.rate, n, w.burstiness)


def sim_config(point: ScenarioPoint, cfg: ModelConfig, hw: HardwareSpec, quant: QuantConfig,
               requests: Sequence[Request], eos_token_id: int | None) -> SimConfig:
    """The engine's KV pool for these requests, as `Engine` plans it (module docstring)."""
    engine = point.engine
    bs = engine.block_size
    windows = kv_group_windows(cfg)
    per_token = kv_bytes_per_token(cfg, point.dtype, quant)
    needed = sum(math.ceil((len(r.prompt_ids) + r.sampling.max_tokens) / bs) * bs * r.n
                 for r in requests)
    cap = math.ceil(needed / bs) + 1
    if engine.kv_cache_memory > 1:
        budget = int(engine.kv_cache_memory)
    else:
        devices = point.parallel.tp * point.parallel.pp
        free = hw.memory_bytes - weight_bytes(cfg, point.dtype, quant) / devices
        # each of the tp x pp devices holds its share of every token's KV (pp: of its layers)
        budget = int(engine.kv_cache_memory * max(free, 0.0)) * devices
    state = state_bytes_per_seq(cfg, point.dtype)
    # pp > 1: each of the pp virtual engines gets 1/pp of the pool (sim/pipeline_sim.py)
    num_blocks = cap if per_token == 0 else min(
        cap, budget // max(per_token * bs, 1) // point.parallel.pp)
    # several KV groups: each group's blocks in proportion; a windowed group needs fewer
    blocks = [max(num_blocks, 1)] * len(windows)
    spec = point.speculative if point.speculative.enabled else None
    return SimConfig(engine=engine, num_kv_blocks=blocks, windows=windows,
                     num_state_slots=engine.max_num_seqs if state else None,
                     eos_token_id=eos_token_id, speculative=spec, seed=point.workload.seed)


def request_overhead_s(point: ScenarioPoint) -> float:
    """Seconds serving adds to each request of this point: `target.request_overhead_s` for
    a client point, 0 for an engine point."""
    return 0.0 if point.target is None else float(point.target.request_overhead_s)


def with_request_overhead(out: SimOutput, overhead_s: float) -> SimOutput:
    """`out` as a client sees it when serving adds `overhead_s` to every request: each
    token time (and the first content token's) that much later, the run that much longer;
    arrivals and steps unchanged."""
    if overhead_s == 0:
        return out
    records = [replace(r, token_times_s=[t + overhead_s for t in r.token_times_s],
                       first_output_s=None if r.first_output_s is None
                       else r.first_output_s + overhead_s) for r in out.requests]
    return SimOutput(records, out.steps, out.wall_s + overhead_s)


def _merge(outputs: list[SimOutput]) -> SimOutput:
    if len(outputs) == 1:
        return outputs[0]
    records: list[RequestRecord] = [r for o in outputs for r in o.requests]
    steps: list[StepRecord] = [s for o in outputs for s in o.steps]
    return SimOutput(records, steps, max(o.wall_s for o in outputs))


def simulate_point(point: ScenarioPoint, cfg: ModelConfig, hw: HardwareSpec, *,
                   requests: Sequence[Request] | None = None,
                   conversations: Sequence[Conversation] | None = None, tokenizer: Any = None,
                   eos_token_id: int | None = None, overlap: str = "auto") -> Simulated:
    """The point's predicted metrics under its load (module docstring); `requests` (or, for
    kind sessions, `conversations`): the ones a run served, else drawn as `run` draws them."""
    note = ""
    is_sessions = point.workload.kind == "sessions"
    if is_sessions:
        if conversations is None:
            conversations, note = sim_conversations(point, cfg, tokenizer, eos_token_id)
        requests = sizing_requests(conversations)  # the KV pool's sizing, as the engine's
    elif requests is None:
        requests, note = point_requests(point, cfg, tokenizer, eos_token_id)
    quant = point.quant_config()
    par = point.parallel
    replica = replace(par, replicas=1)
    try:
        pricer = make_pricer(cfg, hw, point.dtype, quant, replica, overlap)
        config = sim_config(point, cfg, hw, quant, requests, eos_token_id)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    if point.model is not None:  # the model's own step profile on this hardware, if measured
        pricer.scale, scale_note = step_scale(hw, point_step_key(point))
        note = "; ".join(n for n in (note, scale_note) if n)
    cap = client_concurrency(point.workload)
    r = par.replicas
    if conversations is not None:  # kind sessions: each replica every R-th session
        workload = point.workload

        def sampling(turn: Turn) -> SamplingParams:
            return turn_sampling(workload, turn, eos_token_id)

        outputs = [simulate_sessions(conversations[k::r], pricer, config, sampling,
                                     max_concurrency=cap)
                   for k in range(r) if conversations[k::r]]
    else:
        until = getattr(point.measure, "duration_s", None)  # measure.duration_s, where set
        run = simulate_pipeline if par.pp > 1 else simulate  # pp: virtual engines
        outputs = [run(list(requests[k::r]), pricer, config,
                            realtime_arrivals=point.workload.is_realtime, max_concurrency=cap,
                            submit_until_s=until)
                   for k in range(r) if requests[k::r]]
    overhead = request_overhead_s(point)
    out = with_request_overhead(_merge(outputs), overhead)
    wall_s = max(out.wall_s, 1e-12)
    metrics = metrics_mod.summarize(
        out.requests, out.steps, wall_s,
        kv_bytes_per_token=kv_bytes_per_token(cfg, point.dtype, quant),
        block_size=point.engine.block_size,
        weight_bytes=weight_bytes(cfg, point.dtype, quant),
        peak_memory_bytes=0, state_bytes=state_bytes_per_seq(cfg, point.dtype),
        percentiles=point.measure.percentiles)
    metrics["peak_memory_bytes"] = metrics["weight_bytes"] + metrics["peak_kv_bytes"]
    rows = metrics_mod.request_rows(out.requests)
    if conversations is not None:  # per turn index and per session, as a measured run's
        metrics.update(sessions_metrics(tag_rows(rows), conversations, wall_s,
                                        point.measure.percentiles))
    if point.measure.slo is not None:
        metrics.update(goodput_metrics(rows, point.measure.slo, wall_s))
    notes = [note] if note else []
    if not point.workload.ignore_eos:
        notes.append("every request generates its max_tokens (the simulation cannot know "
                     "when a model would emit EOS)")
    if overhead:
        notes.append(f"TTFT and E2E include target.request_overhead_s "
                     f"({overhead * 1e3:.3g} ms per request)")
    return Simulated(metrics, rows, "; ".join(notes), overhead)
