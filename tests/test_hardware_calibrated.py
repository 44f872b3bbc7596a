"""Calibrated profiles: matmul efficiency by token count and fixed step cost."""

from __future__ import annotations

import pytest

from infbench.core.config import ModelConfig
from infbench.core.hardware import HARDWARE, HardwareSpec
from infbench.roofline.analysis import predict


def _profile(**extra) -> HardwareSpec:
    return HardwareSpec("box", "calibrated", {"float32": 100e9}, 20e9, 24e9, kind="cpu",
                        extra=extra)


def test_peak_at_interpolates_in_log_tokens_and_caps_at_peak():
    hw = _profile(matmul_flops_by_tokens={"float32": [[1, 10e9], [16, 50e9], [256, 200e9]]})
    assert hw.peak_at("float32", 1) == 10e9
    assert hw.peak_at("float32", 4) == pytest.approx(30e9)  # halfway in log2 between 1 and 16
    assert hw.peak_at("float32", 16) == 50e9
    assert hw.peak_at("float32", 4096) == 100e9  # capped at the profile's peak
    assert hw.peak_at("float32", None) == 100e9


def test_datasheet_hardware_is_the_plain_roofline():
    hw = HARDWARE["h100-sxm"]
    assert hw.peak_at("bfloat16", 1) == hw.peak("bfloat16")
    assert hw.step_overhead_s(80) == 0.0


def test_prediction_adds_the_fixed_step_cost_per_token():
    cfg = ModelConfig.from_name("smollm2-135m")
    plain = predict(cfg, _profile(), batch=1, prompt_len=128, gen_len=32, dtype="float32")
    slow = predict(cfg, _profile(step_overhead_s=1e-3, layer_overhead_s=1e-4), batch=1,
                   prompt_len=128, gen_len=32, dtype="float32")
    assert slow.time_per_token_s == pytest.approx(plain.time_per_token_s + 1e-3 + 30 * 1e-4)
    assert slow.ttft_s == pytest.approx(plain.ttft_s + 1e-3 + 30 * 1e-4)


def test_small_batch_gemm_efficiency_slows_compute_bound_decode():
    cfg = ModelConfig.from_name("smollm2-135m")
    curve = {"float32": [[1, 5e9], [64, 20e9], [2048, 100e9]]}
    fast = predict(cfg, _profile(), batch=64, prompt_len=16, gen_len=4, dtype="float32")
    real = predict(cfg, _profile(matmul_flops_by_tokens=curve), batch=64, prompt_len=16,
                   gen_len=4, dtype="float32")
    assert real.time_per_token_s > fast.time_per_token_s
    assert real.decode.bound == "compute"
