"""FP8 / MXFP4 / NVFP4 in the vocabulary: bits per weight, the refusals of QuantConfig."""

from __future__ import annotations

import math
from typing import Any

import pytest

from infbench.core.config import ModelConfig, MoEConfig, QuantConfig
from infbench.core.errors import ConfigError, UserError
from infbench.core.formats import FLOAT_CODE_WEIGHTS, WEIGHT_QUANT, stored_bits
from infbench.hardware.spec import get_hardware
from infbench.roofline.analysis import low_precision_rates, predict, step_rates
from infbench.roofline.shapes import weight_bytes


def bits(weights: str, rows: int, cols: int, **kw: str) -> float:
    """Stored bits per weight of a (rows x cols) projection under `weights`."""
    return QuantConfig(weights=weights, **kw).weight_bits(cols, 2, "mlp", rows)


def test_the_formats_are_in_the_vocabulary() -> None:
    assert set(FLOAT_CODE_WEIGHTS) == {"fp8", "mxfp4", "nvfp4"} < set(WEIGHT_QUANT)


@pytest.mark.parametrize(("rows", "cols"), [(4096, 4096), (7168, 18432), (300, 200)])
def test_fp8_bits_per_scale_kind(rows: int, cols: int) -> None:
    n = rows * cols
    assert bits("fp8", rows, cols, fp8_scales="tensor") == 8 + 32 / n
    assert bits("fp8", rows, cols, fp8_scales="channel") == 8 + 32 / cols
    assert bits("fp8", rows, cols) == 8 + 32 / cols  # channel is the default
    tiles = math.ceil(rows / 128) * math.ceil(cols / 128)
    assert bits("fp8", rows, cols, fp8_scales="block") == 8 + 32 * tiles / n


def test_fp8_block_scales_of_a_deepseek_v3_expert() -> None:
    # a 2048 x 7168 expert matrix: 16 x 56 tiles of one fp32 each
    assert bits("fp8", 2048, 7168, fp8_scales="block") * 2048 * 7168 / 8 == (
        2048 * 7168 + 16 * 56 * 4)
    # a 300 x 200 matrix: ceil -> 3 x 2 tiles (partial tiles get a scale too)
    assert bits("fp8", 300, 200, fp8_scales="block") * 300 * 200 / 8 == 300 * 200 + 6 * 4


def test_fp4_bits() -> None:
    assert bits("mxfp4", 5760, 2880) == 4.25  # gpt-oss's gate_up: 90 E8M0 scales a row
    assert bits("nvfp4", 4096, 4096) == 4.5 + 32 / 4096 ** 2
    assert bits("mxfp4", 8, 48) == 4 + 8 * 2 / 48  # a partial block has its own scale
    assert stored_bits("nvfp4", 40, 8, 2) == 4 + 8 * 3 / 40 + 32 / 320


def test_fp8_scales_needs_fp8_weights() -> None:
    with pytest.raises(ConfigError, match=r"quant.fp8_scales='block'.*allowed: quant.weights: fp8"):
        QuantConfig(weights="int8", fp8_scales="block")
    with pytest.raises(ConfigError, match="unknown value 'row'; allowed: tensor, channel, block"):
        QuantConfig(weights="fp8", fp8_scales="row")


@pytest.mark.parametrize(("weights", "activations"), [
    ("int4", "fp8"), ("none", "fp8"), ("mxfp4", "fp8"), ("fp8", "fp4"), ("int8", "fp4"),
    ("none", "fp4")])
def test_low_precision_activations_need_their_weights(weights: str, activations: str) -> None:
    with pytest.raises(ConfigError, match=f"quant.activations='{activations}' multiplies"):
        QuantConfig(weights=weights, activations=activations)


def test_int8_activations_refuse_float_codes() -> None:
    with pytest.raises(ConfigError, match="allowed with fp8: float|fp8"):
        QuantConfig(weights="fp8", activations="int8")


def test_native_activations_follow_the_stored_formats() -> None:
    fp8_mix = (("mlp", "fp8/block", 100), ("qkv_proj", "float", 10))
    assert QuantConfig(weights="native", activations="fp8", native_mix=fp8_mix)
    with pytest.raises(ConfigError, match="native weights stored as int4"):
        QuantConfig(weights="native", activations="fp8", native_mix=(("mlp", "int4/32", 9),))
    with pytest.raises(ConfigError, match="native weights stored as fp8"):
        QuantConfig(weights="native", activations="fp4", native_mix=fp8_mix)


def test_the_pairs_that_are_allowed() -> None:
    for weights, activations in (("fp8", "fp8"), ("mxfp4", "fp4"), ("nvfp4", "fp4"),
                                 ("fp8", "float"), ("nvfp4", "float")):
        assert QuantConfig(weights=weights, activations=activations).activations == activations



# ------------------------------------------------------------------ pricing
BF16_H100 = get_hardware("h100-sxm").peak("bfloat16")


def small_moe() -> ModelConfig:
    """Layer 0 dense, layer 1 MoE (4 experts of 128): 16 projection matrices, all listed in
    `test_weight_bytes_of_a_known_matrix_set`."""
    return ModelConfig(name="t", vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4,
                       num_kv_heads=2, intermediate_size=512, tie_word_embeddings=False,
                       moe=MoEConfig(4, 2, 128, first_k_dense=1))


# (out, in, copies) of every projection of small_moe: q, kv, o, gate_up, down; q, kv, o,
# 4 expert gate_up, 4 expert down
MATRICES = [(256, 256, 1)] * 3 + [(1024, 256, 1), (256, 512, 1)] + [(256, 256, 1)] * 3 + [
    (256, 256, 4), (256, 128, 4)]
# embedding + LM head (1000 x 256 each), the router (4 x 256), 5 norms of 256: bf16
FLOAT_BYTES = 2 * (2 * 1000 * 256 + 4 * 256 + 5 * 256)


@pytest.mark.parametrize(("quant", "matrix_bytes"), [
    (QuantConfig(weights="fp8", fp8_scales="block"),
     lambda o, i: o * i + 4 * math.ceil(o / 128) * math.ceil(i / 128)),
    (QuantConfig(weights="fp8", fp8_scales="tensor"), lambda o, i: o * i + 4),
    (QuantConfig(weights="fp8"), lambda o, i: o * i + 4 * o),
    (QuantConfig(weights="mxfp4"), lambda o, i: o * i / 2 + o * i / 32),
    (QuantConfig(weights="nvfp4"), lambda o, i: o * i / 2 + o * i / 16 + 4),
])
def test_weight_bytes_of_a_known_matrix_set(quant: QuantConfig, matrix_bytes: Any) -> None:
    """Every projection, the routed experts included, at its stored bytes; the embedding,
    head, router and norms in the model dtype."""
    expected = FLOAT_BYTES + sum(n * matrix_bytes(o, i) for o, i, n in MATRICES)
    assert weight_bytes(small_moe(), "bfloat16", quant) == expected


def test_the_peak_each_pairing_runs_at() -> None:
    cfg, h100, b200 = small_moe(), get_hardware("h100-sxm"), get_hardware("b200")
    projections = ["mlp", "moe_experts", "o_proj", "qkv_proj"]
    for weights in FLOAT_CODE_WEIGHTS:  # weight-only: the model dtype's peak (no entry)
        assert low_precision_rates(cfg, h100, QuantConfig(weights=weights), BF16_H100) == {}
    w8a8 = low_precision_rates(cfg, h100, QuantConfig(weights="fp8", activations="fp8"),
                               BF16_H100)
    assert w8a8 == dict.fromkeys(projections, h100.peak_flops["float8"])
    for weights in ("mxfp4", "nvfp4"):
        w4a4 = low_precision_rates(cfg, b200, QuantConfig(weights=weights, activations="fp4"),
                                   b200.peak("bfloat16"))
        assert w4a4 == dict.fromkeys(projections, 9e15)
    rates = step_rates(cfg, h100, "bfloat16", 4096, "prefill",
                       QuantConfig(weights="fp8", activations="fp8"))
    assert rates.peak == h100.peak("bfloat16") and rates.quantized == w8a8


def test_native_w8a8_runs_only_the_fp8_operators_at_the_fp8_peak() -> None:
    mix = (("moe_experts", "fp8/block", 9), ("mlp", "fp8/block", 9), ("qkv_proj", "float", 9),
           ("o_proj", "float", 9))
    quant = QuantConfig(weights="native", activations="fp8", native_mix=mix)
    h100 = get_hardware("h100-sxm")
    assert low_precision_rates(small_moe(), h100, quant, BF16_H100) == dict.fromkeys(
        ["mlp", "moe_experts"], h100.peak_flops["float8"])


def test_an_operator_stored_fp8_in_some_layers_blends_the_two_peaks() -> None:
    """1 layer of 4 kept in bf16: its time and the three fp8 layers' add up exactly."""
    mix = (("mlp", "fp8/channel", 3), ("mlp", "float", 1))
    quant = QuantConfig(weights="native", activations="fp8", native_mix=mix)
    h100 = get_hardware("h100-sxm")
    fp8 = h100.peak_flops["float8"]
    rate = low_precision_rates(small_moe(), h100, quant, BF16_H100)["mlp"]
    flops = 4e12  # one layer's 1e12 each
    assert flops / rate == pytest.approx(3e12 / fp8 + 1e12 / BF16_H100)


def test_w8a8_shortens_a_compute_bound_prefill_and_w8a16_does_not() -> None:
    cfg = ModelConfig(name="wide", vocab_size=32000, hidden_size=4096, num_layers=2,
                      num_heads=32, num_kv_heads=8, intermediate_size=14336)
    h100 = get_hardware("h100-sxm")

    def ttft(**quant: str) -> float:
        return predict(cfg, h100, batch=8, prompt_len=2048, gen_len=2, dtype="bfloat16",
                       quant=QuantConfig(**quant)).ttft_s

    bf16, w8a16, w8a8 = ttft(), ttft(weights="fp8"), ttft(weights="fp8", activations="fp8")
    assert w8a16 == pytest.approx(bf16, rel=1e-2)  # compute-bound: smaller weights barely help
    assert w8a8 < 0.9 * w8a16


@pytest.mark.parametrize(("hardware", "weights", "activations", "key"), [
    ("a100-80g", "fp8", "fp8", "float8"), ("h100-sxm", "nvfp4", "fp4", "float4"),
    ("h200", "mxfp4", "fp4", "float4")])
def test_hardware_without_the_peak_is_refused(hardware: str, weights: str, activations: str,
                                              key: str) -> None:
    hw = get_hardware(hardware)
    with pytest.raises(UserError, match=f"hardware '{hardware}' has no '{key}' peak.*it has: "
                                        f"{', '.join(hw.peak_flops)}"):
        predict(small_moe(), hw, batch=1, prompt_len=16, gen_len=2, dtype="bfloat16",
                quant=QuantConfig(weights=weights, activations=activations))
