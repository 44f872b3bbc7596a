"""Weight quantization in the model: quantize_model, QuantLinear on each backend, the bytes
the quantized model stores against what the analytic model prices, and a scenario run."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import run_cli
from engine_helpers import greedy_recompute, make_engine, random_requests
from torch import nn

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.loader import load_model
from infbench.model.quant import QuantLinear, quantizable_linears, stored_weight_bytes
from infbench.roofline.shapes import weight_bytes

QUANTS = [QuantConfig(weights="int8"), QuantConfig(weights="int4", group_size=32),
          QuantConfig(weights="int4", group_size=64)]
ACT8 = [QuantConfig(weights="int8", activations="int8"),
        QuantConfig(weights="int4", group_size=64, activations="int8")]


@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: f"{q.weights}-g{q.group_size}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stored_bytes_equal_predicted(quant, dtype):
    loaded = load_model({"preset": "tiny"}, dtype=dtype, quant=quant)
    linears = [m for m in loaded.model.modules() if isinstance(m, QuantLinear)]
    assert len(linears) == 2 * 4  # qkv, o, gate_up, down per layer
    assert not list(quantizable_linears(loaded.model))  # no float projection left
    assert loaded.weight_bytes == stored_weight_bytes(loaded.model)
    assert loaded.weight_bytes == weight_bytes(loaded.config, dtype, quant)
    assert loaded.weight_bytes < weight_bytes(loaded.config, dtype)


def test_real_model_bytes_and_logits():
    """SmolLM2's shipped weights are Q4_1 (groups of 32): int4 RTN at group 32 finds the
    same grid, so the logits match the float model's; int8 (one scale per row) moves them a
    little and keeps the top token almost everywhere."""
    ids = torch.arange(100, 132)
    from infbench.model.context import DenseContext

    def logits(loaded):
        with torch.inference_mode():
            hidden = loaded.model(ids, torch.arange(32), DenseContext.single(32, loaded.config))
            return loaded.model.compute_logits(hidden)

    ref = logits(load_model({"preset": "smollm2-135m"}))
    g32 = load_model({"preset": "smollm2-135m"}, quant=QuantConfig(weights="int4",
                                                                   group_size=32))
    assert (logits(g32) - ref).abs().max().item() < 1e-3
    int8 = QuantConfig(weights="int8")
    loaded = load_model({"preset": "smollm2-135m"}, quant=int8)
    assert loaded.weight_bytes == weight_bytes(loaded.config, "float32", int8)
    got = logits(loaded)
    assert 0 < (got - ref).abs().max().item() < 2.0
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9


@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: f"{q.weights}-g{q.group_size}")
def test_engine_cpu_backend_matches_recompute(quant):
    loaded = load_model({"preset": "tiny"}, quant=quant)
    requests = random_requests([5, 9, 3], gen=6, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, requests, backend="cpu")
    out = engine.run(requests, realtime_arrivals=False)
    for layer in loaded.model.modules():
        if isinstance(layer, QuantLinear):
            assert layer.backend == "cpu"
    for r in requests:
        expect = greedy_recompute(loaded.model, r.prompt_ids, 6)
        assert out.outputs[r.request_id] == expect


@pytest.mark.parametrize("quant", ACT8, ids=lambda q: f"{q.weights}-g{q.group_size}-act8")
def test_int8_activations_engine_matches_recompute(quant):
    """The engine's decode (one row: the VNNI path) and a full recompute (many rows: the
    rounded activations through the float GEMM) give the same greedy tokens."""
    loaded = load_model({"preset": "tiny"}, quant=quant)
    flags = [m.act_int8 for m in loaded.model.modules() if isinstance(m, QuantLinear)]
    assert flags and all(flags) and "int8 activations x8" in loaded.source
    requests = random_requests([7], gen=6, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, requests, backend="cpu")
    out = engine.run(requests, realtime_arrivals=False)
    r = requests[0]
    assert out.outputs[r.request_id] == greedy_recompute(loaded.model, r.prompt_ids, 6)


def test_int8_activations_change_the_product_and_need_quantized_weights():
    lin = nn.Linear(64, 40, bias=False)
    from infbench.model.quant import rtn
    q = rtn(lin, QuantConfig(weights="int8"))
    x = torch.randn(3, 64)
    exact = q(x)
    q.act_int8 = True
    rounded = q(x)
    assert 0 < (rounded - exact).abs().max().item() < 0.05 * exact.abs().max().item()
    with pytest.raises(ConfigError, match="needs quant.weights int8|int4|native"):
        QuantConfig(activations="int8")
    with pytest.raises(ConfigError, match="does not combine with quant.method: llm_int8"):
        QuantConfig(weights="int8", method="llm_int8", activations="int8")
    with pytest.raises(ConfigError, match="quant.activations"):
        QuantConfig(weights="int8", activations="int4")
    assert QuantConfig(head="int8", activations="int8").activations == "int8"


def test_quant_linear_paths_agree():
    lin = nn.Linear(64, 40, bias=True)
    from infbench.model.quant import rtn
    q = rtn(lin, QuantConfig(weights="int4", group_size=32))
    x = torch.randn(40, 64)  # > 32 rows: the prefill path
    ref = q.reference(x)
    q.set_backend("cpu")
    torch.testing.assert_close(q(x), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(q(x[:3]), ref[:3], rtol=1e-5, atol=1e-4)


def test_group_size_must_divide_the_input_dimension():
    with pytest.raises(ConfigError, match="group_size=64 does not divide the input dimension 96"):
        load_model({"preset": "tiny", },
                   overrides={"intermediate_size": 96},
                   quant=QuantConfig(weights="int4", group_size=64))


def test_scenario_runs_quantized(tmp_path, monkeypatch, capsys):
    scenario = tmp_path / "q.yaml"
    scenario.write_text("""
name: quant_tiny
device: cpu
dtype: float32
hardware: cpu
model: {preset: tiny, overrides: {max_seq_len: 64},
        quant: {weights: int4, group_size: 32, activations: int8}}
workload: {kind: static, batch_size: 2, prompt_len: 8, gen_len: 4, seed: 0}
engine: {block_size: 4, max_num_batched_tokens: 32}
measure: {warmup: 0, repeats: 1}
""")
    code, out, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                             str(tmp_path / "out"))
    assert code == 0, err
    import json
    result = json.loads(next((tmp_path / "out").glob("quant_tiny_*.json")).read_text())
    assert result["scenario"]["model"]["quant"]["weights"] == "int4"
    assert result["scenario"]["model"]["quant"]["activations"] == "int8"


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("weights", ["none", "int4"])
def test_int8_lm_head(tied, weights):
    """quant.head int8: an int8 head (a tied one as a copy beside the float embedding),
    priced as stored; the engine's greedy tokens equal full recompute with it."""
    from infbench.roofline.costs import step_costs
    from infbench.roofline.ops import SeqWork

    quant = QuantConfig(weights=weights, group_size=32, head="int8")
    over = {"tie_word_embeddings": tied}
    loaded = load_model({"preset": "tiny"}, overrides=over, quant=quant)
    model = loaded.model
    head = getattr(model, "head_q", None) if tied else model.lm_head
    assert isinstance(head, QuantLinear) and head.kind == "int8"
    assert tied == (model.lm_head is None)
    assert loaded.weight_bytes == weight_bytes(loaded.config, "float32", quant)
    cfg = loaded.config
    head_bytes = cfg.vocab_size * (cfg.hidden_size + 2)  # int8 rows + an fp16 scale each
    plain = load_model({"preset": "tiny"}, overrides=over,
                       quant=QuantConfig(weights=weights, group_size=32))
    assert loaded.weight_bytes - plain.weight_bytes == head_bytes - (
        0 if tied else cfg.vocab_size * cfg.hidden_size * 4)
    ops = {op.name: op for op in step_costs(cfg, [SeqWork(1, 16)], "float32", quant)}
    assert ops["lm_head"].weight_bytes == head_bytes
    requests = random_requests([5, 3], gen=5, vocab=cfg.vocab_size)
    out = make_engine(loaded, requests, backend="cpu").run(requests,
                                                         realtime_arrivals=False).outputs
    for r in requests:
        assert out[r.request_id] == greedy_recompute(model, r.prompt_ids, 5)
