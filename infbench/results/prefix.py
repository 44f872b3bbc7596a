"""Prefix sharing in a result: the hit rate the drawn requests mean beside the measured one.

A point with prefix groups (`workload.prefix`, or `shared_prefix_len` as one group) carries
a `prefix` section (schema.PrefixSharing): its groups and the intended hit rate, what an
ideal cache holding every group's prefix would serve (measure/prefix.py).  The measured
rate is read from the first of `MEASURED_FROM` the result has:

- `metrics.prefix_cache_hit_rate`: the engine's own count (`infbench run` of a model),
  prompt tokens served from its prefix cache at first admission / all prompt tokens;
- `telemetry.server_metrics.summary.prefix_cache_hit_rate`: a `target:` run's, from the
  server's Prometheus /metrics, where the run scraped them (absent otherwise: then the
  measured rate is unknown, never 0).

`infbench report` prints one row per such point, with the intended rate of prefixes cut to
whole KV blocks beside it for an engine run (what its cache can serve at most), and a note
where the two differ by more than `DIFFERS_BY` (the usual causes: hits are whole KV
blocks, a group's requests admitted in the same step as its first find nothing cached yet,
eviction under KV pressure, and a server's cache that is warm from earlier requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

MEASURED_FROM = ("metrics.prefix_cache_hit_rate",
                 "telemetry.server_metrics.summary.prefix_cache_hit_rate")
# A note when measured and intended differ by more than this (absolute) or than this
# fraction of the intended rate, whichever is larger.
DIFFERS_BY = 0.05
DIFFERS_BY_RELATIVE = 0.2


def _dig(data: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def measured_hit_rate(metrics: Any, telemetry: Any) -> tuple[float | None, str | None]:
    """(the measured hit rate, the result path it came from), (None, None) when neither the
    engine nor the server's metrics gave one.  Defensive: the server's summary may be
    absent, partial or hold a non-number."""
    sources = {"metrics": metrics, "telemetry": telemetry}
    for path in MEASURED_FROM:
        head, _, rest = path.partition(".")
        value = _dig(sources[head], rest)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            return float(value), path
    return None, None


def with_measured(section: dict[str, Any] | None, metrics: Any,
                  telemetry: Any) -> dict[str, Any] | None:
    """The result's `prefix` section with the measured rate beside the intended one."""
    if section is None:
        return None
    value, source = measured_hit_rate(metrics, telemetry)
    return {**section, "measured_hit_rate": value, "measured_from": source}


def _label(result: dict[str, Any]) -> str:
    name, label = result.get("name"), result.get("label")
    return f"{name} {label}" if name and label else str(label or name)


def _swept(result: dict[str, Any]) -> str:
    """`target_hit_rate=0.5`: the point's swept keys by their last part (narrow tables)."""
    swept = _dig(result.get("scenario"), "swept")
    if isinstance(swept, dict) and swept:
        return ",".join(f"{str(k).rsplit('.', 1)[-1]}={v}" for k, v in swept.items())
    return str(result.get("label") or result.get("name"))


def prefix_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per result with a `prefix` section; the measured rate is read again from the
    result (a section written before its telemetry still shows the server's rate)."""
    rows = []
    for r in results:
        section = r.get("prefix")
        if not isinstance(section, dict):
            continue
        measured, source = measured_hit_rate(r.get("metrics"), r.get("telemetry"))
        if measured is None:
            measured, source = section.get("measured_hit_rate"), section.get("measured_from")
        block = _dig(r.get("scenario"), "engine.block_size")
        rows.append({
            "label": _label(r), "point": _swept(r),
            "num_groups": section.get("num_groups"),
            "lengths": list(section.get("lengths") or []),
            "num_requests": list(section.get("num_requests") or []),
            "target_hit_rate": section.get("target_hit_rate"),
            "intended_hit_rate": section.get("intended_hit_rate"),
            "measured_hit_rate": measured, "measured_from": source,
            "block_hit_rate": _block_rate(section, block) if source == MEASURED_FROM[0]
            else None,
            # a server caches whole blocks of its own size: the rate at the common ones
            "server_block_hit_rates": {} if source == MEASURED_FROM[0] else {
                size: rate for size in SERVER_BLOCK_SIZES
                if (rate := _block_rate(section, size)) is not None},
        })
    return rows


SERVER_BLOCK_SIZES = (16, 128)  # vLLM's KV block on a GPU and on its CPU backend


def _block_rate(section: dict[str, Any], block: Any) -> float | None:
    """The intended rate with each prefix cut to whole blocks of `block` tokens (what the
    engine's cache can serve at most), None where the section does not say enough."""
    lengths, counts = section.get("lengths"), section.get("num_requests")
    total = section.get("num_prompt_tokens")
    if not (isinstance(block, int) and block > 0 and lengths and counts and total):
        return None
    hits = sum(max(c - 1, 0) * (n // block) * block
               for n, c in zip(lengths, counts, strict=False))
    return float(hits / total)


def differs(intended: float | None, measured: float | None) -> bool:
    if intended is None or measured is None:
        return False
    return abs(measured - intended) > max(DIFFERS_BY, DIFFERS_BY_RELATIVE * intended)


def prefix_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One stderr line per point whose measured hit rate is far from the intended one."""
    notes = []
    for row in rows:
        intended, measured = row["intended_hit_rate"], row["measured_hit_rate"]
        if not differs(intended, measured):
            continue
        server = str(row["measured_from"]).startswith("telemetry")
        blocks = row.get("block_hit_rate")
        at_sizes = ", ".join(f"{rate:.3f} at {size}" for size, rate in
                             (row.get("server_block_hit_rates") or {}).items())
        why = ("the server caches whole KV blocks of its own size (vLLM: 16 tokens on a "
               "GPU, 128 on its CPU backend" + (f"; whole blocks give {at_sizes} tokens a "
                                                 "block" if at_sizes else "") + "), its "
               "cache may be warm from earlier requests (warm-up, other clients), or it "
               "counts its own way" if server else
               "hits are whole KV blocks" + (f" (at most {blocks:.3f} here)"
                                             if blocks is not None else "") +
               ", requests of a group admitted in the same step as its first find nothing "
               "cached yet, and KV pressure evicts cached blocks")
        notes.append(f"note: {row['label']}: measured prefix-cache hit rate {measured:.3f} vs "
                     f"{intended:.3f} intended by the workload's prefix groups; {why} "
                     "(docs/prefix.md)")
    return notes


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _lengths(values: list[int]) -> str:
    if len(values) > 1 and len(set(values)) == 1:
        return f"{len(values)} x {values[0]}"
    text = ",".join(str(v) for v in values[:6])
    return text + (f",... ({len(values)})" if len(values) > 6 else "")


def prefix_table(rows: list[dict[str, Any]]) -> Table:
    """Intended vs measured per point; a measured rate from a server's /metrics is marked."""
    from rich.table import Table

    table = Table(title="prefix cache hit rate: intended by the prefix groups vs measured")
    labels = [r["point"] for r in rows]
    if len(set(labels)) < len(labels):  # several scenarios' points: name them
        labels = [r["label"] for r in rows]
    for i, col in enumerate(("point", "prefixes", "requests", "target", "intended",
                             "in blocks", "measured")):
        table.add_column(col, justify="left" if i < 3 else "right", overflow="fold")
    for label, r in zip(labels, rows, strict=True):
        server = str(r["measured_from"]).startswith("telemetry")
        if server:
            table.caption = "* read from the server's /metrics"
        table.add_row(label, _lengths(r["lengths"]), _lengths(r["num_requests"]),
                      _rate(r["target_hit_rate"]), _rate(r["intended_hit_rate"]),
                      _rate(r["block_hit_rate"]),
                      _rate(r["measured_hit_rate"]) + ("*" if server else ""))
    return table


def has_prefix(results: Sequence[dict[str, Any]]) -> bool:
    return any(isinstance(r.get("prefix"), dict) for r in results)


def prefix_columns(result: dict[str, Any]) -> dict[str, Any]:
    """The `prefix_*` columns of `report --json / --markdown / --csv` (None: no groups)."""
    rows = prefix_rows([result])
    row = rows[0] if rows else {}
    return {f"prefix_{key}": row.get(key)
            for key in ("num_groups", "target_hit_rate", "intended_hit_rate",
                        "measured_hit_rate")}
