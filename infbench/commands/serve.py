"""`infbench serve`: the OpenAI-compatible HTTP server (infbench/serve/) over one engine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from infbench.commands import _options as opt
from infbench.core.errors import UserError


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: str | None = typer.Option(None, "--model", callback=opt.non_empty,
                                     help=f"{opt.MODEL_HELP} Or give --scenario."),
    scenario: Path | None = typer.Option(
        None, "--scenario", help="Take the model and engine sections of this scenario file "
                                 "(a sweep must not change them)."),
    random_weights: bool = typer.Option(False, "--random-weights",
                                        help="Seeded random weights with the model's shapes."),
    dtype: str = typer.Option("auto", "--dtype", callback=opt.dtype_or_auto,
                              help=f"auto, {opt.choices(opt.DTYPES)}"),
    device: str = typer.Option("auto", "--device", callback=opt.non_empty,
                               help="auto | cpu | cuda"),
    backend: str | None = typer.Option(None, "--backend", callback=opt.backend,
                                       help=f"{opt.choices(opt.BACKENDS)} (default auto)"),
    quant: str = typer.Option("none", "--quant", callback=opt.weight_quant,
                              help="Weight quantization (model.quant.weights): "
                                   f"{opt.choices(opt.WEIGHT_QUANT)}"),
    kv_quant: str = typer.Option("none", "--kv-quant", callback=opt.kv_quant,
                                 help=f"KV-cache storage: {opt.choices(opt.KV_QUANT)}"),
    seed: int = typer.Option(0, "--seed", callback=opt.seed, help="Weights and sampling seed."),
    host: str = typer.Option("127.0.0.1", "--host", callback=opt.non_empty),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="0: any free port."),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", callback=opt.non_empty,
        help="The model name the API reports and expects (default: --model or the scenario's "
             "model)."),
    max_queue: int = typer.Option(
        256, "--max-queue", callback=opt.non_negative_int,
        help="Requests held beyond --max-num-seqs; more are answered 429."),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", callback=opt.positive_int,
        help="Prompt + completion tokens (default: the model's context)."),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", callback=opt.positive_int,
                                            help="Sequences batched at once (default 256)."),
    max_num_batched_tokens: int | None = typer.Option(
        None, "--max-num-batched-tokens", callback=opt.positive_int,
        help="Tokens per engine step (default 2048)."),
    kv_cache_memory: float | None = typer.Option(
        None, "--kv-cache-memory", callback=opt.positive_finite,
        help="KV budget: a fraction of free memory (<= 1) or bytes (> 1); default 0.9 on a "
             "GPU, min(4 GiB, 0.9 of free RAM) on a CPU."),
    num_kv_blocks: int | None = typer.Option(None, "--num-kv-blocks", callback=opt.positive_int,
                                             help="Fix the KV pool's size in blocks."),
    num_threads: int | None = typer.Option(None, "--num-threads", callback=opt.positive_int,
                                           help="CPU: torch intra-op threads."),
    shutdown_timeout: float = typer.Option(
        30.0, "--shutdown-timeout", callback=opt.non_negative_float,
        help="Seconds in-flight requests get to finish after SIGTERM/SIGINT; then streams "
             "end with an error event, whole responses with a 503."),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="INFBENCH_API_KEY", show_envvar=True,
        help="Require Authorization: Bearer KEY on the API routes."),
    protect_health_metrics: bool = typer.Option(
        False, "--protect-health-metrics", help="Require the key on /health and /metrics too."),
    allow_unauthenticated: bool = typer.Option(
        False, "--allow-unauthenticated",
        help="Allow a --host beyond loopback without --api-key."),
    allowed_hosts: str | None = typer.Option(
        None, "--allowed-hosts", callback=opt.non_empty,
        help="Comma-separated Host names accepted besides loopback and --host (a proxy's "
             "name); '*' accepts any."),
    max_connections: int | None = typer.Option(
        None, "--max-connections", callback=opt.positive_int,
        help="Open connections at most (default min(1024, ulimit -n - 64)); more get a 503."),
    max_request_bytes: int = typer.Option(
        16 << 20, "--max-request-bytes", callback=opt.positive_int,
        help="Largest request body (413 beyond); four of them may be read at once."),
    replicas: int = typer.Option(
        1, "--replicas", help="Engine processes behind one router (data parallel); each holds "
                              "its own model and KV pool."),
    threads_per_replica: int = typer.Option(
        1, "--threads-per-replica", help="With --replicas > 1: torch threads of each replica "
                                         "(pinned to their own cores when there are enough)."),
    router: str = typer.Option("round_robin", "--router",
                               help="With --replicas > 1: round_robin | least_outstanding."),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (completions, chat, /metrics)."""
    from infbench.serve import machine
    from infbench.serve.security import Security, check_bind

    if replicas < 1:
        raise UserError(f"--replicas must be >= 1, got {replicas}")
    machine.check_counts(max_queue=max_queue, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens,
                         num_kv_blocks=num_kv_blocks, max_model_len=max_model_len)
    machine.check_threads(num_threads, "--num-threads")
    machine.check_shutdown_timeout(shutdown_timeout)
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key (or INFBENCH_API_KEY): must not be empty")
    check_bind(host, api_key, allow_unauthenticated)
    security = Security(host=host, api_key=api_key, protect_health_metrics=protect_health_metrics,
                        allowed_hosts=_host_list(allowed_hosts))
    limits = machine.server_limits(max_connections, max_request_bytes, _free_ram())
    if kv_cache_memory is not None and kv_cache_memory > 1:
        where, free = _free_memory(device)
        machine.check_kv_memory(kv_cache_memory * replicas, free, where,
                                "--kv-cache-memory" + (f" x {replicas} replicas"
                                                       if replicas > 1 else ""))
    if replicas > 1:
        if threads_per_replica < 1:
            raise UserError(f"--threads-per-replica must be >= 1, got {threads_per_replica}")
        machine.check_threads(threads_per_replica, "--threads-per-replica")
        machine.check_threads(replicas, "--replicas")
        if num_threads is not None:
            raise UserError("--num-threads: with --replicas, give --threads-per-replica")
        args = _replica_args(model=model, scenario=scenario, random_weights=random_weights,
                             dtype=dtype, device=device, backend=backend, quant=quant,
                             kv_quant=kv_quant, seed=seed, served_model_name=served_model_name,
                             max_queue=max_queue, max_model_len=max_model_len,
                             max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens,
                             kv_cache_memory=kv_cache_memory, num_kv_blocks=num_kv_blocks,
                             shutdown_timeout=shutdown_timeout,
                             max_request_bytes=max_request_bytes)
        _serve_replicas(args, replicas, threads_per_replica, router, host, port,
                        shutdown_timeout, pass_threads=scenario is None, security=security,
                        limits=limits)
        return
    from infbench.serve.app import SERVER_KEY, create_app
    from infbench.serve.engine_loop import EngineLoop
    from infbench.serve.protocol import ModelContext
    from infbench.serve.runtime import run_server

    engine_flags = {"--max-num-seqs": max_num_seqs,
                    "--max-num-batched-tokens": max_num_batched_tokens,
                    "--kv-cache-memory": kv_cache_memory, "--backend": backend,
                    "--num-threads": num_threads}
    if scenario is not None:
        if model is not None:
            raise UserError("give --model or --scenario, not both")
        given = [k for k, v in engine_flags.items() if v is not None]
        if given or quant != "none" or kv_quant != "none" or random_weights:
            flag = given[0] if given else ("--quant" if quant != "none" else "--kv-quant"
                                           if kv_quant != "none" else "--random-weights")
            raise UserError(f"{flag}: with --scenario, set it in the scenario's model or engine "
                            "section")
        built = _from_scenario(scenario, device, num_kv_blocks, max_model_len)
    elif model is None:
        raise UserError("give --model NAME or --scenario FILE")
    else:
        built = _from_flags(model, dtype=dtype, device=device, seed=seed,
                            random_weights=random_weights, quant=quant, kv_quant=kv_quant,
                            engine_flags=engine_flags, num_kv_blocks=num_kv_blocks,
                            max_model_len=max_model_len)
    engine, loaded, label = built
    limit = max_model_len or loaded.config.max_seq_len  # checked by _engine
    name = served_model_name or label
    ctx = ModelContext(name=name, max_model_len=limit, vocab_size=loaded.config.vocab_size,
                       max_num_seqs=engine.engine_cfg.max_num_seqs, tokenizer=loaded.tokenizer)
    app = create_app(EngineLoop(engine, max_queue), ctx, security=security, limits=limits)

    def ready(bound: int) -> None:
        print(f"infbench serve: {name} ({loaded.weights}) on http://{host}:{bound} "
              f"(max_model_len {limit}, {engine.kv.num_blocks} KV blocks of "
              f"{engine.engine_cfg.block_size}, backend {engine.ops.name}; "
              f"{_posture(security)}); Ctrl-C stops", file=sys.stderr, flush=True)

    try:
        run_server(app, host, port, shutdown_timeout=shutdown_timeout, limits=limits,
                   ready=ready, drain=app[SERVER_KEY].drain)
    except OSError as exc:  # the address is in use, or not this machine's
        raise UserError(f"--host {host} --port {port}: {exc.strerror or exc}") from None
    print("infbench serve: stopped", file=sys.stderr)


def _from_flags(model: str, *, dtype: str, device: str, seed: int, random_weights: bool,
                quant: str, kv_quant: str, engine_flags: dict[str, Any],
                num_kv_blocks: int | None, max_model_len: int | None) -> tuple[Any, Any, str]:
    from infbench.checkpoint.metadata import model_source
    from infbench.core.config import EngineConfig, make_quant
    from infbench.core.device import auto_dtype, resolve_device
    from infbench.model.loader import load_model

    dev = resolve_device(device)
    if dtype == "auto":
        dtype = auto_dtype(dev)[0]
    loaded = load_model(model_source(model), dtype=dtype, device=dev, seed=seed,
                        weights="random" if random_weights else "auto",
                        quant=make_quant({"weights": quant}) if quant != "none" else None)
    defaults = EngineConfig()
    cfg = EngineConfig(
        max_num_seqs=engine_flags["--max-num-seqs"] or defaults.max_num_seqs,
        max_num_batched_tokens=(engine_flags["--max-num-batched-tokens"]
                                or defaults.max_num_batched_tokens),
        backend=engine_flags["--backend"] or defaults.backend,
        kv_cache_memory=engine_flags["--kv-cache-memory"] or defaults.kv_cache_memory,
        num_threads=engine_flags["--num-threads"])
    engine = _engine(loaded, cfg, dev, dtype, seed, kv_quant, None, num_kv_blocks,
                     max_model_len, model_source(model))
    return engine, loaded, model


def _from_scenario(path: Path, device: str, num_kv_blocks: int | None,
                   max_model_len: int | None) -> tuple[Any, Any, str]:
    from infbench.core.device import resolve_device
    from infbench.model.loader import load_model
    from infbench.scenario.schema import load_scenario
    from infbench.serve.machine import check_kv_memory

    points = load_scenario(path).points()
    keys = {repr((p.model, p.engine, p.dtype, p.device, p.speculative)) for p in points}
    if len(keys) > 1:
        raise UserError(f"{path}: its sweep changes the model or engine over {len(points)} "
                        "points; serve runs one model and engine")
    point = points[0]
    if point.model is None:
        raise UserError(f"{path}: no model section; serve runs the scenario's model")
    dev = resolve_device(point.device if device == "auto" else device)
    where, free = _free_memory(dev)
    check_kv_memory(point.engine.kv_cache_memory, free, where,
                    f"{path}: engine.kv_cache_memory")
    source, quant = point.model_source(), point.quant_config()
    loaded = load_model(source, dtype=point.dtype, device=dev, seed=point.workload.seed,
                        overrides=point.model.changes(),
                        weights=point.model.weights, quant=quant,
                        prune=point.prune_config())
    spec = point.speculative if point.speculative.enabled else None
    engine = _engine(loaded, point.engine, dev, point.dtype, point.workload.seed, quant.kv, spec,
                     num_kv_blocks, max_model_len, source)
    return engine, loaded, next(iter(source.values()))


def _engine(loaded: Any, cfg: Any, device: str, dtype: str, seed: int, kv_quant: str,
            spec: Any, num_kv_blocks: int | None, max_model_len: int | None,
            source: dict[str, str]) -> Any:
    """An engine sized for any request up to max_model_len (KVSizing.for_max_model_len)."""
    import dataclasses

    from infbench.core.device import available_memory_bytes
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.llm import CPU_KV_CACHE_BYTES  # the KV pool is RAM the machine shares

    if device == "cpu" and cfg.kv_cache_memory <= 1:  # a fraction of RAM: capped, as LLM does
        import torch

        free = available_memory_bytes(torch.device("cpu"))
        cfg = dataclasses.replace(cfg, kv_cache_memory=float(
            min(CPU_KV_CACHE_BYTES, int(cfg.kv_cache_memory * free))))
    limit = max_model_len or loaded.config.max_seq_len
    if limit > loaded.config.max_seq_len:
        raise UserError(f"--max-model-len {limit} exceeds the model context "
                        f"({loaded.config.max_seq_len} tokens)")
    if num_kv_blocks is not None:
        _check_fixed_pool(loaded.config, cfg, device, dtype, kv_quant, num_kv_blocks)
    sizing = KVSizing.for_max_model_len(limit, cfg, num_kv_blocks)
    return Engine.create(loaded, cfg, device, dtype, sizing=sizing, seed=seed,
                         kv_quant=kv_quant, speculative=spec, source=source)

def _check_fixed_pool(model_cfg: Any, cfg: Any, device: str, dtype: str, kv_quant: str,
                      num_kv_blocks: int) -> None:
    """--num-kv-blocks: the pool's bytes (every KV group's) against the free memory."""
    from infbench.engine.kv_cache import TORCH_DTYPES, kv_bytes_per_token_for, kv_value_dtype
    from infbench.engine.kv_groups import kv_group_windows
    from infbench.serve.machine import check_pool_bytes

    elem = kv_value_dtype(kv_quant, TORCH_DTYPES[dtype]).itemsize
    per_token = sum(kv_bytes_per_token_for(model_cfg, elem, g, kv_quant)
                    for g in range(len(kv_group_windows(model_cfg))))
    where, free = _free_memory(device)
    check_pool_bytes(num_kv_blocks, num_kv_blocks * cfg.block_size * per_token, free, where)


def _free_memory(device: str) -> tuple[str, int]:
    """(the device in words, its free bytes) for --device (auto resolved)."""
    import torch

    from infbench.core.device import available_memory_bytes, resolve_device

    dev = resolve_device(device, "--device")
    if dev == "cpu":
        return "this machine", _free_ram()
    return f"device {dev}", available_memory_bytes(torch.device(dev))


def _free_ram() -> int:
    import torch

    from infbench.core.device import available_memory_bytes

    return available_memory_bytes(torch.device("cpu"))


def _host_list(text: str | None) -> tuple[str, ...]:
    return tuple(h.strip() for h in (text or "").split(",") if h.strip())


def _posture(security: Any) -> str:
    if security.api_key is None:
        return "no API key"
    return "API key required" + (" on every route" if security.protect_health_metrics else
                                 ", /health and /metrics open")



def _replica_args(**flags: Any) -> list[str]:
    """The `infbench serve` flags every replica gets (not host, port or threads)."""
    args: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        else:
            args += [flag, str(value)]
    return args


def _serve_replicas(args: list[str], replicas: int, threads: int, policy: str, host: str,
                    port: int, shutdown_timeout: float, pass_threads: bool, security: Any,
                    limits: Any) -> None:
    """Start the replicas, then the router on host:port until SIGTERM/SIGINT."""
    from infbench.serve.replicas import ReplicaSet
    from infbench.serve.router import ROUTER_KEY, ROUTERS, Router, create_router_app
    from infbench.serve.runtime import run_server

    if policy not in ROUTERS:
        raise UserError(f"--router {policy!r}: allowed: {', '.join(ROUTERS)}")
    rs = ReplicaSet(args, replicas, threads, pass_threads=pass_threads)
    log_dir = rs.make_log_dir()
    print(f"infbench serve: starting {replicas} replicas, {threads} thread"
          f"{'s' if threads != 1 else ''} each; their logs in {log_dir}", file=sys.stderr,
          flush=True)
    reps = rs.start(log_dir=log_dir)
    clean = False
    try:
        app = create_router_app(Router(reps, policy), secret=rs.secret, security=security,
                                limits=limits, on_drain=rs.terminate)

        def ready(bound: int) -> None:
            cores = "; ".join(f"replica {r.index}: port {r.port}"
                              + (f", cores {r.cores}" if r.cores else "") for r in reps)
            print(f"infbench serve: router ({policy}) on http://{host}:{bound} in front of "
                  f"{cores} (replicas answer only the router; {_posture(security)}); "
                  "Ctrl-C stops", file=sys.stderr, flush=True)

        try:
            run_server(app, host, port, shutdown_timeout=shutdown_timeout, limits=limits,
                       ready=ready, drain=app[ROUTER_KEY].drain)
        except OSError as exc:
            raise UserError(f"--host {host} --port {port}: {exc.strerror or exc}") from None
    finally:
        clean = rs.stop(timeout_s=shutdown_timeout + 10)
    print("infbench serve: stopped" + (" (replica logs removed)" if clean else
                                       f"; a replica failed, its logs are in {log_dir}"),
          file=sys.stderr)
