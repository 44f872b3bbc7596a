"""GGUF files storing ggml's MXFP4 type (17 bytes per 32 values: an E8M0 scale and 16 bytes of
E2M1 nibbles, what llama.cpp's gpt-oss files store): under `weights: native` the projections
(and an untied LM head) become `FloatCodeLinear`s holding the file's codes and scales,
re-packed bit for bit, with no float copy; their logits equal the model dequantized by
gguf-py; predict prices 17/32 bytes a weight; a malformed MXFP4 tensor is one error line
naming the file and the tensor."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gguf
import gguf_quant
import numpy as np
import pytest
import torch
from cli_helpers import run_cli
from gguf.quants import dequantize
from gguf_quant import FloatAllocations, spy_dequantize, write_quantized_gguf
from model_checkpoints import write_hf_llama

from infbench.checkpoint.metadata import native_quant
from infbench.core.config import QuantConfig
from infbench.core.errors import DamagedFileError
from infbench.model.context import DenseContext
from infbench.model.float_quant import FloatCodeLinear
from infbench.model.gguf_blocks import native_weight
from infbench.model.loader import LoadedModel, load_model
from infbench.model.quant import QuantEmbedding, QuantLinear, stored_weight_bytes
from infbench.roofline.shapes import weight_bytes
from kernels.fp_format import pack_fp4

MXFP4 = gguf.GGMLQuantizationType.MXFP4
NATIVE = QuantConfig(weights="native")
# hidden 64, MLP 160, 4 heads, 2 KV heads, vocab 96, 2 layers (write_hf_llama's defaults)
SHAPE = dict(intermediate_size=160, num_attention_heads=4, num_key_value_heads=2)
VOCAB, HIDDEN, LAYERS = 96, 64, 2
PROJECTIONS = {(128, 64), (64, 64), (320, 64), (64, 160)}  # qkv, o, gate_up, down
PARTS = {(64, 64), (32, 64), (160, 64), (64, 160)}  # q, k/v, gate/up, down as the file has them
# one layer's projection weights: q, k, v, o, gate, up, down
LAYER_WEIGHTS = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 2 * 160 * 64 + 64 * 160


def _logits(loaded: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = loaded.model(ids, torch.arange(len(ids)), DenseContext.single(len(ids)))
        return loaded.model.compute_logits(hidden)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_hf_llama(tmp_path_factory.mktemp("hf"), **SHAPE)


@pytest.fixture(scope="module")
def hf_tied(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_hf_llama(tmp_path_factory.mktemp("tied"), tie_word_embeddings=True, **SHAPE)


# ---------------------------------------------------------------- the block conversion
def test_mxfp4_blocks_convert_bit_for_bit() -> None:
    """Every code and scale byte of gguf-py's MXFP4 blocks is kept; only the nibbles move
    (ggml: value j low, j + 16 high in byte j; infbench: columns 2j, 2j + 1)."""
    rng = np.random.default_rng(0)
    blocks = gguf.quants.quantize(rng.normal(0, 0.05, (24, 96)).astype(np.float32), MXFP4)
    assert blocks.shape == (24, 3 * 17) and blocks.dtype == np.uint8
    b = blocks.reshape(24, 3, 17)
    b[:4, :, 1:] = rng.integers(0, 256, (4, 3, 16), dtype=np.uint8)  # every code
    b[:4, :, 0] = np.array([0, 1, 2, 64, 127, 128, 200, 220, 230, 240, 245, 250]).reshape(4, 3)
    native = native_weight(blocks, "MXFP4")
    assert native.shape == (24, 96)
    assert native.packed.dtype == native.scales.dtype == torch.uint8
    assert torch.equal(native.scales, torch.from_numpy(b[..., 0].copy()))
    # the codes in column order, from ggml's layout, packed infbench's way
    qs = b[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(24, 96)  # (N, K)
    assert torch.equal(native.packed, pack_fp4(torch.from_numpy(codes)))
    assert np.array_equal(native.dequantize().numpy(), dequantize(blocks, MXFP4))


def test_an_mxfp4_nan_scale_is_refused() -> None:
    blocks = gguf.quants.quantize(np.ones((2, 64), np.float32), MXFP4)
    blocks[1, 17] = 255
    with pytest.raises(ValueError, match="1 MXFP4 block.*scale byte 255"):
        native_weight(blocks, "MXFP4")


# ---------------------------------------------------------------- whole files
MIXED = {"q_proj": "MXFP4", "k_proj": "MXFP4", "v_proj": "MXFP4", "o_proj": "Q8_0",
         "gate_proj": "MXFP4", "up_proj": "MXFP4", "down_proj": "Q4_0"}


@pytest.mark.parametrize(("types", "head"), [("MXFP4", "MXFP4"), ("MXFP4", "F32"),
                                             (MIXED, "Q8_0")],
                         ids=["mxfp4-head", "mxfp4", "mixed"])
def test_native_mxfp4_logits_equal_the_gguf_dequantized_model(
        tmp_path: Path, hf_model: Any, types: Any, head: str) -> None:
    file = tmp_path / "mx.gguf"
    data = write_quantized_gguf(hf_model, file, types, embedding="Q8_0", head=head)
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    reference = load_model({"gguf": str(file)})  # every tensor through gguf.quants.dequantize
    codes = [m for m in native.model.layers.modules() if isinstance(m, FloatCodeLinear)]
    assert {m.format_name for m in codes} == {"mxfp4"}
    assert len(codes) == LAYERS * (4 if types == "MXFP4" else 2)
    if types == MIXED:
        assert sum(isinstance(m, QuantLinear) for m in native.model.layers.modules()) == 4
    assert isinstance(native.model.lm_head, FloatCodeLinear) == (head == "MXFP4")
    assert "-> mxfp4" in native.source
    # o_proj / the head are not RoPE-permuted: their values are gguf-py's, exactly
    o_proj = native.model.layers[1].self_attn.o_proj
    if isinstance(o_proj, FloatCodeLinear):
        want = dequantize(data["blk.1.attn_output.weight"], MXFP4)
        assert torch.equal(o_proj.dequantized_weight(), torch.from_numpy(want))
    ids = torch.arange(2, 40) % VOCAB
    a, b = _logits(native, ids), _logits(reference, ids)
    assert (a - b).abs().max().item() <= 1e-4
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    priced = weight_bytes(native.config, "float32", native_quant(NATIVE, {"gguf": str(file)}))
    assert priced == native.weight_bytes == stored_weight_bytes(native.model)


def test_the_storage_is_codes_and_scales_and_no_float_copy_is_made(
        tmp_path: Path, hf_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "mx.gguf"
    write_quantized_gguf(hf_model, file, "MXFP4", embedding="Q8_0", head="MXFP4")
    dequantized = spy_dequantize(monkeypatch)
    with FloatAllocations() as allocations:
        loaded = load_model({"gguf": str(file)}, quant=NATIVE)
    shapes = {shape for shape, _ in allocations.seen}
    head = (VOCAB, HIDDEN)
    assert not shapes & (PROJECTIONS | PARTS | {head}), "a float matrix was materialized"
    assert not set(dequantized) & (PARTS | {head})
    assert dequantized  # the norms were
    for module in [*loaded.model.layers.modules(), loaded.model.lm_head]:
        if not isinstance(module, FloatCodeLinear):
            continue
        n, k = module.out_features, module.in_features
        held = [(tuple(t.shape), t.dtype) for t in [*module.parameters(), *module.buffers()]]
        assert held == [((n, k // 2), torch.uint8), ((n, k // 32), torch.uint8)]
        assert module.stored_bytes == n * k * 17 // 32
    floats = {tuple(t.shape) for t in [*loaded.model.parameters(), *loaded.model.buffers()]
              if t.is_floating_point()}
    assert not floats & (PROJECTIONS | PARTS | {head})


def test_predict_counts_the_stored_mxfp4_bytes(
        tmp_path: Path, hf_model: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "mx.gguf"
    write_quantized_gguf(hf_model, file, "MXFP4", embedding="Q8_0", head="MXFP4")
    code, out, err = run_cli(monkeypatch, capsys, "predict", "--model", str(file),
                             "--quant", "native", "--dtype", "float32", "--json")
    assert code == 0, err
    [row] = json.loads(out)
    # 17 bytes per 32 weights (projections, head), Q8_0 34 per 32 (the embedding's
    # int8/32), float32 norms (2 per layer and the final one)
    expect = ((LAYERS * LAYER_WEIGHTS + VOCAB * HIDDEN) * 17 // 32 + VOCAB * HIDDEN * 34 // 32
              + (2 * LAYERS + 1) * HIDDEN * 4)
    assert row["weight_bytes"] == expect
    assert load_model({"gguf": str(file)}, quant=NATIVE).weight_bytes == expect


def test_an_mxfp4_embedding_is_dequantized_and_priced_so(
        tmp_path: Path, hf_tied: Any) -> None:
    """The gather reads int4 / int8 tables only: an MXFP4 token_embd (here also the tied
    head) is dequantized to the model dtype, the projections still run as stored."""
    file = tmp_path / "tied.gguf"
    write_quantized_gguf(hf_tied, file, "MXFP4", embedding="MXFP4")
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    assert not isinstance(native.model.embed_tokens, QuantEmbedding)
    assert "embedding + tied LM head MXFP4 dequantized to float32" in native.source
    assert "native MXFP4 x14 -> mxfp4" in native.source
    priced = weight_bytes(native.config, "float32", native_quant(NATIVE, {"gguf": str(file)}))
    assert priced == native.weight_bytes


def test_infbench_run_runs_an_mxfp4_file_and_predicts_its_bytes(
        tmp_path: Path, hf_model: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "mx.gguf"
    write_quantized_gguf(hf_model, file, MIXED, embedding="Q8_0", head="MXFP4")
    scenario = tmp_path / "mx.yaml"
    scenario.write_text(f"""
name: native_mx
device: cpu
dtype: float32
hardware: cpu
model: {{gguf: {file}, quant: {{weights: native}}}}
workload: {{kind: static, batch_size: 2, prompt_len: 8, gen_len: 4, seed: 0}}
engine: {{block_size: 4, max_num_batched_tokens: 32}}
measure: {{warmup: 0, repeats: 1}}
""")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                           str(tmp_path / "out"))
    assert code == 0, err
    result = json.loads(next((tmp_path / "out").glob("native_mx_*.json")).read_text())
    stored = load_model({"gguf": str(file)}, quant=NATIVE).weight_bytes
    assert result["metrics"]["weight_bytes"] == result["prediction"]["weight_bytes"] == stored


# ---------------------------------------------------------------- malformed tensors
def _set_columns(file: Path, name: str, columns: int) -> None:
    """Rewrite the first (column) dimension of tensor `name` in the file's header."""
    raw = bytearray(file.read_bytes())
    key = name.encode()
    at = raw.find(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    assert int.from_bytes(raw[at:at + 4], "little") == 2  # two dimensions
    raw[at + 4:at + 12] = columns.to_bytes(8, "little")
    file.write_bytes(bytes(raw))


def _one_error_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                    *args: str) -> str:
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize(("columns", "why"), [
    (192, r"its 6528 bytes at data offset \d+ run into the next tensor \(5440 bytes there\)"),
    (176, "rows of 176 values are not whole blocks of 32"),
])
def test_an_mxfp4_tensor_of_the_wrong_byte_count_is_one_error_line(
        tmp_path: Path, hf_model: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], columns: int, why: str) -> None:
    """blk.0.ffn_down stores 64 x 160 values (5440 bytes); a header saying 64 x 192 asks
    for 6528 bytes, which would read the next tensor's."""
    file = tmp_path / "bad.gguf"
    write_quantized_gguf(hf_model, file, "MXFP4")
    _set_columns(file, "blk.0.ffn_down.weight", columns)
    tensor = f"tensor 'blk.0.ffn_down.weight' (MXFP4, 64 x {columns})"
    for args in (["predict", "--model", str(file), "--quant", "native"],
                 ["predict", "--model", str(file)]):
        err = _one_error_line(monkeypatch, capsys, *args)
        assert str(file) in err and tensor in err
        assert re.search(why, err), err
    for quant in (NATIVE, None):
        with pytest.raises(DamagedFileError, match=why) as exc:
            load_model({"gguf": str(file)}, quant=quant)
        assert str(file) in str(exc.value) and tensor in str(exc.value)


def test_the_last_tensor_cut_short_is_named(tmp_path: Path, hf_model: Any) -> None:
    file = tmp_path / "short.gguf"
    write_quantized_gguf(hf_model, file, "MXFP4")
    last = gguf.GGUFReader(str(file)).tensors[-1]
    file.write_bytes(file.read_bytes()[:-(last.n_bytes // 2)])
    with pytest.raises(DamagedFileError, match=f"tensor '{last.name}'.*past the end of the file"):
        load_model({"gguf": str(file)}, quant=NATIVE)


@pytest.mark.parametrize("quant", [NATIVE, None], ids=["native", "dequantized"])
def test_an_mxfp4_nan_scale_in_a_file_is_one_error_naming_the_tensor(
        tmp_path: Path, hf_model: Any, monkeypatch: pytest.MonkeyPatch,
        quant: QuantConfig | None) -> None:
    real = gguf_quant.quantize

    def nan_scale(w: np.ndarray, type_name: str) -> np.ndarray:
        blocks = real(w, type_name)
        if w.shape == (64, 160):  # ffn_down: its first block's E8M0 byte
            blocks[0, 0] = 255
        return blocks

    monkeypatch.setattr(gguf_quant, "quantize", nan_scale)
    file = tmp_path / "nan.gguf"
    write_quantized_gguf(hf_model, file, "MXFP4")
    with pytest.raises(DamagedFileError, match=r"tensor 'blk.0.ffn_down.weight' \(MXFP4\): 1 "
                                               "MXFP4 block.*scale byte 255") as exc:
        load_model({"gguf": str(file)}, quant=quant)
    assert str(exc.value).startswith(f"{file}: ")
