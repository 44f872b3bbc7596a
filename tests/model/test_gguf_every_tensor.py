"""K-quants (Q4_K, Q5_K, Q6_K) and BF16: every tensor of a GGUF file, as the engine holds it,
is gguf-py's dequantization of that tensor; and the CLI's one-line errors for a tensor type
or a tokenizer model it cannot read.

Each file has every projection, the token embedding and the untied LM head in one type
(the norms F32, as llama.cpp writes them).  Without `quant.weights: native` the loader
dequantizes, so each engine matrix (q/k/v and gate/up fused, q/k back in HF's row order)
must equal gguf-py bit for bit.  Under native, Q4_K and Q6_K stay in int4/32 and int8/16,
whose one fp16 rounding of the sub-block scale (`model/gguf_blocks.py`) bounds the
difference; Q5_K and BF16 have no kernel and are dequantized as without native.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from gguf_quant import write_quantized_gguf
from model_checkpoints import write_hf_llama

from infbench.core.config import QuantConfig
from infbench.model.loader import load_model, unpermute_rope_rows
from infbench.model.quant import QuantEmbedding, QuantLinear

QT = gguf.GGMLQuantizationType
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2)
NATIVE = {"Q4_K": ("int4", 32), "Q6_K": ("int8", 16)}  # the others are dequantized


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_hf_llama(tmp_path_factory.mktemp("hf"), **SHAPE)


def _engine_matrices(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module | torch.Tensor,
                                                                 slice]]:
    """GGUF tensor name -> (the engine module or parameter holding it, its rows there)."""
    cfg = model.config
    d = cfg.dim_head
    q, kv = cfg.num_heads * d, cfg.kv_heads * d
    inter = cfg.intermediate_size
    out: dict[str, tuple[Any, slice]] = {
        "token_embd.weight": (model.embed_tokens, slice(None)),
        "output.weight": (model.lm_head, slice(None)),
        "output_norm.weight": (model.norm.weight, slice(None)),
    }
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        out.update({
            f"blk.{i}.attn_q.weight": (attn.qkv_proj, slice(0, q)),
            f"blk.{i}.attn_k.weight": (attn.qkv_proj, slice(q, q + kv)),
            f"blk.{i}.attn_v.weight": (attn.qkv_proj, slice(q + kv, q + 2 * kv)),
            f"blk.{i}.attn_output.weight": (attn.o_proj, slice(None)),
            f"blk.{i}.ffn_gate.weight": (mlp.gate_up_proj, slice(0, inter)),
            f"blk.{i}.ffn_up.weight": (mlp.gate_up_proj, slice(inter, 2 * inter)),
            f"blk.{i}.ffn_down.weight": (mlp.down_proj, slice(None)),
            f"blk.{i}.attn_norm.weight": (layer.input_layernorm.weight, slice(None)),
            f"blk.{i}.ffn_norm.weight": (layer.post_attention_layernorm.weight, slice(None)),
        })
    return out


def _held(holder: Any) -> tuple[torch.Tensor, Any]:
    """(float32 values the engine multiplies by, its stored format or None)."""
    if isinstance(holder, QuantEmbedding):
        holder = holder.table
    if isinstance(holder, QuantLinear):
        return holder.dequantized_weight().float(), holder.weight_format()
    if isinstance(holder, torch.nn.Module):
        holder = holder.weight
    return holder.detach().float(), None


def _reference(name: str, raw: np.ndarray, qtype: QT, cfg: Any) -> torch.Tensor:
    """gguf-py's dequantization of a tensor, q/k rows back in HF's order."""
    ref = torch.from_numpy(np.array(dequantize(raw, qtype), dtype=np.float32))
    if ".attn_q." in name:
        ref = unpermute_rope_rows(ref, cfg.num_heads)
    elif ".attn_k." in name:
        ref = unpermute_rope_rows(ref, cfg.kv_heads)
    return ref


@pytest.mark.parametrize("native", [False, True], ids=["dequantized", "native"])
@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "BF16"])
def test_every_tensor_is_gguf_pys_dequantization(tmp_path: Path, hf_model: Any,
                                                  type_name: str, native: bool) -> None:
    file = tmp_path / f"{type_name}.gguf"
    written = write_quantized_gguf(hf_model, file, type_name, embedding=type_name,
                                   head=type_name)
    quant = QuantConfig(weights="native") if native else None
    loaded = load_model({"gguf": str(file)}, quant=quant)
    assert f"{type_name} x16" in loaded.source  # 14 projections, the embedding, the head
    reader = gguf.GGUFReader(str(file))
    matrices = _engine_matrices(loaded.model)
    assert {t.name for t in reader.tensors} == set(matrices) == set(written)
    stored_as = set()
    for tensor in reader.tensors:
        holder, rows = matrices[tensor.name]
        got, fmt = _held(holder)
        got = got[rows]
        ref = _reference(tensor.name, tensor.data, tensor.tensor_type, loaded.config)
        assert got.shape == ref.shape, tensor.name
        if fmt is None:
            assert torch.equal(got, ref), tensor.name
            continue
        stored_as.add((type(fmt).__name__, fmt.group_size))
        # One fp16 rounding of each sub-block's scale (and Q4_K's min): |error| <= 2^-11 of
        # (scale * the largest code + |min|), per group of columns.
        scales = fmt.scales.float()[rows].repeat_interleave(fmt.group_size, dim=1)
        mins = (fmt.mins.float()[rows].repeat_interleave(fmt.group_size, dim=1)
                if hasattr(fmt, "mins") else 0.0)
        top = 15 if type_name == "Q4_K" else 32
        bound = (top * scales.abs() + abs(mins)) * 2.0 ** -11 + 1e-12  # type: ignore[arg-type]
        assert ((got - ref).abs() <= bound).all(), tensor.name
    if native and type_name in NATIVE:
        kind, group = NATIVE[type_name]
        assert stored_as == {({"int4": "Int4Weight", "int8": "Int8Weight"}[kind], group)}
    else:
        assert not stored_as  # no kernel for Q5_K, BF16 is float: dequantized


# ---------------------------------------------------------------- bad input through the CLI
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infbench.cli", *args], capture_output=True,
                          text=True, timeout=300)


def _tiny_gguf(path: Path, embedding_type: QT | None = None,
               tokenizer_model: str | None = None) -> None:
    """A 1-layer llama GGUF (hidden 64) with random F32 tensors, its embedding optionally
    in another type, and optionally a tokenizer of the named kind."""
    rng = np.random.default_rng(0)
    vocab, hidden, inter = 32, 64, 128
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    if tokenizer_model is not None:
        w.add_tokenizer_model(tokenizer_model)
        w.add_token_list([f"t{i}" for i in range(vocab)])
        w.add_token_types([1] * vocab)
    f32 = lambda *shape: rng.normal(0, 0.02, shape).astype(np.float32)
    if embedding_type is None:
        w.add_tensor("token_embd.weight", f32(vocab, hidden))
    else:  # IQ4_NL: 18 bytes per 32 values
        w.add_tensor("token_embd.weight", np.zeros((vocab, hidden // 32 * 18), np.uint8),
                     raw_dtype=embedding_type)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for leaf, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden, hidden)),
                        ("attn_v", (hidden, hidden)), ("attn_output", (hidden, hidden)),
                        ("ffn_gate", (inter, hidden)), ("ffn_up", (inter, hidden)),
                        ("ffn_down", (hidden, inter))):
        w.add_tensor(f"blk.0.{leaf}.weight", f32(*shape))
    for leaf in ("attn_norm", "ffn_norm"):
        w.add_tensor(f"blk.0.{leaf}.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(("kind", "names"), [
    ("tensor", ["IQ4_NL", "token_embd.weight", "supported: F32, F16, BF16", "Q4_K, Q5_K, Q6_K"]),
    ("tokenizer", ["'bert'", "supported: gpt2", "llama (SentencePiece"]),
])
def test_cli_unsupported_type_or_tokenizer_is_one_line_exit_2(
        tmp_path: Path, kind: str, names: list[str]) -> None:
    file = tmp_path / f"{kind}.gguf"
    if kind == "tensor":
        _tiny_gguf(file, embedding_type=QT.IQ4_NL, tokenizer_model="gpt2")
    else:
        _tiny_gguf(file, tokenizer_model="bert")
    res = _cli("generate", "--model", str(file), "--prompt", "hi", "--max-tokens", "1")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, res.stderr  # (a note: line on the dtype may come before it)
    for name in names:
        assert name in lines[0], lines[0]
