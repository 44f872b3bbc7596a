"""Predictions under load against measurement: Poisson sweeps on the CPU, simulated vs run.

`python -m infbench.benchmarks.sim_fidelity` runs, for each model (default the packaged
SmolLM2-135M and `llama-small`, a 200M-parameter random Llama), a Poisson sweep through the
in-process engine (`measure.bench.run_point`, as `infbench run` does) and reads each
result's `prediction.metrics` (measure/simulation.py: the engine's scheduler over steps
priced on `--hardware`, a profile `infbench calibrate` wrote; before each model's sweep the
benchmark runs `calibrate --model` on it, measure/calibrate_model.py, unless
`--no-model-steps`).  The rates are fractions of
the predicted capacity (`--load`: 0.3, 0.7 and 1.3 of the requests/s the simulation serves
with every request at t=0), from light load to past saturation; prompt and output lengths
are uniform within +-`--spread` of `--prompt` and `--gen`.  The SLO (for the SLO max rate)
puts each limit between the predicted p90s of the two lowest rates (their geometric mean,
at 90% of requests), so that the predicted SLO max rate is the lowest rate and the
measured one can fall on either side of it.

`--through serve` measures each point through `infbench serve` and the client instead
(sim_fidelity_serve.py: a server per point with the point's model and engine section, its
request overhead measured at idle and priced in the prediction as
`target.request_overhead_s`); `--threads N` sets `engine.num_threads` for either way.

Prints measured / predicted / error % for TTFT, TPOT and ITL at p50 and p90 per rate (and,
through serve, the overhead term), the measured and the predicted SLO max rate, the seconds
the simulation took beside the run's, and the load average before and after (the machine is
shared: rerun it quietly), and writes `--out` (JSON).  Targets (issue 28): p50 within 15%,
p90 within 25%, the same SLO max rate.

    python -m infbench.benchmarks.sim_fidelity [--hardware local] [--models smollm2-135m,
        llama-small] [--load 0.3,0.7,1.3] [--requests 48] [--prompt 128] [--gen 32]
        [--spread 0.5] [--through engine|serve] [--threads N]
        [--out results/bench_sim_fidelity.json] [--no-model-steps] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from infbench.benchmarks._main import bench_main

MODELS = {"smollm2-135m": {"gguf": "smollm2-135m"}, "llama-small": {"preset": "llama-small"}}
TARGETS = {"p50": 15.0, "p90": 25.0}  # percent
THROUGH = ("engine", "serve")
METRICS = ("ttft_s", "tpot_s", "itl_s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from infbench.core.errors import UserError

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hardware", default="local", help="a calibrated profile (default local)")
    parser.add_argument("--models", default="smollm2-135m,llama-small",
                        help=f"comma-separated, of: {', '.join(MODELS)}")
    parser.add_argument("--load", default="0.3,0.7,1.3", help="rates as fractions of capacity")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--spread", type=float, default=0.5)
    parser.add_argument("--through", default="engine",
                        help="engine: the in-process engine; serve: infbench serve + the client")
    parser.add_argument("--threads", type=int, default=None,
                        help="engine.num_threads (default: torch's)")
    parser.add_argument("--out", default="results/bench_sim_fidelity.json")
    parser.add_argument("--no-model-steps", action="store_true",
                        help="skip `calibrate --model` of each model before its sweep (the "
                             "simulation then prices with the profile's generic rates)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes for a test: llama-small with 2 layers, 8 requests")
    args = parser.parse_args(argv)
    try:
        args.load = [float(x) for x in args.load.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--load: comma-separated numbers, got {args.load!r}") from None
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for model in args.models:
        if model not in MODELS:
            raise UserError(f"--models: unknown {model!r}; allowed: {', '.join(MODELS)}")
    if not args.load or min(args.load) <= 0 or args.requests < 2 or args.prompt < 2 \
            or args.gen < 2 or not 0 <= args.spread < 1:
        raise UserError("--load entries > 0, --requests/--prompt/--gen >= 2 and --spread in "
                        "[0, 1) are required")
    if args.through not in THROUGH:
        raise UserError(f"--through: unknown {args.through!r}; allowed: {', '.join(THROUGH)}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if args.quick:
        args.models, args.requests, args.prompt, args.gen = ["llama-small"], 8, 32, 8
    return args


def _doc(args: argparse.Namespace, model: str, workload: dict[str, Any],
         slo: dict[str, float] | None = None) -> dict[str, Any]:
    source = dict(MODELS[model])
    if args.quick:
        source["overrides"] = {"num_layers": 2}  # type: ignore[assignment]
    return {"name": f"fidelity_{model}", "device": "cpu", "dtype": "float32",
            "hardware": args.hardware, "model": source,
            "workload": {"num_requests": args.requests, "prompt_len": args.prompt,
                         "gen_len": args.gen, "prompt_len_dist": "uniform",
                         "gen_len_dist": "uniform", "len_spread": args.spread, "seed": 0,
                         **workload},
            "engine": {"block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 4096,
                       **({"num_threads": args.threads} if args.threads else {})},
            "measure": {"warmup": 1, "repeats": 1, "percentiles": [50, 90, 99],
                        **({"slo": slo} if slo else {})}}


def _point(doc: dict[str, Any]) -> Any:
    from infbench.scenario.schema import scenario_from_document

    return scenario_from_document(doc, "sim_fidelity").points()[0]


def _predicted(point: Any) -> dict[str, Any]:
    from infbench.hardware.spec import get_hardware
    from infbench.measure.simulation import point_tokenizer, simulate_point

    tok = point_tokenizer(point)
    return simulate_point(point, point.model_config(), get_hardware(point.hardware),
                          tokenizer=tok).metrics


def _slo_between(args: argparse.Namespace, model: str, capacity: float) -> dict[str, float]:
    """An SLO the sweep's grid can tell apart: each limit is the geometric mean of the
    predicted p90 at the two lowest rates, so the prediction puts the SLO max rate at the
    lowest rate and the measurement checks it on both sides (the lowest rate must meet it,
    the next must not).  A run whose p90s are off by less than the square root of the two
    rates' predicted p90s gets the same SLO max rate."""
    low, high = sorted(args.load)[:2] if len(args.load) > 1 else (args.load[0],) * 2
    p90s = [_predicted(_point(_doc(args, model, {"kind": "poisson", "rate": frac * capacity})))
            for frac in (low, high)]

    def between(name: str) -> float:
        return 1e3 * math.sqrt(p90s[0][name]["p90"] * p90s[1][name]["p90"])

    return {"ttft_ms": round(between("ttft_s"), 1), "tpot_ms": round(between("tpot_s"), 2),
            "target": 0.9}


def _load() -> float:
    return os.getloadavg()[0]


def run(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    from infbench.measure.bench import ModelCache, run_point
    from infbench.results.goodput import max_rate_summaries
    from infbench.results.under_load import predicted_results

    rows: list[dict[str, Any]] = []
    sweeps: list[dict[str, Any]] = []
    cache = ModelCache()
    load_before = _load()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for model in args.models:
        steps = None
        if not args.no_model_steps:  # the model's own step ratios on the profile, saved into it
            from infbench.measure.calibrate_model import measure_model_steps, save_model_steps

            log(f"{model}: calibrate --model (its decode and prefill steps against their price)")
            key, steps = measure_model_steps(_doc(args, model, {"kind": "offline"}),
                                             args.hardware, quick=args.quick)
            save_model_steps(args.hardware, key, steps)
        offline = _predicted(_point(_doc(args, model, {"kind": "offline"})))
        capacity = offline["requests_per_s"]
        slo = _slo_between(args, model, capacity)
        results = []
        for frac in sorted(args.load):
            rate = round(frac * capacity, 3)
            doc = _doc(args, model, {"kind": "poisson", "rate": rate}, slo)
            doc["sweep"] = {"workload.rate": [rate]}  # labelled and grouped as a rate sweep
            point = _point(doc)
            log(f"{model}: rate {rate:g} req/s ({frac:g} of the predicted capacity "
                f"{capacity:.3g}), load {_load():.1f}")
            begin = time.perf_counter()
            served: dict[str, Any] = {}
            if args.through == "serve":
                from infbench.benchmarks.sim_fidelity_serve import run_served

                result, served = run_served(doc, point, model, args.prompt, log)
            else:
                result = run_point(point, cache=cache)
            run_s = time.perf_counter() - begin
            begin = time.perf_counter()
            plain = _predicted(point)
            sim_s = time.perf_counter() - begin
            if served:  # the engine's times alone, beside the prediction with the term
                served["predicted_without_overhead"] = {
                    f"{n}_{p}": plain[n][p] for n in METRICS for p in ("p50", "p90")}
            results.append(result)
            rows.append({**_row(model, frac, rate, result, run_s, sim_s), **served})
        measured = max_rate_summaries(results)
        predicted = max_rate_summaries(predicted_results(results))
        sweeps.append({"model": model, "capacity_requests_per_s": capacity, "slo": slo,
                       "model_steps": steps,
                       "max_rate_measured": measured[0]["max_rate"] if measured else None,
                       "max_rate_predicted": predicted[0]["max_rate"] if predicted else None})
    return {"kind": "infbench.bench.sim_fidelity", "hardware": args.hardware,
            "through": args.through,
            "started": started, "load_before": load_before, "load_after": _load(),
            "args": {k: v for k, v in vars(args).items()}, "rows": rows, "sweeps": sweeps,
            "targets_pct": TARGETS}


def _row(model: str, frac: float, rate: float, result: dict[str, Any], run_s: float,
         sim_s: float) -> dict[str, Any]:
    measured = result.get("metrics") or {}
    predicted = (result.get("prediction") or {}).get("metrics") or {}
    row: dict[str, Any] = {"model": model, "load": frac, "rate": rate,
                           "run_s": run_s, "sim_s": sim_s}
    for name in METRICS:
        for pct in ("p50", "p90"):
            m = (measured.get(name) or {}).get(pct)
            p = (predicted.get(name) or {}).get(pct)
            row[f"{name}_{pct}"] = {"measured": m, "predicted": p,
                                   "error_pct": None if not m or p is None
                                   else (p - m) / m * 100}
    return row


def render(data: dict[str, Any]) -> Iterable[Any]:
    from rich.table import Table

    serve = data.get("through") == "serve"
    way = "through infbench serve" if serve else "in-process engine"
    table = Table(title=f"predicted under load vs measured ({way}) on {data['hardware']} (ms, "
                        "measured / predicted error %)",
                  caption=f"{data['started']}; load average {data['load_before']:.1f} before, "
                          f"{data['load_after']:.1f} after (a shared machine: rerun quietly)")
    for col in ("model", "load", "rate req/s", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90",
                "ITL p50", "ITL p90", *(("overhead ms",) if serve else ()), "run s", "sim s"):
        table.add_column(col, justify="left" if col == "model" else "right")

    def cell(d: dict[str, Any]) -> str:
        m, p, e = d["measured"], d["predicted"], d["error_pct"]
        if m is None or p is None:
            return "-"
        return f"{m * 1e3:.3g} / {p * 1e3:.3g} {e:+.0f}%"

    for r in data["rows"]:
        table.add_row(r["model"], f"{r['load']:g}", f"{r['rate']:.3g}",
                      *(cell(r[f"{n}_{p}"]) for n in METRICS for p in ("p50", "p90")),
                      *((f"{r['request_overhead_s'] * 1e3:.2f}",) if serve else ()),
                      f"{r['run_s']:.1f}", f"{r['sim_s']:.2f}")
    yield table
    for s in data["sweeps"]:
        def text(rate: float | None) -> str:
            return "none" if rate is None else ("inf" if math.isinf(rate) else f"{rate:.3g}")

        yield (f"{s['model']}: SLO max rate (ttft <= {s['slo']['ttft_ms']} ms, tpot <= "
               f"{s['slo']['tpot_ms']} ms, 90%): measured {text(s['max_rate_measured'])}, "
               f"predicted {text(s['max_rate_predicted'])} req/s")


def main(argv: list[str] | None = None) -> int:
    return bench_main(argv, parse_args, run, render, min_width=190)


if __name__ == "__main__":
    sys.exit(main())
