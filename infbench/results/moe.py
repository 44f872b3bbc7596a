"""One row per MoE point: what `infbench report` prints under its per-point table when some
result carries `metrics.moe` (a run of an MoE model, e.g. `scenarios/moe_mixtral.yaml`).

A row reads what `infbench run` stored (measure/moe_routing.py computes it): the routed
experts touched per step (summed over the MoE layers) beside the number uniform routing
gives, E * (1 - (1 - k/E)^T) per layer for T tokens, the bytes of the touched experts'
weights beside the roofline's, their difference in %, and the routing skew (max/mean
tokens per expert, coefficient of variation); the same for decode-only steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from infbench.results.accessor import metric

if TYPE_CHECKING:
    from rich.table import Table

_FIELDS = ("experts_touched_per_step", "expected_experts_per_step", "expert_bytes",
           "expected_expert_bytes", "expert_bytes_error_pct", "max_over_mean", "cv")


def moe_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the points that measured MoE routing, in the results' order."""
    rows = []
    for r in results:
        if metric(r, "moe.experts_touched_per_step") is None:
            continue
        name, label = r.get("name"), r.get("label")  # several scenarios may share labels
        row: dict[str, Any] = {"label": f"{name} {label}" if name and label else
                               str(label or name)}
        row.update({f: metric(r, f"moe.{f}") for f in _FIELDS})
        for f in ("experts_touched_per_step", "expected_experts_per_step",
                  "expert_bytes_error_pct"):
            row[f"decode_{f}"] = metric(r, f"moe.decode.{f}")
        rows.append(row)
    return rows


def has_moe(results: Sequence[dict[str, Any]]) -> bool:
    return any(metric(r, "moe.experts_touched_per_step") is not None for r in results)


def moe_columns(result: dict[str, Any]) -> dict[str, Any]:
    """The `moe_*` columns of `report --json / --markdown / --csv` (None: no MoE routing)."""
    cols = {f"moe_{f}": metric(result, f"moe.{f}") for f in _FIELDS}
    cols.update({f"moe_decode_{f}": metric(result, f"moe.decode.{f}")
                 for f in ("experts_touched_per_step", "expected_experts_per_step",
                           "expert_bytes_error_pct")})
    return cols


def _num(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def moe_table(rows: list[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(title="MoE routing: measured vs uniform routing (the roofline's)")
    cols = ("point", "experts/step", "uniform", "expert MB", "roofline MB", "diff %",
            "max/mean", "CV", "decode experts/step", "decode uniform", "decode diff %")
    for i, col in enumerate(cols):
        table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        table.add_row(
            r["label"], _num(r["experts_touched_per_step"]),
            _num(r["expected_experts_per_step"]), _num(r["expert_bytes"], 1, 1e-6),
            _num(r["expected_expert_bytes"], 1, 1e-6), _num(r["expert_bytes_error_pct"]),
            _num(r["max_over_mean"], 2), _num(r["cv"], 2),
            _num(r["decode_experts_touched_per_step"]),
            _num(r["decode_expected_experts_per_step"]),
            _num(r["decode_expert_bytes_error_pct"]))
    return table
