"""One row per speculative point: what `infbench report` prints under its per-point table
when some result carries `metrics.speculative` (a run with `speculative.method` set, e.g.
`scenarios/speculative.yaml`), and what `infbench plots` draws as speed-up against k.

A row reads the numbers `infbench run` stored (measure/speculative.py computes them; its
docstring defines each): the acceptance rate (accepted / proposed drafts), the tokens
emitted per verification, the draft cost ratio c, output tokens/s speculating and decoding
plainly (the baseline: the same workload in the same invocation), the speed-up measured
(baseline TPOT / speculative TPOT) beside the one predicted from the measured a and c, and
the mean TPOT of both runs.  Nothing is recomputed here: a number the run did not measure
(an n-gram proposer that never found a match has no acceptance) stays None, shown `-`.

Rows are ordered by variant (the order the variants first appear), then batch size, then k.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from infbench.results.accessor import metric, scenario_number
from infbench.results.variants import variant_of

if TYPE_CHECKING:
    from rich.table import Table

# The per-point columns `report --json / --markdown / --csv` add when some result has
# speculative metrics (results/report.py), named as in the row with a `spec_` prefix.
EXPORTED = ("method", "num_tokens", "acceptance_rate", "acceptance_per_token",
            "mean_accepted_tokens", "draft_cost_ratio", "baseline_output_tokens_per_s",
            "speedup_measured", "speedup_predicted", "tpot_ms", "baseline_tpot_ms")


def has_speculative(results: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any result carries `metrics.speculative`."""
    return any(isinstance((r.get("metrics") or {}).get("speculative"), Mapping)
               for r in results)


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def spec_row(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The speculative numbers of one point, or None when it has no `metrics.speculative`."""
    spec = (result.get("metrics") or {}).get("speculative")
    if not isinstance(spec, Mapping):
        return None
    method = spec.get("method")
    k = metric(result, "speculative.num_tokens")
    if k is None:  # the configured k, echoed in the scenario
        k = scenario_number(result, "speculative.num_tokens")
    variant = variant_of(result)
    return {
        "variant": variant if variant is not None else str(method or "-"),
        "method": None if method is None else str(method),
        "num_tokens": _int(k),
        "batch_size": _int(scenario_number(result, "workload.batch_size")),
        "acceptance_rate": metric(result, "speculative.acceptance_rate"),
        "acceptance_per_token": metric(result, "speculative.acceptance_per_token"),
        "mean_accepted_tokens": metric(result, "speculative.mean_accepted_tokens"),
        "draft_cost_ratio": metric(result, "speculative.draft_cost_ratio"),
        "output_tokens_per_s": metric(result, "output_tokens_per_s"),
        "baseline_output_tokens_per_s":
            metric(result, "speculative.baseline_output_tokens_per_s"),
        "speedup_measured": metric(result, "speculative.speedup_measured"),
        "throughput_ratio": metric(result, "speculative.throughput_ratio"),
        "speedup_predicted": metric(result, "speculative.speedup_predicted"),
        "tpot_ms": _ms(metric(result, "tpot_s.mean")),
        "baseline_tpot_ms": _ms(metric(result, "speculative.baseline_tpot_s")),
        "label": result.get("label"),
        "file": result.get("_path"),
    }


def spec_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per point with speculative metrics, by variant (first appearance), batch, k."""
    rows = [row for row in map(spec_row, results) if row is not None]
    order = {name: i for i, name in enumerate(dict.fromkeys(r["variant"] for r in rows))}

    def key(row: dict[str, Any]) -> tuple[int, bool, int, bool, int]:
        batch, k = row["batch_size"], row["num_tokens"]
        return (order[row["variant"]], batch is None, batch or 0, k is None, k or 0)

    return sorted(rows, key=key)  # stable: repeated points keep their file order


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _short(value: float | None) -> str:
    """About three significant digits: 2346, 46.2, 9.71 (narrow columns for 80-wide logs)."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _pair(first: str, second: str) -> str:
    return f"{first} / {second}"


def spec_cells(row: Mapping[str, Any]) -> list[str]:
    """One row of `spec_table` as text: the columns of `SPEC_COLUMNS`."""
    return [str(row["variant"]), _num(row["num_tokens"], "d"), _num(row["batch_size"], "d"),
            _num(row["acceptance_rate"], ".2f"), _num(row["mean_accepted_tokens"], ".2f"),
            _num(row["draft_cost_ratio"], ".3g"),
            _pair(_short(row["output_tokens_per_s"]),
                  _short(row["baseline_output_tokens_per_s"])),
            _pair(_short(row["tpot_ms"]), _short(row["baseline_tpot_ms"])),
            _pair(_num(row["speedup_measured"], ".2f"), _num(row["speedup_predicted"], ".2f"))]


SPEC_COLUMNS = ("variant", "k", "batch", "accept rate", "tokens / verif", "draft cost c",
                "tok/s spec / base", "TPOT ms spec / base", "speed-up meas. / pred.")


def spec_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """The rows of `spec_rows` for the terminal, a `spec / baseline` pair per cell for
    tokens/s and mean TPOT and `measured / predicted` for the speed-up.  A number is never
    cut: on a narrow terminal a pair wraps at its spaces, headers and long labels fold."""
    from rich.table import Table

    cells = [spec_cells(row) for row in rows]
    table = Table(title="speculative decoding: speed-up over plain decoding of the same "
                        "workload", title_style="bold")
    for i, col in enumerate(SPEC_COLUMNS):
        widest = max((len(word) for c in cells for word in c[i].split()), default=1)
        if i == 0:
            table.add_column(col, overflow="fold", min_width=min(12, widest))  # long labels fold
        else:  # a pair may wrap at its spaces, a number never splits
            table.add_column(col, justify="right", overflow="fold", min_width=widest)
    for row_cells in cells:
        table.add_row(*row_cells)
    return table
