"""A scenario's resolved points: typed, frozen, all scalars: what `run`, `predict` and
`serve` consume.

A point holds each section as it was validated, or the config derived from it: `.model` is
the frozen `ModelSection` (weights resolved), `.workload` a `WorkloadPoint`, `.engine` and
`.speculative` core's configs, `.measure`, `.gate` and `.target` the sections themselves.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from infbench.checkpoint.metadata import config_from_source, native_quant
from infbench.core.config import EngineConfig, ModelConfig, PruneConfig, QuantConfig
from infbench.core.decoding import DiffusionConfig
from infbench.core.errors import UserError
from infbench.core.parallel import ParallelConfig
from infbench.core.speculative import SpeculativeConfig
from infbench.scenario.measure import GateSection, MeasureSection
from infbench.scenario.model import ModelSection
from infbench.scenario.target import TargetSection
from infbench.scenario.workload import WorkloadPoint

# The point's model is its validated section: source(), changes(), to_dict().
ModelPoint = ModelSection


@dataclass(frozen=True)
class ScenarioPoint:
    """One fully resolved point of a scenario: what `bench.run_point` and `predict` consume."""

    name: str
    index: int
    device: str  # auto | cpu | cuda (as written; the runner resolves auto)
    dtype: str  # resolved: float32 | float16 | bfloat16
    hardware: str  # resolved: cpu on a CPU, else the entry of the GPU NVML names
    model: ModelSection | None  # None: a target scenario without a model section
    workload: WorkloadPoint
    engine: EngineConfig
    speculative: SpeculativeConfig
    measure: MeasureSection
    gate: GateSection | None
    swept: dict[str, Any] = field(default_factory=dict)  # swept keys -> values at this point
    source: str = "<scenario>"  # the scenario file, for error messages
    dtype_reason: str = ""  # with dtype: auto, what it resolved to and why (else empty)
    # other defaults this point resolved from its model, said once by `run` (else empty)
    notes: tuple[str, ...] = ()
    target: TargetSection | None = None  # the `target:` section: a server measured instead
    parallel: ParallelConfig = ParallelConfig()  # the `parallel:` section
    decoding: DiffusionConfig | None = None  # the `decoding:` section; None: autoregressive

    @property
    def label(self) -> str:
        """`batch_size=8,prompt_len=128` from the swept keys, or `default`."""
        return point_label(self.swept)

    def model_source(self) -> dict[str, str]:
        return {} if self.model is None else self.model.source()

    def model_config(self) -> ModelConfig:
        """The ModelConfig of this point: preset or loaded config, then overrides + attention."""
        m = self.model
        if m is None:
            raise UserError(f"{self.source}: model: no model section; this target scenario "
                            "names no model shape (add model: to price it)")
        try:
            cfg = config_from_source(m.source())  # each checkpoint read once
            changes = m.changes()
            cfg = cfg.with_overrides(**changes) if changes else cfg
            prune = self.prune_config()
            return prune.pruned_shape(cfg) if prune.active else cfg  # the shape that runs
        except UserError as exc:
            raise UserError(f"{self.source}: {self.where()}{exc}") from None

    def quant_config(self) -> QuantConfig:
        """model.quant; with native weights, priced by the GGUF file's own tensor types."""
        m = self.model
        try:
            quant = QuantConfig() if m is None else m.quant_config()
            if m is None or quant.weights != "native":
                return quant
            overrides = m.overrides.model_dump(exclude_unset=True)
            return native_quant(quant, m.source(), m.weights, overrides or None)
        except UserError as exc:
            raise UserError(f"{self.source}: {self.where()}{exc}") from None

    def prune_config(self) -> PruneConfig:
        try:
            return PruneConfig() if self.model is None else self.model.prune_config()
        except UserError as exc:
            raise UserError(f"{self.source}: {self.where()}{exc}") from None

    def where(self) -> str:
        """'point 2 (batch_size=8): ' for a swept point, '' for a single one: an error's
        prefix."""
        return f"point {self.index} ({self.label}): " if self.swept else ""

    def to_dict(self) -> dict[str, Any]:
        """The resolved point as JSON-able data (stored inside every result file)."""
        return {
            "name": self.name, "index": self.index, "label": self.label, "source": self.source,
            "device": self.device, "dtype": self.dtype, "hardware": self.hardware,
            "model": {} if self.model is None else self.model.to_dict(),
            "workload": _workload_dict(self.workload),
            "engine": dataclasses.asdict(self.engine),
            "speculative": dataclasses.asdict(self.speculative),
            "measure": self.measure.model_dump(),
            "gate": self.gate.model_dump() if self.gate is not None else None,
            "swept": dict(self.swept),
            **({"target": self.target.model_dump()} if self.target is not None else {}),
            **({"decoding": self.decoding.to_dict()} if self.decoding is not None else {}),
        }


def _workload_dict(workload: WorkloadPoint) -> dict[str, Any]:
    """The workload as strict JSON: num_requests as run (resolved when unset), a rate of
    inf as the string "inf", the dataset and the prefix block as their keys."""
    out = {f.name: getattr(workload, f.name) for f in dataclasses.fields(workload)}
    out["num_requests"] = workload.num_prompts
    if out["rate"] == math.inf:
        out["rate"] = "inf"
    if workload.dataset is not None:
        out["dataset"] = workload.dataset.model_dump()
    if workload.prefix is not None:
        out["prefix"] = workload.prefix.model_dump(mode="json")  # tuples as lists
    if workload.sessions is not None:
        out["sessions"] = workload.sessions.model_dump()
    return out


def point_label(swept: dict[str, Any]) -> str:
    """`batch_size=8,prompt_len=128`; a swept mapping reads `model.attention=gqa(kv_heads=8)`."""
    return ",".join(f"{k}={_label_value(v)}" for k, v in swept.items()) or "default"


def _label_value(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("kind")
        rest = ",".join(f"{k}={v}" for k, v in value.items() if k != "kind")
        if kind is None:
            return "{" + rest + "}"
        return f"{kind}({rest})" if rest else str(kind)
    return str(value)
