"""Safetensors checkpoints storing fp8 / nvfp4 projections (model/fp_checkpoint.py): loaded
as stored under `quant.weights: native` (no float copy of a projection, the bytes the file
stores), logits equal to the float model on the dequantized weights, dequantized without
`native`, and the refusals of malformed files."""

from __future__ import annotations

import json

import pytest
import torch
from fp_checkpoints import PROJECTIONS, STYLES, write_fp_checkpoint
from safetensors.torch import load_file, save_file

from infbench.core.config import QuantConfig
from infbench.core.errors import UserError
from infbench.model.context import DenseContext
from infbench.model.float_quant import FloatCodeLinear, ShardedLinear
from infbench.model.loader import load_model
from infbench.model.quant import quantizable_linears

NATIVE = QuantConfig(weights="native")


def _logits(loaded, n: int = 10) -> torch.Tensor:
    ids = torch.arange(2, 2 + n)
    with torch.inference_mode():
        hidden = loaded.model(ids, torch.arange(n), DenseContext.single(n, loaded.config))
        return loaded.model.compute_logits(hidden)


def _file_bytes(path, quantized_only: bool) -> int:
    tensors = load_file(str(path / "model.safetensors"))
    return sum(t.numel() * t.element_size() for name, t in tensors.items()
               if not quantized_only or name.rpartition(".")[0].rpartition(".")[2] in PROJECTIONS)


@pytest.mark.parametrize("style", list(STYLES))
def test_native_load_runs_the_stored_codes(tmp_path, style):
    quant_dir, twin_dir = write_fp_checkpoint(tmp_path, style)
    loaded = load_model({"path": str(quant_dir)}, quant=NATIVE)
    twin = load_model({"path": str(twin_dir)})
    torch.testing.assert_close(_logits(loaded), _logits(twin), atol=1e-5, rtol=1e-5)
    # No float copy: no projection is a float linear, no parameter is a projection matrix
    assert not list(quantizable_linears(loaded.model))
    names = {name.rpartition(".")[0] for name, _ in loaded.model.named_parameters()}
    assert all("proj" not in n for n in names), names
    layer = loaded.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, ShardedLinear)  # q, k, v: their own scales
    assert isinstance(layer.self_attn.o_proj, FloatCodeLinear)
    assert isinstance(layer.mlp.gate_up_proj, ShardedLinear)
    # The bytes held: the file's quantized tensors (static activation scales aside) plus
    # the float tensors, each as the model dtype stores it
    floats = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert loaded.weight_bytes == floats + _file_bytes(quant_dir, quantized_only=True)
    assert loaded.weight_bytes == _file_bytes(quant_dir, quantized_only=False)
    kind = style if style in ("nvfp4", "mxfp4") else "fp8/" + {"deepseek-block": "block",
                                                      "ct-tensor": "tensor",
                                                      "ct-channel": "channel"}[style]
    assert f"{kind} x14, run as stored" in loaded.source


def test_without_native_the_codes_are_dequantized(tmp_path):
    quant_dir, twin_dir = write_fp_checkpoint(tmp_path, "deepseek-block")
    loaded = load_model({"path": str(quant_dir)})
    assert len(list(quantizable_linears(loaded.model))) == 2 * 4
    assert "dequantized to the model dtype" in loaded.source
    twin = load_model({"path": str(twin_dir)})
    torch.testing.assert_close(_logits(loaded), _logits(twin), atol=1e-6, rtol=1e-6)
    assert loaded.weight_bytes == twin.weight_bytes


def test_static_input_scales_are_skipped(tmp_path):
    quant_dir, twin_dir = write_fp_checkpoint(tmp_path, "ct-channel", input_scales=True)
    loaded = load_model({"path": str(quant_dir)}, quant=NATIVE)
    twin = load_model({"path": str(twin_dir)})
    torch.testing.assert_close(_logits(loaded), _logits(twin), atol=1e-5, rtol=1e-5)


def test_fp8_activations_on_a_native_checkpoint(tmp_path):
    quant_dir, _ = write_fp_checkpoint(tmp_path, "deepseek-block")
    w8a8 = QuantConfig(weights="native", activations="fp8")
    loaded = load_model({"path": str(quant_dir)}, quant=w8a8)
    assert "fp8 activations x14 (numerics only)" in loaded.source
    weight_only = load_model({"path": str(quant_dir)}, quant=NATIVE)
    assert 0 < (_logits(loaded) - _logits(weight_only)).abs().max().item() < 1.0


def _rewrite(path, edit) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_refusals(tmp_path):
    quant_dir, twin_dir = write_fp_checkpoint(tmp_path, "deepseek-block")
    with pytest.raises(UserError, match="stores no fp8 / nvfp4 projections"):
        load_model({"path": str(twin_dir)}, quant=NATIVE)
    with pytest.raises(UserError, match="weights: random has none"):
        load_model({"path": str(quant_dir)}, quant=NATIVE, weights="random")
    name = "model.layers.0.self_attn.o_proj.weight_scale_inv"

    def bad_shape(t):
        t[name] = torch.ones(5, 5)

    _rewrite(quant_dir, bad_shape)
    with pytest.raises(UserError, match=r"o_proj.weight_scale_inv is F32 \(5, 5\).*\(2, 2\)"):
        load_model({"path": str(quant_dir)}, quant=NATIVE)

    def no_scale(t):
        del t[name]

    _rewrite(quant_dir, no_scale)
    with pytest.raises(UserError, match="needs a 2-D weight and"):
        load_model({"path": str(quant_dir)}, quant=NATIVE)


def test_partly_quantized_fused_projection_is_refused(tmp_path):
    quant_dir, _ = write_fp_checkpoint(tmp_path, "ct-channel")
    prefix = "model.layers.1.self_attn.k_proj"

    def float_k(t):
        codes, scale = t.pop(f"{prefix}.weight"), t.pop(f"{prefix}.weight_scale")
        t[f"{prefix}.weight"] = codes.float() * scale

    _rewrite(quant_dir, float_k)
    with pytest.raises(UserError, match="only some parts of this fused projection"):
        load_model({"path": str(quant_dir)}, quant=NATIVE)


def test_block_size_is_checked(tmp_path):
    quant_dir, _ = write_fp_checkpoint(tmp_path, "deepseek-block")
    config = json.loads((quant_dir / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [32]
    (quant_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="weight_block_size must be two positive integers"):
        load_model({"path": str(quant_dir)}, quant=NATIVE)


def test_mxfp4_scale_shape_is_checked(tmp_path):
    quant_dir, _ = write_fp_checkpoint(tmp_path, "mxfp4")
    name = "model.layers.0.mlp.down_proj.weight_scale"

    def bad(t):
        t[name] = t[name][:, :1].contiguous()

    _rewrite(quant_dir, bad)
    with pytest.raises(UserError, match=r"mxfp4 tensor .*down_proj.weight.*\(64, 3\)"):
        load_model({"path": str(quant_dir)}, quant=NATIVE)
