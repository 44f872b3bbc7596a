"""The profile key of a model's calibrated step ratios and their lookup (torch-free).

`infbench calibrate --model` (measure/calibrate_model.py) measures them and
`measure.simulation.simulate_point` reads them through `step_scale`; this module is the
vocabulary both share, apart from the measurement (which runs the engine)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from infbench.hardware.spec import MODEL_STEPS_KEY, HardwareSpec, interpolate_curve


def step_key(source: dict[str, Any], overrides: dict[str, Any] | None, dtype: str,
             weights: str) -> str:
    """The profile key of one model as the engine runs it: source, overrides, dtype, format."""
    return json.dumps({"source": dict(sorted(source.items())),
                       "overrides": dict(sorted((overrides or {}).items())),
                       "dtype": dtype, "weights": weights}, sort_keys=True,
                      separators=(",", ":"))


def point_step_key(point: Any) -> str:
    """`step_key` of a scenario point's model (what `simulate_point` looks up)."""
    model = point.model
    overrides = model.changes() if model is not None else {}
    return step_key(point.model_source(), overrides, point.dtype, point.quant_config().weights)


def step_scale(hw: HardwareSpec, key: str) -> tuple[Callable[[int], float] | None, str]:
    """The model's measured / priced step ratio by token count, and a note saying where it
    came from; (None, note) when the profile has no entry for `key`."""
    entry = (hw.extra.get(MODEL_STEPS_KEY) or {}).get(key)
    if not entry:
        return None, ""
    curve = entry["by_tokens"]

    def scale(num_tokens: int) -> float:
        return interpolate_curve(curve, num_tokens)

    return scale, (f"steps scaled by this model's calibrated step profile "
                   f"(infbench calibrate --model, {entry.get('timestamp', '?')})")
