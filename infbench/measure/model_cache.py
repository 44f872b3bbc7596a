"""The models a run has loaded, shared by its points (`bench.run_point`'s `cache`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelCache:
    """Loaded models keyed by (source, overrides, dtype, device); `accuracy` keeps the
    accuracy figures of every model measured in the run (measure/accuracy.py); `said` the
    run-wide notes already printed (a flagged profile's flags: once per run, not per point)."""

    entries: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)
    said: set[str] = field(default_factory=set)

    def get(self, key: str, load: Callable[[], Any]) -> Any:
        if key not in self.entries:
            self.entries.clear()  # keep one model resident: sweeps are ordered by point
            self.entries[key] = load()
        return self.entries[key]
