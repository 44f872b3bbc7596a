"""The router's /metrics: its own counters per replica, then the replicas' metrics merged.

Each replica's Prometheus text gains a `replica="i"` label on every sample, and each metric
family stays one group (its HELP and TYPE lines once, then every replica's samples), as the
text format requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Counted(Protocol):
    index: int
    routed: int
    outstanding: int
    failed: int
    healthy: bool


def router_metrics(replicas: Sequence[_Counted]) -> str:
    """The router's own families: requests, outstanding, upstream errors, rotation."""
    lines: list[str] = []
    for name, kind, help_, value in (
            ("infbench:router_requests_total", "counter",
             "Requests the router sent to each replica.", lambda r: r.routed),
            ("infbench:router_requests_outstanding", "gauge",
             "Requests a replica is answering now.", lambda r: r.outstanding),
            ("infbench:router_upstream_errors_total", "counter",
             "Requests a replica could not be reached for or failed while answering.",
             lambda r: r.failed),
            ("infbench:router_replica_healthy", "gauge",
             "1 while the replica is in rotation (it answers its health check).",
             lambda r: int(r.healthy))):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{replica="{r.index}"}} {value(r)}' for r in replicas]
    return "\n".join(lines) + "\n"


def _with_replica(sample: str, replica: int) -> str:
    name_labels, _, value = sample.rpartition(" ")
    if "{" in name_labels:
        name, rest = name_labels.split("{", 1)
        sep = "" if rest.startswith("}") else ","
        return f'{name}{{replica="{replica}"{sep}{rest} {value}'
    return f'{name_labels}{{replica="{replica}"}} {value}'


def merge_metrics(texts: Sequence[str]) -> str:
    """The replicas' Prometheus texts as one (i = the text's index in `texts`)."""
    families: dict[str, tuple[list[str], list[str]]] = {}  # name -> (comments, samples)
    for replica, text in enumerate(texts):
        current = ""
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    comments, _ = families.setdefault(current, ([], []))
                    if line not in comments:
                        comments.append(line)
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            family = current if current and name.startswith(current) else name
            families.setdefault(family, ([], []))[1].append(_with_replica(line, replica))
    out = [line for comments, samples in families.values() for line in (*comments, *samples)]
    return "\n".join(out) + ("\n" if out else "")
