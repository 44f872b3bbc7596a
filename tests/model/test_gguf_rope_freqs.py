"""Llama 3.1's `rope_freqs.weight`: infbench's RoPE frequencies equal transformers' llama3 rope.

The factors are derived from transformers alone (its plain frequencies over its llama3
ones), written into a GGUF as llama.cpp's converter does, and read back by infbench.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from model_checkpoints import llama_cpp_permute, write_hf_llama

from infbench.checkpoint.gguf_rope import llama3_scaling
from infbench.checkpoint.metadata import config_from_gguf
from infbench.core.errors import UserError
from infbench.model.context import DenseContext
from infbench.model.layers import rope_inv_freq
from infbench.model.loader import load_model

LEAVES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
          "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _transformers_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None
                           ) -> torch.Tensor:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "default", "rope_theta": theta, **(scaling or {})}
    cfg = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, rope_parameters=params)
    inv_freq, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu") if scaling else (
        1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim),
        1.0)
    return inv_freq


def _file_factors(head_dim: int, theta: float, scaling: dict[str, Any]) -> np.ndarray:
    """What the converter writes: plain frequency / scaled frequency, float32."""
    plain = _transformers_inv_freq(head_dim, theta, None)
    scaled = _transformers_inv_freq(head_dim, theta, scaling)
    return (plain.double() / scaled.double()).float().numpy()


LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize(("head_dim", "theta", "scaling"), [
    (128, 500000.0, LLAMA31),  # Llama 3.1 8B/70B's own
    (64, 500000.0, {**LLAMA31, "factor": 32.0}),  # Llama 3.2 1B/3B
    (64, 10000.0, {**LLAMA31, "original_max_position_embeddings": 256}),
    (16, 500000.0, LLAMA31),  # one blended entry: the band pinned at its edges
], ids=["llama3.1", "llama3.2", "short-original", "one-blended"])
@pytest.mark.parametrize("original", [None, "true"])
def test_rope_freqs_give_transformers_llama3_frequencies(
        head_dim: int, theta: float, scaling: dict[str, Any], original: str | None) -> None:
    factors = _file_factors(head_dim, theta, scaling)
    known = scaling["original_max_position_embeddings"] if original else None
    items = llama3_scaling([float(f) for f in factors], head_dim, theta, known)
    assert items is not None and dict(items)["rope_type"] == "llama3"
    ours = rope_inv_freq(head_dim, theta, dict(items))
    want = _transformers_inv_freq(head_dim, theta, scaling)
    torch.testing.assert_close(ours, want, rtol=2e-6, atol=0)
    assert not torch.allclose(want, _transformers_inv_freq(head_dim, theta, None))
    if original and head_dim > 16:  # the file's context: the parameters themselves come back
        got = dict(items)
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            assert got[name] == pytest.approx(scaling[name], rel=1e-4), name


def test_rope_freqs_that_are_not_llama3_are_refused() -> None:
    factors = [float(f) for f in _file_factors(64, 10000.0, {
        **LLAMA31, "original_max_position_embeddings": 256})]
    assert 1 < factors[10] < 8
    factors[10] *= 1.2  # one blended factor off the llama3 curve
    with pytest.raises(ValueError, match=r"factor \d+ is .* where llama3 scaling"):
        llama3_scaling(factors, 64, 10000.0, None)
    with pytest.raises(ValueError, match="needs 32"):
        llama3_scaling(factors[:-1], 64, 10000.0, None)
    assert llama3_scaling([1.0] * 32, 64, 10000.0, None) is None


def _write_gguf(model: Any, path: Path, factors: np.ndarray | None,
                original: int | None = None, scaling_type: str | None = None) -> None:
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    if original is not None:
        w.add_rope_scaling_orig_ctx_len(original)
    if scaling_type is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType(scaling_type))
        w.add_rope_scaling_factor(2.0)
    if factors is not None:
        w.add_tensor("rope_freqs.weight", factors.astype(np.float32))
    for name, t in model.state_dict().items():
        arr = t.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            out = "output.weight"
        else:
            leaf = name.split(".")[-2]
            out = f"blk.{name.split('.')[2]}.{LEAVES[leaf]}.weight"
            if leaf in ("q_proj", "k_proj"):
                heads = c.num_attention_heads if leaf == "q_proj" else c.num_key_value_heads
                arr = llama_cpp_permute(arr, heads)
        w.add_tensor(out, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


SCALING = {**LLAMA31, "original_max_position_embeddings": 32}


@pytest.fixture(scope="module")
def hf_llama31(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_hf_llama(tmp_path_factory.mktemp("hf"), hidden_size=64, num_attention_heads=2,
                          num_key_value_heads=1, max_position_embeddings=256,
                          rope_parameters={"rope_theta": 10000.0, **SCALING})


def test_gguf_with_rope_freqs_runs_transformers_llama31_logits(
        tmp_path: Path, hf_llama31: Any) -> None:
    file = tmp_path / "llama31.gguf"
    factors = _file_factors(32, 10000.0, SCALING)
    assert (factors > 1).any() and (factors == 1).any()
    _write_gguf(hf_llama31, file, factors, original=32)
    config = config_from_gguf(file)
    assert dict(config.rope_scaling or ())["rope_type"] == "llama3"
    loaded = load_model({"gguf": str(file)})
    ids = torch.arange(3, 83) % 96  # 80 positions: past the 32-token original context
    with torch.no_grad():
        ref = hf_llama31(ids[None]).logits[0]
        got = loaded.model.compute_logits(loaded.model(ids, torch.arange(len(ids)),
                                                       DenseContext.single(len(ids))))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    # Without the factors the same weights give other logits: the test sees the scaling.
    plain = tmp_path / "plain.gguf"
    _write_gguf(hf_llama31, plain, None)
    other = load_model({"gguf": str(plain)})
    with torch.no_grad():
        got_plain = other.model.compute_logits(other.model(ids, torch.arange(len(ids)),
                                                           DenseContext.single(len(ids))))
    assert (got_plain - ref).abs().max() > 100 * (got - ref).abs().max()


def test_rope_freqs_errors_are_one_line(tmp_path: Path, hf_llama31: Any) -> None:
    factors = _file_factors(32, 10000.0, SCALING)
    bent = factors.copy()
    bent[-1] = 0.5
    for name, kwargs, words in (
        ("bent", dict(factors=bent), "not Llama 3's rope scaling"),
        ("both", dict(factors=factors, scaling_type="linear"), "both scale RoPE"),
    ):
        file = tmp_path / f"{name}.gguf"
        _write_gguf(hf_llama31, file, **kwargs)
        with pytest.raises(UserError) as info:
            config_from_gguf(file)
        message = str(info.value)
        assert "\n" not in message and words in message and "supported:" in message
