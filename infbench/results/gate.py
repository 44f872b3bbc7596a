"""Compare result files and fail CI on a regression (exit 0 pass, 1 regression, 2 bad input).

`compare()` gates one metric of one baseline point against one new point;
`compare_many()` matches several points per side by (name, point_index);
`gate_from_scenario()` runs a scenario's `gate:` block after `infbench run`.

Noise: a result's `metrics` hold the median of its repeats, and the gate uses the
median of the repeats' values when `repeats` carry the metric, so one slow repeat
does not fail a job.  The baseline's spread (min..max over its repeats) is shown
next to the verdict, with a note when the threshold is inside that spread.

Bad data is bad input, never a verdict: every gated value (each repeat's, the
summary's, the prediction a roofline fraction divides by) must be a finite number
> 0 on both sides, else the gate stops with exit 2 naming the file and the metric
path.  A NaN or inf is a broken measurement and a zero or negative has no relative
change, so neither may pass as "ok" or "+inf% improved".

Normalized gating answers "is the code slower, or the machine busier?":
- `mbu`: gate on decode MBU (achieved / peak bandwidth) instead of a raw metric;
- `roofline_fraction`: measured / predicted value of the metric (tokens/s by default);
- `reference`: tokens/s per GB/s of a read-bandwidth probe taken in the same run;
- `torch_reference`: output tokens/s over the tokens/s of a plain-torch forward of the
  same model shape, timed between the repeats (measure/torch_reference.py): it moves
  with the machine (CPU, threads, bandwidth, load) and not with the engine's code.

Windows (measure.window, docs/windows.md): when both results have `metrics.window`, a
metric the window holds is gated there (its repeats' `window.<metric>`), with normalize
none or roofline_fraction; when only one side has a window, both are gated on the
whole-run figures, with a note.

Decision (`gate.decision`, `--decision`): `median` (the default, as before) compares the
medians; `confidence` takes the t interval of the new repeats at `gate.confidence`
(results/confidence.py) and calls a regression only when the whole interval is worse than
the baseline's median by more than the threshold (for a higher-is-better metric: its upper
bound below baseline * (1 - threshold)), an improvement only when the whole interval is
better by more than it, else ok.  A new side of one repeat has no interval: the median
decides, with a note.  Every row carries both sides' intervals and whether they overlap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infbench.core.errors import ResultSchemaError, UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.results.accessor import (
    has_window,
    section_metric,
    split_name,
    windowed_name,
    with_default_statistic,
)
from infbench.results.confidence import DEFAULT_CONFIDENCE, Interval, interval
from infbench.results.schema import upgrade
from infbench.scenario.measure import GATE_DECISIONS, NORMALIZE_MODES, GateSection
from infbench.scenario.target import DEFAULT_METRICS_INTERVAL_S
from infbench.scenario.values import parse_fraction
from infbench.scenario.workload import DEFAULT_MAX_DURATION_S

# Scenario keys that may differ between runs of the same benchmark.
VOLATILE_SCENARIO_KEYS = frozenset({"gate", "measure", "source", "out", "out_dir"})
# Scenario keys added after results were recorded, with the value that reproduces what
# those results ran: a result without the key equals a scenario holding that value.
_SPEC_DEFAULTS = SpeculativeConfig()
ADDED_SCENARIO_KEYS: dict[str, Any] = {
    f"scenario.speculative.{name}": getattr(_SPEC_DEFAULTS, name)
    for name in ("draft_model", "draft_layers", "draft_quant", "draft_group_size", "heads",
                 "ngram_max", "ngram_min")}
ADDED_SCENARIO_KEYS.update({"scenario.workload.burstiness": 1.0,
                            "scenario.workload.max_concurrency": None,
                            "scenario.workload.dataset": None,
                            "scenario.model.quant.activations": "float",
                            "scenario.workload.max_duration_s": DEFAULT_MAX_DURATION_S,
                            # 2026-12-02: fp8 scales and the parallel layouts of issue 26
                            "scenario.model.quant.fp8_scales": None,
                            # 2026-12-02: prefix groups (issue 27)
                            "scenario.workload.prefix": None,
                            # multi-turn sessions (docs/sessions.md)
                            "scenario.workload.sessions": None,
                            # 2026-12-02: client processes (issue 27)
                            "scenario.target.workers": 1,
                            # 2026-12-02: the client scrapes the target's /metrics
                            "scenario.target.metrics": True,
                            "scenario.target.metrics_interval_s": DEFAULT_METRICS_INTERVAL_S})


def _as_recorded(scenario: dict[str, Any]) -> dict[str, Any]:
    """A scenario recorded before workloads had `burstiness` (and before kind static
    honoured num_requests) ran batch_size requests whatever its num_requests said: read
    its num_requests as batch_size, so it matches the same point run today."""
    workload = scenario.get("workload")
    if (not isinstance(workload, dict) or "burstiness" in workload
            or workload.get("kind", "static") != "static" or "batch_size" not in workload):
        return scenario
    return {**scenario, "workload": {**workload, "num_requests": workload["batch_size"]}}


DEFAULT_METRIC = "output_tokens_per_s"


@dataclass(frozen=True)
class GateRow:
    """The verdict for one point: the gated value on both sides and the relative change."""

    point: str
    metric: str
    baseline: float
    new: float
    change_pct: float  # (new - baseline) / baseline * 100
    threshold_pct: float
    status: str  # ok | improved | regression
    is_lower_better: bool
    baseline_spread: dict[str, float] | None = None  # min, max, stdev over repeats
    source: str = "metrics"  # where the values came from: metrics | median of N repeats
    # t intervals over each side's repeats (Interval.to_dict; None: one repeat) and whether
    # they overlap (None unless both have one)
    baseline_ci: dict[str, float | int] | None = None
    new_ci: dict[str, float | int] | None = None
    overlap: bool | None = None
    decided_by: str = "median"  # median | confidence (the interval of the new repeats)


@dataclass
class GateResult:
    metric: str
    normalize: str
    max_regression: float
    decision: str = "median"
    confidence: float = DEFAULT_CONFIDENCE
    rows: list[GateRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.status != "regression" for r in self.rows)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def parse_threshold(value: str | float, key: str = "--max-regression") -> float:
    """The scenario's parser (`parse_fraction`: '5%' or 0.05, in [0, 1)) with a CLI error."""
    try:
        return parse_fraction(value)
    except ValueError as exc:
        raise UserError(f"{key}: {exc}") from None


def is_lower_better(metric: str) -> bool:
    """Latencies (names ending in _s, not rates ending in _per_s), bytes, memory and
    perplexity (accuracy.perplexity, accuracy.perplexity_change)."""
    from infbench.core.metric_names import is_stat_name

    name = metric.split(".")
    for part in reversed(name):
        # any configured percentile (p95; p99.9 splits into p99 and 9) is a statistic
        if part in ("min", "max") or is_stat_name(part) or part.isdigit():
            continue
        if part.endswith("_per_s") or part.endswith("_per_gbs"):
            return False
        return (part.endswith("_s") or "latency" in part or "bytes" in part
                or "memory" in part or "fragmentation" in part or "perplexity" in part)
    return False


def _result_id(result: dict[str, Any]) -> str:
    path = result.get("_path")
    label = f"{result.get('name')}[{result.get('point_index')}] {result.get('label', '')}".strip()
    return f"{label} ({path})" if path else label


def _check_schema(result: dict[str, Any]) -> None:
    """Results from load_result are validated; this guards dicts handed in directly."""
    from infbench.results.schema import RESULT_KIND, SCHEMA_VERSION, UPGRADABLE_VERSIONS

    if result.get("kind") != RESULT_KIND:
        raise ResultSchemaError(f"{_result_id(result)}: not an infbench result "
                                f"(expected kind {RESULT_KIND!r})")
    version = result.get("schema_version")
    if version != SCHEMA_VERSION and version not in UPGRADABLE_VERSIONS:
        raise ResultSchemaError(
            f"{_result_id(result)}: result schema_version {result.get('schema_version')}, "
            f"expected {SCHEMA_VERSION}; re-run the scenario to regenerate it")


def scenario_difference(a: Any, b: Any, prefix: str = "scenario") -> str | None:
    """The first key path where two scenarios differ (volatile top-level keys ignored)."""
    if prefix == "scenario" and isinstance(a, dict) and isinstance(b, dict):
        a, b = _as_recorded(a), _as_recorded(b)
    if isinstance(a, dict) and isinstance(b, dict):
        skip = VOLATILE_SCENARIO_KEYS if prefix == "scenario" else frozenset()
        for key in list(a) + [k for k in b if k not in a]:
            if key in skip:
                continue
            if key not in a or key not in b:
                path = f"{prefix}.{key}"
                present = b[key] if key in b else a[key]
                if path in ADDED_SCENARIO_KEYS and present == ADDED_SCENARIO_KEYS[path]:
                    continue  # recorded before the key existed, with its default meaning
                return path
            diff = scenario_difference(a[key], b[key], f"{prefix}.{key}")
            if diff:
                return diff
        return None
    return None if a == b else prefix


def gated_values(result: dict[str, Any], metric: str, normalize: str,
                 window: bool = False) -> tuple[str, list[float], str]:
    """(gated metric name, values: one per repeat or the single summary, source).

    A bare latency name (`ttft_s`) gates its p50 (`accessor.with_default_statistic`);
    the prediction, one number per latency, is read under the bare name.  `window`: read
    a metric the window holds in `window.` (normalize none or roofline_fraction).
    """
    if split_name(metric)[0] == "accuracy":  # measured once per point, not per repeat
        return _accuracy_value(result, metric, normalize)
    predicted_name = metric
    if normalize == "mbu":
        metric = "decode.mbu"
    elif normalize == "reference":
        metric = f"normalized.{metric}_per_gbs"
    elif normalize == "torch_reference":
        if metric != DEFAULT_METRIC:
            raise UserError(f"--metric {metric}: normalize torch_reference divides by the torch "
                            f"reference's output tokens/s; allowed: {DEFAULT_METRIC}")
        metric = f"normalized.{metric}_over_torch_reference"
    metric = with_default_statistic(metric)
    if window and normalize in ("none", "roofline_fraction"):
        metric = windowed_name(metric) or metric
    denom = 1.0
    if normalize == "roofline_fraction":
        pred = section_metric(result.get("prediction") or {}, predicted_name, "prediction")
        if pred is None:
            raise ResultSchemaError(
                f"{_result_id(result)}: no prediction.{predicted_name} to normalize by "
                "(the analytic model does not predict this workload); use --normalize none")
        denom = _positive(result, f"prediction.{predicted_name}", pred)
    shown = {"roofline_fraction": f"{metric} / predicted",
             "torch_reference": f"{predicted_name} / torch reference"}.get(normalize, metric)
    repeats = [section_metric(r, metric) for r in result.get("repeats") or []
               if isinstance(r, dict)]
    values = [v for v in repeats if v is not None]
    if values and len(values) == len(repeats):
        checked = [_positive(result, f"repeats[{i}].{metric}", v) for i, v in enumerate(values)]
        return shown, [v / denom for v in checked], f"median of {len(values)} repeats"
    value = section_metric(result.get("metrics") or {}, metric)
    if value is None:
        hint = {"reference": " (the run took no same-run reference bandwidth)",
                "torch_reference": " (the run timed no torch reference: it ran without "
                "measure.torch_reference: true, or before infbench recorded one; re-run "
                "it with that key)"}.get(normalize, "")
        raise ResultSchemaError(f"{_result_id(result)}: metric {metric!r} is missing{hint}")
    return shown, [_positive(result, f"metrics.{metric}", value) / denom], "metrics"


def _accuracy_value(result: dict[str, Any], metric: str,
                    normalize: str) -> tuple[str, list[float], str]:
    if normalize != "none":
        raise UserError(f"--metric {metric}: accuracy is compared as measured; allowed "
                        "--normalize: none")
    value = section_metric(result.get("accuracy") or {}, metric, "accuracy")
    if value is None:
        raise ResultSchemaError(f"{_result_id(result)}: metric {metric!r} is missing (the "
                                "point is neither quantized nor pruned, or ran without "
                                "measure.eval_tokens)")
    return metric, [_positive(result, metric, value)], "accuracy"


def _positive(result: dict[str, Any], where: str, value: float) -> float:
    """`value` if it is a finite number > 0; else a ResultSchemaError naming file and path."""
    if math.isfinite(value) and value > 0:
        return value
    why = ("not a number: a broken measurement" if math.isnan(value)
           else "infinite: a broken measurement" if math.isinf(value)
           else "zero: no relative change can be computed from it" if value == 0
           else "negative: not a valid measurement")
    raise ResultSchemaError(f"{_result_id(result)}: {where} is {value!r} ({why}); the gate "
                            "needs a finite number > 0 on both sides; re-run the point or "
                            "gate on another --metric")


def _spread(values: list[float], result: dict[str, Any], metric: str) -> dict[str, float] | None:
    if len(values) >= 2:
        return {"min": min(values), "max": max(values), "stdev": statistics.stdev(values)}
    stored = (result.get("spread") or {}).get(metric)
    if not isinstance(stored, dict):
        return None
    # A stored spread is display only: one with a missing or non-finite bound is dropped.
    shown = {k: v for k, v in stored.items() if k in ("min", "max", "stdev")}
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in shown.values()) or not {"min", "max"} <= set(shown):
        return None
    return {k: float(v) for k, v in shown.items()}


def compare(baseline: dict[str, Any], new: dict[str, Any], metric: str = DEFAULT_METRIC,
            max_regression: float = 0.05, normalize: str = "none", decision: str = "median",
            confidence: float = DEFAULT_CONFIDENCE) -> GateResult:
    """Gate one new result against one baseline result."""
    out = GateResult(metric, normalize, max_regression, decision, confidence)
    _compare_into(out, baseline, new)
    return out


def _compare_into(out: GateResult, baseline: dict[str, Any], new: dict[str, Any]) -> None:
    if out.normalize not in NORMALIZE_MODES:
        raise UserError(f"--normalize: unknown value {out.normalize!r}; "
                        f"allowed: {', '.join(NORMALIZE_MODES)}")
    if out.decision not in GATE_DECISIONS:
        raise UserError(f"--decision: unknown value {out.decision!r}; "
                        f"allowed: {', '.join(GATE_DECISIONS)}")
    for r in (baseline, new):
        _check_schema(r)
    # Both sides as the current schema (a no-op for results read by load_result): a result
    # built in memory by an older writer compares like its file would.
    diff = scenario_difference(upgrade(baseline).get("scenario") or {},
                               upgrade(new).get("scenario") or {})
    if diff:
        raise UserError(f"{_result_id(new)} and baseline {_result_id(baseline)} ran different "
                        f"scenarios: {diff} differs; compare runs of the same scenario point")
    window = has_window(baseline) and has_window(new)
    if has_window(baseline) != has_window(new):
        out.notes.append(f"{new.get('label') or new.get('name')}: only the "
                         f"{'baseline' if has_window(baseline) else 'new result'} has a "
                         "measure.window: both gated on the whole-run figures")
    name, base_vals, source = gated_values(baseline, out.metric, out.normalize, window)
    _, new_vals, _ = gated_values(new, out.metric, out.normalize, window)
    b, n = statistics.median(base_vals), statistics.median(new_vals)
    change = (n - b) / b * 100  # both > 0 and finite (gated_values)
    if not math.isfinite(change):
        raise ResultSchemaError(f"{_result_id(new)}: {name} changed from {b!r} to {n!r}, "
                                "beyond what a relative change can express; check both files")
    # mbu and the references gate rates; a roofline fraction keeps the metric's direction.
    lower = out.normalize in ("none", "roofline_fraction") and is_lower_better(out.metric)
    worse = change if lower else -change  # > 0 means worse
    threshold = out.max_regression * 100
    status = "regression" if worse > threshold else ("improved" if -worse > threshold else "ok")
    base_ci, new_ci = interval(base_vals, out.confidence), interval(new_vals, out.confidence)
    decided_by = "median"
    if out.decision == "confidence":
        if new_ci is None:
            out.notes.append(f"{new.get('label') or new.get('name')}: the new result has one "
                             "repeat, so no interval: the median decided")
        else:
            status, decided_by = _confidence_status(new_ci, b, out.max_regression, lower), \
                "confidence"
    spread = _spread(base_vals, baseline, name)
    out.rows.append(GateRow(
        str(new.get("label") or new.get("name")), name, b, n, change, threshold, status, lower,
        spread, source, None if base_ci is None else base_ci.to_dict(),
        None if new_ci is None else new_ci.to_dict(),
        None if base_ci is None or new_ci is None else base_ci.overlaps(new_ci), decided_by))
    if spread and b:
        noise = (spread["max"] - spread["min"]) / abs(b) * 100
        if noise > threshold:
            hint = "" if out.normalize != "none" else " or --normalize torch_reference"
            out.notes.append(f"{out.rows[-1].point}: baseline repeats vary by {noise:.1f}% "
                             f"(> threshold {threshold:.1f}%): consider more repeats{hint}")


def _confidence_status(new_ci: Interval, baseline: float, max_regression: float,
                       lower_is_better: bool) -> str:
    """decision confidence: regression / improved only when the whole interval is beyond
    the threshold around the baseline's median."""
    worse_bound = baseline * (1 + max_regression) if lower_is_better else \
        baseline * (1 - max_regression)
    better_bound = baseline * (1 - max_regression) if lower_is_better else \
        baseline * (1 + max_regression)
    if lower_is_better:
        return ("regression" if new_ci.low > worse_bound else
                "improved" if new_ci.high < better_bound else "ok")
    return ("regression" if new_ci.high < worse_bound else
            "improved" if new_ci.low > better_bound else "ok")


def compare_many(baselines: list[dict[str, Any]], news: list[dict[str, Any]],
                 metric: str = DEFAULT_METRIC, max_regression: float = 0.05,
                 normalize: str = "none", decision: str = "median",
                 confidence: float = DEFAULT_CONFIDENCE) -> GateResult:
    """Match points by (name, point_index); one file per side is compared directly."""
    if not baselines or not news:
        raise UserError("compare: need at least one baseline and one new result")
    out = GateResult(metric, normalize, max_regression, decision, confidence)
    if len(baselines) == 1 and len(news) == 1:
        _compare_into(out, baselines[0], news[0])
        return out
    index = {(r.get("name"), r.get("point_index")): r for r in baselines}
    available = ", ".join(f"{n}[{i}]" for n, i in index)
    seen: set[tuple[Any, Any]] = set()
    for new in news:
        key = (new.get("name"), new.get("point_index"))
        if key in seen:
            raise UserError(f"{_result_id(new)}: point {key[0]}[{key[1]}] appears twice among "
                            "the new results; give one result per point")
        seen.add(key)
        if key not in index:
            raise UserError(f"{_result_id(new)}: no baseline point with name {key[0]!r} and "
                            f"point_index {key[1]}; baseline has {available}")
        _compare_into(out, index.pop(key), new)
    for name, i in index:
        out.notes.append(f"baseline point {name}[{i}] has no new result: not gated")
    return out


def load_results(paths: list[str] | list[Path]) -> list[dict[str, Any]]:
    """Result files, or run directories (their manifest's done points; see rundir)."""
    from infbench.results.rundir import result_files
    from infbench.results.store import load_result

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(result_files(p))
        else:
            files.append(p)
    out = []
    for f in files:
        result = load_result(f)
        result["_path"] = str(f)
        out.append(result)
    return out


def gate_table(result: GateResult) -> Any:
    """A rich Table of the verdicts (rich imported here: the gate itself needs only stdlib)."""
    from rich.table import Table

    from infbench.results.report import short_label

    mode = "" if result.normalize == "none" else f", normalized: {result.normalize}"
    level = f"{result.confidence * 100:g}%"
    decided = "" if result.decision == "median" else f", decision: {level} interval"
    table = Table(title=f"gate: max regression {result.max_regression * 100:g}%{mode}{decided}")
    for col in ("point", "metric", "baseline", "repeats range", "new", "change"):
        table.add_column(col, justify="left" if col in ("point", "metric") else "right",
                         overflow="fold")
    table.add_column("status", no_wrap=True, min_width=10)
    colors = {"ok": "green", "improved": "cyan", "regression": "bold red"}
    for r in result.rows:
        spread = (f"{r.baseline_spread['min']:.3g}-{r.baseline_spread['max']:.3g}"
                  if r.baseline_spread else "-")
        arrow = " (lower better)" if r.is_lower_better else ""
        table.add_row(short_label(r.point), r.metric + arrow, f"{r.baseline:.4g}", spread,
                      f"{r.new:.4g}", f"{r.change_pct:+.1f}%",
                      f"[{colors[r.status]}]{r.status}[/]")
    return table


def _ci_text(ci: Mapping[str, Any] | None) -> str:
    return "- (one repeat)" if ci is None else f"{ci['low']:.4g}..{ci['high']:.4g}"


def interval_lines(result: GateResult) -> list[str]:
    """One line per row: both sides' t intervals over their repeats and whether they
    overlap (lines, not table columns: the table stays within an 80-column CI log)."""
    from infbench.results.report import short_label

    level = f"{result.confidence * 100:g}%"
    out = []
    for r in result.rows:
        overlap = {True: ": they overlap", False: ": apart", None: ""}[r.overlap]
        out.append(f"{level} interval over the repeats, {short_label(r.point)} {r.metric}: "
                   f"baseline {_ci_text(r.baseline_ci)}, new {_ci_text(r.new_ci)}{overlap}")
    return out


def print_gate(result: GateResult, console: Any) -> None:
    console.print(gate_table(result))
    for line in interval_lines(result):
        console.print(line, highlight=False, soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {note}")
    verdict = "PASS" if result.passed else "FAIL: regression beyond threshold"
    console.print(f"gate {verdict} (exit {result.exit_code})")


def _field(gate: GateSection | Mapping[str, Any], name: str, default: Any) -> Any:
    if isinstance(gate, Mapping):
        return gate.get(name, default)
    return getattr(gate, name, default)


def gate_from_scenario(gate: GateSection | Mapping[str, Any], results: list[dict[str, Any]],
                       console: Any) -> int:
    """Run a scenario's `gate:` block against the fresh results; print; return the exit code."""
    baseline = _field(gate, "baseline", None)
    if not baseline:
        raise UserError("gate.baseline: no baseline result file given; set gate.baseline to a "
                        "result JSON (create one with `infbench run SCENARIO --out DIR`)")
    path = Path(baseline)
    if not path.exists():
        raise UserError(f"gate.baseline: {path} does not exist; create it with `infbench run "
                        f"SCENARIO --out DIR` (without the gate) and copy DIR/<name>_000.json "
                        f"(or the whole DIR) to {path}")
    threshold = parse_threshold(_field(gate, "max_regression", 0.05))
    result = compare_many(load_results([path]), results,
                          metric=_field(gate, "metric", DEFAULT_METRIC),
                          max_regression=threshold,
                          normalize=_field(gate, "normalize", "none"),
                          decision=_field(gate, "decision", "median"),
                          confidence=_field(gate, "confidence", DEFAULT_CONFIDENCE))
    print_gate(result, console)
    return result.exit_code
