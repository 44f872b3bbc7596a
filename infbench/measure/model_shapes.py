"""The model shapes of scenario points, without torch: `predict`, `kv` and `roofline` need
each point's ModelConfig before (or instead of) loading any weights.  Each checkpoint is read
once (`checkpoint.metadata.config_from_source` keeps them by source and file stamp)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infbench.core.config import ModelConfig

if TYPE_CHECKING:  # annotations only: the flag-only commands never load the scenario schema
    from infbench.scenario.point import ScenarioPoint


def model_configs(points: list[ScenarioPoint]) -> list[ModelConfig]:
    """Each point's ModelConfig (`ScenarioPoint.model_config`: source, changes, pruning)."""
    return [point.model_config() for point in points]
