"""FP8 / MXFP4 / NVFP4 in the vocabulary: bits per weight, the refusals of QuantConfig."""

from __future__ import annotations

import math

import pytest

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.core.formats import FLOAT_CODE_WEIGHTS, WEIGHT_QUANT, stored_bits


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


def test_the_engine_refuses_what_it_cannot_store_yet() -> None:
    """Priced, not run: the engine says so in one line instead of running float weights."""
    from infbench.model.loader import load_model

    with pytest.raises(ConfigError, match="quant.weights=nvfp4: the engine has no kernel"):
        load_model({"preset": "tiny"}, "float32", "cpu", quant=QuantConfig(weights="nvfp4"))
