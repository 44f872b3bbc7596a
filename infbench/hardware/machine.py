"""Which machine this is: the key a calibrated profile or a bandwidth probe is cached under.

`hardware: auto` (the default of a CPU scenario) means "this machine": its `infbench
calibrate` profile when it has one, else a quick read-bandwidth probe of it (see
`hardware.spec.machine_profile` and `measure.machine`).  Both are found again by this
machine's identity: the CPU model, its feature flags, the CPUs this process may run on
and the memory size (to the GiB, MemTotal moves by a few MB between boots).  A different
CPU, a container given other cores, or a resized VM is another machine and gets its own
measurement; nothing measured elsewhere is taken for this machine's.

No torch: the analytic commands read the profile store without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    """The identity of a machine as far as its speed is concerned."""

    cpu_model: str
    flags: tuple[str, ...]  # sorted
    num_cpus: int  # CPUs this process may run on (its affinity), not the host's count
    memory_gib: int

    @property
    def key(self) -> str:
        """16 hex digits: a stable digest of the four fields."""
        text = json.dumps([self.cpu_model, list(self.flags), self.num_cpus, self.memory_gib])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{self.cpu_model}, {self.num_cpus} CPUs, {self.memory_gib} GiB"


def _cpuinfo_fields(path: Path) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: they are alike
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _memory_gib(path: Path) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) * 1024 / 2**30)
    except (OSError, ValueError, IndexError):
        pass
    return 0  # unknown (not Linux): the other fields still tell machines apart


def _num_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def this_machine(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo",
                 meminfo: str | os.PathLike[str] = "/proc/meminfo") -> Machine:
    """This machine's identity (Linux /proc; elsewhere the platform module's names)."""
    fields = _cpuinfo_fields(Path(cpuinfo))
    model = (fields.get("model name") or fields.get("Hardware")
             or " ".join(f"{k} {fields[k]}" for k in ("CPU implementer", "CPU part")
                         if k in fields)
             or platform.processor() or platform.machine() or "cpu")
    flags = fields.get("flags") or fields.get("Features") or ""
    return Machine(model, tuple(sorted(set(flags.split()))), _num_cpus(),
                   _memory_gib(Path(meminfo)))
