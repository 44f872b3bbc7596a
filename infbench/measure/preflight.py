"""Validate a whole sweep before its first point is measured.

`infbench run` calls `preflight(points, out_dir, device)` once: it refuses, with one
line naming the point, the key and the limit, what would otherwise fail only when
that point is reached, after earlier points spent minutes:

- an `--out` that is a file, lies under a file or is not writable;
- a point whose longest request (prompt + gen, with the workload's length
  distribution drawn exactly as the run will draw it) exceeds the model's context;
- a point whose requests alone (millions of them) would not fit in host memory;
- a point whose weights plus the KV cache and state of one longest sequence (the
  least the engine needs, sized by `infbench.roofline.shapes`) exceed the free memory
  of the device or the byte budget `engine.kv_cache_memory`;
- a `gate:` block whose baseline is missing, unreadable, lacks the gated metric, or
  ran a different scenario or other points;
- a `target:` server that does not answer one `GET {base_url}/models` within 5 s, or
  answers it 401/403 (the key in `api_key_env` missing or refused).

A whole batch that does not fit at once is not an error (the engine queues and
preempts); it comes back as a note.  The analytic memory model counts weights, KV
cache and recurrent state; activations are not in it.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from infbench.core.config import ModelConfig
from infbench.core.device import available_memory_bytes, resolve_device
from infbench.core.errors import UserError
from infbench.measure.sessions import session_lengths
from infbench.measure.windows import timed_workload
from infbench.measure.workload import request_lengths
from infbench.results.gate import gated_values, load_results, parse_threshold, scenario_difference
from infbench.results.rundir import check_writable, normalized_points
from infbench.roofline.shapes import kv_cache_bytes, state_bytes_per_seq, weight_bytes
from infbench.scenario.measure import GateSection
from infbench.scenario.point import ScenarioPoint
from infbench.scenario.target import TargetSection, redact_url


def preflight(points: list[ScenarioPoint], out_dir: Path,
              device: str | None = None) -> list[str]:
    """Raise a UserError for the first problem found; return notes worth printing."""
    check_writable(out_dir)
    notes: list[str] = []
    free: dict[str, int] = {}
    for point in points:
        if point.target is not None:  # a server: its model is not here
            check_workers(point)
            check_host_memory(point, _lengths(point))
            continue
        check_single_device(point)
        cfg = point.model_config()  # each checkpoint is read once (config_from_source)
        lengths = _lengths(point)  # drawn once, read by every check
        longest = longest_request(lengths)
        check_context(point, cfg, longest)
        notes.extend(check_memory(point, cfg, longest, device, free))
        check_host_memory(point, lengths)
    if points and points[0].gate is not None:
        check_gate(points[0].gate, points)
    probed: set[tuple[str, str | None]] = set()
    for point in points:  # last: the network, once per server and key
        target = point.target
        if target is not None and (target.base_url, target.api_key_env) not in probed:
            probed.add((target.base_url, target.api_key_env))
            probe_target(target, _where(point))
    return notes


PROBE_TIMEOUT_S = 5.0


def check_workers(point: ScenarioPoint) -> None:
    """`target.workers` split a concurrency cap evenly (client/workers.py): each worker
    needs at least one of its streams."""
    assert point.target is not None
    workers = point.target.workers
    w = point.workload
    limit = w.batch_size if w.kind == "static" else getattr(w, "max_concurrency", None)
    if workers > 1 and w.kind == "sessions":
        raise UserError(f"{_where(point)}: target.workers: workload kind sessions runs its "
                        "conversations in one client process (not split across workers); "
                        "allowed with kind sessions: 1")
    if workers == 1 or limit is None:
        return
    streams = int(limit) * int(getattr(w, "samples_per_prompt", 1) or 1)
    if workers > streams:
        key = "batch_size" if w.kind == "static" else "max_concurrency"
        raise UserError(f"{_where(point)}: target.workers: {workers} workers cannot share "
                        f"workload.{key}'s {streams} stream(s) (the cap is split evenly, "
                        f"at least one stream each); allowed: 1 .. {streams}")


def probe_target(target: TargetSection, where: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One `GET {base_url}/models`: a server that does not answer, or answers 401/403 (a
    missing or refused key), is refused here, before the run claims its output directory.
    Any other answer, an error status included, is a server that is there."""
    url = target.base_url + "/models"
    shown = redact_url(url)
    headers = {"Accept": "application/json"}
    key = os.environ.get(target.api_key_env) if target.api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    # No proxies from the environment: the client (aiohttp) does not use them either.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        if exc.code not in (401, 403):
            return
        if target.api_key_env:
            raise UserError(f"{where}: target.api_key_env: the server at {shown} refused the "
                            f"key in {target.api_key_env} (HTTP {exc.code}); export the "
                            "server's key in it; nothing was measured") from None
        raise UserError(f"{where}: target.api_key_env: the server at {shown} asks for an API "
                        f"key (HTTP {exc.code}); export it in an environment variable and "
                        "name that in target.api_key_env; nothing was measured") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, DNS, timeout
        reason = getattr(exc, "reason", None) or exc
        raise UserError(f"{where}: target.base_url: no server answered GET {shown} within "
                        f"{timeout_s:g} s ({' '.join(str(reason).split()) or 'timed out'}); "
                        "start the server or fix target.base_url; nothing was measured"
                        ) from None


def check_single_device(point: ScenarioPoint) -> None:
    """The engine runs on one device: a `parallel:` layout is priced by `predict` (and for a
    `target:` server, whose layout it is), never measured here as if it ran."""
    par = point.parallel
    if par.trivial:
        return
    layout = ", ".join(f"{k} {v}" for k, v in (("tp", par.tp), ("pp", par.pp), ("ep", par.ep),
                                               ("replicas", par.replicas)) if v != 1) \
        or "disaggregated prefill and decode pools"
    raise UserError(f"{_where(point)}: parallel: {layout}: the engine runs on "
                    "one device, so run measures only parallel degrees of 1; price the layout "
                    "with `infbench predict` (or measure a server that runs it with target:)")


def _where(point: ScenarioPoint) -> str:
    return f"{point.source}: point {point.index} ({point.label})"


def longest_request(lengths: tuple[np.ndarray, np.ndarray]) -> tuple[int, int]:
    """(prompt, gen) of the request with the most tokens, drawn exactly as the run draws them.

    Text prompts take the lengths of random ones (the same seeded length streams); a
    chat template can still add a few tokens, which the engine checks when it runs.
    Only the lengths are drawn (vectorized), so a million-request point costs milliseconds.
    """
    prompt_lens, gen_lens = lengths
    i = int(np.argmax(prompt_lens + gen_lens))
    return int(prompt_lens[i]), int(gen_lens[i])


# Host memory the engine's bookkeeping takes per sequence (Request, Sequence, records,
# Python token lists), measured with `generate_requests` plus the engine's sequence
# objects at 3.7 kB for a 64-token prompt; rounded up so the check refuses early rather
# than letting the kernel kill the run halfway.
HOST_BYTES_PER_SEQUENCE = 2_000
HOST_BYTES_PER_TOKEN = 40


def _lengths(point: ScenarioPoint) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) lengths of every request; a session's turns at their longest."""
    if point.workload.kind == "sessions":
        return session_lengths(point.workload)
    return request_lengths(timed_workload(point))  # measure.duration_s: the requests it sends


def check_host_memory(point: ScenarioPoint, lengths: tuple[np.ndarray, np.ndarray]) -> None:
    """The workload's requests themselves must fit in host memory (a batch of millions of
    requests is valid YAML but would be OOM-killed while the requests are built)."""
    prompt_lens, gen_lens = lengths
    num_seqs = point.workload.num_sequences
    tokens = float(prompt_lens.sum() + gen_lens.sum()) * point.workload.samples_per_prompt
    need = num_seqs * HOST_BYTES_PER_SEQUENCE + tokens * HOST_BYTES_PER_TOKEN
    avail = free_memory_bytes("cpu")
    if need > avail / 2:  # the other half: weights, KV and the interpreter on a CPU run
        raise UserError(
            f"{_where(point)}: {num_seqs} requests of {prompt_lens.mean() + gen_lens.mean():.0f} "
            f"tokens on average need about {need / 1e9:.1f} GB of host memory for their "
            f"bookkeeping, more than half the free {avail / 1e9:.1f} GB; lower "
            "workload.batch_size / workload.num_requests; nothing was measured")


def check_context(point: ScenarioPoint, cfg: ModelConfig, longest: tuple[int, int]) -> None:
    prompt, gen = longest
    if prompt + gen > cfg.max_seq_len and point.workload.kind == "sessions":
        raise UserError(
            f"{_where(point)}: workload.sessions: the longest turn's prompt (its history with "
            f"every earlier reply at max_tokens) + output = {prompt} + {gen} = {prompt + gen} "
            f"tokens exceeds the model context (model max_seq_len {cfg.max_seq_len} "
            "tokens); allowed: fewer turns or shorter messages; nothing was measured")
    if prompt + gen > cfg.max_seq_len:
        w = point.workload
        drawn = "" if w.prompt_len_dist == w.gen_len_dist == "fixed" else " (longest drawn)"
        raise UserError(
            f"{_where(point)}: workload.prompt_len + workload.gen_len = {prompt} + {gen} = "
            f"{prompt + gen} tokens{drawn} exceeds the model context "
            f"(model max_seq_len {cfg.max_seq_len} tokens); nothing was measured")


def free_memory_bytes(device: str) -> int:
    """Free device memory (CUDA) or MemAvailable (CPU), as the engine sizes its KV budget."""
    import torch

    return available_memory_bytes(torch.device(device))


def check_memory(point: ScenarioPoint, cfg: ModelConfig, longest: tuple[int, int],
                 device: str | None, free: dict[str, int]) -> list[str]:
    key = "--device" if device else f"{point.source}: device"
    dev = resolve_device(device or point.device, key)
    if dev not in free:
        free[dev] = free_memory_bytes(dev)
    avail = free[dev]
    quant = point.quant_config()
    weights = weight_bytes(cfg, point.dtype, quant)
    prompt, gen = longest
    one_seq = (kv_cache_bytes(cfg, point.dtype, quant, prompt + gen, 1)
               + state_bytes_per_seq(cfg, point.dtype))
    gb = 1e9
    if weights + one_seq > avail:
        raise UserError(
            f"{_where(point)}: predicted memory {(weights + one_seq) / gb:.2f} GB (weights "
            f"{weights / gb:.2f} GB + KV and state of one {prompt + gen}-token sequence "
            f"{one_seq / gb:.3f} GB) exceeds the free memory of {dev} ({avail / gb:.2f} GB); "
            "nothing was measured")
    budget = point.engine.kv_cache_memory
    if budget > 1 and one_seq > budget:
        raise UserError(
            f"{_where(point)}: the KV cache and state of one {prompt + gen}-token sequence "
            f"({one_seq / gb:.3f} GB) exceed engine.kv_cache_memory={budget:g} bytes; "
            "raise it or lower the lengths; nothing was measured")
    w = point.workload
    batch = min(w.num_sequences, point.engine.max_num_seqs)
    total = weights + (kv_cache_bytes(cfg, point.dtype, quant, prompt + gen, batch)
                       + state_bytes_per_seq(cfg, point.dtype) * batch)
    if batch > 1 and total > avail:
        return [f"{_where(point)}: {batch} sequences at once need {total / gb:.2f} GB, more "
                f"than the free {avail / gb:.2f} GB of {dev}; the engine will queue or preempt"]
    return []


def check_gate(gate: GateSection, points: list[ScenarioPoint]) -> None:
    """The gate's baseline exists, is readable, carries the metric and ran these points."""
    if not gate.baseline:
        raise UserError("gate.baseline: no baseline result file given; set gate.baseline to a "
                        "result JSON or run directory (create one with `infbench run SCENARIO "
                        "--out DIR` without the gate); nothing was measured")
    path = Path(gate.baseline)
    if not path.exists():
        raise UserError(f"gate.baseline: {path} does not exist; create it with `infbench run "
                        "SCENARIO --out DIR` (without the gate) and point gate.baseline at DIR "
                        "or one of its result files; nothing was measured")
    parse_threshold(gate.max_regression)
    baselines = load_results([path])
    for base in baselines:
        gated_values(base, gate.metric, gate.normalize)  # the metric is there to gate on
    news = normalized_points(points)
    if len(baselines) == 1 and len(points) == 1:
        pairs = [(baselines[0], news[0])]
    else:
        index = {(b.get("name"), b.get("point_index")): b for b in baselines}
        pairs = []
        for point, new in zip(points, news, strict=True):
            found = index.get((point.name, point.index))
            if found is None:
                have = ", ".join(f"{n}[{i}]" for n, i in index)
                raise UserError(f"gate.baseline: {path} has no point {point.name}[{point.index}] "
                                f"({point.label}); it has {have}; nothing was measured")
            pairs.append((found, new))

    for base, new in pairs:
        diff = scenario_difference(base.get("scenario") or {}, {**new, "source": None})
        if diff:
            raise UserError(f"gate.baseline: {base.get('_path')} ran a different scenario "
                            f"than point {new.get('index')} ({new.get('label')}): {diff} "
                            "differs; nothing was measured")
