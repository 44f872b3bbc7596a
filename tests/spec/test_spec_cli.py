"""Speculative decoding from the command line: `infbench generate --speculative ...` prints
the plain greedy text, and a scenario's speculative section runs through `infbench run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli, tiny_scenario

GEN = ["generate", "--model", "tiny", "--prompt-ids", "5,6,7,8,5,6,7", "--max-tokens", "12",
       "--output-ids", "--dtype", "float32"]


@pytest.mark.parametrize("extra", [
    ["--speculative", "ngram", "--num-speculative-tokens", "3"],
    ["--speculative", "draft", "--num-speculative-tokens", "2"],
    ["--speculative", "draft", "--draft-layers", "1", "--num-speculative-tokens", "4"],
    ["--speculative", "draft", "--draft-quant", "int8"],
], ids=["ngram", "self", "layers-1", "int8"])
def test_generate_speculative_prints_the_plain_greedy_ids(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        extra: list[str]) -> None:
    code, plain, _ = run_cli(monkeypatch, capsys, *GEN)
    assert code == 0
    code, spec, err = run_cli(monkeypatch, capsys, *GEN, *extra)
    assert code == 0, err
    assert spec == plain
    assert "speculative" in err and ("drafts accepted" in err or "no drafts" in err)


@pytest.mark.parametrize("extra,needle", [
    (["--speculative", "draft", "--num-speculative-tokens", "0"], "--num-speculative-tokens"),
    (["--speculative", "bogus"], "'bogus'; allowed: none, ngram, draft, medusa, eagle"),
    (["--draft-layers", "1"], "--draft-layers needs --speculative"),
    (["--speculative", "medusa"], "method medusa needs heads"),
    (["--speculative", "ngram", "--draft-layers", "1"], "draft_layers is a setting of method"),
    (["--speculative", "draft", "--draft-layers", "9"], "draft_layers=9"),
    (["--speculative", "draft", "--draft-model", "smollm2-135m"], "vocabulary"),
])
def test_generate_speculative_bad_input(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str],
                                        extra: list[str], needle: str) -> None:
    code, _, err = run_cli(monkeypatch, capsys, *GEN, *extra)
    assert code == 2, err
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()[-1]) > 0


def test_run_scenario_reports_speculation(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(tiny_scenario("spec", batch_size="[2]", gen_len=10)
                    + "speculative: {method: draft, num_tokens: 3}\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out",
                           str(tmp_path / "out"))
    assert code == 0, err
    result = json.loads((tmp_path / "out" / "spec_000.json").read_text())
    spec = result["metrics"]["speculative"]
    assert spec["method"] == "draft(target)" and spec["num_tokens"] == 3
    assert spec["acceptance_rate"] == 1.0  # the target drafting for itself
    assert spec["num_accepted_tokens"] == spec["num_draft_tokens"] > 0
    assert spec["speedup_measured"] > 0 and spec["speedup_predicted"] > 0
    assert spec["baseline_tpot_s"] > 0
    assert any(step["spec_drafts"] for step in result["steps"])
