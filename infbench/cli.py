"""The `infbench` command line (Typer): parse, call, print; no logic of its own.

Every sub-command lives in `infbench/commands/<family>.py` and registers itself
here.  A `UserError` anywhere, and every usage error the parser finds (unknown
option or command, missing or badly typed value, value out of range), becomes one
line `error: ...` on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

from infbench.core.errors import UserError

app = typer.Typer(
    name="infbench",
    help="LLM inference performance: analytic roofline, a batched engine, measured rooflines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Sub-command modules, in the order their commands appear in --help.
COMMAND_MODULES = ("predict", "predict_views", "plan", "run", "search", "serve", "eval",
                   "prune", "train_draft", "kernels", "measure")

for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"infbench.commands.{_name}")
    except ModuleNotFoundError as _exc:  # a family not built yet in this checkout
        if _exc.name != f"infbench.commands.{_name}":
            raise
        continue
    _module.register(app)


# Typer 0.29 raises the exceptions of the click copy it bundles, older Typer those of
# click itself; so usage errors are recognised by their interface, never by class.
def _is_usage_error(exc: BaseException) -> bool:
    return isinstance(getattr(exc, "exit_code", None), int) and callable(
        getattr(exc, "format_message", None))


def _is_exit(exc: BaseException) -> bool:
    """typer.Exit / click.exceptions.Exit: an exit code and nothing to show."""
    return (isinstance(exc, typer.Exit) or type(exc).__name__ == "Exit") and isinstance(
        getattr(exc, "exit_code", None), int)


def _is_abort(exc: BaseException) -> bool:
    return isinstance(exc, typer.Abort) or type(exc).__name__ == "Abort"


def _option_name(param: Any) -> str:
    """'--top-k' for an option (its longest spelling), 'SCENARIO' for an argument."""
    opts = [o for o in getattr(param, "opts", None) or [] if o.startswith("-")]
    if opts:
        return max(opts, key=len)
    name = getattr(param, "human_readable_name", None) or getattr(param, "name", None)
    return str(name or "argument")


def _one_line(text: str) -> str:
    """Line breaks become spaces (a path with two spaces in it stays as it is)."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def usage_message(exc: Any) -> str:
    """The one line (without `error: `) for a click/typer usage error."""
    ctx = getattr(exc, "ctx", None)
    param = getattr(exc, "param", None)
    message = getattr(exc, "message", "")
    param_type = getattr(exc, "param_type", None)  # set on MissingParameter only
    if param is not None and message and param_type is None:
        # A bad value: name the option first, as UserError messages do.
        text = f"{_option_name(param)}: {_one_line(str(message))}"
    else:
        text = _one_line(exc.format_message())
    command_path = getattr(ctx, "command_path", None)
    command = getattr(ctx, "command", None)
    list_commands = getattr(command, "list_commands", None)
    if "No such command" in text and ctx is not None and callable(list_commands):
        text = text.rstrip(".") + f"; commands: {', '.join(list_commands(ctx))}"
    elif command_path and ("No such option" in text or "unexpected extra" in text):
        text = text.rstrip(".") + f"; see '{command_path} --help'"
    return text


def _show_no_args_help(exc: Any) -> bool:
    """no_args_is_help: click >= 8.2 raises an error whose message is the help text."""
    ctx = getattr(exc, "ctx", None)
    if ctx is None or type(exc).__name__ != "NoArgsIsHelpError":
        return False
    print(exc.format_message(), file=sys.stderr)
    return True


def main(args: list[str] | None = None) -> None:
    """Run the CLI; always ends in SystemExit (0 ok, 1 failed gate, 2 usage/input error)."""
    try:
        rc = app(args=args, prog_name="infbench", standalone_mode=False)
    except UserError as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click/typer errors arrive here in non-standalone mode
        if _is_exit(exc):
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        if _is_abort(exc):
            print("aborted", file=sys.stderr)
            sys.exit(1)
        if _is_usage_error(exc):
            if _show_no_args_help(exc):
                sys.exit(2)
            print(f"error: {usage_message(exc)}", file=sys.stderr)
            sys.exit(2)  # click's FileError says 1; every bad input is 2 here
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
