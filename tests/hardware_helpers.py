"""A profile store for tests: `hardware: auto` (a CPU scenario's default) must not measure
the machine the tests run on, nor read the user's own profiles.

`seed_probe(home, spec)` writes a bandwidth probe of this machine into `home`'s profile
store with the figures of `spec` (the `cpu` entry by default), so `hardware: auto` resolves
to those figures without probing, as `measure.machine` would after a real probe.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from infbench.hardware.machine import this_machine
from infbench.hardware.spec import AUTO, HARDWARE, HardwareSpec


def probe_document(spec: HardwareSpec | None = None) -> dict:
    """A probe profile of this machine (what `measure.machine` caches) with `spec`'s
    figures."""
    spec = spec or HARDWARE["cpu"]
    machine = this_machine()
    data = asdict(spec)
    data.update(name=AUTO, interconnect=None,
                source=f"tests: the figures of {spec.name!r}, not a measurement")
    data["extra"] = {"device": "cpu", "probe": True, "machine": machine.key,
                     "machine_description": machine.describe()}
    return data


def seed_probe(home: Path, spec: HardwareSpec | None = None) -> Path:
    """Write the probe of `probe_document(spec)` under `home` (INFBENCH_HOME); its path."""
    path = Path(home) / "hardware" / f"probe-{this_machine().key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(probe_document(spec), indent=2))
    return path
