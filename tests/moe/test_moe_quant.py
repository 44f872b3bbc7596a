"""Routed experts stored as fp8 / mxfp4 / nvfp4 (`quant.weights`): logits equal the same
model whose experts hold the reference-dequantized weights, the bytes held are the stored
ones, greedy decoding through the engine equals a recompute; what cannot be stored is
refused in one line."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from engine_helpers import greedy_recompute, make_engine, random_requests
from moe_checkpoints import VOCAB, write_hf_moe
from torch import nn

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.context import DenseContext
from infbench.model.float_quant import FloatCodeLinear, StackedFloatCodes
from infbench.model.loader import load_model
from infbench.model.moe import MoEMLP, moe_layers, routed_expert_bytes
from infbench.roofline.shapes import weight_bytes

TOL = 1e-5
# Every expert and shared-expert width a multiple of 32 (the fp4 blocks)
SHAPES = {"mixtral": dict(intermediate_size=64),
          "qwen2_moe": dict(shared_expert_intermediate_size=64),
          "deepseek_v2": dict(moe_intermediate_size=32)}
FORMATS = [("fp8", "channel"), ("fp8", "block"), ("mxfp4", None), ("nvfp4", None)]


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(ids, torch.arange(ids.numel()), DenseContext([0, ids.numel()]))
        return model.compute_logits(hidden)  # (T, V)


def _dequantized_experts(model: nn.Module) -> nn.Module:
    """A copy of `model` whose stored experts are float stacks of their decoded values."""
    ref = copy.deepcopy(model)
    for m in moe_layers(ref):
        assert isinstance(m.w13, StackedFloatCodes) and isinstance(m.w2, StackedFloatCodes)
        w13, w2 = m.w13.dequantized(), m.w2.dequantized()
        del m.w13, m.w2
        m.w13, m.w2 = nn.Parameter(w13, requires_grad=False), nn.Parameter(w2,
                                                                           requires_grad=False)
    return ref


def _expert_bytes(fmt: str, scales: str | None, n: int, k: int) -> int:
    """Stored bytes of one (n, k) expert matrix, from the format's definition."""
    if fmt == "fp8":
        groups = n if scales == "channel" else -(-n // 128) * -(-k // 128)
        return n * k + 4 * groups
    if fmt == "mxfp4":
        return n * k // 2 + n * k // 32
    return n * k // 2 + n * k // 16 + 4  # nvfp4: E4M3 per 16, one float32 global


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize(("fmt", "scales"), FORMATS, ids=["fp8-channel", "fp8-block", "mxfp4",
                                                         "nvfp4"])
def test_stored_experts_equal_their_dequantized_weights(tmp_path: Path, kind: str, fmt: str,
                                                        scales: str | None) -> None:
    write_hf_moe(tmp_path, kind, **SHAPES[kind])
    quant = QuantConfig(weights=fmt, fp8_scales=scales)
    loaded = load_model({"path": str(tmp_path)}, quant=quant)
    layers = moe_layers(loaded.model)
    assert layers
    for m in layers:  # codes and scales only; the router stays float
        assert isinstance(m.w13, StackedFloatCodes) and isinstance(m.w2, StackedFloatCodes)
        assert not any(n.endswith(("w13", "w2")) for n, _ in m.named_parameters())
        assert type(m.gate) is nn.Linear
        if m.shared_experts is not None:
            assert isinstance(m.shared_experts.down_proj, FloatCodeLinear)
    ids = torch.randint(0, VOCAB, (19,), generator=torch.Generator().manual_seed(2))
    out = _logits(loaded.model, ids)
    ref = _logits(_dequantized_experts(loaded.model), ids)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=TOL)
    # Bytes held = the float parameters left + every stored matrix's codes and scales.
    m = layers[0]
    e, two_i, h = m.w13.shape
    one = _expert_bytes(fmt, scales, two_i, h) + _expert_bytes(fmt, scales, h, two_i // 2)
    assert routed_expert_bytes(loaded.model) == one
    assert m.w13.stored_bytes + m.w2.stored_bytes == e * one
    floats = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    stored = sum(mod.stored_bytes for mod in loaded.model.modules()
                 if isinstance(mod, FloatCodeLinear | StackedFloatCodes))
    assert loaded.weight_bytes == floats + stored
    if kind != "deepseek_v2" and (fmt == "mxfp4" or scales == "channel"):
        # formats without per-matrix scales: exactly what `predict` prices (MLA keeps its
        # kv_b_proj float in the engine, docs/quantization.md)
        assert loaded.weight_bytes == weight_bytes(loaded.config, "float32", quant)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_engine_greedy_tokens_equal_a_recompute(tmp_path: Path, backend: str) -> None:
    write_hf_moe(tmp_path, "qwen2_moe", **SHAPES["qwen2_moe"])
    loaded = load_model({"path": str(tmp_path)}, quant=QuantConfig(weights="mxfp4"))
    reqs = random_requests([5, 9, 3], gen=4, vocab=VOCAB)
    engine = make_engine(loaded, reqs, backend=backend)
    assert all(m.stored_experts for m in moe_layers(loaded.model))
    outputs = engine.run(reqs).outputs
    for r in reqs:
        assert outputs[r.request_id] == greedy_recompute(loaded.model, list(r.prompt_ids), 4)


def test_experts_an_fp4_block_does_not_divide_are_refused(tmp_path: Path) -> None:
    write_hf_moe(tmp_path, "mixtral")  # expert width 48: down_proj's input not a block multiple
    with pytest.raises(ConfigError, match="routed experts: .*allowed for this model: fp8") as info:
        load_model({"path": str(tmp_path)}, quant=QuantConfig(weights="mxfp4"))
    assert "\n" not in str(info.value)


def test_integer_experts_stay_refused() -> None:
    with pytest.raises(ConfigError, match="allowed for MoE models: none, fp8, mxfp4, nvfp4"):
        load_model({"preset": "tiny-moe"}, quant=QuantConfig(weights="int4"))


def test_stored_experts_keep_the_float_modules_out() -> None:
    loaded = load_model({"preset": "tiny-moe"}, quant=QuantConfig(weights="fp8"))
    m = moe_layers(loaded.model)[0]
    assert isinstance(m, MoEMLP) and m.stored_experts and m.w13.format_name == "fp8/channel"


def test_rounded_activations_are_refused_for_stored_experts() -> None:
    """W8A8 / W4A4 numerics are not reproduced inside the experts: refused, not skipped."""
    with pytest.raises(ConfigError, match="activations=fp8: .*allowed for MoE models: float"):
        load_model({"preset": "tiny-moe"}, quant=QuantConfig(weights="fp8", activations="fp8"))
