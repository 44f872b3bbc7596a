"""The model shape of a source or a scenario point, without torch, each checkpoint read once.

`predict`, `kv`, `roofline`, `prune`, `eval` and `train-draft` need a model's ModelConfig
before (or instead of) loading any weights: a preset, an HF directory's config.json or a
GGUF file's metadata.  Reading GGUF metadata takes seconds, and one command may need the
same shape several times (attention flags, sweeps), so the base configs are kept by source
and file stamp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from infbench.checkpoint import metadata as configs
from infbench.core.config import ModelConfig
from infbench.core.errors import UserError

if TYPE_CHECKING:  # annotations only: the flag-only commands never load the scenario schema
    from infbench.scenario.point import ScenarioPoint

# Checkpoint configs already read, by source and file stamp (a rewritten file is read again).
_BASE_CONFIGS: dict[str, ModelConfig] = {}


def base_config(source: dict[str, str]) -> ModelConfig:
    """The ModelConfig of a preset, an HF directory or a GGUF file, before any override."""
    kind, value = next(iter(source.items()))
    path = Path(value)
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if kind != "preset" and \
        path.exists() else None
    key = json.dumps([source, stamp], sort_keys=True)
    if key not in _BASE_CONFIGS:
        if kind == "preset":
            _BASE_CONFIGS[key] = ModelConfig.from_name(value)
        elif kind == "path":
            _BASE_CONFIGS[key] = configs.config_from_hf_dir(value)
        else:
            _BASE_CONFIGS[key] = configs.config_from_gguf(configs.resolve_gguf(value))
    return _BASE_CONFIGS[key]


def model_configs(points: list[ScenarioPoint]) -> list[ModelConfig]:
    """Each point's ModelConfig (as `ScenarioPoint.model_config`), each checkpoint read once."""
    out = []
    for point in points:
        if point.model is None:  # a target scenario without a model section: its own error
            out.append(point.model_config())
            continue
        changes = point.model.changes()
        try:
            base = base_config(point.model.source())
            cfg = base.with_overrides(**changes) if changes else base
            prune = point.prune_config()  # model.prune: the pruned shape is the one that runs
            out.append(prune.pruned_shape(cfg) if prune.active else cfg)
        except UserError as exc:  # as ScenarioPoint.model_config words it
            raise UserError(f"{point.source}: {point_where(point)}{exc}") from None
    return out


def point_where(point: ScenarioPoint) -> str:
    """'point 2 (batch_size=8): ' for a swept point, '' for a single one: an error's prefix."""
    return f"point {point.index} ({point.label}): " if point.swept else ""
