"""The `infbench` command line (Typer): parse, call, print; no logic of its own.

Every sub-command lives in `infbench/commands/<family>.py` and registers itself
here.  A `UserError` anywhere becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from infbench.errors import UserError

app = typer.Typer(
    name="infbench",
    help="LLM inference performance: analytic roofline, a batched engine, measured rooflines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Sub-command modules, in the order their commands appear in --help.
COMMAND_MODULES = ("predict", "run", "kernels", "measure")

for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"infbench.commands.{_name}")
    except ModuleNotFoundError as _exc:  # a family not built yet in this checkout
        if _exc.name != f"infbench.commands.{_name}":
            raise
        continue
    _module.register(app)


def main() -> None:
    try:
        rc = app(standalone_mode=False)
        if isinstance(rc, int):
            sys.exit(rc)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        if isinstance(exc, click.exceptions.Exit):
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
