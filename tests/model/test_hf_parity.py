"""Logits of our Transformer equal transformers' on tiny random checkpoints (fp32, < 1e-4)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
from model_checkpoints import write_hf_llama

from infbench.checkpoint.metadata import config_from_hf_dir
from infbench.model.context import DenseContext
from infbench.model.loader import load_model

TOL = 1e-4
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 10000.0,
}
CASES: dict[str, dict[str, Any]] = {
    "mha": dict(num_key_value_heads=4),
    "gqa": dict(num_key_value_heads=2),
    "mqa": dict(num_key_value_heads=1),
    "gqa-tied": dict(num_key_value_heads=2, tie_word_embeddings=True),
    "rope-llama3": dict(rope_parameters=LLAMA3_ROPE),
    "rope-linear": dict(
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    ),
    "head-dim-32": dict(head_dim=32, num_key_value_heads=2),
    "mistral-window": dict(arch="mistral", sliding_window=5),
}
SEQ_LEN = 19  # past the Mistral window, not a power of two


def _ours(path: Path) -> Any:
    return load_model({"path": str(path)}).model


def _our_logits(model: Any, ids: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
    positions = torch.cat([torch.arange(b - a) for a, b in pairwise(cu_seqlens)])
    with torch.no_grad():
        hidden = model(ids, positions, DenseContext(cu_seqlens))  # (T, H)
        return model.compute_logits(hidden)  # (T, V)


def _hf_logits(hf: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(ids[None]).logits[0].float()  # (T, V)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_logits_match_transformers(tmp_path: Path, case: str) -> None:
    cfg = dict(CASES[case])
    hf = write_hf_llama(tmp_path, **cfg)
    model = _ours(tmp_path)
    ids = torch.randint(0, 96, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    ours, ref = _our_logits(model, ids, [0, SEQ_LEN]), _hf_logits(hf, ids)
    assert ours.dtype == torch.float32 and ours.shape == (SEQ_LEN, 96)
    assert (ours - ref).abs().max().item() < TOL


@pytest.mark.parametrize("case", ["gqa", "gqa-tied", "mistral-window"])
def test_packed_sequences_equal_each_alone(tmp_path: Path, case: str) -> None:
    hf = write_hf_llama(tmp_path, **CASES[case])
    model = _ours(tmp_path)
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, 96, (11,), generator=gen), torch.randint(0, 96, (17,), generator=gen)
    packed = _our_logits(model, torch.cat([a, b]), [0, 11, 28])  # (28, V)
    alone_a, alone_b = _our_logits(model, a, [0, 11]), _our_logits(model, b, [0, 17])
    torch.testing.assert_close(packed[:11], alone_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[11:], alone_b, atol=1e-5, rtol=0)
    assert (packed[11:] - _hf_logits(hf, b)).abs().max().item() < TOL


def test_window_changes_logits_past_the_window(tmp_path: Path) -> None:
    # Guards the Mistral case above: with the window ignored the late logits differ.
    write_hf_llama(tmp_path, **CASES["mistral-window"])
    windowed = load_model({"path": str(tmp_path)}).model
    full = load_model(
        {"path": str(tmp_path)}, overrides={"attention": {"kind": "gqa", "window": None}}
    ).model
    ids = torch.randint(0, 96, (SEQ_LEN,), generator=torch.Generator().manual_seed(3))
    lw, lf = _our_logits(windowed, ids, [0, SEQ_LEN]), _our_logits(full, ids, [0, SEQ_LEN])
    torch.testing.assert_close(lw[:5], lf[:5])  # inside the window: identical
    assert (lw[5:] - lf[5:]).abs().max().item() > 1e-3


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4)
    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    ).eval()
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    ids = torch.randint(0, 96, (9,), generator=torch.Generator().manual_seed(5))
    ours = _our_logits(_ours(tmp_path), ids, [0, 9])
    assert (ours - _hf_logits(hf, ids)).abs().max().item() < TOL


def test_config_from_hf_dir_fields(tmp_path: Path) -> None:
    write_hf_llama(
        tmp_path,
        arch="mistral",
        sliding_window=5,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )
    cfg = config_from_hf_dir(tmp_path)
    assert (cfg.name, cfg.arch) == (tmp_path.name, "mistral")
    assert (cfg.num_heads, cfg.kv_heads, cfg.dim_head, cfg.max_seq_len) == (4, 2, 16, 128)
    assert cfg.attention.kind == "sliding" and cfg.attention.window == 5
    assert cfg.tie_word_embeddings and cfg.rms_norm_eps == 1e-6 and cfg.rope_scaling is None
    assert [spec.window for spec in cfg.layers()] == [5, 5]


def test_config_rope_scaling_is_sorted_items(tmp_path: Path) -> None:
    write_hf_llama(tmp_path, rope_parameters=LLAMA3_ROPE, num_key_value_heads=4)
    cfg = config_from_hf_dir(tmp_path)
    assert cfg.attention.kind == "mha" and cfg.rope_theta == 10000.0
    expected = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    assert cfg.rope_scaling == tuple(sorted(expected.items()))


def test_weight_bytes_count_tied_embedding_once(tmp_path: Path) -> None:
    write_hf_llama(tmp_path, tie_word_embeddings=True)
    tied = load_model({"path": str(tmp_path)})
    # embed 96*64 + final norm 64 + per layer: qkv (64+2*32)*64, o 64*64, gate_up 192*64,
    # down 64*96, two norms 64; 4 bytes each
    per_layer = 128 * 64 + 64 * 64 + 192 * 64 + 64 * 96 + 2 * 64
    assert tied.weight_bytes == 4 * (96 * 64 + 2 * per_layer + 64)
    half = load_model({"path": str(tmp_path)}, dtype="float16")
    assert half.weight_bytes * 2 == tied.weight_bytes
    assert half.model.embed_tokens.weight.dtype == torch.float16
