"""How fast the simulation of issue 28 runs: N Poisson requests through the engine's own
scheduler over priced steps (infbench/sim), timed in its three parts.

    python -m infbench.benchmarks.sim_speed [--requests 10000] [--rate 1000]
        [--max-num-seqs 256] [--out results/bench_sim_speed.json]

Llama-3-8B on `h100-sxm` in bfloat16, prompts 256-768 and outputs 64-192 tokens (uniform,
seeded), `max_num_seqs` 256: at 1,000 req/s the running batch reaches 256. Prints wall and
CPU seconds of drawing the requests, the simulation and the metrics, the steps and the
largest batch; the target (issue 28) is at most 10 s in all on the 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable
from typing import Any

from infbench.benchmarks._main import bench_main

TARGET_S = 10.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from infbench.core.errors import UserError

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--out", default="results/bench_sim_speed.json")
    args = parser.parse_args(argv)
    for name in ("requests", "max_num_seqs"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.rate > 0:
        raise UserError(f"--rate must be > 0, got {args.rate}")
    return args


def _timed(fn: Any) -> tuple[Any, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def run(opts: argparse.Namespace, log: Any) -> dict[str, Any]:
    from infbench.hardware.spec import get_hardware
    from infbench.measure import metrics as metrics_mod
    from infbench.measure.simulation import point_requests, sim_config
    from infbench.scenario.schema import scenario_from_document
    from infbench.sim.engine_sim import simulate
    from infbench.sim.step_cost import make_pricer

    doc = {"name": "sim_speed", "model": {"preset": "llama3-8b"}, "hardware": "h100-sxm",
           "dtype": "bfloat16",
           "workload": {"kind": "poisson", "rate": opts.rate, "num_requests": opts.requests,
                        "prompt_len": 512, "gen_len": 128, "prompt_len_dist": "uniform",
                        "gen_len_dist": "uniform", "len_spread": 0.5},
           "engine": {"max_num_seqs": opts.max_num_seqs}}
    point = scenario_from_document(doc, "sim_speed").points()[0]
    cfg, hw, quant = point.model_config(), get_hardware("h100-sxm"), point.quant_config()
    load_before = os.getloadavg()[0]
    log(f"simulating {opts.requests} requests at {opts.rate:g} req/s")
    (reqs, _), gen_w, gen_c = _timed(lambda: point_requests(point, cfg))
    out, sim_w, sim_c = _timed(lambda: simulate(
        reqs, make_pricer(cfg, hw, "bfloat16", quant),
        sim_config(point, cfg, hw, quant, reqs, None), realtime_arrivals=True))
    _, met_w, met_c = _timed(lambda: metrics_mod.from_request_rows(
        metrics_mod.request_rows(out.requests), (50, 90), out.wall_s))
    total = gen_w + sim_w + met_w
    return {"requests": opts.requests, "rate": opts.rate, "max_num_seqs": opts.max_num_seqs,
            "steps": len(out.steps),
            "max_batch": max((s.num_running for s in out.steps), default=0),
            "parts": {"generate": [gen_w, gen_c], "simulate": [sim_w, sim_c],
                      "metrics": [met_w, met_c]},
            "total_wall_s": total, "target_s": TARGET_S,
            "status": "PASS" if total <= TARGET_S else "NOT MET",
            "load_before": load_before, "load_after": os.getloadavg()[0]}


def render(data: dict[str, Any]) -> Iterable[Any]:
    from rich.table import Table

    table = Table(title=f"simulation of {data['requests']:,} requests at {data['rate']:g} "
                        f"req/s: {data['steps']:,} steps, batch up to {data['max_batch']}")
    for col in ("part", "wall s", "CPU s"):
        table.add_column(col, justify="left" if col == "part" else "right")
    for name, (wall, cpu) in data["parts"].items():
        table.add_row(name, f"{wall:.2f}", f"{cpu:.2f}")
    table.add_row("total", f"{data['total_wall_s']:.2f}", "",
                  end_section=True)
    yield table
    yield (f"target <= {data['target_s']:g} s: {data['status']} (load average "
           f"{data['load_before']:.1f} before, {data['load_after']:.1f} after)")


def main(argv: list[str] | None = None) -> int:
    return bench_main(argv, parse_args, run, render)


if __name__ == "__main__":
    raise SystemExit(main())
