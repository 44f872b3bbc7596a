"""The by-turn table of multi-turn sessions: what `infbench report` prints under its per-point
table when some result carries `metrics.by_turn` (a `workload.kind: sessions` run).

One row per point and turn index: the turn's requests, their mean prompt tokens (the
history grows with every turn), mean output tokens, and TTFT, TPOT and E2E at p50 and p90
(the stored statistics; `-` where a percentile was not measured).  A line per point under
the table counts its sessions: completed of planned, turns answered and skipped, and the
p50 of a completed session's duration (think times included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

_STATS = ("p50", "p90")


def _label(result: dict[str, Any]) -> str:
    name, label = result.get("name"), result.get("label")  # several scenarios may share labels
    if name and label in (None, "default"):
        return str(name)
    return f"{name} {label}" if name and label else str(label or name)


def by_turn_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (point, turn) of the results that ran sessions, in the results' order."""
    rows = []
    for r in results:
        for turn in (r.get("metrics") or {}).get("by_turn") or ():
            row: dict[str, Any] = {"label": _label(r), "turn": turn.get("turn"),
                                   "num_requests": turn.get("num_requests"),
                                   "mean_prompt_tokens": turn.get("mean_prompt_tokens"),
                                   "mean_output_tokens": turn.get("mean_output_tokens")}
            for key in ("ttft_s", "tpot_s", "e2e_s"):
                stats = turn.get(key) or {}
                row.update({f"{key}_{s}": stats.get(s) for s in _STATS})
            rows.append(row)
    return rows


def session_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """`sessions: NAME LABEL: 8 of 8 completed, 24 turns answered, 0 skipped, duration p50
    1.23 s` per result that ran sessions."""
    lines = []
    for r in results:
        s = (r.get("metrics") or {}).get("sessions")
        if not s:
            continue
        duration = (s.get("duration_s") or {}).get("p50")
        lines.append(f"sessions: {_label(r)}: {s.get('num_completed')} of "
                     f"{s.get('num_sessions')} completed, {s.get('num_turns_done')} turns "
                     f"answered, {s.get('num_turns_skipped')} skipped"
                     + (f", duration p50 {duration:.3g} s" if duration is not None else ""))
    return lines


def _ms(value: float | None) -> str:
    """Milliseconds to 0.1, three significant digits under 10 ms (a fast step is not 0.0)."""
    if value is None:
        return "-"
    ms = value * 1e3
    return f"{ms:.3g}" if ms < 10 else f"{ms:,.1f}"


def by_turn_table(rows: list[dict[str, Any]],
                  title: str = "sessions by turn (tokens: means; latencies in ms)") -> Table:
    """The by-turn rows as a table (`predict` titles its predicted one)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("point", overflow="fold", min_width=12)
    for col in ("turn", "reqs", "prompt", "output", "TTFT p50", "TTFT p90", "TPOT p50",
                "TPOT p90", "E2E p50", "E2E p90"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(row["label"], str(row["turn"]), str(row["num_requests"]),
                      "-" if row["mean_prompt_tokens"] is None else
                      f"{row['mean_prompt_tokens']:,.1f}",
                      "-" if row["mean_output_tokens"] is None else
                      f"{row['mean_output_tokens']:,.1f}",
                      *(_ms(row[f"{key}_{s}"]) for key in ("ttft_s", "tpot_s", "e2e_s")
                        for s in _STATS))
    return table
