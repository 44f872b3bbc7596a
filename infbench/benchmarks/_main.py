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


def round_options(argv: list[str] | None, doc: str | None, full: dict[str, Any],
                  quick: dict[str, Any], out: str, threads_help: str) -> dict[str, Any]:
    """The options of a rounds-of-generation benchmark (peers, quant_speed): --rounds,
    --prompt, --gen (unset: from `full`, or `quick` with --quick), --threads, --out,
    --quick, as a dict of checked values; a bad value raises UserError naming it."""
    import argparse

    from infbench.core.errors import UserError

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, help=f"timed rounds (default {full['rounds']})")
    parser.add_argument("--prompt", type=int, help=f"prompt tokens (default {full['prompt']})")
    parser.add_argument("--gen", type=int, help=f"new tokens, >= 2 (default {full['gen']})")
    parser.add_argument("--threads", type=int, help=threads_help)
    parser.add_argument("--out", default=out, help="the JSON file")
    tiny = ", ".join(f"{k} {v}" for k, v in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"tiny sizes for a test: {tiny}")
    args = parser.parse_args(argv)
    base = quick if args.quick else full
    values: dict[str, Any] = {}
    for name, low in (("rounds", 1), ("prompt", 1), ("gen", 2)):
        given = getattr(args, name)
        values[name] = int(base[name] if given is None else given)
        if values[name] < low:
            raise UserError(f"--{name} must be >= {low}, got {values[name]}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    return {**values, "threads": args.threads, "out": args.out, "quick": args.quick,
            "base": base}
