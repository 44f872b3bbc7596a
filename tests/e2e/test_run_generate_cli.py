"""`infbench run` and `infbench generate` end to end through the real CLI entry point."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import tiny_scenario

TINY = tiny_scenario(warmup=1, repeats=2)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infbench.cli", *args], capture_output=True,
                          text=True, check=False)


def _scenario(tmp: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def test_run_writes_self_describing_results_and_csv(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = _cli("run", str(_scenario(tmp_path, TINY)), "--out", str(out))
    assert res.returncode == 0, res.stderr
    files = sorted(out.glob("tiny_run_*.json"))
    assert [f.name for f in files] == ["tiny_run_000.json", "tiny_run_001.json"]
    doc = json.loads(files[1].read_text())
    for key in ("schema_version", "scenario", "env", "metrics", "prediction", "steps", "seed"):
        assert key in doc
    m = doc["metrics"]
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(m[key]) >= {"mean", "p50", "p90", "p99"}
    for key in ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s",
                "kv_bytes_per_token", "peak_kv_bytes", "kv_fragmentation", "weight_bytes",
                "peak_memory_bytes"):
        assert key in m
    assert m["num_requests"] == 3 and m["num_output_tokens"] == 18
    assert doc["scenario"]["workload"]["batch_size"] == 3
    assert doc["env"]["git_sha"] and len(doc["repeats"]) == 2
    rows = list(csv.DictReader((out / "tiny_run.csv").open()))
    assert len(rows) == 2


def test_run_keeps_finished_points_when_a_later_one_fails(tmp_path: Path) -> None:
    # Point 1 fails only when it runs (the tiny preset has no tokenizer for text prompts);
    # a point beyond the context is refused before any point runs (tests/e2e/test_rundir.py).
    bad = TINY.replace("batch_size: [1, 3]", "batch_size: 1") + (
        "sweep: {workload.prompt_source: [random, text]}\n")
    out = tmp_path / "out"
    res = _cli("run", str(_scenario(tmp_path, bad)), "--out", str(out))
    assert res.returncode == 2
    # where the kept results are, then the one-line error
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "tokenizer" in last
    assert res.stderr.count("error:") == 1 and "Traceback" not in res.stderr
    kept = sorted(p.name for p in out.glob("tiny_run_*.json"))
    assert kept == ["tiny_run_000.json"]  # point 0 (random prompts) finished before the failure


def test_run_gate_block_passes_then_fails_on_a_doctored_baseline(tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert _cli("run", str(_scenario(tmp_path, TINY)), "--out", str(base)).returncode == 0
    gated = TINY + f"gate: {{metric: output_tokens_per_s, baseline: {base}, max_regression: 0.9}}\n"
    ok = _cli("run", str(_scenario(tmp_path, gated, "g.yaml")), "--out", str(tmp_path / "n1"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for f in base.glob("tiny_run_*.json"):  # a baseline 100x faster than anything this run reaches
        doc = json.loads(f.read_text())
        doc["metrics"]["output_tokens_per_s"] *= 100
        for rep in doc["repeats"]:
            rep["output_tokens_per_s"] *= 100
        f.write_text(json.dumps(doc))
    bad = _cli("run", str(_scenario(tmp_path, gated, "g.yaml")), "--out", str(tmp_path / "n2"))
    assert bad.returncode == 1


def test_generate_prints_only_the_completion_ids_on_stdout() -> None:
    res = _cli("generate", "--model", "tiny", "--prompt-ids", "5,6,7,8", "--max-tokens", "5",
               "--temperature", "0", "--output-ids")
    assert res.returncode == 0, res.stderr
    ids = [int(t) for t in res.stdout.strip().split(",")]
    assert len(ids) == 5 and all(0 <= t < 256 for t in ids)
    assert "tokens/s" in res.stderr
    again = _cli("generate", "--model", "tiny", "--prompt-ids", "5,6,7,8", "--max-tokens", "5",
                 "--output-ids")
    assert again.stdout == res.stdout  # greedy by default: deterministic


@pytest.mark.parametrize("args,needle", [
    (["--model", "tiny", "--prompt", "hi"], "no tokenizer"),
    (["--model", "tiny", "--prompt-ids", "1,x"], "--prompt-ids"),
    (["--model", "/nonexistent", "--prompt", "hi"], "unknown model '/nonexistent'"),
])
def test_generate_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    res = _cli("generate", *args)
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr


def test_generate_smollm2_text() -> None:
    res = _cli("generate", "--model", "smollm2-135m", "--prompt", "The capital of France is",
               "--max-tokens", "6")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() and "6 generated" in res.stderr
