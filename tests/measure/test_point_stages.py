"""run_point as named stages (measure/engine_point.py): their order, their size, and the
torch-free entry that a run against a server imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import yaml

from infbench.measure.bench import run_point
from infbench.scenario.schema import load_scenario

REPO = Path(__file__).resolve().parents[2]


def test_bench_imports_no_torch() -> None:
    """`infbench run` against a server imports measure.bench (client_concurrency, ModelCache)
    and never runs an engine point: torch stays unloaded."""
    code = "import sys, infbench.measure.bench; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 0


def test_every_stage_is_under_80_lines() -> None:
    for name in ("bench.py", "engine_point.py"):
        tree = ast.parse((REPO / "infbench" / "measure" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                length = node.end_lineno - node.body[0].lineno + 1  # type: ignore[operator]
                assert length < 80, f"{name}: {node.name} is {length} lines"


def test_stages_run_in_order(tmp_path: Path) -> None:
    """Warm-up (with the plain baseline), the torch reference before repeat 1, each repeat
    then its plain baseline, and ncu last (skipped off CUDA); the result carries each."""
    doc = {"name": "stages", "device": "cpu", "dtype": "float32", "hardware": "cpu",
           "model": {"preset": "tiny", "overrides": {"max_seq_len": 64, "num_layers": 2}},
           "workload": {"kind": "static", "batch_size": 2, "prompt_len": 6, "gen_len": 4},
           "engine": {"block_size": 4}, "speculative": {"method": "ngram", "num_tokens": 2},
           "measure": {"warmup": 1, "repeats": 2, "torch_reference": True, "profile": "ncu"}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    phases: list[str] = []
    result = run_point(load_scenario(path).points()[0], on_phase=phases.append)
    assert phases == ["loading model", "warm-up 1/1", "torch reference",
                      "repeat 1/2", "repeat 1/2: plain baseline",
                      "repeat 2/2", "repeat 2/2: plain baseline",
                      "profiling decode steps under ncu"]
    assert result["telemetry"] == {"ncu": {"status": "skipped: ncu profiles CUDA kernels; "
                                                     "device is cpu"}}
    assert len(result["repeats"]) == 2
    for repeat in result["repeats"]:
        assert repeat["speculative"]["method"] == "ngram"
        assert repeat["torch_reference"]["output_tokens_per_s"] > 0
        assert repeat["normalized"]["output_tokens_per_s_over_torch_reference"] > 0
    assert len(result["requests"]) == 2 and result["steps"]
