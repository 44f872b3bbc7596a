"""`quant.weights: native` on a Hugging Face directory: config.json's quantization_config
(DeepSeek-V3's fp8 blocks, compressed-tensors, ModelOpt, gpt-oss's mxfp4) priced as stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infbench.checkpoint.metadata import config_from_source, native_quant
from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.errors import UserError
from infbench.roofline.shapes import _all_weights, weight_bytes

NATIVE = QuantConfig(weights="native")


def write_config(tmp: Path, family: str, quantization: dict[str, Any] | None,
                 **extra: Any) -> dict[str, str]:
    """A config.json written by transformers (no weights: predict reads none), with
    `quantization_config` added as the checkpoints ship it."""
    from transformers import DeepseekV2Config, LlamaConfig

    if family == "llama":
        cfg: Any = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=640,
                               num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, tie_word_embeddings=False, **extra)
    else:  # DeepSeek-V2's layout, which V3 keeps: MLA, first_k_dense dense layers, experts
        cfg = DeepseekV2Config(vocab_size=512, hidden_size=256, intermediate_size=640,
                               moe_intermediate_size=128, num_hidden_layers=3,
                               num_attention_heads=4, kv_lora_rank=64, q_lora_rank=96,
                               qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                               n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                               first_k_dense_replace=1, tie_word_embeddings=False, **extra)
    cfg.save_pretrained(tmp)
    data = json.loads((tmp / "config.json").read_text())
    if quantization is not None:
        data["quantization_config"] = quantization
    (tmp / "config.json").write_text(json.dumps(data))
    return {"path": str(tmp)}


def per_op_bytes(cfg: ModelConfig, formats: dict[str, QuantConfig]) -> int:
    """Weight bytes with each operator priced by its own QuantConfig (the model dtype when
    absent): the independent sum the native mix must equal."""
    return round(sum(w.nbytes(formats.get(w.op, QuantConfig()), 2) for w in _all_weights(cfg)))


def test_deepseek_v3_fp8_blocks_price_as_quant_fp8_block(tmp_path: Path) -> None:
    source = write_config(tmp_path, "deepseek", {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128]})
    cfg, quant = config_from_source(source), native_quant(NATIVE, source)
    block = QuantConfig(weights="fp8", fp8_scales="block")
    assert {fmt for _, fmt, _ in quant.native_mix} == {"fp8/block"}
    assert weight_bytes(cfg, "bfloat16", quant) == weight_bytes(cfg, "bfloat16", block)
    assert weight_bytes(cfg, "bfloat16", quant) < weight_bytes(cfg, "bfloat16") * 0.6


def test_gpt_oss_style_mxfp4_keeps_the_modules_not_converted(tmp_path: Path) -> None:
    source = write_config(tmp_path, "deepseek", {
        "quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.gate", "model.embed_tokens",
            "lm_head", "model.layers.*.mlp.shared_experts"]})
    cfg, quant = config_from_source(source), native_quant(NATIVE, source)
    mx = QuantConfig(weights="mxfp4")
    assert weight_bytes(cfg, "bfloat16", quant) == per_op_bytes(
        cfg, {"moe_experts": mx, "mlp": mx})
    assert ("qkv_proj", "float", 3) in quant.native_mix


def test_compressed_tensors_fp8_channel_with_ignore(tmp_path: Path) -> None:
    source = write_config(tmp_path, "llama", {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}},
        "ignore": ["lm_head", "re:model.layers.1.mlp.*"]})
    cfg, quant = config_from_source(source), native_quant(NATIVE, source)
    assert {("mlp", "float", 1), ("mlp", "fp8/channel", 1)} <= set(quant.native_mix)
    fp8 = QuantConfig(weights="fp8")
    mlp_layer = [w for w in _all_weights(cfg) if w.op == "mlp"]
    saved = sum(w.nbytes(QuantConfig(), 2) - w.nbytes(fp8, 2) for w in mlp_layer) / 2
    expected = per_op_bytes(cfg, {"qkv_proj": fp8, "o_proj": fp8}) - saved  # layer 0's MLP
    assert weight_bytes(cfg, "bfloat16", quant) == pytest.approx(expected, abs=1)
    w8a8 = QuantConfig(weights="native", activations="fp8", native_mix=quant.native_mix)
    assert w8a8.activations == "fp8"  # the stored fp8 projections take fp8 activations


@pytest.mark.parametrize(("algo", "fmt"), [("NVFP4", "nvfp4"), ("FP8", "fp8/tensor")])
def test_modelopt(tmp_path: Path, algo: str, fmt: str) -> None:
    source = write_config(tmp_path, "llama", {
        "quant_method": "modelopt", "quant_algo": algo, "exclude_modules": ["lm_head"]})
    cfg, quant = config_from_source(source), native_quant(NATIVE, source)
    assert {f for _, f, _ in quant.native_mix} == {fmt}
    direct = QuantConfig(weights="nvfp4") if algo == "NVFP4" else QuantConfig(
        weights="fp8", fp8_scales="tensor")
    assert weight_bytes(cfg, "bfloat16", quant) == weight_bytes(cfg, "bfloat16", direct)


def test_modelopt_hf_quant_config_file(tmp_path: Path) -> None:
    source = write_config(tmp_path, "llama", None)
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                         "exclude_modules": ["lm_head"]}}))
    assert {f for _, f, _ in native_quant(NATIVE, source).native_mix} == {"nvfp4"}


@pytest.mark.parametrize(("quantization", "message"), [
    ({"quant_method": "gptq", "bits": 4}, "quant_method='gptq' is not priced as stored; "
     "allowed: fp8, compressed-tensors, modelopt, mxfp4"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "allowed: \\[128, 128\\]"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "quant_algo='W4A8_AWQ'"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}}, "int 4-bit"),
    ({"quant_method": "fp8", "modules_to_not_convert": ["model.layers.0.self_attn.k_proj"]},
     "an exclusion inside one operator is not priced"),
    (None, "no quantization_config"),
])
def test_refusals(tmp_path: Path, quantization: Any, message: str) -> None:
    source = write_config(tmp_path, "llama", quantization)
    with pytest.raises(UserError, match=message):
        native_quant(NATIVE, source)


def test_predict_native_on_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from cli_helpers import run_cli

    source = write_config(tmp_path, "deepseek", {"quant_method": "fp8",
                                                 "weight_block_size": [128, 128]})
    args = ["predict", "--model", source["path"], "--quant", "native", "--json"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    cfg = config_from_source(source)
    block = QuantConfig(weights="fp8", fp8_scales="block")
    assert json.loads(out)[0]["weight_bytes"] == weight_bytes(cfg, "bfloat16", block)
    code, out, err = run_cli(monkeypatch, capsys, *args[:-1], "--activations", "fp4")
    assert code == 2 and "native weights stored as fp8" in err


def test_a_preset_released_quantized_prices_its_published_formats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`PUBLISHED_QUANTIZATION` (filled by the families whose checkpoints ship quantized):
    native on the preset reads its entry as it would the checkpoint's config.json."""
    from infbench.checkpoint import hf_quant

    monkeypatch.setitem(hf_quant.PUBLISHED_QUANTIZATION, "deepseek-v2-lite", {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]})
    source = {"preset": "deepseek-v2-lite"}
    cfg, quant = config_from_source(source), native_quant(NATIVE, source)
    mx = QuantConfig(weights="mxfp4")
    assert weight_bytes(cfg, "bfloat16", quant) == per_op_bytes(
        cfg, {"moe_experts": mx, "moe_shared": mx, "mlp": mx})
    with pytest.raises(UserError, match="native needs a GGUF model"):  # released in float
        native_quant(NATIVE, {"preset": "llama3-8b"})


@pytest.mark.parametrize("preset", ["deepseek-v3", "kimi-k2"])
def test_deepseek_v3_and_kimi_k2_presets_price_their_fp8_blocks(preset: str) -> None:
    source = {"preset": preset}
    cfg, quant = config_from_source(source), native_quant(NATIVE, source)
    block = QuantConfig(weights="fp8", fp8_scales="block")
    assert weight_bytes(cfg, "bfloat16", quant) == weight_bytes(cfg, "bfloat16", block)
