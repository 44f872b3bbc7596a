"""The command-line shell every `python -m infbench.benchmarks.X` shares: parse, measure,
write the JSON atomically, print the tables; a bad option or input is one `error:` line and
exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any


def bench_main(argv: list[str] | None, parse_args: Callable[[list[str] | None], Any],
               run: Callable[[Any, Callable[[str], None]], dict[str, Any]],
               render: Callable[[dict[str, Any]], Iterable[Any]],
               min_width: int | None = None) -> int:
    """`parse_args(argv)` gives options with an `out` path; `run(opts, log)` measures and
    returns the document; `render(doc)` the rich items printed after it is written."""
    from rich.console import Console

    from infbench.core.errors import UserError
    from infbench.results.store import write_json_atomic

    err = Console(stderr=True)
    try:
        opts = parse_args(argv)
        data = run(opts, lambda msg: err.print(msg, markup=False, highlight=False))
        write_json_atomic(opts.out, data)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Console() if min_width is None else Console(width=max(Console().width, min_width))
    for item in render(data):
        out.print(item)
    err.print(f"wrote {opts.out}", markup=False, highlight=False)
    return 0
