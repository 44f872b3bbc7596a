"""Long jobs check their outputs before the work: `prune --distill-steps`, `train-draft`,
`eval` and `calibrate` refuse an unusable `--out` (or `--name`) in one `error:` line, exit 2,
before loading a model or measuring anything.

Each test replaces the expensive step with one that fails the test if it is reached, so a
check that runs after the work (as the audit found: 92 s of eval, 129 s of train-draft,
105 s of prune) fails here.  The second half: a killed run's temporary output is removed by
the next start, and eval picks an int4 group size that divides the model when none is given.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_args
from eval_checkpoint import write_tiny_with_tokenizer

DEAD_PID = 999_999_999


def _no_work(*_args: object, **_kw: object) -> None:
    raise AssertionError("the work started before --out was checked")


@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A path whose parent is a file: no output can be written under it."""
    (tmp_path / "file").write_text("x")
    return tmp_path / "file" / "out"


def _one_error_line(code: int, stderr: str, says: str) -> None:
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and says in lines[0], stderr
    assert "Traceback" not in stderr


def test_prune_checks_out_before_pruning(blocked: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from infbench.commands import prune

    monkeypatch.setattr(prune, "run_prune", _no_work)
    code, _, stderr = run_args(["prune", "--model", "tiny", "--layers", "1", "--distill-steps",
                                "50", "--out", str(blocked)], capsys)
    _one_error_line(code, stderr, "is a file, not a directory")


def test_prune_refuses_a_file_where_the_directory_goes(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    from infbench.commands import prune

    monkeypatch.setattr(prune, "run_prune", _no_work)
    (tmp_path / "ckpt").write_text("x")
    code, _, stderr = run_args(["prune", "--model", "tiny", "--layers", "1", "--out",
                                str(tmp_path / "ckpt")], capsys)
    _one_error_line(code, stderr, "exists and is not a directory")


def test_prune_removes_a_killed_runs_temporary_checkpoint(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """A prune killed mid-write left a hidden, loadable model next to --out: the next start
    removes it (and says so) before its own work."""
    from infbench.commands import prune
    from infbench.core.errors import UserError

    reached = []

    def work(*_args: object, **_kw: object) -> None:
        reached.append(1)
        raise UserError("stopped here: the clean-up came first")

    monkeypatch.setattr(prune, "run_prune", work)
    stale = tmp_path / f".pruned.{DEAD_PID}.k2l3m4n5.tmp"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    code, _, stderr = run_args(["prune", "--model", "tiny", "--layers", "1", "--out",
                                str(tmp_path / "pruned")], capsys)
    assert reached and code == 2 and "stopped here" in stderr  # the work came after it
    assert not stale.exists() and f"note: removed {stale}" in stderr


def test_train_draft_checks_out_before_training(blocked: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from infbench.commands import train_draft

    monkeypatch.setattr(train_draft, "run_train_draft", _no_work)
    code, _, stderr = run_args(["train-draft", "--method", "medusa", "--model", "tiny",
                                "--steps", "100", "--out", str(blocked / "heads.safetensors")],
                               capsys)
    _one_error_line(code, stderr, "is a file, not a directory")


def test_train_draft_checks_its_default_out_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """No --out: results/draft-heads/<method>-<model>.safetensors, checked just the same."""
    from infbench.commands import train_draft

    monkeypatch.setattr(train_draft, "run_train_draft", _no_work)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").write_text("a file where the directory goes")
    code, _, stderr = run_args(["train-draft", "--method", "eagle", "--model", "tiny",
                                "--steps", "100"], capsys)
    _one_error_line(code, stderr, "results/draft-heads/eagle-tiny.safetensors")


def test_eval_checks_out_before_loading(blocked: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from infbench.model import loader

    monkeypatch.setattr(loader, "load_model", _no_work)
    code, _, stderr = run_args(["eval", "--model", "tiny", "--quant", "int8", "--out",
                                str(blocked / "eval.json")], capsys)
    _one_error_line(code, stderr, "is a file, not a directory")


def test_eval_refuses_a_name_too_long_before_loading(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from infbench.model import loader

    monkeypatch.setattr(loader, "load_model", _no_work)
    code, _, stderr = run_args(["eval", "--model", "tiny", "--out",
                                str(tmp_path / ("e" * 300 + ".json"))], capsys)
    _one_error_line(code, stderr, "the file name is 305 bytes")


@pytest.mark.parametrize("name, says", [
    ("x" * 300, "not a usable profile name"),
    ("My Box", "not a usable profile name"),
    ("../escape", "not a usable profile name"),
    ("cpu", "a built-in hardware name"),
    ("auto", "a built-in hardware name"),
], ids=["300-characters", "space-and-upper-case", "path", "table-entry", "auto"])
def test_calibrate_checks_the_name_before_measuring(name: str, says: str,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from infbench.measure import calibrate

    monkeypatch.setattr(calibrate, "calibrate", _no_work)
    code, _, stderr = run_args(["calibrate", "--quick", "--name", name], capsys)
    _one_error_line(code, stderr, says)
    assert len(stderr) < 400  # a 300-character name is not echoed whole


def test_calibrate_checks_the_profile_store_before_measuring(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    from infbench.measure import calibrate

    monkeypatch.setattr(calibrate, "calibrate", _no_work)
    (tmp_path / "home").write_text("not a directory")
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path / "home"))
    code, _, stderr = run_args(["calibrate", "--quick"], capsys)
    _one_error_line(code, stderr, "set INFBENCH_HOME to a writable directory")


@pytest.fixture(scope="module")
def rows_96(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose projections read 96 and 192 columns: only groups of 32 divide."""
    return write_tiny_with_tokenizer(tmp_path_factory.mktemp("rows96"), hidden_size=96,
                                     intermediate_size=192)


SMALL = ["--tokens", "100", "--window", "50", "--prompts", "1", "--new-tokens", "2"]


def test_eval_int4_picks_the_largest_group_that_divides(rows_96: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    code, stdout, stderr = run_args(["eval", "--model", str(rows_96), "--quant", "int4",
                                     *SMALL, "--json"], capsys)
    assert code == 0, stderr
    assert json.loads(stdout)["quant"]["group_size"] == 32
    assert ("note: --group-size not given: int4 groups of 32, the largest of 32, 64, 128 that "
            "divides every projection's input width (96, 192)") in stderr


def test_eval_keeps_the_error_for_a_group_the_user_gave(rows_96: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    code, _, stderr = run_args(["eval", "--model", str(rows_96), "--quant", "int4",
                                "--group-size", "64", *SMALL], capsys)
    _one_error_line(code, stderr, "quant.group_size=64 does not divide the input dimension 96")


def test_the_group_choice_on_smollm2_shapes() -> None:
    """SmolLM2-135M: hidden 576 = 4.5 x 128, MLP 1536: 64 is the largest group."""
    from infbench.commands.eval import default_group_size
    from infbench.core.config import ModelConfig

    assert default_group_size(ModelConfig.from_name("smollm2-135m")) == (64, [576, 1536])
    assert default_group_size(ModelConfig.from_name("tiny")) == (64, [64, 128])
