"""The `$ infbench ...` examples in README.md and docs/*.md run as written.

The convention (docs/architecture.md, "Documentation"):

- a command is a line `$ infbench ...` in a fenced block whose info string is `console`;
  the lines after it, up to the next `$` line, are its output;
- `<!-- expect-exit: N -->` on the line before a block: each of its commands exits with N
  (for N = 2: stderr is one `error:` line);
- `<!-- no-run -->` on the line before a block: its commands are too slow to run here
  (engine runs of real scenarios, calibrate, benchmarks) or need a run's results; they are
  checked against `--help` instead: the sub-command exists and so does every option named.

Every other command really runs, exit 0 expected, in a scratch directory holding copies of
the repository's `scenarios/`, `results/baselines/` and `pyproject.toml` (relative paths
in the examples resolve as they do from the repository root; whatever a command writes
stays in the scratch directory).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TIMEOUT_S = 120

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*(no-run|expect-exit:\s*(\d+))\s*-->$")
_INFBENCH_LINE = re.compile(r"^\s*(\$\s+)?infbench(\s|$)")
_SHELL = {">", ">>", "<", "|", "&&", "||", ";", "&", "2>", "2>&1"}
_OPTION = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class Example:
    page: str  # path relative to the repository
    line: int  # 1-based line of the `$ infbench` line
    command: str  # the text after `$ `
    argv: tuple[str, ...]  # shlex-split, comments dropped, without the leading `infbench`
    no_run: bool
    expect_exit: int

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse_page(path: Path) -> tuple[list[Example], list[str]]:
    """The examples of one Markdown page and the convention errors found in it."""
    rel = str(path.relative_to(REPO))
    lines = path.read_text(encoding="utf-8").splitlines()
    examples: list[Example] = []
    errors: list[str] = []
    markers: list[tuple[int, re.Match[str]]] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        marker = _MARKER.match(stripped)
        fence = _FENCE.match(stripped)
        if marker:
            markers.append((i + 1, marker))
            i += 1
            continue
        if not fence:
            if stripped and markers:
                errors.append(f"{rel}:{markers[0][0]}: marker not followed by a code block")
                markers = []
            i += 1
            continue
        ticks, info = fence.group(1), fence.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = lines[i + 1:end]
        no_run = any(m.group(1) == "no-run" for _, m in markers)
        expect = [int(m.group(2)) for _, m in markers if m.group(2) is not None]
        if markers and info != "console":
            errors.append(f"{rel}:{markers[0][0]}: marker before a ```{info} block")
        markers = []
        for offset, text in enumerate(body):
            lineno = i + 2 + offset
            if info != "console":
                if _INFBENCH_LINE.match(text):
                    errors.append(f"{rel}:{lineno}: infbench command in a ```{info} block; "
                                  "use ```console and `$ infbench ...`")
                continue
            if not text.startswith("$ "):
                continue
            command = text[2:].strip()
            if not command.startswith("infbench"):
                continue  # `$ make run` and the like: documentation only
            if command.endswith("\\"):
                errors.append(f"{rel}:{lineno}: write the command on one line")
                continue
            argv = shlex.split(command, comments=True)
            if argv[0] != "infbench" or _SHELL & set(argv):
                errors.append(f"{rel}:{lineno}: not a plain infbench command: {command}")
                continue
            examples.append(Example(rel, lineno, command, tuple(argv[1:]), no_run,
                                    expect[0] if expect else 0))
        i = end + 1
    if markers:
        errors.append(f"{rel}:{markers[0][0]}: marker not followed by a code block")
    return examples, errors


def _collect() -> tuple[list[Example], list[str]]:
    examples: list[Example] = []
    errors: list[str] = []
    for page in PAGES:
        found, errs = parse_page(page)
        examples += found
        errors += errs
    return examples, errors


EXAMPLES, CONVENTION_ERRORS = _collect()
_PASSED: set[tuple[tuple[str, ...], int]] = set()  # (argv, exit code) of examples that passed


def _infbench() -> list[str]:
    script = Path(sys.executable).parent / "infbench"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from infbench.cli import main; main()"]


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["INFBENCH_HOME"] = str(home)  # calibrated profiles and caches stay in the scratch dir
    env["COLUMNS"] = "200"  # help text on one line per option
    env["NO_COLOR"] = "1"
    env["TERM"] = "dumb"
    return env


def _workdir(tmp: Path) -> Path:
    """A scratch directory that looks like the repository root to the examples."""
    work = tmp / "repo"
    work.mkdir()
    shutil.copytree(REPO / "scenarios", work / "scenarios")
    shutil.copytree(REPO / "results" / "baselines", work / "results" / "baselines")
    shutil.copy2(REPO / "pyproject.toml", work / "pyproject.toml")
    (work / "docs").mkdir()
    return work


@functools.cache
def _help(path: tuple[str, ...]) -> tuple[int, str]:
    home = Path(tempfile.gettempdir()) / "infbench-docs-help"
    proc = subprocess.run([*_infbench(), *path, "--help"], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=_env(home), cwd=REPO)
    return proc.returncode, proc.stdout + proc.stderr


def _check_against_help(example: Example) -> None:
    """The sub-command exists and every option the example names is one of its options."""
    path: tuple[str, ...] = ()
    code, text = _help(path)
    assert code == 0, text
    for token in example.argv:
        if token.startswith("-") or "COMMAND" not in _usage(text):
            break  # the rest are arguments and options of a command, not sub-commands
        path = (*path, token)
        code, text = _help(path)
        assert code == 0, f"{example.id}: `infbench {' '.join(path)}` is not a command:\n{text}"
    known = set(_OPTION.findall(text))
    named = {t.split("=", 1)[0] for t in example.argv if t.startswith("--")}
    unknown = sorted(named - known)
    assert not unknown, (f"{example.id}: `infbench {' '.join(path)}` has no option "
                         f"{', '.join(unknown)} (see its --help)")


def _usage(help_text: str) -> str:
    for line in help_text.splitlines():
        if "Usage:" in line:
            return line
    return ""


def test_examples_follow_the_convention() -> None:
    assert not CONVENTION_ERRORS, "\n".join(CONVENTION_ERRORS)
    runnable = [e for e in EXAMPLES if not e.no_run]
    assert len(EXAMPLES) >= 20 and len(runnable) >= 10
    assert any(e.page == "README.md" and not e.no_run for e in EXAMPLES)
    # the fast analytic commands must really run somewhere in the docs
    ran = {e.argv[0] for e in runnable if e.argv}
    assert {"predict", "kv", "roofline", "models", "hardware", "schema"} <= ran


def test_readme_links_resolve() -> None:
    """The README's relative links (the docs pages, the figure) point at files that exist."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#", 1)[0] for t in targets if "://" not in t and not t.startswith("#")]
    assert local
    missing = sorted({t for t in local if not (REPO / t).exists()})
    assert not missing, f"README.md links to missing files: {missing}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example(example: Example, tmp_path: Path) -> None:
    if example.no_run:
        _check_against_help(example)
        return
    key = (example.argv, example.expect_exit)
    if key in _PASSED:
        return  # the same command already ran for another page (README and docs share some)
    work = _workdir(tmp_path)
    proc = subprocess.run([*_infbench(), *example.argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=_env(tmp_path / "home"), cwd=work)
    shown = f"$ infbench {example.command}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr}"
    assert proc.returncode == example.expect_exit, f"{example.id}: exit {proc.returncode}\n{shown}"
    assert "Traceback" not in proc.stderr, f"{example.id}: traceback\n{shown}"
    if example.expect_exit == 2:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), (
            f"{example.id}: expected one `error:` line on stderr\n{shown}")
    _PASSED.add(key)
