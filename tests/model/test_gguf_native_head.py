"""`weights: native` on a GGUF file's quantized token embedding and LM head: `token_embd`
in Q8_0 / Q4_0 / ... becomes a `QuantEmbedding` (the gather dequantizes only its rows; a
tied head multiplies the same bytes through its `QuantLinear`), `output` a `QuantLinear`
head; the logits equal the dequantize-then-float path's, the bytes the prediction's, and
`quant.head: int8` keeps a head the file already stores quantized."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_helpers import run_cli
from gguf_quant import FloatAllocations, write_quantized_gguf
from model_checkpoints import write_hf_llama

from infbench.checkpoint.metadata import native_quant
from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.context import DenseContext
from infbench.model.hf_writer import hf_tensors
from infbench.model.linear import use_cpu_linears
from infbench.model.loader import LoadedModel, load_model
from infbench.model.quant import QuantEmbedding, QuantLinear, quantized_head, stored_weight_bytes
from infbench.roofline.shapes import weight_bytes

NATIVE = QuantConfig(weights="native")
SHAPE = dict(intermediate_size=160, num_attention_heads=4, num_key_value_heads=2)
VOCAB, HIDDEN = 96, 64  # write_hf_llama's embedding


def _logits(loaded: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = loaded.model(ids, torch.arange(len(ids)), DenseContext.single(len(ids)))
        return loaded.model.compute_logits(hidden)


def _predicted(loaded: LoadedModel, file: Path, dtype: str, quant: QuantConfig = NATIVE) -> int:
    return weight_bytes(loaded.config, dtype, native_quant(quant, {"gguf": str(file)}))


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_hf_llama(tmp_path_factory.mktemp("tied"), tie_word_embeddings=True, **SHAPE)


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_hf_llama(tmp_path_factory.mktemp("untied"), **SHAPE)


@pytest.mark.parametrize(("embedding", "fmt"), [("Q8_0", ("int8", 32)), ("Q4_0", ("int4", 32))])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_tied_quantized_embedding_is_the_head_and_the_gather(
        tmp_path: Path, tied: Any, embedding: str, fmt: tuple[str, int], dtype: str) -> None:
    file = tmp_path / "tied.gguf"
    write_quantized_gguf(tied, file, "Q4_1", embedding=embedding)
    native = load_model({"gguf": str(file)}, dtype=dtype, quant=NATIVE)
    floats = load_model({"gguf": str(file)}, dtype=dtype)
    embed = native.model.embed_tokens
    assert isinstance(embed, QuantEmbedding) and native.model.lm_head is None
    assert (embed.table.kind, embed.table.group_size) == fmt
    assert quantized_head(native.model) is embed.table
    assert f"embedding + tied LM head {embedding} -> {fmt[0]}/{fmt[1]}" in native.source
    ids = torch.tensor([0, 5, 5, 95, 17, 3, 64])
    rows = embed(ids)
    assert rows.dtype == floats.model.dtype and rows.shape == (len(ids), HIDDEN)
    assert torch.equal(rows, floats.model.embed_tokens(ids))  # the same values, exactly
    a, b = _logits(native, ids).float(), _logits(floats, ids).float()
    tol = 1e-5 if dtype == "float32" else 2e-2
    assert (a - b).abs().max().item() <= tol * b.abs().max().item()
    # One copy of the table: the float embedding's bytes, less what quantization saves.
    table = embed.table.weight_format().nbytes
    assert floats.weight_bytes - native.weight_bytes > VOCAB * HIDDEN * 2 - table
    assert native.weight_bytes == stored_weight_bytes(native.model) == \
        _predicted(native, file, dtype)


def test_an_untied_file_runs_its_quantized_embedding_and_output_each_in_its_format(
        tmp_path: Path, untied: Any) -> None:
    file = tmp_path / "untied.gguf"
    write_quantized_gguf(untied, file, "Q4_0", embedding="Q4_1", head="Q8_0")
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    floats = load_model({"gguf": str(file)})
    embed, head = native.model.embed_tokens, native.model.lm_head
    assert isinstance(embed, QuantEmbedding) and isinstance(head, QuantLinear)
    assert (embed.table.kind, head.kind, head.group_size) == ("int4", "int8", 32)
    assert "embedding Q4_1 -> int4/32, LM head Q8_0 -> int8/32" in native.source
    ids = torch.arange(0, VOCAB, 7)
    assert torch.equal(embed(ids), floats.model.embed_tokens(ids))
    a, b = _logits(native, ids), _logits(floats, ids)
    assert (a - b).abs().max().item() <= 1e-5 * b.abs().max().item()
    assert native.weight_bytes == stored_weight_bytes(native.model) == \
        _predicted(native, file, "float32")


def test_no_float_copy_of_a_quantized_embedding_is_made(tmp_path: Path, tied: Any) -> None:
    file = tmp_path / "tied.gguf"
    write_quantized_gguf(tied, file, "Q4_1", embedding="Q8_0")
    with FloatAllocations() as allocations:
        loaded = load_model({"gguf": str(file)}, quant=NATIVE)
        use_cpu_linears(loaded.model, "cpu")  # the C++ GEMV for the head's few rows
        _logits(loaded, torch.arange(2, 9))  # the gather and the head too
    assert (VOCAB, HIDDEN) not in {shape for shape, _ in allocations.seen}


@pytest.mark.parametrize("embedding", ["F16", "F32"])
def test_a_float_embedding_stays_an_nn_embedding(tmp_path: Path, tied: Any,
                                                 embedding: str) -> None:
    file = tmp_path / "f.gguf"
    write_quantized_gguf(tied, file, "Q8_0", embedding=embedding)
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    assert isinstance(native.model.embed_tokens, torch.nn.Embedding)
    assert quantized_head(native.model) is None
    assert native.source.endswith("; native Q8_0 x14 -> int8/32)")
    assert native.weight_bytes == _predicted(native, file, "float32")


def test_a_k_quant_embedding_without_kernel_is_dequantized_and_says_so(
        tmp_path: Path) -> None:
    model = write_hf_llama(tmp_path / "hf", hidden_size=256, tie_word_embeddings=True,
                           **dict(SHAPE, intermediate_size=512))  # K-quants: 256-value rows
    file = tmp_path / "q5k.gguf"
    write_quantized_gguf(model, file, "Q4_K", embedding="Q5_K")
    native = load_model({"gguf": str(file)}, quant=NATIVE)
    assert isinstance(native.model.embed_tokens, torch.nn.Embedding)
    assert "embedding + tied LM head Q5_K dequantized to float32 (no kernel" in native.source
    assert native.weight_bytes == _predicted(native, file, "float32")


# ------------------------------------------------------------------ quant.head: int8 too
def test_head_int8_keeps_the_files_quantized_head_and_says_so(tmp_path: Path,
                                                              tied: Any) -> None:
    file = tmp_path / "tied.gguf"
    write_quantized_gguf(tied, file, "Q4_1", embedding="Q8_0")
    quant = dataclasses.replace(NATIVE, head="int8")
    both = load_model({"gguf": str(file)}, quant=quant)
    plain = load_model({"gguf": str(file)}, quant=NATIVE)
    assert getattr(both.model, "head_q", None) is None  # no second (int8/576) copy
    assert "quant.head int8 not applied: the LM head is the file's int8/32 already" in \
        both.source and "LM head int8" not in both.source
    assert both.weight_bytes == plain.weight_bytes == _predicted(both, file, "float32", quant)
    ids = torch.arange(1, 20)
    assert torch.equal(_logits(both, ids), _logits(plain, ids))


def test_head_int8_still_quantizes_a_float_head_under_native(tmp_path: Path,
                                                             tied: Any) -> None:
    file = tmp_path / "f32.gguf"
    write_quantized_gguf(tied, file, "Q4_1")  # token_embd F32
    quant = dataclasses.replace(NATIVE, head="int8")
    loaded = load_model({"gguf": str(file)}, quant=quant)
    head_q = getattr(loaded.model, "head_q", None)
    assert isinstance(head_q, QuantLinear) and head_q.group_size == HIDDEN
    assert "; LM head int8" in loaded.source
    assert loaded.weight_bytes == _predicted(loaded, file, "float32", quant)


# ------------------------------------------------------------------ engine, predict, refusals
def test_engine_cpu_backend_runs_the_quantized_head_as_the_model_does(
        tmp_path: Path, tied: Any) -> None:
    """The `cpu` backend: the fused decode layers, the C++ int8/32 head GEMV for the logits,
    and the gather give the greedy tokens of a full recompute of the model."""
    from engine_helpers import greedy_recompute, make_engine, random_requests

    file = tmp_path / "tied.gguf"
    write_quantized_gguf(tied, file, "Q4_1", embedding="Q8_0")
    loaded = load_model({"gguf": str(file)}, quant=NATIVE)
    requests = random_requests([5, 9, 3], gen=6, vocab=VOCAB)
    engine = make_engine(loaded, requests, backend="cpu")
    out = engine.run(requests, realtime_arrivals=False)
    embed = loaded.model.embed_tokens
    assert isinstance(embed, QuantEmbedding) and embed.table.backend == "cpu"
    for r in requests:
        assert out.outputs[r.request_id] == greedy_recompute(loaded.model, r.prompt_ids, 6)


def test_predict_prices_the_quantized_embedding_and_head(
        tmp_path: Path, tied: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "tied.gguf"
    write_quantized_gguf(tied, file, "Q4_1", embedding="Q8_0")
    stored = load_model({"gguf": str(file)}, dtype="bfloat16", quant=NATIVE).weight_bytes
    code, out, err = run_cli(monkeypatch, capsys, "predict", "--model", str(file), "--quant",
                             "native", "--dtype", "bfloat16", "--json")
    assert code == 0, err
    assert [row["weight_bytes"] for row in json.loads(out)] == [stored]
    mix = native_quant(NATIVE, {"gguf": str(file)}).native_mix
    assert ("embed", "int8/32", VOCAB * HIDDEN) in mix
    assert ("lm_head", "int8/32", VOCAB * HIDDEN) in mix


def test_a_quantized_embedding_cannot_be_written_as_a_float_checkpoint(
        tmp_path: Path, tied: Any) -> None:
    file = tmp_path / "tied.gguf"
    write_quantized_gguf(tied, file, "F32", embedding="Q8_0")
    loaded = load_model({"gguf": str(file)}, quant=NATIVE)
    with pytest.raises(ConfigError, match="quantized model cannot be written"):
        hf_tensors(loaded.model)
