"""Calibrated profiles: matmul efficiency by token count, decode attention, fixed step cost,
and the operator overlap they default to."""

from __future__ import annotations

import pytest

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.errors import ConfigError
from infbench.hardware.spec import HARDWARE, HardwareSpec
from infbench.roofline.analysis import default_overlap, predict, quantized_rates, step_rates
from infbench.roofline.costs import SeqWork, group_costs


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


def test_decode_attention_reads_kv_at_the_measured_rate():
    """Softmax attention's two passes read KV at the profile's decode-attention rate and
    compute at the dtype's peak; the matmuls keep the bandwidth and the curve."""
    cfg = ModelConfig.from_name("smollm2-135m")
    curve = {"float32": [[1, 10e9], [64, 50e9]]}
    hw = _profile(matmul_flops_by_tokens=curve, decode_attention_bytes_per_s=5e9)
    batch, context = 8, 200
    ops = {op.name: op for op in group_costs(cfg, [(SeqWork(1, context), batch)], "float32",
                                             None, stage="decode")}
    rates = step_rates(cfg, hw, "float32", batch, "decode")
    score, value, mlp = ops["attn_score"], ops["attn_value"], ops["mlp"]
    assert rates.op_times(score) == (score.bytes / 5e9, score.flops / 100e9)
    assert rates.op_times(value) == (value.bytes / 5e9, value.flops / 100e9)
    peak8 = hw.peak_at("float32", 8)
    assert rates.op_times(mlp) == (mlp.bytes / 20e9, mlp.flops / peak8)
    # the decode step is the mean over contexts prompt + 1 .. prompt + gen; overlap none
    p = predict(cfg, hw, batch=batch, prompt_len=context - 1, gen_len=2, dtype="float32")
    assert p.overlap == "none"
    steps = [sum(max(rates.op_times(op)) for op in group_costs(
        cfg, [(SeqWork(1, c), batch)], "float32", None, stage="decode")) for c in (200, 201)]
    assert p.decode.time_s == pytest.approx(sum(steps) / 2, rel=1e-12)
    attn = {op.cost.name: op for op in p.decode.ops}["attn_score"]
    assert attn.time_s == pytest.approx(attn.cost.bytes / 5e9) and attn.bound == "memory"
    # prefill runs the prefill kernel: not measured here, attention at bandwidth and curve
    pre = step_rates(cfg, hw, "float32", batch * 128, "prefill")
    assert pre.attention is None and pre.of(score) == (20e9, hw.peak_at("float32", 1024))


def test_attention_rate_applies_to_softmax_attention_only():
    hw = _profile(decode_attention_bytes_per_s=5e9)
    mla = ModelConfig.from_name("deepseek-v2-lite")
    assert step_rates(mla, hw, "float32", 4, "decode").attention is None
    gqa = ModelConfig.from_name("llama-small")
    assert step_rates(gqa, hw, "float32", 4, "decode").attention == (5e9, 100e9)
    assert step_rates(gqa, hw, "float32", 4, "verify").attention == (5e9, 100e9)
    assert step_rates(gqa, _profile(), "float32", 4, "decode").attention is None


def test_overlap_auto_is_none_on_an_engine_profile_and_full_on_a_datasheet():
    cfg = ModelConfig.from_name("llama-small")
    engine = _profile(matmul_flops_by_tokens={"float32": [[1, 10e9], [64, 50e9]]})
    assert default_overlap(engine) == "none" and default_overlap(HARDWARE["h100-sxm"]) == "full"
    assert default_overlap(_profile()) == "full"  # hand-written profile: no engine terms
    for hw in (engine, HARDWARE["h100-sxm"]):
        auto = predict(cfg, hw, batch=16, prompt_len=128, gen_len=8, dtype="float32")
        explicit = predict(cfg, hw, batch=16, prompt_len=128, gen_len=8, dtype="float32",
                           overlap=default_overlap(hw))
        assert auto == explicit and auto.overlap == default_overlap(hw)


def test_prefill_attention_computes_at_the_measured_rate():
    cfg = ModelConfig.from_name("llama-small")
    hw = _profile(prefill_attention_flops_per_s=25e9, matmul_flops_by_tokens={
        "float32": [[1, 10e9], [64, 50e9], [2048, 90e9]]})
    rates = step_rates(cfg, hw, "float32", 4 * 512, "prefill")
    assert rates.attention == (20e9, 25e9)  # KV at the bandwidth, FLOPs at the kernel's rate
    assert step_rates(cfg, hw, "float32", 4, "decode").attention is None  # decode not measured
    plain = predict(cfg, _profile(matmul_flops_by_tokens=hw.extra["matmul_flops_by_tokens"]),
                    batch=4, prompt_len=512, gen_len=2, dtype="float32")
    slow = predict(cfg, hw, batch=4, prompt_len=512, gen_len=2, dtype="float32")
    attn = sum(op.cost.flops for op in slow.prefill.ops if op.cost.name in ("attn_score",
                                                                               "attn_value"))
    peak = hw.peak_at("float32", 4 * 512)
    assert slow.ttft_s - plain.ttft_s == pytest.approx(attn / 25e9 - attn / peak, rel=1e-9)
    assert slow.time_per_token_s == plain.time_per_token_s


QUANT = {"int8": [[1, 40e9], [4, 80e9], [32, 170e9]], "int4": [[1, 50e9], [32, 160e9]]}


def test_quant_rate_interpolates_within_the_curve_only():
    hw = _profile(quant_matmul_flops_by_tokens=QUANT)
    assert hw.quant_rate("int8", 1) == 40e9 and hw.quant_rate("int8", 2) == pytest.approx(60e9)
    assert hw.quant_rate("int8", 33) is None  # past 32 rows the engine runs the float GEMM
    assert _profile().quant_rate("int8", 1) is None
    with pytest.raises(ConfigError, match="quant_matmul_flops_by_tokens.int3 unknown format"):
        _profile(quant_matmul_flops_by_tokens={"int3": [[1, 1e9]]})


def test_quantized_projections_run_at_their_curve_in_decode():
    cfg = ModelConfig.from_name("smollm2-135m")
    curve = {"float32": [[1, 10e9], [64, 50e9]]}
    hw = _profile(matmul_flops_by_tokens=curve, quant_matmul_flops_by_tokens=QUANT)
    int8 = QuantConfig(weights="int8")
    assert quantized_rates(cfg, hw, int8, 4) == {"qkv_proj": 80e9, "o_proj": 80e9,
                                                 "mlp": 80e9}
    head = QuantConfig(weights="int4", group_size=64, head="int8")
    assert quantized_rates(cfg, hw, head, 1) == {"qkv_proj": 50e9, "o_proj": 50e9,
                                                 "mlp": 50e9, "lm_head": 40e9}
    # other kernels keep the float curve: int8 activations, LLM.int8(), past 32 rows
    assert quantized_rates(cfg, hw, QuantConfig(weights="int8", activations="int8"), 1) == {}
    assert quantized_rates(cfg, hw, QuantConfig(weights="int8", method="llm_int8"), 1) == {}
    assert quantized_rates(cfg, hw, int8, 64) == {}
    assert quantized_rates(ModelConfig.from_name("tiny-moe"), hw, int8, 1) == {}
    decode = step_rates(cfg, hw, "float32", 4, "decode", int8)
    assert decode.of(next(op for op in _ops(cfg, 4) if op.name == "mlp")) == (20e9, 80e9)
    assert step_rates(cfg, hw, "float32", 4, "prefill", int8).quantized == {}
    fast = predict(cfg, hw, batch=1, prompt_len=64, gen_len=8, dtype="float32", quant=int8)
    slow = predict(cfg, _profile(matmul_flops_by_tokens=curve), batch=1, prompt_len=64,
                   gen_len=8, dtype="float32", quant=int8)
    assert fast.time_per_token_s < slow.time_per_token_s and fast.ttft_s == slow.ttft_s


def _ops(cfg, batch):
    return group_costs(cfg, [(SeqWork(1, 100), batch)], "float32", None, stage="decode")
