"""`infbench plan SCENARIO --slo ...`: GPU capacity planning by the simulation under load.

Parsing and printing only; the candidates come from `infbench.measure.plan` (the scenario's
first point simulated on each GPU, tensor-parallel degree and replica count).  No torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from infbench.core.errors import UserError


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)


def _slo(text: str | None, point: Any) -> Any:
    from pydantic import ValidationError

    from infbench.scenario.measure import SloSection

    if text is None:
        if point.measure.slo is None:
            raise UserError(f"{point.source}: plan needs objectives: --slo ttft_ms=...,"
                            "tpot_ms=... or measure.slo in the scenario")
        return point.measure.slo
    values: dict[str, float] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise UserError(f"--slo: {item!r} is not KEY=NUMBER; allowed keys: ttft_ms, "
                            "tpot_ms, e2e_ms, target") from None
    try:
        return SloSection.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "slo"
        raise UserError(f"--slo: {where}: {first['msg']}; allowed keys: ttft_ms, tpot_ms, "
                        "e2e_ms (> 0), target (0, 1]") from None


def plan_command(
    scenario: Path = typer.Argument(..., help="A scenario YAML: its first point's model, "
                                    "workload and engine settings."),
    slo: str | None = typer.Option(None, "--slo", help="ttft_ms=200,tpot_ms=30[,e2e_ms=..]"
                                   "[,target=0.9] (default: the scenario's measure.slo)."),
    hardware: str | None = typer.Option(None, "--hardware", help="Comma-separated hardware "
                                        "entries to try (default: h100-sxm, h200, b200, "
                                        "a100-80g, l40s)."),
    max_gpus: int = typer.Option(8, "--max-gpus", help="The most GPUs of one candidate."),
    efficiency: str | None = typer.Option(
        None, "--efficiency", help="Derate every candidate's peaks: a fraction in (0, 1], "
        "or an engine whose published rows fit the fractions (as predict --efficiency)."),
    as_json: bool = typer.Option(False, "--json", help="Print the candidates as JSON."),
) -> None:
    """GPUs, layout and replicas that serve a workload within an SLO.

    Simulated under load on each candidate (docs/predictions-under-load.md)."""
    from infbench.measure.plan import DEFAULT_GPUS, best_candidate, plan
    from infbench.scenario.schema import load_scenario

    if max_gpus < 1:
        raise UserError(f"--max-gpus: must be >= 1 (got {max_gpus})")
    point = load_scenario(scenario).points()[0]
    objectives = _slo(slo, point)
    names = tuple(h.strip() for h in hardware.split(",") if h.strip()) if hardware \
        else DEFAULT_GPUS
    derate, derated = None, "the datasheet peaks (no --efficiency)"
    if efficiency is not None:  # the achievable fractions: given, or fitted on an engine's rows
        from infbench.measure.efficiency import parse_efficiency
        from infbench.measure.prediction import derate as derate_hw

        eff, _ = parse_efficiency(efficiency)
        derated = (f"{eff.bandwidth:.0%} of the bandwidth and {eff.compute:.0%} of the compute "
                   f"peaks ({eff.label})")

        def derate(hw: Any) -> Any:
            return derate_hw(hw, eff)

    rows = plan(point, objectives, names, max_gpus, derate=derate)
    best = best_candidate(rows, objectives.target)
    if as_json:
        sys.stdout.write(json.dumps({"candidates": [r.to_dict(objectives.target) for r in rows],
                                     "plan": None if best is None
                                     else best.to_dict(objectives.target),
                                     "efficiency": derated}, indent=2) + "\n")
        return
    _print(rows, best, objectives, point)
    print(f"priced at {derated}")


def _print(rows: list[Any], best: Any, slo: Any, point: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    goals = ", ".join(f"{k.removesuffix('_ms')} <= {getattr(slo, k):g} ms"
                      for k in ("ttft_ms", "tpot_ms", "e2e_ms") if getattr(slo, k) is not None)
    w = point.workload
    load = f"{w.kind} at {w.rate:g} req/s" if w.kind == "poisson" else w.kind
    table = Table(title=f"plan: {point.name}, {w.num_prompts} requests ({load}); SLO {goals} "
                        f"for >= {slo.target:.0%}")
    for col in ("hardware", "tp", "pp", "ep", "replicas", "GPUs", "within SLO %", "TTFT p90 ms",
                "TPOT p90 ms", "out tok/s", "feasible"):
        table.add_column(col, justify="left" if col in ("hardware", "feasible") else "right")
    for r in rows:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:.3g}"

        table.add_row(r.hardware, str(r.tp), str(r.pp), str(r.ep), str(r.replicas or "-"),
                      str(r.gpus or "-"),
                      "-" if r.attainment is None else f"{r.attainment * 100:.1f}",
                      ms(r.ttft_p90_s), ms(r.tpot_p90_s),
                      "-" if r.output_tokens_per_s is None else f"{r.output_tokens_per_s:,.0f}",
                      "yes" if r.feasible(slo.target) else (r.reason or "no"))
    console = Console(width=max(Console().width, 120))
    console.print(table)
    if best is None:
        console.print(f"plan: no candidate meets the SLO ({goals} for >= {slo.target:.0%}) "
                      "within the GPUs tried; allowed: more --max-gpus, other --hardware or a "
                      "looser --slo", highlight=False)
    else:
        console.print(f"plan: {best.replicas} x {best.hardware} tp {best.tp} pp {best.pp} "
                      f"ep {best.ep} "
                      f"({best.gpus} GPUs): "
                      f"{best.attainment * 100:.1f}% within the SLO, TTFT p90 "
                      f"{best.ttft_p90_s * 1e3:.3g} ms", highlight=False)
