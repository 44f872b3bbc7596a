"""The fidelity tables of docs/fidelity.md: every published measurement beside its roofline.

    python -m infbench.benchmarks.published

prints, as Markdown, the table of every row of `infbench/data/published/measurements.yaml`
(measured, predicted, the ratio, whether the roofline is a bound and a useful one), the
`--efficiency` fits per engine with their leave-one-out errors, and the rows' sources.
docs/fidelity.md holds this output between its `published-tables` markers, and
tests/roofline/test_published.py checks that it is what this prints at the commit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from infbench.measure.efficiency import EngineFit, fit_engine, fittable_engines
from infbench.measure.published import (
    PublishedRow,
    RowPrice,
    load_rows,
    missing_features,
    price_row,
)

START = "<!-- published-tables:start -->"
END = "<!-- published-tables:end -->"
UNITS = {"output_tokens_per_s": "output tok/s", "itl_ms": "ITL ms",
         "decode_tokens_per_s": "decode tok/s", "prefill_tokens_per_s": "prefill tok/s"}


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _row_cells(row: PublishedRow, rp: RowPrice | None) -> list[str]:
    scope = "" if row.scope == "total" or row.metric == "itl_ms" else f" ({row.scope})"
    head = [row.id, row.engine, row.published_model or row.model, row.setup,
            UNITS[row.metric] + scope, _num(row.value)]
    if rp is None:
        return [*head, "-", "-", "-", "-", "needs " + ", ".join(missing_features(row))]
    status = f"gap: {row.gap}" if row.gap else "priced"
    useful = f"{'yes' if rp.is_useful else 'NO'} (<= {row.bar:g}x)"
    batch = "" if row.batch is not None else f"; batch {rp.batch}"
    bound = "yes" if rp.is_bound else "NO"
    return [*head, _num(rp.predicted_as_published), f"{rp.ratio:.2f}", bound, useful,
            status + batch]


def rows_table(rows: list[PublishedRow]) -> list[str]:
    cols = ["row", "engine", "model", "setup", "metric", "measured", "predicted", "ratio",
            "bound", "useful", "status"]
    out = [_line(cols), _line(["---"] * len(cols))]
    for row in rows:
        rp = None if missing_features(row) else price_row(row)
        out.append(_line(_row_cells(row, rp)))
    return out


def fits_table(fits: list[EngineFit]) -> list[str]:
    cols = ["engine", "rows", "bandwidth", "compute", "leave-one-out error (median / max)",
            "each row held out"]
    out = [_line(cols), _line(["---"] * len(cols))]
    for f in fits:
        e = f.efficiency
        each = ", ".join(f"{rid} {err:.0%}" for rid, err in zip(f.rows, f.loo_errors,
                                                                 strict=True))
        out.append(_line([
            f.engine, str(len(f.rows)),
            f"{e.bandwidth:.1%}" if f.bandwidth_determined else "100% (not determined)",
            f"{e.compute:.1%}" if f.compute_determined else "100% (not determined)",
            f"{f.loo_median:.0%} / {f.loo_max:.0%}", each]))
    return out


def render() -> str:
    """The Markdown docs/fidelity.md holds between its markers."""
    rows = load_rows()
    priced = [r for r in rows if not missing_features(r)]
    fits = [fit_engine(e, rows) for e in fittable_engines(rows)]
    prices = [price_row(r) for r in priced]
    bounds = sum(rp.is_bound for rp in prices)
    useful = sum(rp.is_bound and rp.is_useful for rp in prices)
    lines = [START, "", f"{len(rows)} published rows, {len(priced)} priced now: the roofline "
             f"bounds {bounds} of them, {useful} within the bar (2x time per token, 3x "
             "throughput).", ""]
    lines += rows_table(rows)
    lines += ["", "Fitted efficiencies (`infbench predict --efficiency ENGINE`):", ""]
    lines += fits_table(fits) if fits else ["No engine has 2 priced rows yet."]
    lines += ["", "Sources:", ""]
    lines += sources_lines(rows)
    lines += ["", END]
    return "\n".join(lines) + "\n"


def sources_lines(rows: list[Any]) -> list[str]:
    """The "Sources:" list of a generated table: each row's source and notes."""
    return [f"- `{r.id}`: {r.source}" + (f" ({r.notes})" if r.notes else "") for r in rows]


def print_table(argv: list[str] | None, render_table: Callable[[], str]) -> int:
    """The shell of a table generator: no arguments, the table on stdout, a UserError one
    `error:` line and exit 2."""
    from infbench.core.errors import UserError

    if argv:
        print(f"error: {sys.argv[0]}: takes no arguments, got {argv[0]!r}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(render_table())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return print_table(argv, render)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
