"""Series read from a result's per-request and per-step records, for the report's figures.

A result keeps the last repeat's `requests` (arrival, first token and finish on the run's
clock, each inter-token gap, preemptions) and `steps` (start, duration, running and waiting
sequences, KV blocks, MoE routing); the functions here turn them into plain lists, in ms or
s as their names say, so the figures (`plots.html.figures`) only draw and tests check
numbers.  Metric definitions are the project's: TTFT = first token - arrival, TPOT = (E2E -
TTFT) / (output tokens - 1), ITL the gaps between one request's tokens.
"""

from __future__ import annotations

from typing import Any

from infbench.plots.measured import _steps, cdf, point_labels

MAX_TIMELINE_REQUESTS = 300  # a bar per request: more is unreadable and heavy
LOAD_BINS = 60  # output tokens/s over time is counted in this many intervals


def _requests(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = result.get("requests")
    if not isinstance(rows, list):
        return []
    return [r for r in rows if isinstance(r, dict) and _is_num(r.get("arrival_s"))]


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _num(value: Any) -> float | None:
    """A number from a record as float, None for anything else (a bool is no number)."""
    return float(value) if _is_num(value) else None


def request_latencies_ms(result: dict[str, Any]) -> dict[str, list[float]]:
    """Per-request TTFT and TPOT and every ITL gap (ms) of the result's request rows."""
    out: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": []}
    for r in _requests(result):
        first, finish = _num(r.get("first_token_s")), _num(r.get("finish_s"))
        n = r.get("num_output_tokens")
        if first is not None:
            out["ttft"].append((first - r["arrival_s"]) * 1e3)
            if finish is not None and isinstance(n, int) and n > 1:
                out["tpot"].append((finish - first) / (n - 1) * 1e3)
        out["itl"] += [v * 1e3 for v in r.get("itl_s") or [] if _is_num(v)]
    return out


def request_latency_cdfs(result: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """{metric: CDF} of TTFT and TPOT per request and of ITL per token; {} without rows."""
    return {metric: cdf(values) for metric, values in request_latencies_ms(result).items()
            if values}


def request_bars(result: dict[str, Any],
                 limit: int = MAX_TIMELINE_REQUESTS) -> dict[str, Any]:
    """The timeline's bars, by arrival: arrival, first token and finish (ms), the two
    phases' lengths, token counts, preemptions, finish reason; at most `limit` of them."""
    rows = sorted(_requests(result), key=lambda r: r["arrival_s"])
    bars = []
    for r in rows[:limit]:
        arrival = r["arrival_s"] * 1e3
        first = r["first_token_s"] * 1e3 if _is_num(r.get("first_token_s")) else None
        finish = r["finish_s"] * 1e3 if _is_num(r.get("finish_s")) else None
        first = arrival if first is None else first
        finish = first if finish is None else finish
        bars.append({"id": str(r.get("id")), "arrival_ms": arrival, "first_token_ms": first,
                     "finish_ms": finish, "ttft_ms": first - arrival,
                     "decode_ms": finish - first, "e2e_ms": finish - arrival,
                     "num_prompt_tokens": r.get("num_prompt_tokens"),
                     "num_output_tokens": r.get("num_output_tokens"),
                     "num_preemptions": int(r.get("num_preemptions") or 0),
                     "finish_reason": str(r.get("finish_reason") or "-")})
    return {"rows": bars, "num_requests": len(rows)}


def acceptance_by_position(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per speculative point: the acceptance at draft positions 1..k (None skipped)."""
    lines = []
    for r, label in zip(results, point_labels(results), strict=True):
        spec = (r.get("metrics") or {}).get("speculative")
        values = spec.get("acceptance_by_position") if isinstance(spec, dict) else None
        if not isinstance(values, list):
            continue
        xy = [(i + 1, v) for i, v in enumerate(values) if _is_num(v)]
        if xy:
            lines.append({"label": label, "position": [x for x, _ in xy],
                          "acceptance": [y for _, y in xy]})
    return lines


def moe_steps(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per MoE point: each step's routed experts touched, uniform routing's expectation and
    the skew (max / mean tokens per expert)."""
    out = []
    for r, label in zip(results, point_labels(results), strict=True):
        rows = [(s.get("index"), s["moe"]) for s in _steps(r) if isinstance(s.get("moe"), dict)]
        if not rows:
            continue
        out.append({"label": label, "step": [i for i, _ in rows],
                    "experts_touched": [m.get("experts_touched") for _, m in rows],
                    "expected_experts": [m.get("expected_experts") for _, m in rows],
                    "max_over_mean": [m.get("max_over_mean") for _, m in rows]})
    return out


def load_over_time(result: dict[str, Any]) -> dict[str, Any] | None:
    """Requests in flight and KV blocks in use at each engine step (from `steps`), or in
    flight from the request rows (a client run has no steps); output tokens/s counted in
    `LOAD_BINS` intervals from each request's token times.  None without either record."""
    steps = [s for s in _steps(result) if _is_num(s.get("start_s"))]
    requests = _requests(result)
    if not steps and not requests:
        return None
    out: dict[str, Any] = {"source": "steps" if steps else "requests", "kv_used_pct": []}
    if steps:
        out["t_s"] = [s["start_s"] for s in steps]
        out["in_flight"] = [int(s.get("num_running") or 0) + int(s.get("num_waiting") or 0)
                            for s in steps]
        if all(s.get("kv_blocks_total") for s in steps):
            out["kv_used_pct"] = [100 * (s.get("kv_blocks_used") or 0) / s["kv_blocks_total"]
                                  for s in steps]
    else:  # +1 at each arrival, -1 at each finish
        events = sorted([(r["arrival_s"], 1) for r in requests] +
                        [(r["finish_s"], -1) for r in requests if _is_num(r.get("finish_s"))])
        level, out["t_s"], out["in_flight"] = 0, [0.0], [0]
        for t, change in events:
            level += change
            out["t_s"].append(t)
            out["in_flight"].append(level)
    token_times: list[float] = []
    for r in requests:
        t = _num(r.get("first_token_s"))
        if t is None:
            continue
        token_times.append(t)
        for gap in r.get("itl_s") or []:
            if _is_num(gap):
                t += float(gap)
                token_times.append(t)
    end = max(token_times + [float(x) for x in out["t_s"]], default=0.0)
    width = end / LOAD_BINS if end > 0 else 1.0
    counts = [0] * LOAD_BINS
    for t in token_times:
        counts[min(LOAD_BINS - 1, int(t / width))] += 1
    out["tokens_t_s"] = [(i + 0.5) * width for i in range(LOAD_BINS)] if token_times else []
    out["tokens_per_s"] = [c / width for c in counts] if token_times else []
    return out
