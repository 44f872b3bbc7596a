"""One row per scenario variant (`variants:` in a scenario): what `infbench report` prints
under its per-point table when the results come from a scenario with variants, e.g.
`scenarios/quantization.yaml`: stored weight bytes, KV bytes per token, decode tokens/s at
each batch size, and the accuracy (perplexity, its change against the unquantized model of
the same dtype, greedy agreement) that quantized and pruned points carry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from infbench.results.accessor import metric, scenario_number


def variant_of(result: Mapping[str, Any]) -> str | None:
    """The variant label the point ran under (`scenario.swept.variant`), or None."""
    swept = (result.get("scenario") or {}).get("swept") or {}
    value = swept.get("variant")
    return None if value is None else str(value)


def decode_tokens_per_s(result: Mapping[str, Any]) -> float | None:
    """Decode tokens over decode-only step time (the rate of the steady state)."""
    tokens, time_s = metric(result, "decode.num_tokens"), metric(result, "decode.time_s")
    if not tokens or not time_s:
        return None
    return tokens / time_s


def variant_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows in the order the variants first appear; decode tok/s keyed by batch size."""
    rows: dict[str, dict[str, Any]] = {}
    for r in results:
        name = variant_of(r)
        if name is None:
            continue
        row = rows.setdefault(name, {
            "variant": name, "dtype": (r.get("scenario") or {}).get("dtype"),
            "weight_bytes": metric(r, "weight_bytes"),
            "kv_bytes_per_token": metric(r, "kv_bytes_per_token"),
            "decode_tokens_per_s": {}, "perplexity": None, "perplexity_change": None,
            "greedy_agreement": None})
        batch = scenario_number(r, "workload.batch_size")
        if batch is not None:
            row["decode_tokens_per_s"][int(batch)] = decode_tokens_per_s(r)
        for key in ("perplexity", "perplexity_change", "greedy_agreement"):
            value = _accuracy(r, key)
            if value is not None and row[key] is None:
                row[key] = value
    return list(rows.values())


def _accuracy(result: Mapping[str, Any], key: str) -> float | None:
    acc = result.get("accuracy")
    if isinstance(acc, Mapping) and isinstance(acc.get(key), (int, float)):
        return float(acc[key])
    return None


def variant_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    batches = sorted({b for row in rows for b in row["decode_tokens_per_s"]})
    table = Table(title="variants: bytes, speed and accuracy", title_style="bold")
    for col in ("variant", "dtype", "weights MB", "KV B/token",
                *(f"decode tok/s b={b}" for b in batches), "perplexity", "change",
                "greedy agree"):
        table.add_column(col, justify="left" if col in ("variant", "dtype") else "right")

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for row in rows:
        speeds = [num(row["decode_tokens_per_s"].get(b), ".1f") for b in batches]
        change = row["perplexity_change"]
        table.add_row(row["variant"], str(row["dtype"] or "-"),
                      num(None if row["weight_bytes"] is None else row["weight_bytes"] / 1e6,
                          ".1f"),
                      num(row["kv_bytes_per_token"], ".0f"), *speeds,
                      num(row["perplexity"], ".3f"),
                      "-" if change is None else f"{100 * change:+.2f}%",
                      num(row["greedy_agreement"], ".3f"))
    return table
