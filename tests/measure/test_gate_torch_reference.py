"""`normalize: torch_reference`: the gate's arithmetic, its bad input, the run that records
the reference (measure.torch_reference) and the test-only slowdown that must fail it."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli, tiny_scenario

from infbench.core.errors import ResultSchemaError, UserError
from infbench.engine.records import StepRecord
from infbench.measure.bench import SLOWDOWN_ENV, injected_slowdown, slowed_down
from infbench.results.gate import compare
from infbench.results.schema import validate

RATIO = "normalized.output_tokens_per_s_over_torch_reference"
V1_BASELINE = Path(__file__).resolve().parents[1] / "results/data/v1_ci_baseline/ci_gate_000.json"


def with_reference(result: dict[str, Any], ref_tps: list[float]) -> dict[str, Any]:
    """`result` with a torch reference per repeat (tokens/s `ref_tps[i]`) and its ratios,
    as measure.bench records them; the summary is the median, as aggregate_repeats makes."""
    assert len(ref_tps) == len(result["repeats"])
    for rep, tps in zip(result["repeats"], ref_tps, strict=True):
        rep["torch_reference"] = {"output_tokens_per_s": tps, "wall_s": 128 / tps,
                                  "num_output_tokens": 128, "num_threads": 1}
        rep["normalized"]["output_tokens_per_s_over_torch_reference"] = (
            rep["output_tokens_per_s"] / tps)
    m = result["metrics"]
    m["torch_reference"] = {"output_tokens_per_s": statistics.median(ref_tps)}
    m["normalized"]["output_tokens_per_s_over_torch_reference"] = statistics.median(
        r["normalized"]["output_tokens_per_s_over_torch_reference"] for r in result["repeats"])
    return result


def test_a_slower_machine_cancels_a_slower_engine_does_not(fake_result):
    base = with_reference(fake_result(), [300.0, 310.0, 290.0])
    # the median of the per-repeat ratios, not a ratio of medians
    ratios = [r["output_tokens_per_s"] / t for r, t in zip(base["repeats"], [300, 310, 290],
                                                            strict=True)]
    res = compare(base, base, normalize="torch_reference", max_regression=0.10)
    assert res.rows[0].metric == "output_tokens_per_s / torch reference"
    assert res.rows[0].baseline == pytest.approx(
        statistics.median(ratios))
    # every time 40% longer, the reference's too: the machine, not the code
    machine = with_reference(fake_result(speed=0.6), [180.0, 186.0, 174.0])
    res = compare(base, machine, normalize="torch_reference", max_regression=0.10)
    assert res.passed and res.rows[0].change_pct == pytest.approx(0.0, abs=1e-9)
    assert not compare(base, machine, max_regression=0.10).passed  # raw tokens/s: -40%
    # the engine 15% slower on the same machine: the ratio drops 15%
    code = with_reference(fake_result(speed=0.85), [300.0, 310.0, 290.0])
    res = compare(base, code, normalize="torch_reference", max_regression=0.10)
    assert res.rows[0].status == "regression" and res.exit_code == 1
    assert res.rows[0].change_pct == pytest.approx(-15.0)


def test_a_result_without_the_reference_is_a_clear_error(fake_result):
    base = with_reference(fake_result(), [300.0, 310.0, 290.0])
    old = fake_result()
    with pytest.raises(ResultSchemaError, match=r"measure\.torch_reference: true"):
        compare(base, old, normalize="torch_reference")
    with pytest.raises(ResultSchemaError, match=r"measure\.torch_reference: true"):
        compare(old, base, normalize="torch_reference")
    assert compare(old, base).passed  # the other modes read such files as before


def test_only_output_tokens_per_s_is_normalized_by_it(fake_result):
    base = with_reference(fake_result(), [300.0, 310.0, 290.0])
    with pytest.raises(UserError, match="allowed: output_tokens_per_s"):
        compare(base, base, metric="ttft_s.p50", normalize="torch_reference")


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_broken_ratio_is_bad_input(fake_result, bad):
    base = with_reference(fake_result(), [300.0, 310.0, 290.0])
    new = with_reference(fake_result(), [300.0, 310.0, 290.0])
    new["repeats"][1]["normalized"]["output_tokens_per_s_over_torch_reference"] = bad
    with pytest.raises(ResultSchemaError, match=rf"repeats\[1\]\.{RATIO}"):
        compare(base, new, normalize="torch_reference")


def test_compare_cli_names_the_file_and_exits_2(monkeypatch, capsys, tmp_path, fake_result):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(with_reference(fake_result(), [300.0, 310.0, 290.0])))
    old = tmp_path / "old.json"  # written before the reference existed
    old.write_text(json.dumps(fake_result()))
    code, _, err = run_cli(monkeypatch, capsys, "compare", str(base), str(old),
                           "--normalize", "torch_reference")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(old) in lines[0]
    assert f"metric '{RATIO}' is missing" in lines[0]
    code, out, err = run_cli(monkeypatch, capsys, "compare", str(base), str(base),
                             "--normalize", "torch_reference")
    assert code == 0 and "gate PASS" in out + err


def test_old_results_still_load(tmp_path):
    from infbench.results.store import load_result

    result = load_result(V1_BASELINE)  # version 1, upgraded
    assert result["metrics"].get("torch_reference") is None
    data = json.loads((Path(__file__).resolve().parents[2] / "results/baselines/ci"
                       / "ci_gate_000.json").read_text())
    validate(data)  # a version-2 file of any age validates


# ------------------------------------------------------------------ the scenario keys
@pytest.mark.parametrize("extra,key", [
    ("gate: {baseline: base, normalize: torch_reference}\n", "gate.normalize"),
    ("gate: {baseline: base, normalize: torch_reference, metric: ttft_s.p50}\n"
     "measure: {torch_reference: true}\n", "gate.metric"),
    ("measure: {torch_reference: true}\nworkload: {kind: poisson, rate: 2}\n",
     "measure.torch_reference"),
    ("measure: {torch_reference: 'yes'}\n", "measure.torch_reference"),
])
def test_bad_scenario_keys(monkeypatch, capsys, tmp_path, extra, key):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nmodel: {preset: tiny}\n" + extra)
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / "o"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert str(path) in lines[0] and key in lines[0]


def test_unsupported_model_is_refused_before_measuring(monkeypatch, capsys, tmp_path):
    path = tmp_path / "mla.yaml"
    path.write_text("name: mla\ndevice: cpu\nmodel: {preset: tiny-mla}\n"
                    "workload: {batch_size: 1, prompt_len: 4, gen_len: 2}\n"
                    "measure: {warmup: 0, repeats: 1, torch_reference: true}\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / "o"))
    assert code == 2
    assert "measure.torch_reference" in err and "does not run arch 'deepseek_v2'" in err


# ------------------------------------------------------------------ a real run records it
@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """engine.num_threads sets torch's threads for the whole process: restore them."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _run(monkeypatch, capsys, tmp_path: Path, name: str, repeats: int = 3) -> list[dict]:
    # One thread, as the CI gate runs: two threads on a loaded 2-core machine stall.
    path = tmp_path / f"{name}.yaml"
    path.write_text(tiny_scenario(name, batch_size="[2]", prompt_len=16, gen_len=24,
                                  warmup=1, repeats=repeats)
                    .replace("measure: {", "measure: {torch_reference: true, ")
                    .replace("engine: {", "engine: {num_threads: 1, "))
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / name))
    assert code == 0, err
    return [json.loads(p.read_text()) for p in sorted((tmp_path / name).glob(f"{name}_*.json"))]


def test_run_records_the_reference_per_repeat(monkeypatch, capsys, tmp_path):
    (result,) = _run(monkeypatch, capsys, tmp_path, "ref")
    validate(result)
    assert len(result["repeats"]) == 3
    for rep in result["repeats"]:
        ref = rep["torch_reference"]
        assert ref["num_output_tokens"] == 2 * 24 and ref["output_tokens_per_s"] > 0
        assert ref["output_tokens_per_s"] == pytest.approx(ref["num_output_tokens"]
                                                           / ref["wall_s"])
        assert rep["normalized"]["output_tokens_per_s_over_torch_reference"] == pytest.approx(
            rep["output_tokens_per_s"] / ref["output_tokens_per_s"])
    assert "test_slowdown" not in result["env"]
    assert result["scenario"]["measure"]["torch_reference"] is True


@pytest.mark.slow
def test_injected_slowdown_fails_the_gate(monkeypatch, capsys, tmp_path):
    """The knob the docs use for the 15% demonstration, at a fraction no noise hides."""
    (base,) = _run(monkeypatch, capsys, tmp_path, "knob", repeats=5)
    monkeypatch.setenv(SLOWDOWN_ENV, "0.5")
    (slow,) = _run(monkeypatch, capsys, tmp_path, "knob2", repeats=5)
    assert slow["env"]["test_slowdown"] == 0.5
    slow["scenario"] = base["scenario"]  # same point, another name
    res = compare(base, slow, normalize="torch_reference", max_regression=0.2)
    assert res.rows[0].status == "regression", res.rows[0]
    assert res.rows[0].change_pct < -25  # nominally -50%; tokens/s halve on a quiet machine


def test_slowdown_hook_burns_the_fraction_of_cpu_time():
    seen: list[int] = []
    hook = slowed_down(lambda r: seen.append(r.index), 0.5)  # extra = 1x the step's CPU

    def burn(seconds: float) -> None:
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            pass

    record = StepRecord(index=1, start_s=0.0, duration_s=0.02, num_prefill_tokens=0,
                        num_decode_tokens=1, num_prefill_seqs=0, num_decode_seqs=1,
                        num_running=1, num_waiting=0, kv_blocks_used=1, kv_blocks_total=4,
                        kv_slots_used=1, kv_bytes_used=0, num_preempted=0)
    hook(record)  # first call: burns for the CPU since the hook was made
    burn(0.03)
    start = time.thread_time()
    hook(record)
    spent = time.thread_time() - start
    assert 0.025 <= spent <= 0.045, spent
    assert seen == [1, 1]


@pytest.mark.parametrize("raw", ["abc", "1", "1.5", "-0.1", "nan"])
def test_bad_slowdown_values(monkeypatch, capsys, tmp_path, raw):
    monkeypatch.setenv(SLOWDOWN_ENV, raw)
    with pytest.raises(UserError, match=SLOWDOWN_ENV):
        injected_slowdown()
    path = tmp_path / "s.yaml"
    path.write_text(tiny_scenario("s", batch_size="[1]"))
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and SLOWDOWN_ENV in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err


def test_unset_or_empty_slowdown_is_off(monkeypatch):
    monkeypatch.delenv(SLOWDOWN_ENV, raising=False)
    assert injected_slowdown() == 0.0
    monkeypatch.setenv(SLOWDOWN_ENV, " ")
    assert injected_slowdown() == 0.0
    monkeypatch.setenv(SLOWDOWN_ENV, "0.15")
    assert injected_slowdown() == 0.15


def test_the_shipped_gate_and_its_committed_baseline_fit(monkeypatch):
    """scenarios/ci_gate.yaml gates on the torch reference and results/baselines/ci carries
    it for every point, with the same scenario (what `infbench run` checks before it
    measures): a baseline re-recorded without the key fails here, not in CI."""
    from infbench.measure.preflight import check_gate
    from infbench.scenario.schema import load_scenario

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)  # gate.baseline is relative to the repository root
    points = load_scenario(repo / "scenarios" / "ci_gate.yaml").points()
    gate = points[0].gate
    assert gate is not None and gate.normalize == "torch_reference"
    assert all(p.measure.torch_reference for p in points)
    check_gate(gate, points)


def test_ci_gate_base_commit_runs_the_same_scenario():
    """.ci/gate measures results/baselines/ci/base_commit on the CI machine and gates HEAD
    against it: the base must be a full sha whose scenarios/ci_gate.yaml is today's (else the
    two sides are different points and the gate refuses them, exit 2)."""
    import re
    import shutil
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    lines = [line.strip() for line in (repo / "results/baselines/ci/base_commit")
             .read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 1 and re.fullmatch(r"[0-9a-f]{40}", lines[0]), lines
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{lines[0]}:scenarios/ci_gate.yaml"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"base commit not in this clone (shallow?): {shown.stderr.strip()}")
    import yaml

    base = yaml.safe_load(shown.stdout)
    now = yaml.safe_load((repo / "scenarios/ci_gate.yaml").read_text())
    assert {k: v for k, v in base.items() if k not in ("gate", "measure")} == \
        {k: v for k, v in now.items() if k not in ("gate", "measure")}
