"""One way to read a number out of a result: `metric(result, "metrics.ttft_s.p99")`.

Names are dotted paths through the result schema (`schema.RunResult`):

- `metrics.<name>` or the short form `<name>` (what `--metric`, the scenario's
  `gate.metric` and the report use): `output_tokens_per_s`, `ttft_s.p50`,
  `decode.mbu`, `normalized.output_tokens_per_s_per_gbs`;
- `prediction.<name>`: the analytic prediction of the same point (`prediction.tpot_s`,
  `prediction.decode.time_per_token_s`).
- `accuracy.<name>`: the point's accuracy, present on quantized or pruned points
  (`accuracy.perplexity`, `accuracy.perplexity_change`, `accuracy.greedy_agreement`).
- `window.<name>` (`metrics.window.<name>`): the same metrics for the window of a point run
  with `measure.window` (docs/windows.md).  `measured()` reads a name there when the result
  has a window and the window has that metric, else in the whole-run metrics: what
  `report` and `run`'s table show; the gate does the same when both sides have a window.

A name is checked against the schema, not against the data: an unknown name, or one
that stops at a group (`ttft_s` without a statistic, `decode` without a field) is a
UserError listing the valid names, while a valid name whose value this run does not
have (no decode steps, an unpredicted Poisson point, a percentile of no samples) is
None.  A latency has no implicit statistic here; the gate's backwards-compatible
reading of a bare latency name as its p50 is `with_default_statistic`, explicit and
documented (docs/results.md).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from infbench.core.errors import UserError
from infbench.core.metric_names import LATENCY_STATS
from infbench.results.schema import (
    PERCENTILE_KEY,
    Accuracy,
    LatencyStats,
    Metrics,
    Prediction,
    WindowMetrics,
)

SECTIONS: dict[str, type[BaseModel]] = {"metrics": Metrics, "prediction": Prediction,
                                        "accuracy": Accuracy}
# The statistic the gate reads for a bare latency name (`--metric ttft_s`), kept from
# before the schema so existing CI configs keep gating the same number.
DEFAULT_STATISTIC = "p50"


def _field_types(annotation: Any) -> list[Any]:
    """The non-None members of `X | None` (or the annotation itself)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _child(model: type[BaseModel], key: str) -> tuple[str, Any] | None:
    """('model', submodel) / ('stats', LatencyStats) / ('number', None) for a field, else None."""
    info = model.model_fields.get(key)
    if info is None:
        return None
    for t in _field_types(info.annotation):
        if t is LatencyStats:
            return "stats", t
        if isinstance(t, type) and issubclass(t, BaseModel):
            return "model", t
        if t in (int, float):
            return "number", None
    return None  # strings, bools, lists, open dicts: not metrics


def metric_names(section: str = "metrics", *, short: bool = True,
                 stats: tuple[str, ...] = LATENCY_STATS) -> list[str]:
    """Every valid metric name of a section (latencies listed with `stats`)."""
    prefix = "" if short and section == "metrics" else f"{section}."
    out: list[str] = []

    def walk(model: type[BaseModel], path: str) -> None:
        for key in model.model_fields:
            kind = _child(model, key)
            if kind is None:
                continue
            if kind[0] == "number":
                out.append(path + key)
            elif kind[0] == "stats":
                out.extend(f"{path}{key}.{s}" for s in stats)
            else:
                walk(kind[1], f"{path}{key}.")

    walk(SECTIONS[section], prefix)
    return out


def split_name(name: str, section: str = "metrics") -> tuple[str, list[str]]:
    """(section, path parts) of a metric name; a name without a section head is `section`'s."""
    parts = str(name).split(".")
    if parts[0] in SECTIONS and len(parts) > 1:
        return parts[0], parts[1:]
    return section, parts


def check_name(name: str, section: str = "metrics") -> tuple[str, list[str]]:
    """The (section, parts) of a valid name; a UserError listing the valid names otherwise."""
    sec, parts = split_name(name, section)
    model: type[BaseModel] = SECTIONS[sec]
    for i, part in enumerate(parts):
        kind = _child(model, part)
        last = i == len(parts) - 1
        if kind is None:
            break
        if kind[0] == "number":
            if last:
                return sec, parts
            break
        if kind[0] == "stats":
            stat = ".".join(parts[i + 1:])  # a percentile key may hold a dot: p99.9
            if stat == "mean" or PERCENTILE_KEY.match(stat):
                return sec, [*parts[:i + 1], stat]
            if last:
                stats = ", ".join(f"{name}.{s}" for s in LATENCY_STATS)
                raise UserError(f"metric {name!r} is a latency distribution, not a number; "
                                f"name a statistic: {stats} (or another percentile p<number>)")
            break
        if last:
            valid = [n for n in metric_names(sec) if n.startswith(f"{name}.")]
            raise UserError(f"metric {name!r} is a group, not a number; valid: "
                            f"{', '.join(valid)}")
        model = kind[1]
    raise UserError(f"unknown metric {name!r}; valid names in {sec}: "
                    f"{', '.join(metric_names(sec))}")


def with_default_statistic(name: str) -> str:
    """`ttft_s` -> `ttft_s.p50` (the gate's documented default); any other name unchanged."""
    sec, parts = split_name(name)
    if len(parts) == 1 and _child(SECTIONS[sec], parts[0]) == ("stats", LatencyStats):
        return f"{name}.{DEFAULT_STATISTIC}"
    return name


def value_at(tree: Any, parts: list[str]) -> float | None:
    """The number at `parts` inside one section's dict (metrics, a repeat, prediction).

    None when absent, null or not a number (a loaded result was validated, so a wrong
    type only reaches here from a hand-built dict); NaN and inf are returned as stored.
    """
    node = tree
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node)


def metric(result: Mapping[str, Any], name: str, *, section: str = "metrics") -> float | None:
    """The number `name` names in a whole result (see the module docstring for names)."""
    sec, parts = check_name(name, section)
    return value_at(result.get(sec), parts)


def section_metric(tree: Any, name: str, section: str = "metrics") -> float | None:
    """Like `metric`, on one section's dict: `metrics`, one of `repeats`, or `prediction`."""
    sec, parts = check_name(name, section)
    if sec != section:
        raise UserError(f"metric {name!r} names the {sec} section; here only {section} "
                        "names are read")
    return value_at(tree, parts)


def scenario_number(result: Mapping[str, Any], path: str) -> float | None:
    """A number in the result's scenario echo (`workload.batch_size`); the echo is open (it
    is validated by scenario.schema when the run starts), so the path is not checked."""
    return value_at(result.get("scenario"), path.split("."))


WINDOW = "window"
# Window fields that describe the interval rather than measure the run.
_WINDOW_BOUNDS = frozenset({"start_s", "end_s"})


def has_window(result: Mapping[str, Any]) -> bool:
    """Whether the result was run with measure.window (it has `metrics.window`)."""
    return isinstance((result.get("metrics") or {}).get(WINDOW), Mapping)


def windowed_name(name: str) -> str | None:
    """`ttft_s.p50` -> `window.ttft_s.p50` for a metric the window also has; else None."""
    sec, parts = split_name(name)
    if sec != "metrics" or not parts or parts[0] == WINDOW:
        return None
    if parts[0] in WindowMetrics.model_fields and parts[0] not in _WINDOW_BOUNDS:
        return ".".join([WINDOW, *parts])
    return None


def measured(result: Mapping[str, Any], name: str) -> float | None:
    """`metric(result, name)`, read in the window when the result has one that holds it."""
    windowed = windowed_name(name) if has_window(result) else None
    return metric(result, windowed or name)
