"""Scenario YAML -> validated `Scenario` -> a list of `ScenarioPoint`s (one per sweep point):
the names callers import.

User input is validated once, with pydantic (extra keys forbidden at every level).  Every
problem becomes a one-line `UserError` that names the file, the dotted key and what is
allowed, e.g. `scenarios/x.yaml: workload.batch_size: must be > 0 (got -1)`.

Where each part lives: scenario/values.py (strict value types and limits), derive.py (a
section derived from a config dataclass), model.py / engine.py / workload.py / measure.py /
parallel.py / decoding.py / target.py (the sections), document.py (the top-level model and
its expansion into points), loading.py (the file, `--set`), errors.py (the one-line
messages), point.py (the points).  Points are frozen: the engine and the analytic model
read core's configs and never import this package.
"""

from __future__ import annotations

from typing import Any

from infbench.scenario.document import Scenario
from infbench.scenario.engine import EngineSection, SpeculativeSection
from infbench.scenario.loading import apply_sets, load_scenario, scenario_from_document
from infbench.scenario.measure import GateSection, MeasureSection, SloSection
from infbench.scenario.model import (
    AttentionSection,
    ModelSection,
    OverridesSection,
    PruneSection,
    QuantSection,
)
from infbench.scenario.values import MAX_POINTS, MAX_VALUE, parse_fraction
from infbench.scenario.workload import SWEEPABLE_WORKLOAD, DatasetSection, WorkloadSection

__all__ = [
    "MAX_POINTS", "MAX_VALUE", "SWEEPABLE_WORKLOAD", "AttentionSection", "DatasetSection",
    "EngineSection", "GateSection", "MeasureSection", "ModelSection", "OverridesSection",
    "PruneSection", "QuantSection", "Scenario", "SloSection", "SpeculativeSection",
    "WorkloadSection", "apply_sets", "load_scenario", "parse_fraction",
    "scenario_from_document", "scenario_json_schema",
]


def scenario_json_schema() -> dict[str, Any]:
    return Scenario.model_json_schema()
