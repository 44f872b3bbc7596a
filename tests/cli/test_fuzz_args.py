"""Fuzz the argument parsing of every command: exit 0 or 2, never a traceback, no stray files.

Hypothesis builds argument lists from each command's real option names mixed with
unknown options and hostile values (NaN, inf, negative and huge numbers, empty strings,
broken comma lists, random text).  Every example runs in-process in a fresh temporary
directory; nothing may be written outside it.

The commands that would do real work past their argument checks (`run`, `generate`,
`calibrate`, `kernels bench`) have that work replaced by a `UserError` (exit 2): the
fuzz is about the boundary, not the engine.  Huge sizes for `predict`/`kv`/`roofline`
stay in the example space because the analytic model refuses them in constant time.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infbench.cli import app, main
from infbench.core.errors import UserError


def _leaf_commands() -> dict[str, list[object]]:
    """'kernels bench' -> its click parameters (options and arguments)."""
    found: dict[str, list[object]] = {}

    def walk(group: object, prefix: str) -> None:
        for name, cmd in getattr(group, "commands", {}).items():
            if getattr(cmd, "commands", None) is not None:
                walk(cmd, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = list(getattr(cmd, "params", []))

    walk(typer.main.get_command(app), "")
    return found


COMMANDS = _leaf_commands()
# 30 per command keeps the file well under a minute; raise it locally to hunt harder.
MAX_EXAMPLES = int(os.environ.get("INFBENCH_FUZZ_EXAMPLES", "30"))

# Values a user (or a script with an empty variable) might pass.
HOSTILE = ["nan", "NaN", "inf", "-inf", "1e309", "-1", "0", "-0", "1.5", "1e3",
           "99999999999999999999999", "-99999999999999999999", "", " ", ",", "1,,2", "8,",
           ",8", "abc", "-", "--", "=", "x=1", "-5%", ".", "..", "\\", "~"]
NAMES = ["llama2-13b", "llama3-8b", "deepseek-v2-lite", "tiny", "tiny-mla", "h100-sxm", "cpu",
         "cuda", "auto", "none", "int8", "int4", "fp8", "bfloat16", "float32", "float16", "mha",
         "gqa", "mqa", "mla", "cla", "sliding", "ssm", "linear", "elu", "favor", "1,8,64", "5%",
         "0.05", "mbu", "ttft_s.p99", "attention.window=4", "num_layers=2", "rope_theta=5e5"]
PATHS = ["out.png", "out.json", "out.csv", "out.md", "x.yaml", "a.json", "plots", "."]
# No '/' (absolute paths would leave the sandbox) and no NUL (impossible in a real argv).
TEXT = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
               max_size=8)
JUNK = st.one_of(st.sampled_from(HOSTILE), TEXT,
                 st.integers(min_value=-(2**70), max_value=2**70).map(str),
                 st.floats(allow_nan=True, allow_infinity=True).map(repr))
PLAUSIBLE = {
    "integer": st.integers(min_value=-2, max_value=2**12).map(str),
    "float": st.floats(min_value=-0.5, max_value=1.5).map(str),
    "path": st.sampled_from(PATHS),
}
UNKNOWN_OPTIONS = st.sampled_from(["--bogus", "-x", "--json=3", "--ops=1", "---", "--no-json"])


def _kind(param: object) -> str:
    """'integer', 'float', 'path' or 'text' under click (param.type) or typer 0.29."""
    name = getattr(getattr(param, "type", None), "name", None)
    if isinstance(name, str):
        return name
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return {int: "integer", float: "float", Path: "path"}.get(annotation, "text")  # type: ignore[call-overload]


def _value(param: object) -> st.SearchStrategy[str]:
    """Mostly a value of the option's type, sometimes junk."""
    kind = _kind(param)
    plausible = PLAUSIBLE.get(kind, st.sampled_from(NAMES))
    return st.one_of(plausible, plausible, JUNK)


def _chunk(param: object) -> st.SearchStrategy[list[str]]:
    opts = [o for o in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
            if o.startswith("-")]
    if not opts:  # an argument
        return _value(param).map(lambda value: [value])
    if getattr(param, "is_flag", False):
        return st.sampled_from(opts).map(lambda opt: [opt])
    return st.tuples(st.sampled_from(opts), _value(param)).map(list)


def arguments(command: str) -> st.SearchStrategy[list[str]]:
    """The command's words, then options with (mostly) typed values, sometimes junk."""
    params = [p for p in COMMANDS[command] if getattr(p, "name", "") != "help"]
    options = [p for p in params if getattr(p, "param_type_name", "") == "option"]
    positional = [p for p in params if p not in options]
    junk = st.one_of(UNKNOWN_OPTIONS, JUNK).map(lambda token: [token])
    good = st.one_of(*[_chunk(p) for p in options]) if options else junk
    rare = st.one_of(junk, *[_chunk(p) for p in positional])
    chunks = st.lists(st.one_of(good, good, good, good, good, good, rare), max_size=5)
    return chunks.map(lambda parts: [*command.split(), *(t for part in parts for t in part)])


def _stop(*_args: object, **_kwargs: object) -> None:
    raise UserError("fuzz: stopped before the real work")


@pytest.fixture(scope="module")
def no_real_work() -> Iterator[None]:
    """Replace what run/generate/calibrate/kernels bench would do after parsing."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("infbench.measure.bench.run_point", _stop)
        mp.setattr("infbench.model.loader.load_model", _stop)
        mp.setattr("infbench.measure.calibrate.calibrate", _stop)
        mp.setattr("infbench.measure.kernel_bench.run_kernel_bench", _stop)
        yield


def run_sandboxed(args: list[str], inputs: dict[str, Path] | None = None,
                  ) -> tuple[int, str, set[str]]:
    """Run main(args) with cwd in a fresh directory holding `inputs` (name -> source file);
    return (exit code, output, entries written next to that directory)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        for name, source in (inputs or {}).items():
            shutil.copyfile(source, work / name)
        out, err = io.StringIO(), io.StringIO()
        old_cwd = os.getcwd()
        os.chdir(work)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception as exc:  # a traceback the user would have seen
            raise AssertionError(f"infbench {args!r} raised {exc!r}\n{err.getvalue()}") from exc
        finally:
            os.chdir(old_cwd)
        stray = {p.name for p in Path(tmp).iterdir()} - {"work"}
    return code, out.getvalue() + err.getvalue(), stray


@pytest.mark.parametrize("command", sorted(COMMANDS))
@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_arguments_exit_0_or_2_without_traceback(command: str, data: st.DataObject,
                                                        no_real_work: None) -> None:
    args = data.draw(arguments(command), label="args")
    code, output, stray = run_sandboxed(args)
    assert "Traceback" not in output, (args, output)
    assert code in (0, 2), (args, code, output)
    assert not stray, (args, stray)
    if code == 2:
        lines = [line for line in output.splitlines() if line.strip()]
        # A usage error is one line; `infbench kernels` without a sub-command prints help.
        assert any(line.startswith("error: ") for line in lines) or "Usage" in output, (
            args, output)


REPO = Path(__file__).resolve().parents[2]
# A real result file and a predict-only scenario (a preset, no checkpoint), so that the
# commands reading them get past "no such file" and parse their other options for real.
INPUTS = {"a.json": REPO / "results" / "baselines" / "ci" / "ci_gate_000.json",
          "x.yaml": REPO / "scenarios" / "lecture_llama2_13b.yaml"}
WITH_INPUTS = {"report": ["a.json"], "compare": ["a.json", "a.json"], "plots": ["a.json"],
               "roofline": ["a.json"], "kv": ["--results", "a.json"], "predict": ["x.yaml"],
               "run": ["x.yaml"]}


@pytest.mark.parametrize("command", sorted(WITH_INPUTS))
@settings(max_examples=max(MAX_EXAMPLES // 4, 5), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_options_on_real_inputs(command: str, data: st.DataObject,
                                       no_real_work: None) -> None:
    """Options fuzzed after a real input (these examples plot: fewer of them)."""
    if not all(path.is_file() for path in INPUTS.values()):
        pytest.skip("the example result file or scenario moved")
    args = data.draw(arguments(command), label="args")
    args[len(command.split()):len(command.split())] = WITH_INPUTS[command]
    code, output, stray = run_sandboxed(args, INPUTS)
    assert "Traceback" not in output, (args, output)
    assert code in (0, 2), (args, code, output)
    assert not stray, (args, stray)


def test_every_command_is_fuzzed() -> None:
    assert "predict" in COMMANDS and "kernels bench" in COMMANDS and len(COMMANDS) >= 13
