"""One scenario point with `target:` measured against a server -> the same result as `run`.

The counterpart of `measure.bench.run_point` for a remote, OpenAI-compatible server: the
workload is drawn exactly as for the engine (`generate_requests`, seeded), replayed
through `client.openai_target` once per warm-up and repeat on one event loop and one
connection pool, and summarized by the same `metrics` code, so `report`, `compare`, the
plots and the gate read the result unchanged.  No weights are loaded; only the tokenizer
named by `target.tokenizer`.  The prediction is filled in only when the scenario names a
model shape and a hardware; the engine-only fields (steps, KV, MBU) stay empty.

While the repeats run, the target's Prometheus /metrics is scraped every
`target.metrics_interval_s` (client/server_metrics.py) into `telemetry.server_metrics`.

Failed requests are counted by reason (client/failures.py) and kept per request for the
last repeat, beside its `requests` rows (`telemetry.client.failed_requests`), with a note on
stderr; a repeat in which every request failed is a one-line UserError.  Credentials never
reach the result: the target schema refuses a base_url with user:password@, and an API key
is read from the variable `target.api_key_env` names, which is all the result records.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infbench.client.failures import count_reasons
from infbench.client.openai_target import (
    ClientPlan,
    TargetRun,
    fetch_models,
    frozen_heap,
    open_session,
    run_requests,
)
from infbench.client.server_metrics import MetricsScraper
from infbench.client.sessions import (
    SessionsRun,
    check_plan,
    run_sessions,
)
from infbench.core.errors import UserError
from infbench.core.metric_names import NUM_REASONING_TOKENS, TTFO_METRIC
from infbench.engine.request import Request
from infbench.engine.session_loop import Conversation
from infbench.measure.sessions import plan_sessions, sessions_metrics, tag_rows
from infbench.results.prefix import with_measured
from infbench.scenario.point import ScenarioPoint
from infbench.scenario.target import TargetSection, tokenizer_source

if TYPE_CHECKING:
    from infbench.measure.workload import DrawnWorkload

CLIENT_BACKEND = "openai-client"


def load_tokenizer(name: str, where: str) -> Any:
    """A tokenizer from a preset of a released model, an HF directory or a .gguf file (the
    source checked when the scenario loaded: scenario.target.tokenizer_source)."""
    from infbench.model.tokenizer import Tokenizer

    try:
        kind, path = tokenizer_source(name)
    except ValueError as exc:
        raise UserError(f"{where}: target.tokenizer: {exc}") from None
    return Tokenizer.from_hf_dir(path) if kind == "hf" else Tokenizer.from_gguf(path)


def concurrency_cap(workload: Any) -> int | None:
    """Streams in flight at most, as the engine's client caps requests: batch_size for kind
    static, else workload.max_concurrency (None: no cap); times samples_per_prompt, since
    each sample of a prompt is a request of its own to a server."""
    samples = int(getattr(workload, "samples_per_prompt", 1) or 1)
    limit = workload.batch_size if workload.kind == "static" else \
        getattr(workload, "max_concurrency", None)
    return None if limit is None else int(limit) * samples


def point_requests(point: ScenarioPoint, tokenizer: Any) -> DrawnWorkload:
    """The point's workload, drawn as the engine draws it (vocabulary from the tokenizer,
    else from the model section), with its prefix groups' summary."""
    from infbench.measure.windows import timed_workload
    from infbench.measure.workload import draw_workload

    vocab, eos = _vocabulary(point, tokenizer)
    return draw_workload(timed_workload(point), vocab, tokenizer=tokenizer, eos_token_id=eos)


def point_conversations(point: ScenarioPoint, tokenizer: Any) -> list[Conversation]:
    """The point's conversations (kind sessions), planned as the engine plans them."""
    vocab, eos = _vocabulary(point, tokenizer)
    return plan_sessions(point.workload, vocab, tokenizer=tokenizer, eos_token_id=eos)


def _vocabulary(point: ScenarioPoint, tokenizer: Any) -> tuple[int, int | None]:
    """(vocabulary size, EOS id) for drawing prompts: the tokenizer's, else the model
    section's vocabulary without an EOS."""
    if tokenizer is not None:
        return tokenizer.vocab_size, tokenizer.eos_token_id
    if point.model:
        return point.model_config().vocab_size, None
    raise UserError(f"{point.source}: target.tokenizer: required without a model section "
                    "(random prompt ids need the server's vocabulary size)")


def client_env(target: TargetSection, models: Any) -> dict[str, Any]:
    """env of a client run: this host's facts (the client), the endpoint and its /models."""
    from infbench.results import store as results_mod

    env = results_mod.env_info("cpu")
    client = {"host": env.get("host"), "cpu": env.get("device_name"),
              "cpu_count": env.get("cpu_count")}
    env.update({
        "device": "remote", "device_name": f"server at {target.base_url}",
        "backend": CLIENT_BACKEND, "client": client,
        "endpoint": {"kind": target.kind, "base_url": target.base_url, "model": target.model,
                     "endpoint": target.endpoint, "url": target.url,
                     "prompt_format": "text" if target.sends_text else "tokens",
                     "tokenizer": target.tokenizer, "models": models},
    })
    return env


def _rows(run: TargetRun) -> list[dict[str, Any]]:
    """The result's request rows; a session turn's carry its session_id and turn."""
    from infbench.measure import metrics as metrics_mod

    rows = metrics_mod.request_rows(run.records)
    return tag_rows(rows) if isinstance(run, SessionsRun) else rows


def _summary(run: TargetRun, point: ScenarioPoint) -> dict[str, Any]:
    from infbench.measure import metrics as metrics_mod
    from infbench.measure.goodput import goodput_metrics
    from infbench.measure.windows import add_window

    percentiles, slo = point.measure.percentiles, point.measure.slo

    rows = _rows(run)
    m = metrics_mod.from_request_rows(rows, percentiles, run.wall_s)
    m.update({"num_requests": len(run.records), "wall_s": float(run.wall_s),
              "num_prompt_tokens": sum(r.num_prompt_tokens for r in run.records),
              "num_output_tokens": sum(r.num_output_tokens for r in run.records)})
    if TTFO_METRIC in m:  # a reasoning model: its reasoning tokens among the output tokens
        m[NUM_REASONING_TOKENS] = sum(r.num_reasoning_tokens for r in run.records)
    if isinstance(run, SessionsRun):
        m.update(sessions_metrics(rows, run.conversations, run.wall_s, percentiles,
                                  num_failed=len(run.failures)))
    if slo is not None:  # as for an engine run (measure/bench.py); failures meet no SLO
        m.update(goodput_metrics(rows, slo, run.wall_s, num_failed=len(run.failures)))
    add_window(m, rows, run.wall_s, point)  # measure.window: metrics.window (docs/windows.md)
    return m


def run_target_point(point: ScenarioPoint, *, cache: Any = None, device: str | None = None,
                     on_step: Callable[[Any], None] | None = None,
                     on_phase: Callable[[str], None] | None = None,
                     pool_type: Any = None) -> dict[str, Any]:
    """Measure one ScenarioPoint with `target:` and return its result dict.

    `cache`, `device` and `on_step` are run_point's; a client run has no model to cache,
    runs on no local device and has no engine steps.  `pool`: the client/workers.WorkerPool
    class that runs `target.workers` (default: processes here; `--ray`: Ray actors); kind
    sessions always runs in this process.
    """
    del cache, device, on_step
    from infbench.hardware.spec import get_hardware
    from infbench.measure import metrics as metrics_mod
    from infbench.measure.prediction import predict_point
    from infbench.measure.windows import duration_note
    from infbench.results import store as results_mod

    if point.target is None:
        raise ValueError("run_target_point needs a point with a target section")
    target = TargetSection.model_validate(point.target)
    phase = on_phase or (lambda _msg: None)
    tokenizer = None
    if target.tokenizer is not None:
        phase("loading tokenizer")
        tokenizer = load_tokenizer(target.tokenizer, point.source)
    cap = concurrency_cap(point.workload)
    plan = ClientPlan(target, tokenizer, cap)
    is_sessions = point.workload.kind == "sessions"  # multi-turn: client/sessions.py
    drawn = None
    if is_sessions:
        check_plan(plan)
        conversations = point_conversations(point, tokenizer)
        requests: list[Request] = []
        num_sequences = sum(len(c.turns) for c in conversations)
        pool = cap or len(conversations)
    else:
        drawn = point_requests(point, tokenizer)
        requests = drawn.requests
        num_sequences = sum(r.n for r in requests)
        pool = cap or num_sequences
    api_key = os.environ.get(target.api_key_env) if target.api_key_env else None
    if target.api_key_env and not api_key:
        raise UserError(f"{point.source}: target.api_key_env: environment variable "
                        f"{target.api_key_env} is not set (or empty)")
    where = f"{point.name} point {point.index} ({point.label})"
    until = point.measure.duration_s  # a time-based run stops submitting then

    async def one_pass(session: Any) -> TargetRun:
        if is_sessions:
            with frozen_heap():  # as run_requests does: no full collection inside a pass
                return await run_sessions(plan, point.workload, conversations,
                                          session=session, api_key=api_key,
                                          eos_token_id=getattr(tokenizer, "eos_token_id",
                                                               None))
        return await run_requests(plan, requests, session=session, api_key=api_key,
                                  submit_until_s=until)

    scraper = MetricsScraper.for_target(target, api_key, where)

    async def measure() -> tuple[Any, list[TargetRun]]:
        async with open_session(target, pool) as session:
            models = await fetch_models(session, target, api_key)
            passes: list[TargetRun] = []
            for i in range(point.measure.warmup):
                phase(f"warm-up {i + 1}/{point.measure.warmup}")
                warm = await one_pass(session)
                _refuse_all_failed(warm, num_sequences, point, "warm-up")
            if scraper is not None:  # the server's gauges over the measured repeats
                await scraper.start()
            try:
                for i in range(point.measure.repeats):
                    phase(f"repeat {i + 1}/{point.measure.repeats}")
                    run = await one_pass(session)
                    _refuse_all_failed(run, num_sequences, point, f"repeat {i + 1}")
                    passes.append(run)
            finally:
                if scraper is not None:
                    await scraper.stop()
            return models, passes

    workers: dict[str, Any] = {}
    if (target.workers > 1 or pool_type is not None) and not is_sessions:  # workers.py
        from infbench.client.workers import measure_with_workers

        models, passes, workers = measure_with_workers(
            target, requests, cap, api_key, point.measure.warmup, point.measure.repeats,
            phase, lambda run, what: _refuse_all_failed(run, num_sequences, point, what),
            pool_type, submit_until_s=until, scraper=scraper)
    else:
        models, passes = asyncio.run(measure())
    runs = [_summary(run, point) for run in passes]
    summary, spread = metrics_mod.aggregate_repeats(runs)
    for key in ("num_requests", "num_prompt_tokens", "num_output_tokens",
                NUM_REASONING_TOKENS):
        # Counts differ between repeats only when requests failed; the median of two can
        # be a half, so the summary keeps the last repeat's, like `requests` below.
        if key in runs[-1]:
            summary[key] = runs[-1][key]
    if is_sessions:  # per turn and per session: of the last repeat, like `requests`
        summary.update({k: runs[-1][k] for k in ("by_turn", "sessions")})
    short = duration_note(point, num_sequences - passes[-1].num_unsent, num_sequences)
    if short is not None:
        print(f"note: {where}: {short}", file=sys.stderr)
    summary["noise"] = metrics_mod.noise(runs)
    for warning in summary["noise"]["warnings"]:
        print(f"note: {where}: {warning}", file=sys.stderr)
    failed = [len(run.failures) for run in passes]
    first = next((run.failures[0] for run in passes if run.failures), None)
    by_reason = count_reasons(f.reason for run in passes for f in run.failures)
    if first is not None:
        reasons = ", ".join(f"{reason} {n}" for reason, n in by_reason.items())
        print(f"note: {where}: {sum(failed)} of {num_sequences * len(passes)} request(s) "
              f"failed over {len(passes)} repeat(s) ({reasons}); first ({first.request_id}, "
              f"{first.reason}): {first.message}", file=sys.stderr)
    prediction: dict[str, Any] = {}
    hardware = None
    if point.model and point.hardware != "unknown":
        hw = get_hardware(point.hardware)
        hardware = hw.to_dict()
        prediction = predict_point(point, point.model_config(), hw, requests=requests,
                                   conversations=conversations if is_sessions else None)
    env = client_env(target, models)
    env["model_source"] = point.model_source() or None
    telemetry = {"client": {
        # a session's turns after a failed one are never sent (client/sessions.py), nor
        # requests due after measure.duration_s
        "num_sent": sum(num_sequences - getattr(run, "num_skipped", 0) - run.num_unsent
                        for run in passes),
        "num_failed": sum(failed),
        "failed_per_repeat": failed, "failures_by_reason": by_reason,
        "failed_requests": [{"request_id": f.request_id, "reason": f.reason, "error": f.message}
                            for f in passes[-1].failures],
        "first_error": None if first is None else
        f"{first.request_id} ({first.reason}): {first.message}",
        "max_concurrency": cap, "client_host": socket.gethostname(),
        "send_error_s": _send_errors(passes[-1])}}
    rows = _rows(passes[-1])
    worker_of = workers.pop("worker_of", {})
    for row in rows:
        row["send_error_s"] = passes[-1].send_errors_s.get(row["id"])
        if worker_of:
            row["worker"] = worker_of.get(row["id"], worker_of.get(row["id"].rpartition("/")[0]))
    if workers:
        telemetry["client"]["workers"] = workers
    if scraper is not None:
        telemetry["server_metrics"] = scraper.result()
    return results_mod.build_result(
        point.to_dict(), metrics=summary, prediction=prediction, steps=[], env=env,
        seed=point.workload.seed, hardware=hardware, repeats=runs, spread=spread,
        extra={"telemetry": telemetry,
               "requests": rows, "engine_disabled": [],
               # prefix groups: intended hit rate vs the server's (telemetry.server_metrics)
               **({"prefix": with_measured(drawn.prefix, summary, telemetry)}
                  if drawn is not None and drawn.prefix is not None else {})})


def _send_errors(run: TargetRun) -> dict[str, Any]:
    from infbench.client.workers import send_error_summary

    return send_error_summary(list(run.send_errors_s.values()))


def _refuse_all_failed(run: TargetRun, num_sequences: int, point: ScenarioPoint,
                       what: str) -> None:
    if run.records or not run.failures:
        return
    assert point.target is not None  # a target point
    first = run.failures[0]
    reasons = ", ".join(f"{r} {n}" for r, n in count_reasons(f.reason for f in run.failures)
                        .items())
    # `run` prefixes the file and the point, as for every error of a point.
    raise UserError(f"target {point.target.base_url}: all "
                    f"{num_sequences} request(s) of the {what} failed ({reasons}); first "
                    f"({first.request_id}): {first.message}")
