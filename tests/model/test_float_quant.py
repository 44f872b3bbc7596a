"""fp8 / mxfp4 / nvfp4 weights in the engine (model/float_quant.py): a float model's
projections quantized at load and run as stored, the bytes the model holds against the
format's bytes and the analytic price, logits against the float model on the dequantized
weights, the engine against a recompute, W8A8 / W4A4 numerics and the refusals."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import greedy_recompute, make_engine, random_requests
from torch import nn

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.context import DenseContext
from infbench.model.float_quant import FloatCodeLinear
from infbench.model.loader import load_model
from infbench.model.quant import quantizable_linears, stored_weight_bytes
from infbench.roofline.shapes import weight_bytes

QUANTS = [QuantConfig(weights="fp8", fp8_scales="tensor"), QuantConfig(weights="fp8"),
          QuantConfig(weights="fp8", fp8_scales="block"), QuantConfig(weights="mxfp4"),
          QuantConfig(weights="nvfp4")]


def _id(q: QuantConfig) -> str:
    return q.weights + (f"-{q.fp8_scales}" if q.fp8_scales else "")


def _logits(loaded, n: int = 12) -> torch.Tensor:
    ids = torch.arange(3, 3 + n)
    with torch.inference_mode():
        hidden = loaded.model(ids, torch.arange(n), DenseContext.single(n, loaded.config))
        return loaded.model.compute_logits(hidden)


def _float_twin(loaded):
    """The float model whose projections hold `loaded`'s dequantized weights."""
    twin = load_model({"preset": "tiny"})
    quantized = dict(loaded.model.named_modules())
    with torch.no_grad():
        for name, module in twin.model.named_modules():
            if isinstance(module, nn.Linear) and isinstance(quantized.get(name), FloatCodeLinear):
                module.weight.copy_(quantized[name].dequantized_weight())
    return twin


@pytest.mark.parametrize("quant", QUANTS, ids=_id)
def test_stored_bytes_are_the_formats(quant):
    loaded = load_model({"preset": "tiny"}, quant=quant)
    linears = [m for m in loaded.model.modules() if isinstance(m, FloatCodeLinear)]
    assert len(linears) == 2 * 4  # qkv, o, gate_up, down per layer
    assert not list(quantizable_linears(loaded.model))  # no float projection left
    floats = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert loaded.weight_bytes == stored_weight_bytes(loaded.model)
    assert loaded.weight_bytes == floats + sum(m.weight_format().nbytes for m in linears)
    # The analytic model prices q and k/v as two matrices, the engine stores one fused qkv:
    # per-matrix scales (fp8 tensor / block, nvfp4's global) differ by one fp32 a layer.
    priced = weight_bytes(loaded.config, "float32", quant)
    per_matrix = quant.fp8_scales in ("tensor", "block") or quant.weights == "nvfp4"
    assert abs(loaded.weight_bytes - priced) <= (4 * loaded.config.num_layers if per_matrix
                                                 else 0)
    expect = {"fp8": "fp8/" + (quant.fp8_scales or "channel")}.get(quant.weights, quant.weights)
    assert {m.format_name for m in linears} == {expect}


@pytest.mark.parametrize("quant", QUANTS, ids=_id)
def test_logits_equal_the_dequantized_float_model(quant):
    loaded = load_model({"preset": "tiny"}, quant=quant)
    got, ref = _logits(loaded), _logits(_float_twin(loaded))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert (ref - _logits(load_model({"preset": "tiny"}))).abs().max() > 0  # it is quantized


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("quant", [QUANTS[2], QUANTS[3]], ids=_id)
def test_engine_matches_recompute(quant, backend):
    loaded = load_model({"preset": "tiny"}, quant=quant)
    requests = random_requests([5, 9, 3], gen=5, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, requests, backend=backend)
    out = engine.run(requests, realtime_arrivals=False)
    assert {m.backend for m in loaded.model.modules() if isinstance(m, FloatCodeLinear)} == {
        backend}
    for r in requests:
        assert out.outputs[r.request_id] == greedy_recompute(loaded.model, r.prompt_ids, 5)


@pytest.mark.parametrize("quant,act", [(QUANTS[1], "fp8"), (QUANTS[3], "fp4"),
                                       (QUANTS[4], "fp4")], ids=["fp8", "mxfp4", "nvfp4"])
def test_low_precision_activations_round_the_inputs(quant, act):
    weight_only = load_model({"preset": "tiny"}, quant=quant)
    both = QuantConfig(weights=quant.weights, fp8_scales=quant.fp8_scales, activations=act)
    loaded = load_model({"preset": "tiny"}, quant=both)
    assert f"{act} activations x8 (numerics only)" in loaded.source
    linear = next(m for m in loaded.model.modules() if isinstance(m, FloatCodeLinear))
    x = torch.randn(3, linear.in_features)
    rounded = linear._rounded(x)
    assert not torch.equal(rounded, x)
    torch.testing.assert_close(linear(x), rounded @ linear.dequantized_weight().t(),
                               atol=1e-5, rtol=1e-5)
    diff = (_logits(loaded) - _logits(weight_only)).abs().max().item()
    assert 0 < diff < 1.0


def test_fp4_needs_whole_scale_blocks():
    with pytest.raises(ConfigError, match="not a multiple of 32"):
        load_model({"preset": "tiny"}, overrides={"hidden_size": 48, "num_heads": 4,
                                                  "num_kv_heads": 2},
                   quant=QuantConfig(weights="mxfp4"))


@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_mla_keeps_kv_b_proj_in_float(weights):
    """MLA's cached decode multiplies by per-head slices of kv_b_proj's float weight: the
    quantizers leave it (it once became a QuantLinear and decode failed)."""
    loaded = load_model({"preset": "tiny-mla"}, quant=QuantConfig(weights=weights))
    attn = loaded.model.layers[0].self_attn
    assert type(attn.kv_b_proj) is nn.Linear
    requests = random_requests([5, 4], gen=3, vocab=loaded.config.vocab_size)
    out = make_engine(loaded, requests, backend="torch").run(requests, realtime_arrivals=False)
    for r in requests:
        assert out.outputs[r.request_id] == greedy_recompute(loaded.model, r.prompt_ids, 3)
