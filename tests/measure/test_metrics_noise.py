"""metrics.noise: run-to-run variation of the headline metrics and its warnings."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from infbench.core.metric_names import HEADLINE_METRICS
from infbench.measure.metrics import MAX_CV, noise
from infbench.scenario.schema import load_scenario


def _repeat(tps: float, ttft: float, *, p50: bool = True) -> dict[str, Any]:
    lat = {"mean": ttft, "p50": ttft} if p50 else {"mean": ttft, "p99": ttft}
    return {"output_tokens_per_s": tps, "total_tokens_per_s": 2 * tps,
            "ttft_s": lat, "tpot_s": dict(lat), "itl_s": dict(lat), "e2e_s": dict(lat)}


def test_cv_is_sample_stdev_over_mean_of_each_headline_metric() -> None:
    runs = [_repeat(100.0, 0.5), _repeat(102.0, 0.5), _repeat(98.0, 0.5)]
    out = noise(runs)
    assert set(out["cv"]) == set(HEADLINE_METRICS)
    assert out["cv"]["output_tokens_per_s"] == pytest.approx(
        statistics.stdev([100, 102, 98]) / 100)
    assert out["cv"]["total_tokens_per_s"] == pytest.approx(0.02)
    assert out["cv"]["ttft_s.p50"] == 0.0
    assert out["warnings"] == []  # 2% < 10%


def test_a_noisy_metric_warns_by_name() -> None:
    runs = [_repeat(100.0, 0.5), _repeat(100.0, 0.9), _repeat(100.0, 0.5)]
    out = noise(runs)
    cv = statistics.stdev([0.5, 0.9, 0.5]) / statistics.fmean([0.5, 0.9, 0.5])
    assert cv > MAX_CV and out["cv"]["ttft_s.p50"] == pytest.approx(cv)
    named = [w for w in out["warnings"] if w.startswith("ttft_s.p50 varies by")]
    assert len(named) == 1 and f"{cv:.1%}" in named[0] and "3 repeats" in named[0]
    # the steady metrics do not warn
    assert not any(w.startswith("output_tokens_per_s") for w in out["warnings"])


def test_no_cv_without_two_repeats_or_without_the_statistic() -> None:
    one = noise([_repeat(100.0, 0.5)])
    assert one == {"cv": {name: None for name in HEADLINE_METRICS}, "warnings": []}
    no_p50 = noise([_repeat(100.0, 0.5, p50=False), _repeat(120.0, 0.7, p50=False)])
    assert no_p50["cv"]["ttft_s.p50"] is None
    assert no_p50["cv"]["output_tokens_per_s"] == pytest.approx(
        statistics.stdev([100, 120]) / 110)
    zero = noise([_repeat(0.0, 0.5), _repeat(0.0, 0.5)])
    assert zero["cv"]["output_tokens_per_s"] is None


def test_reference_bandwidth_far_from_the_profile_warns() -> None:
    runs = [_repeat(100.0, 0.5), _repeat(100.0, 0.5)]
    low = noise(runs, reference_bytes_per_s=60e9, hardware_bandwidth=100e9, hardware_name="x")
    assert len(low["warnings"]) == 1
    assert "60 GB/s is 40% below hardware 'x' (100 GB/s)" in low["warnings"][0]
    high = noise(runs, reference_bytes_per_s=140e9, hardware_bandwidth=100e9)
    assert "40% above" in high["warnings"][0]
    for ok in (75e9, 125e9):  # within 30%
        assert noise(runs, reference_bytes_per_s=ok, hardware_bandwidth=100e9)["warnings"] == []
    assert noise(runs, reference_bytes_per_s=None, hardware_bandwidth=100e9)["warnings"] == []


def test_run_point_stores_noise_and_notes_each_warning_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A fake same-run reference (half the profile's bandwidth) must warn, in the result and
    once on stderr; the measured CVs come from the stored repeats."""
    from infbench.hardware.spec import get_hardware
    from infbench.measure import calibrate
    from infbench.measure.bench import run_point

    profile = get_hardware("cpu").bandwidth
    monkeypatch.setattr(calibrate, "measure_reference_bandwidth",
                        lambda device, seconds=0.5, nbytes=None: profile / 2)
    doc = {"name": "noisy", "device": "cpu", "dtype": "float32", "hardware": "cpu",
           "model": {"preset": "tiny", "overrides": {"max_seq_len": 64, "num_layers": 2}},
           "workload": {"kind": "static", "batch_size": 2, "prompt_len": 6, "gen_len": 4},
           "engine": {"block_size": 4}, "measure": {"warmup": 0, "repeats": 2}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = run_point(load_scenario(path).points()[0])
    got = result["metrics"]["noise"]
    assert got == noise(result["repeats"], reference_bytes_per_s=profile / 2,
                        hardware_bandwidth=profile, hardware_name="cpu")
    assert all(v is not None for v in got["cv"].values())
    bandwidth = [w for w in got["warnings"] if "reference bandwidth" in w]
    assert len(bandwidth) == 1 and "50% below hardware 'cpu'" in bandwidth[0]
    err = capsys.readouterr().err
    for warning in got["warnings"]:
        assert err.count(f"note: noisy point 0 (default): {warning}\n") == 1
