"""GGUF loading on tiny files written here in llama.cpp's layout (permuted q/k, blk.N names)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from model_checkpoints import llama_cpp_permute, write_gguf_from_hf, write_hf_llama

from infbench.checkpoint.metadata import config_from_gguf
from infbench.core.errors import UserError
from infbench.model.context import DenseContext
from infbench.model.loader import load_model, unpermute_rope_rows


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(
            model(ids, torch.arange(len(ids)), DenseContext.single(len(ids)))
        )


@pytest.mark.parametrize(
    ("dtype", "tol"), [(np.float32, 1e-4), (np.float16, 5e-3)], ids=["f32", "f16"]
)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gguf_logits_match_transformers(
    tmp_path: Path, dtype: type, tol: float, tied: bool
) -> None:
    hf = write_hf_llama(tmp_path / "hf", tie_word_embeddings=tied)
    file = tmp_path / "tiny.gguf"
    write_gguf_from_hf(hf, file, dtype)
    loaded = load_model({"gguf": str(file)})
    assert loaded.config.tie_word_embeddings is tied and loaded.tokenizer is None
    assert "gguf" in loaded.source and ("F16" in loaded.source) == (dtype == np.float16)
    ids = torch.randint(0, 96, (13,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert (_logits(loaded.model, ids) - ref).abs().max().item() < tol


def test_config_from_gguf_fields(tmp_path: Path) -> None:
    hf = write_hf_llama(tmp_path / "hf", num_key_value_heads=1)
    write_gguf_from_hf(hf, tmp_path / "t.gguf")
    cfg = config_from_gguf(tmp_path / "t.gguf")
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.intermediate_size) == (
        96,
        64,
        2,
        96,
    )
    assert (cfg.num_heads, cfg.kv_heads, cfg.attention.kind, cfg.max_seq_len) == (4, 1, "mqa", 128)
    assert cfg.rms_norm_eps == pytest.approx(1e-5) and not cfg.tie_word_embeddings


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.arange(6 * 16 * 3, dtype=np.float32).reshape(6 * 16, 3)  # 6 heads of dim 16
    permuted = torch.from_numpy(llama_cpp_permute(w, 6).copy())
    assert not torch.equal(permuted, torch.from_numpy(w))
    assert torch.equal(unpermute_rope_rows(permuted, 6), torch.from_numpy(w))


def test_unsupported_tensor_type_is_a_user_error(tmp_path: Path) -> None:
    import gguf

    file = tmp_path / "iq4.gguf"
    w = gguf.GGUFWriter(str(file), "llama")
    for key, value in [
        ("block_count", 1),
        ("embedding_length", 64),
        ("feed_forward_length", 64),
        ("attention.head_count", 4),
        ("context_length", 64),
    ]:
        w.add_uint32(f"llama.{key}", value)
    w.add_uint32("llama.vocab_size", 32)
    # IQ4_NL: 18 bytes per block of 32 values (a lookup-table type gguf_types does not load).
    w.add_tensor(
        "token_embd.weight",
        np.zeros((32, 2 * 18), np.uint8),
        raw_dtype=gguf.GGMLQuantizationType.IQ4_NL,
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(
        UserError, match="unsupported type IQ4_NL; supported: F32, F16, BF16, Q4_0, Q4_1, "
        "Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"
    ):
        load_model({"gguf": str(file)})
