"""AWQ (model/awq.py): the search against RTN on the same weights and activations, the
exactness of the scale folds, the bytes against the analytic price, the issue's perplexity
check on SmolLM2 and a scenario run."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from cli_helpers import run_cli

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.awq import (
    awq_quantize,
    fake_quantize_int4,
    foldable,
    scale_attention_output,
    scale_mlp_down,
    scale_norm_input,
    search_scale,
)
from infbench.model.calibration import InputStats, calibration_ids
from infbench.model.context import DenseContext
from infbench.model.evaluate import perplexity, token_ids
from infbench.model.layers import RMSNorm
from infbench.model.loader import load_model
from infbench.model.quant import QuantLinear, quantizable_linears, quantize_model
from infbench.roofline.shapes import weight_bytes
from kernels.quant_format import quantize_int4


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_fake_quantize_is_the_stored_format(group_size):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 256, generator=gen) * torch.rand(1, 256, generator=gen) * 3
    w[5, :group_size] = 0.25  # a constant group: zero range
    assert torch.equal(fake_quantize_int4(w, group_size),
                       quantize_int4(w, group_size).dequantize())


def _stats(x: torch.Tensor) -> InputStats:
    stats = InputStats(x.shape[1], keep_inputs=True)
    for chunk in x.split(100):  # several calls, as a hook sees them
        stats.add(chunk)
    return stats


@pytest.mark.parametrize("num_tokens", [64, 512], ids=["rows", "gram"])
def test_stats_error_is_the_output_error(num_tokens):
    """InputStats keeps X while T <= K and X^T X beyond; both give ||X' E^T||^2."""
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(num_tokens, 128, generator=gen), torch.randn(24, 128, generator=gen)
    w_hat = torch.randn(24, 128, generator=gen)
    s = torch.rand(128, generator=gen) + 0.5
    stats = _stats(x)
    expect = ((x @ (w_hat / s - w).t()) ** 2).sum().item()
    assert stats.error(w_hat, w, s) == pytest.approx(expect, rel=1e-4)
    assert stats.error(w_hat, w, s, stats.reference(w)) == pytest.approx(expect, rel=1e-4)
    blocks = stats.group_grams(32, s)
    xs = x / s
    torch.testing.assert_close(blocks[2], xs[:, 64:96].t() @ xs[:, 64:96], rtol=1e-4,
                               atol=1e-3)


def test_search_beats_rtn_where_a_few_channels_dominate():
    """Activations with 4 channels 30x larger than the rest (the salient channels AWQ is
    about): the searched scale cuts the output error well below RTN's."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(512, 128, generator=gen)
    x[:, [3, 40, 77, 100]] *= 30.0
    w = torch.randn(96, 128, generator=gen) * 0.05
    stats = _stats(x)
    s, alpha, err, rtn_err = search_scale(w, stats, 32)
    exact = ((x @ (quantize_int4(w, 32).dequantize() - w).t()) ** 2).sum().item()
    assert rtn_err == pytest.approx(exact, rel=1e-3)
    direct = ((x @ (quantize_int4(w * s, 32).dequantize() / s - w).t()) ** 2).sum().item()
    assert err == pytest.approx(direct, rel=1e-3)
    assert alpha > 0 and err < 0.7 * rtn_err
    assert s[[3, 40, 77, 100]].min() > s.median()  # the salient channels scaled up


def test_search_keeps_rtn_when_activations_are_flat():
    """alpha = 0 (s = 1, RTN) is on the grid: the search never does worse than RTN."""
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(256, 64, generator=gen), torch.randn(32, 64, generator=gen)
    _, _, err, rtn_err = search_scale(w, _stats(x), 32)
    assert err <= rtn_err


def test_folds_leave_the_layer_output_unchanged():
    """Every 1 / s AWQ folds away (norm weights, v rows under GQA, up rows) is exact."""
    loaded = load_model({"preset": "tiny"}, dtype="float32", seed=3)
    model, cfg = loaded.model, loaded.config
    layer = model.layers[0]
    assert set(foldable(layer)) == {"self_attn.o_proj", "self_attn.qkv_proj",
                                    "mlp.down_proj", "mlp.gate_up_proj"}
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(10, cfg.hidden_size)
    positions = torch.arange(10)

    def out():
        with torch.no_grad():
            return layer(x, positions, DenseContext.single(10, cfg), model.rope_cache)

    before = out()
    attn, mlp = layer.self_attn, layer.mlp
    gen = torch.Generator().manual_seed(4)
    share = attn.num_heads // attn.num_kv_heads
    s_kv = torch.rand(attn.num_kv_heads, 1, attn.head_dim, generator=gen) + 0.5
    with torch.no_grad():
        scale_attention_output(attn, s_kv.expand(-1, share, -1).reshape(-1))
        scale_norm_input(layer.input_layernorm, attn.qkv_proj,
                         torch.rand(cfg.hidden_size, generator=gen) + 0.5)
        scale_mlp_down(mlp, torch.rand(mlp.intermediate_size, generator=gen) + 0.5)
        scale_norm_input(layer.post_attention_layernorm, mlp.gate_up_proj,
                         torch.rand(cfg.hidden_size, generator=gen) + 0.5)
    torch.testing.assert_close(out(), before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_awq_stores_what_int4_is_priced(dtype):
    """The scales are folded, so AWQ stores exactly RTN int4's bytes (and the analytic
    model's); a model without a tokenizer calibrates on seeded random tokens."""
    quant = QuantConfig(weights="int4", group_size=32, method="awq", calibration_tokens=64)
    loaded = load_model({"preset": "tiny"}, dtype=dtype, quant=quant)
    assert not list(quantizable_linears(loaded.model))
    assert sum(isinstance(m, QuantLinear) for m in loaded.model.modules()) == 8
    assert all(m.input_scales is None for m in loaded.model.modules()
               if isinstance(m, QuantLinear))
    assert all(m.weight.dtype == getattr(torch, dtype) for m in loaded.model.modules()
               if isinstance(m, RMSNorm))
    assert loaded.weight_bytes == weight_bytes(loaded.config, dtype, quant)
    assert "int4 awq g32: awq x8, rtn x0" in loaded.source
    assert "64 random tokens" in loaded.source


def test_awq_group_size_must_divide():
    with pytest.raises(ConfigError, match="group_size=128 does not divide the input dimension 64"):
        load_model({"preset": "tiny"}, quant=QuantConfig(weights="int4", group_size=128,
                                                         method="awq"))


def test_awq_perplexity_below_rtn_on_smollm2():
    """The issue's check.  SmolLM2's shipped weights are Q4_1 at group 32, so RTN at group 32
    is lossless for them; group 64 is where RTN loses (its hidden size 576 is not a multiple
    of 128, so group 128 cannot be applied to it)."""
    base = load_model({"preset": "smollm2-135m"})
    tok = base.tokenizer
    assert tok is not None
    test_ids = token_ids(tok, "test", 512)
    quant = QuantConfig(weights="int4", group_size=64, method="awq", calibration_tokens=128)
    rtn_model = copy.deepcopy(base.model)
    quantize_model(rtn_model, QuantConfig(weights="int4", group_size=64))
    ppl_rtn = perplexity(rtn_model, test_ids)
    del rtn_model
    ids, _ = calibration_ids(tok, quant.calibration_tokens, base.config.vocab_size)
    result = awq_quantize(base.model, quant, ids)
    assert result.num_awq == 4 * base.config.num_layers and result.num_rtn == 0
    ppl_awq = perplexity(base.model, test_ids)
    assert ppl_awq < ppl_rtn, (ppl_awq, ppl_rtn)


def test_scenario_runs_awq(tmp_path, monkeypatch, capsys):
    scenario = tmp_path / "awq.yaml"
    scenario.write_text("""
name: awq_tiny
device: cpu
dtype: float32
hardware: cpu
model:
  preset: tiny
  overrides: {max_seq_len: 64}
  quant: {weights: int4, group_size: 32, method: awq, calibration_tokens: 32}
workload: {kind: static, batch_size: 2, prompt_len: 8, gen_len: 4, seed: 0}
engine: {block_size: 4, max_num_batched_tokens: 32}
measure: {warmup: 0, repeats: 1}
""")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                           str(tmp_path / "out"))
    assert code == 0, err
    result = json.loads(next((tmp_path / "out").glob("awq_tiny_*.json")).read_text())
    assert result["scenario"]["model"]["quant"]["method"] == "awq"
    assert result["metrics"]["num_output_tokens"] == 8
    cfg = load_model({"preset": "tiny"}, overrides={"max_seq_len": 64}).config
    quant = QuantConfig(weights="int4", group_size=32)
    assert result["metrics"]["weight_bytes"] == weight_bytes(cfg, "float32", quant)
