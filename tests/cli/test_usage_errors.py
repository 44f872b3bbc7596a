"""Every usage error on every command: one `error:` line on stderr, exit 2, no traceback.

The table covers each registered command x {unknown option, missing option value, wrong
type, out-of-range value, missing required argument}, plus unknown commands.  Most rows
run in-process through `infbench.cli.main`; a few run the real console entry point in a
subprocess, since that is what users see.  No row reaches a command body that would do
real work: each fails while its arguments are parsed, or on a fast input check.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from cli_helpers import run_args as run_in_process

from infbench.cli import app

# (command path, error kind) -> (args after the command, text the error line must contain).
# None: the command has no option or argument of that kind.
Case = tuple[list[str], str] | None
KINDS = ("unknown_option", "missing_value", "wrong_type", "out_of_range", "missing_argument")

TABLE: dict[str, dict[str, Case]] = {
    "predict": {
        "unknown_option": (["--bogus"], "--bogus"),
        "missing_value": (["--model"], "--model"),
        "wrong_type": (["--prompt", "abc"], "--prompt"),
        "out_of_range": (["--batch", "0"], "--batch: each size must be >= 1"),
        "missing_argument": None,  # SCENARIO is optional
    },
    "kv": {
        "unknown_option": (["--bogus"], "--bogus"),
        "missing_value": (["--context"], "--context"),
        "wrong_type": (["--context", "abc"], "--context"),
        "out_of_range": (["--batch", "-3"], "--batch: must be >= 1 (got -3)"),
        "missing_argument": None,
    },
    "roofline": {
        "unknown_option": (["--bogus"], "--bogus"),
        "missing_value": (["--out"], "--out"),
        "wrong_type": (["--gen", "1.5"], "--gen"),
        "out_of_range": (["--prompt", "0"], "--prompt: must be >= 1 (got 0)"),
        "missing_argument": None,
    },
    "models": {
        "unknown_option": (["--bogus"], "--bogus"),
        "missing_value": None,
        "wrong_type": (["--json=3"], "--json"),  # a flag given a value
        "out_of_range": None,
        "missing_argument": None,
    },
    "hardware": {
        "unknown_option": (["--bogus"], "--bogus"),
        "missing_value": None,
        "wrong_type": (["--json=yes"], "--json"),
        "out_of_range": None,
        "missing_argument": None,
    },
    "run": {
        "unknown_option": (["x.yaml", "--bogus"], "--bogus"),
        "missing_value": (["x.yaml", "--out"], "--out"),
        "wrong_type": (["x.yaml", "--set"], "--set"),
        "out_of_range": None,
        "missing_argument": ([], "scenario"),
    },
    "search": {
        "unknown_option": (["x.yaml", "--bogus"], "--bogus"),
        "missing_value": (["x.yaml", "--out"], "--out"),
        "wrong_type": (["x.yaml", "--set"], "--set"),
        "out_of_range": None,
        "missing_argument": ([], "scenario"),
    },
    "plan": {
        "unknown_option": (["x.yaml", "--bogus"], "--bogus"),
        "missing_value": (["x.yaml", "--slo"], "--slo"),
        "wrong_type": (["x.yaml", "--max-gpus", "abc"], "--max-gpus"),
        "out_of_range": (["x.yaml", "--max-gpus", "0"], "--max-gpus: must be >= 1 (got 0)"),
        "missing_argument": ([], "scenario"),
    },
    "generate": {
        "unknown_option": (["--model", "tiny", "--bogus"], "--bogus"),
        "missing_value": (["--model"], "--model"),
        "wrong_type": (["--model", "tiny", "--max-tokens", "abc"], "--max-tokens"),
        "out_of_range": (["--model", "tiny", "--top-k", "-1"], "--top-k: must be >= 0 (got -1)"),
        "missing_argument": (["--prompt", "hi"], "--model"),  # a required option
    },
    "eval": {
        "unknown_option": (["--model", "tiny", "--bogus"], "--bogus"),
        "missing_value": (["--model", "tiny", "--quant"], "--quant"),
        "wrong_type": (["--model", "tiny", "--tokens", "abc"], "--tokens"),
        "out_of_range": (["--model", "tiny", "--group-size", "0"],
                         "--group-size: must be >= 1 (got 0)"),
        "missing_argument": ([], "--model"),  # a required option
    },
    "prune": {
        "unknown_option": (["--model", "tiny", "--out", "o", "--bogus"], "--bogus"),
        "missing_value": (["--model", "tiny", "--out", "o", "--layers"], "--layers"),
        "wrong_type": (["--model", "tiny", "--out", "o", "--layers", "abc"], "--layers"),
        "out_of_range": (["--model", "tiny", "--out", "o", "--layers", "-1"],
                         "--layers: must be >= 0 (got -1)"),
        "missing_argument": (["--layers", "1"], "--model"),  # a required option
    },
    "serve": {
        "unknown_option": (["--model", "tiny", "--bogus"], "--bogus"),
        "missing_value": (["--model"], "--model"),
        "wrong_type": (["--model", "tiny", "--port", "abc"], "--port"),
        "out_of_range": (["--model", "tiny", "--replicas", "0"],
                         "--replicas must be >= 1, got 0"),
        "missing_argument": ([], "give --model NAME or --scenario FILE"),
    },
    "train-draft": {
        "unknown_option": (["--method", "medusa", "--model", "tiny", "--steps", "1", "--bogus"],
                           "--bogus"),
        "missing_value": (["--method", "medusa", "--model", "tiny", "--steps"], "--steps"),
        "wrong_type": (["--method", "medusa", "--model", "tiny", "--steps", "abc"], "--steps"),
        "out_of_range": (["--method", "medusa", "--model", "tiny", "--steps", "0"],
                         "--steps: must be >= 1 (got 0)"),
        "missing_argument": (["--model", "tiny", "--steps", "1"], "--method"),
    },
    "schema": {
        "unknown_option": (["--bogus"], "--bogus"),
        "missing_value": None,
        "wrong_type": (["extra"], "extra"),  # takes no argument at all
        "out_of_range": None,
        "missing_argument": None,
    },
    "calibrate": {
        "unknown_option": (["--bogus"], "--bogus"),
        "missing_value": (["--name"], "--name"),
        "wrong_type": (["--quick=1"], "--quick"),
        "out_of_range": (["--name", ""], "--name"),
        "missing_argument": None,
    },
    "report": {
        "unknown_option": (["x.json", "--bogus"], "--bogus"),
        "missing_value": (["x.json", "--csv"], "--csv"),
        "wrong_type": (["x.json", "--markdown"], "--markdown"),
        "out_of_range": None,
        "missing_argument": ([], "results"),
    },
    "compare": {
        "unknown_option": (["a.json", "b.json", "--bogus"], "--bogus"),
        "missing_value": (["a.json", "b.json", "--metric"], "--metric"),
        "wrong_type": (["a.json", "b.json", "--max-regression", "abc"], "--max-regression"),
        "out_of_range": (["a.json", "b.json", "--max-regression", "-5%"], "--max-regression"),
        "missing_argument": (["a.json"], "new"),
    },
    "plots": {
        "unknown_option": (["x.json", "--bogus"], "--bogus"),
        "missing_value": (["x.json", "--out"], "--out"),
        "wrong_type": (["x.json", "--out", "o", "--steps=2"], "--steps"),
        "out_of_range": None,
        "missing_argument": (["--out", "o"], "results"),
    },
    "kernels bench": {
        "unknown_option": (["--bogus"], "--bogus"),
        "missing_value": (["--out"], "--out"),
        "wrong_type": (["--quick=yes"], "--quick"),
        "out_of_range": (["--out", "rows.txt"], "--out"),
        "missing_argument": None,
    },
}

# Value checks that the generic table does not reach: NaN, inf, empty lists, ranges.
EXTRA: list[tuple[list[str], str]] = [
    (["predict", "--batch", ""], "--batch"),
    (["predict", "--batch", "1,,2"], "--batch"),
    (["predict", "--batch", "1,x"], "--batch"),
    (["predict", "--model", ""], "--model: must not be empty"),
    (["predict", "--spec-acceptance", "nan"], "--spec-acceptance: must be a finite number"),
    (["predict", "--spec-acceptance", "1.5"], "--spec-acceptance: must be in [0, 1]"),
    (["predict", "--spec-draft-ratio", "-inf"], "--spec-draft-ratio"),
    (["predict", "--spec-tokens", "0"], "--spec-tokens: must be >= 1"),
    (["predict", "--kv-heads", "-2"], "--kv-heads: must be >= 1"),
    (["predict", "--prompt", "1e3"], "--prompt"),
    (["kv", "--models", ""], "--models"),
    (["kv", "--models", "llama2-13b,,llama3-8b"], "--models"),
    (["roofline", "--batch", "8,"], "--batch"),
    (["generate", "--model", "tiny", "--max-tokens", "0"], "--max-tokens: must be >= 1 (got 0)"),
    (["generate", "--model", "tiny", "--temperature", "nan"], "--temperature: must be a finite"),
    (["generate", "--model", "tiny", "--temperature", "-0.5"], "--temperature: must be >= 0"),
    (["generate", "--model", "tiny", "--temperature", "inf"], "--temperature"),
    (["generate", "--model", "tiny", "--top-p", "0"], "--top-p: must be in (0, 1]"),
    (["generate", "--model", "tiny", "--top-p", "nan"], "--top-p"),
    (["generate", "--model", "tiny", "--seed", "-1"], "--seed: must be in [0, 2**63 - 1]"),
    (["generate", "--model", "tiny", "--seed", str(2**64)], "--seed"),
    (["generate", "--model", "tiny", "--prompt-ids", "1,,2"], "--prompt-ids"),
    (["generate", "--model", "tiny", "--prompt-ids", ""], "--prompt-ids"),
    (["generate", "--model", "", "--prompt", "hi"], "--model: must not be empty"),
    (["report", "a.json", "--csv", "."], "--csv: . is a directory"),
    (["report", "a.json", "--markdown", "."], "--markdown"),
    (["roofline", "--out", "."], "--out"),
    (["kv", "--plot", "."], "--plot"),
    (["kernels", "bench", "--out", "."], "--out"),
    (["kernels", "bench", "--hardware", ""], "--hardware: must not be empty"),
    (["calibrate", "--device", ""], "--device: must not be empty"),
    (["generate", "--model", "tiny", "--backend", " "], "--backend: must not be empty"),
    (["predict", "a.yaml", "b.yaml"], "unexpected extra argument"),
    (["frobnicate"], "No such command 'frobnicate'"),
    (["kernels", "frobnicate"], "No such command 'frobnicate'"),
    (["--bogus"], "--bogus"),
]


def command_paths() -> list[str]:
    """Every leaf command registered on the app ('kernels bench' for a sub-group)."""
    root = typer.main.get_command(app)
    paths: list[str] = []

    def walk(group: object, prefix: str) -> None:
        for name, cmd in getattr(group, "commands", {}).items():
            path = f"{prefix}{name}"
            if getattr(cmd, "commands", None) is not None:
                walk(cmd, path + " ")
            else:
                paths.append(path)

    walk(root, "")
    return sorted(paths)


def cases() -> list[object]:
    rows: list[object] = []
    for command, kinds in TABLE.items():
        for kind in KINDS:
            case = kinds[kind]
            if case is not None:
                args, needle = case
                rows.append(pytest.param([*command.split(), *args], needle,
                                         id=f"{command.replace(' ', '-')}-{kind}"))
    for args, needle in EXTRA:
        rows.append(pytest.param(args, needle, id=" ".join(args) or "empty"))
    return rows


def assert_one_error_line(code: int, out: str, err: str, needle: str) -> None:
    assert "Traceback" not in out + err, err
    assert code == 2, (code, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert needle in lines[0], (needle, lines[0])


def test_the_table_covers_every_registered_command() -> None:
    assert sorted(TABLE) == command_paths()


@pytest.mark.parametrize(("args", "needle"), cases())
def test_usage_error_is_one_line_and_exit_2(args: list[str], needle: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # nothing a row might write lands in the checkout
    code, out, err = run_in_process(args, capsys)
    assert_one_error_line(code, out, err, needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["predict", "--bogus"], "--bogus"),
        (["run"], "scenario"),
        (["frobnicate"], "frobnicate"),
        (["predict", "--batch", ""], "--batch"),
        (["generate", "--model", "tiny", "--temperature", "nan"], "--temperature"),
    ],
    ids=["unknown-option", "missing-argument", "unknown-command", "empty-list", "nan"],
)
def test_usage_error_through_the_real_entry_point(args: list[str], needle: str,
                                                  tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "infbench.cli", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert_one_error_line(proc.returncode, proc.stdout, proc.stderr, needle)


def test_console_script_prints_one_line() -> None:
    """The installed `infbench` script itself (what `pip install` puts on PATH)."""
    script = Path(sys.executable).with_name("infbench")
    if not script.exists():
        pytest.skip("no infbench console script next to this interpreter")
    proc = subprocess.run([str(script), "predict", "--top-k", "3"], capture_output=True,
                          text=True, timeout=120)
    assert_one_error_line(proc.returncode, proc.stdout, proc.stderr, "--top-k")


@pytest.mark.parametrize("args", [["--help"], ["predict", "--help"], ["kernels", "bench", "--help"],
                                  ["generate", "--help"]])
def test_help_still_prints_help_and_exits_0(args: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_in_process(args, capsys)
    assert code == 0, err
    assert "Usage" in out and "Traceback" not in out + err


@pytest.mark.parametrize("args", [[], ["kernels"]], ids=["root", "kernels"])
def test_no_args_prints_help_without_a_traceback(args: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_in_process(args, capsys)
    assert code in (0, 2)
    assert "Usage" in out + err and "Traceback" not in out + err


def _raise(exc: BaseException) -> Callable[..., None]:
    def fake_app(*_args: object, **_kwargs: object) -> None:
        raise exc

    return fake_app


@pytest.mark.parametrize("source", ["click", "typer-bundled", "duck"])
def test_any_click_copy_is_recognised(source: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The errors of click itself, of Typer's bundled copy, or any look-alike: one line, 2."""
    exc: Exception
    if source == "click":
        click = pytest.importorskip("click")
        exc = click.exceptions.NoSuchOption("--bogus")
    elif source == "typer-bundled":
        exc = typer.BadParameter("must be >= 0 (got -1)", param_hint="'--top-k'")
    else:
        class LookAlike(Exception):
            exit_code = 2

            def format_message(self) -> str:
                return "No such option: --bogus\n(wrapped)"

        exc = LookAlike()
    monkeypatch.setattr("infbench.cli.app", _raise(exc))
    code, out, err = run_in_process(["predict"], capsys)
    assert_one_error_line(code, out, err, "--bogus" if source != "typer-bundled" else "--top-k")


@pytest.mark.parametrize("item", ["attention=3", "moe=3"])
def test_set_of_a_group_to_a_scalar_is_a_usage_error(item: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_in_process(["predict", "--set", item], capsys)
    assert_one_error_line(code, out, err, item.split("=")[0])
