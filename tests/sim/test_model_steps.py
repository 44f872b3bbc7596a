"""The per-model step profile (`infbench calibrate --model`, measure/calibrate_model.py): its
key, its ratio curve, the pricer's scaling and the simulation's use of it; the CLI end to end
on the tiny preset against a profile of the `cpu` entry's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from infbench.core.config import QuantConfig
from infbench.hardware.spec import HARDWARE, MODEL_STEPS_KEY, get_hardware, load_profile
from infbench.measure.model_steps import point_step_key, step_key, step_scale
from infbench.measure.simulation import simulate_point
from infbench.scenario.schema import scenario_from_document
from infbench.sim.step_cost import StepBatch, make_pricer

CPU = HARDWARE["cpu"]


def _point(model: dict[str, Any], **top: Any) -> Any:
    doc = {"name": "steps", "device": "cpu", "dtype": "float32", "hardware": "cpu",
           "model": model, "workload": {"kind": "offline", "num_requests": 6,
                                        "prompt_len": 64, "gen_len": 8, "seed": 0}, **top}
    return scenario_from_document(doc, "steps.yaml").points()[0]


def _entry(curve: list[list[float]]) -> dict[str, Any]:
    return {"by_tokens": curve, "decode": [[1, 0.002, 0.001]], "prefill": [[64, 0.02, 0.01]],
            "timestamp": "2026-12-02T00:00:00+0000", "quick": True}


def test_the_key_names_source_overrides_dtype_and_format() -> None:
    base = step_key({"preset": "tiny"}, {}, "float32", "none")
    assert base == point_step_key(_point({"preset": "tiny"}))
    others = {step_key({"preset": "tiny"}, {"num_layers": 2}, "float32", "none"),
              step_key({"preset": "tiny"}, {}, "bfloat16", "none"),
              step_key({"preset": "tiny"}, {}, "float32", "int8"),
              step_key({"gguf": "smollm2-135m"}, {}, "float32", "none")}
    assert base not in others and len(others) == 4
    assert point_step_key(_point({"preset": "tiny", "overrides": {"num_layers": 2}})) == \
        step_key({"preset": "tiny"}, {"num_layers": 2}, "float32", "none")


def test_the_ratio_is_interpolated_in_log_tokens_and_flat_past_the_ends() -> None:
    key = step_key({"preset": "tiny"}, {}, "float32", "none")
    hw = replace(CPU, extra={MODEL_STEPS_KEY: {key: _entry([[1.0, 2.0], [16.0, 1.0]])}})
    scale, note = step_scale(hw, key)
    assert scale is not None and "calibrate --model" in note
    assert scale(1) == 2.0 and scale(16) == 1.0 and scale(4) == pytest.approx(1.5)
    assert scale(1000) == 1.0
    assert step_scale(hw, step_key({"preset": "tiny"}, {}, "bfloat16", "none")) == (None, "")
    assert step_scale(CPU, key) == (None, "")


def test_the_pricer_scales_each_step_at_its_token_count() -> None:
    cfg = _point({"preset": "tiny"}).model_config()
    pricer = make_pricer(cfg, CPU, "float32", QuantConfig())
    batch = StepBatch([(32, 32, 1)], [40, 50, 60])  # a chunk beside three decodes: 35 tokens
    plain = pricer.seconds(batch)
    pricer.scale = lambda n: 1.0 + n / 100
    assert pricer.seconds(batch) == pytest.approx(plain * 1.35, rel=1e-12)


def test_the_simulation_prices_with_the_models_ratio(tmp_path: Path) -> None:
    point = _point({"preset": "tiny"})
    profile = tmp_path / "doubled.json"
    data = asdict(replace(CPU, name="doubled"))
    data["extra"] = {MODEL_STEPS_KEY: {point_step_key(point): _entry([[1.0, 2.0]])}}
    profile.write_text(json.dumps(data))
    hw = load_profile(profile)  # the schema accepts the entry
    plain = simulate_point(point, point.model_config(), CPU)
    doubled = simulate_point(point, point.model_config(), hw)
    for metric in ("ttft_s", "tpot_s", "e2e_s"):  # every step twice as long, all at t = 0
        assert doubled.metrics[metric]["p50"] == pytest.approx(
            2 * plain.metrics[metric]["p50"], rel=1e-9)
    assert "calibrate --model" in doubled.note and "calibrate --model" not in plain.note
    other = _point({"preset": "tiny"}, dtype="bfloat16")  # another key: not scaled
    assert simulate_point(other, other.model_config(), hw).metrics["tpot_s"]["p50"] == \
        pytest.approx(simulate_point(other, other.model_config(), CPU).metrics["tpot_s"]["p50"])


def test_a_malformed_entry_is_refused_in_one_line(tmp_path: Path) -> None:
    profile = tmp_path / "bad.json"
    data = asdict(replace(CPU, name="bad"))
    data["extra"] = {MODEL_STEPS_KEY: {"k": {"by_tokens": [[1.0, -2.0]], "decode": [],
                                             "prefill": [], "timestamp": "t"}}}
    profile.write_text(json.dumps(data))
    with pytest.raises(Exception) as info:
        load_profile(profile)
    assert "model_steps" in str(info.value) and "\n" not in str(info.value).strip()


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"INFBENCH_HOME": str(home), "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "infbench", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_calibrate_model_measures_the_tiny_preset_and_saves_its_ratios(tmp_path: Path) -> None:
    home = tmp_path / "home"
    missing = _cli("calibrate", "--model", "tiny", "--quick", home=home)
    assert missing.returncode == 2 and missing.stderr.startswith("error: calibrate --model")
    assert "infbench calibrate --name local" in missing.stderr
    (home / "hardware").mkdir(parents=True)
    data = asdict(replace(CPU, name="local"))
    data["extra"] = {"device": "cpu"}
    (home / "hardware" / "local.json").write_text(json.dumps(data))
    done = _cli("calibrate", "--model", "tiny", "--quick", "--json", home=home)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [row[0] for row in out["decode"]] == [1, 2, 4, 8]
    assert [row[0] for row in out["prefill"]] == [32, 64]
    assert all(m > 0 and p > 0 for _, m, p in out["decode"] + out["prefill"])
    saved = get_hardware(str(home / "hardware" / "local.json"))
    entry = saved.extra[MODEL_STEPS_KEY][step_key({"preset": "tiny"}, {}, "float32", "none")]
    by_tokens = dict(entry["by_tokens"])
    decode1 = out["decode"][0]
    assert by_tokens[1.0] == pytest.approx(decode1[1] / decode1[2])  # measured / priced
    assert saved.bandwidth == CPU.bandwidth  # the profile's own figures are kept
