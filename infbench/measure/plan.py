"""Capacity planning: which GPUs, in which layout, how many replicas serve a workload under
an SLO (`infbench plan`).

For every candidate hardware entry and layout: a tensor-parallel degree (a power of two that
divides the heads) times a pipeline depth of 1, 2 or 4 stages (pp > 1 simulated as pp
virtual engines over the stages, sim/pipeline_sim.py), and for an MoE model with tp > 1
also the experts spread over the tp devices (ep = tp) beside them sharded, whose
weights, the activation workspace and one longest request fit every device,
the scenario's point is simulated under its load (measure/simulation.py: the engine's
scheduler with its `engine:` settings, each step priced on that GPU) with 1, 2, 3, ...
replicas, each serving every R-th request, until the share of requests within every
objective reaches `slo.target` or the GPU budget is spent.  A candidate's row is its
smallest feasible replica count (or the last one tried); the plan is the feasible row with
the fewest GPUs, then the lowest TTFT p90.  Datasheet entries are the roofline's peaks:
derate them with `--efficiency` for an engine's achievable fraction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from infbench.core.errors import UserError
from infbench.hardware.spec import HardwareSpec, get_hardware
from infbench.measure.goodput import meets_slo
from infbench.measure.simulation import point_requests, simulate_point, unsimulated
from infbench.roofline.analysis import DEFAULT_RESERVE, device_memory

if TYPE_CHECKING:
    from infbench.scenario.measure import SloSection
    from infbench.scenario.point import ScenarioPoint

DEFAULT_GPUS = ("h100-sxm", "h200", "b200", "a100-80g", "l40s")
TP_DEGREES = (1, 2, 4, 8)
PP_DEGREES = (1, 2, 4)


@dataclass(frozen=True)
class Candidate:
    """One hardware x layout tried, at its smallest feasible replica count (or the last)."""

    hardware: str
    tp: int
    replicas: int
    fits: bool
    attainment: float | None = None
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    output_tokens_per_s: float | None = None
    reason: str = ""  # why it was not simulated (does not fit, tp does not divide)
    pp: int = 1
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    def feasible(self, target: float) -> bool:
        return self.attainment is not None and self.attainment >= target

    def to_dict(self, target: float) -> dict[str, Any]:
        return {"hardware": self.hardware, "tp": self.tp, "pp": self.pp, "ep": self.ep,
                "replicas": self.replicas,
                "gpus": self.gpus, "fits": self.fits, "slo_attainment": self.attainment,
                "ttft_p90_s": self.ttft_p90_s, "tpot_p90_s": self.tpot_p90_s,
                "output_tokens_per_s": self.output_tokens_per_s,
                "feasible": self.feasible(target), "reason": self.reason}


def _attainment(rows: list[dict[str, Any]], slo: SloSection) -> float:
    return sum(meets_slo(r, slo) for r in rows) / len(rows) if rows else 0.0


def plan(point: ScenarioPoint, slo: SloSection, hardware: tuple[str, ...] = DEFAULT_GPUS,
         max_gpus: int = 8, derate: Any = None) -> list[Candidate]:
    """Every candidate's row (module docstring); `derate(hw)` adjusts a hardware entry."""
    from infbench.core.parallel import ParallelConfig

    if max_gpus < 1:
        raise UserError(f"--max-gpus must be >= 1, got {max_gpus}")
    cfg = point.model_config()
    quant = point.quant_config()
    requests, _ = point_requests(point, cfg)
    longest = max(len(r.prompt_ids) + r.sampling.max_tokens for r in requests)
    out = []
    for name in hardware:
        hw: HardwareSpec = get_hardware(name)
        hw = derate(hw) if derate is not None else hw
        layouts = [(tp, pp, ep) for pp in PP_DEGREES for tp in TP_DEGREES
                   for ep in ((1, tp) if cfg.moe is not None and tp > 1 else (1,))
                   if tp * pp <= max_gpus and pp <= cfg.num_layers]
        for tp, pp, ep in layouts:
            par = ParallelConfig(tp=tp, pp=pp, ep=ep)
            skipped = partial(Candidate, hw.name, tp, 0, False, pp=pp, ep=ep)
            try:
                par.check_model(cfg)
            except UserError as exc:
                out.append(skipped(reason=str(exc)))
                continue
            if tp * pp > 1 and hw.interconnect is None:
                out.append(skipped(reason="no interconnect"))
                continue
            mem = device_memory(cfg, hw, point.dtype, quant, longest, 1, par, DEFAULT_RESERVE)
            if not mem.fits:
                out.append(skipped(reason="weights + one request do not fit"))
                continue
            why = unsimulated(replace(point, parallel=par))  # e.g. sessions with pp > 1
            if why:
                out.append(skipped(reason=why))
                continue
            best: Candidate | None = None
            for replicas in range(1, max_gpus // (tp * pp) + 1):
                layout = replace(point, parallel=replace(par, replicas=replicas),
                                 hardware=hw.name)
                sim = simulate_point(layout, cfg, hw, requests=requests)
                m = sim.metrics
                best = Candidate(hw.name, tp, replicas, True, _attainment(sim.rows, slo),
                                 m["ttft_s"].get("p90"), m["tpot_s"].get("p90"),
                                 m["output_tokens_per_s"], pp=pp, ep=ep)
                if best.feasible(slo.target):
                    break
            assert best is not None
            out.append(best)
    return out


def best_candidate(candidates: list[Candidate], target: float) -> Candidate | None:
    feasible = [c for c in candidates if c.feasible(target)]
    if not feasible:
        return None
    return min(feasible, key=lambda c: (c.gpus, c.ttft_p90_s or 0.0))
