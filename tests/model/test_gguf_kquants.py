"""K-quants (Q2_K ... Q6_K) and the other dequantized GGUF types: the block packers of
`gguf_quant` against gguf-py, the native conversions of `model/gguf_blocks` and their
error, and tiny llama files in each type loading dequantized (`weights: native` on them:
test_gguf_native)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from gguf_quant import pack_q4_k, pack_q5_k, pack_q6_k, quantize, write_quantized_gguf
from model_checkpoints import write_hf_llama

from infbench.model.context import DenseContext
from infbench.model.gguf_blocks import native_weight
from infbench.model.loader import load_model

QT = gguf.GGMLQuantizationType
# K-quants need rows of whole 256-value super-blocks: hidden 256, MLP 512.
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float32)


# ---------------------------------------------------------------- the packers (test helpers)
def test_q4_k_and_q5_k_packers_match_gguf_dequantize() -> None:
    rng, nb = _rng(), 6
    sc, m = rng.integers(0, 64, (nb, 8)), rng.integers(0, 64, (nb, 8))
    d, dmin = _f16(rng.uniform(1e-4, 1e-3, nb)), _f16(rng.uniform(1e-4, 1e-3, nb))
    for bits, pack, qtype in ((4, pack_q4_k, QT.Q4_K), (5, pack_q5_k, QT.Q5_K)):
        codes = rng.integers(0, 1 << bits, (nb, 256))
        want = (d[:, None, None] * sc[..., None] * codes.reshape(nb, 8, 32)
                - dmin[:, None, None] * m[..., None]).reshape(nb, 256)
        got = dequantize(pack(codes, sc, m, d, dmin), qtype)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def test_q6_k_packer_matches_gguf_dequantize() -> None:
    rng, nb = _rng(1), 5
    codes, sc = rng.integers(0, 64, (nb, 256)), rng.integers(-128, 128, (nb, 16))
    d = _f16(rng.uniform(1e-5, 1e-4, nb))
    want = (d[:, None, None] * sc[..., None] * (codes.reshape(nb, 16, 16) - 32)).reshape(nb, 256)
    got = dequantize(pack_q6_k(codes, sc.astype(np.int8), d), QT.Q6_K)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------- native conversions
def _conversion_error(type_name: str, w: np.ndarray) -> tuple[float, float, Any]:
    """(max |native - gguf|, max |gguf|, native weight) for w quantized to type_name."""
    blocks = quantize(w, type_name)
    ref = dequantize(blocks, QT[type_name])
    native = native_weight(blocks, type_name)
    return float(np.abs(native.dequantize().numpy() - ref).max()), float(np.abs(ref).max()), \
        native


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_legacy_blocks_convert_bit_exactly(type_name: str) -> None:
    w = _rng(2).normal(0, 0.05, (24, 96)).astype(np.float32)
    err, _, native = _conversion_error(type_name, w)
    assert err == 0.0
    assert native.group_size == 32 and native.shape == (24, 96)


def test_q4_k_converts_to_int4_group_32_within_fp16_rounding_of_the_scales() -> None:
    """Each 32-value sub-block: scale = fp16(d sc), min = fp16(-dmin m); the only loss is that
    one rounding, at most 2^-11 of the scale (times the code, up to 15) and of the min."""
    w = _rng(3).normal(0, 0.02, (64, 1024)).astype(np.float32)
    blocks = quantize(w, "Q4_K")
    ref = dequantize(blocks, QT.Q4_K).reshape(64, 32, 32)
    native = native_weight(blocks, "Q4_K")
    assert native.group_size == 32 and native.shape == (64, 1024)
    got = native.dequantize().numpy().reshape(64, 32, 32)
    scale = native.scales.float().numpy()[..., None]
    mins = native.mins.float().numpy()[..., None]
    bound = (15 * np.abs(scale) + np.abs(mins)) * 2.0 ** -11 + 1e-12
    assert (np.abs(got - ref) <= bound).all()
    err = float(np.abs(got - ref).max())
    print(f"Q4_K -> int4/32: max |error| {err:.3g} on weights up to {np.abs(ref).max():.3g} "
          f"(std 0.02); {err / np.abs(ref).max():.2g} of the largest weight")
    assert 0 < err < 1e-4  # not bit-exact, but far below the 4-bit step (~4e-3 here)


def test_q6_k_converts_to_int8_group_16_within_fp16_rounding_of_the_scales() -> None:
    w = _rng(4).normal(0, 0.02, (32, 512)).astype(np.float32)
    err, top, native = _conversion_error("Q6_K", w)
    assert native.group_size == 16 and native.q.dtype == torch.int8
    assert int(native.q.min()) >= -32 and int(native.q.max()) <= 31
    assert err <= 32 * float(native.scales.float().abs().max()) * 2.0 ** -11
    print(f"Q6_K -> int8/16: max |error| {err:.3g} on weights up to {top:.3g}")


def test_k_scales_that_fp16_holds_convert_exactly() -> None:
    """d a power of two: d * sc is exact in fp16, so Q4_K and Q6_K convert bit for bit."""
    rng, nb = _rng(5), 4
    sc, m = rng.integers(0, 64, (nb, 8)), rng.integers(0, 64, (nb, 8))
    d = np.full(nb, 2.0 ** -12, np.float32)
    blocks = pack_q4_k(rng.integers(0, 16, (nb, 256)), sc, m, d, d).reshape(2, -1)
    ref = dequantize(blocks, QT.Q4_K)
    assert np.array_equal(native_weight(blocks, "Q4_K").dequantize().numpy(), ref)
    blocks6 = pack_q6_k(rng.integers(0, 64, (nb, 256)), rng.integers(-128, 128, (nb, 16)),
                        d).reshape(2, -1)
    ref6 = dequantize(blocks6, QT.Q6_K)
    assert np.array_equal(native_weight(blocks6, "Q6_K").dequantize().numpy(), ref6)


# ---------------------------------------------------------------- whole files
def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(len(ids)),
                                          DenseContext.single(len(ids))))


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_hf_llama(tmp_path_factory.mktemp("hf"), **SHAPE)


# Largest logit error against transformers' float model, over the largest logit, of a file
# whose projections are in each type (measured on this model: Q4_K 0.16, Q5_K 0.08, Q5_0/Q5_1
# 0.09, Q6_K 0.05): a wrong block layout gives errors the size of the logits themselves.
TOLERANCE = {"Q4_K": 0.25, "Q5_K": 0.15, "Q5_0": 0.15, "Q5_1": 0.15, "Q6_K": 0.1, "BF16": 0.02}


@pytest.mark.parametrize("type_name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0",
                                       "Q5_1", "BF16"])
def test_types_load_dequantized_to_what_gguf_py_gives(
        tmp_path: Path, hf_model: Any, type_name: str) -> None:
    file = tmp_path / f"{type_name}.gguf"
    data = write_quantized_gguf(hf_model, file, type_name)
    loaded = load_model({"gguf": str(file)})
    assert f"{type_name} x14" in loaded.source  # 2 layers x 7 projections
    # o_proj is not permuted: its float weight is exactly gguf-py's dequantization.
    want = dequantize(data["blk.1.attn_output.weight"], QT[type_name])
    got = loaded.model.layers[1].self_attn.o_proj.weight
    assert torch.equal(got, torch.from_numpy(want))
    if type_name in TOLERANCE:  # the others encode the HF model, to within their bits
        ids = torch.arange(5, 17)
        with torch.no_grad():
            ref = hf_model(ids[None]).logits[0]
        err = (_logits(loaded.model, ids) - ref).abs().max().item()
        assert err < TOLERANCE[type_name] * ref.abs().max().item()
