"""MLAAttention logits equal transformers' DeepseekV2ForCausalLM on tiny random checkpoints."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
from mla_checkpoints import VOCAB, write_hf_deepseek_v2

from infbench.checkpoint.metadata import config_from_hf_dir
from infbench.core.errors import UserError
from infbench.model.context import DenseContext
from infbench.model.loader import load_model
from infbench.model.mla import MLAAttention

# Stricter than 1e-4: at these weight scales a wrong RoPE layout, softmax scale or latent
# norm epsilon moves the logits by 7e-5 to 3e-3, a correct model by about 2e-7.
TOL = 1e-5
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,  # != mscale_all_dim: cos/sin get YaRN's attention factor (1.08 / 1.04)
    "mscale_all_dim": 0.4,  # and the softmax scale mscale(4, 0.4)^2
}
CASES: dict[str, dict[str, Any]] = {
    "q-full-rank": {},
    "q-lora": dict(q_lora_rank=24),
    "yarn-q-lora": dict(q_lora_rank=24, rope_parameters=YARN, max_position_embeddings=128),
    "tied-2-heads": dict(num_attention_heads=2, tie_word_embeddings=True),
}
SEQ_LEN = 45  # past YaRN's original 32 positions, not a power of two


def _logits(model: Any, ids: torch.Tensor, cu_seqlens: list[int], config=None) -> torch.Tensor:
    positions = torch.cat([torch.arange(b - a) for a, b in pairwise(cu_seqlens)])
    with torch.no_grad():
        hidden = model(ids, positions, DenseContext(cu_seqlens, config))  # (T, H)
        return model.compute_logits(hidden)  # (T, V)


def _hf_logits(hf: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(ids[None]).logits[0].float()  # (T, V)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_logits_match_transformers(tmp_path: Path, case: str) -> None:
    hf = write_hf_deepseek_v2(tmp_path, **CASES[case])
    loaded = load_model({"path": str(tmp_path)})
    assert all(isinstance(layer.self_attn, MLAAttention) for layer in loaded.model.layers)
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    ref = _hf_logits(hf, ids)
    ours = _logits(loaded.model, ids, [0, SEQ_LEN])
    assert ours.shape == (SEQ_LEN, VOCAB)
    assert (ours - ref).abs().max().item() < TOL
    # With the config the context splits the latent itself: the same logits.
    with_cfg = _logits(loaded.model, ids, [0, SEQ_LEN], loaded.config)
    torch.testing.assert_close(with_cfg, ours, atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", ["q-full-rank", "yarn-q-lora"])
def test_packed_sequences_match_transformers(tmp_path: Path, case: str) -> None:
    hf = write_hf_deepseek_v2(tmp_path, **CASES[case])
    model = load_model({"path": str(tmp_path)}).model
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(0, VOCAB, (11,), generator=gen)
    b = torch.randint(0, VOCAB, (40,), generator=gen)
    packed = _logits(model, torch.cat([a, b]), [0, 11, 51])  # (51, V)
    assert (packed[:11] - _hf_logits(hf, a)).abs().max().item() < TOL
    assert (packed[11:] - _hf_logits(hf, b)).abs().max().item() < TOL


def test_config_mapping(tmp_path: Path) -> None:
    write_hf_deepseek_v2(tmp_path, q_lora_rank=24, rope_parameters=YARN)
    cfg = config_from_hf_dir(tmp_path)
    a = cfg.attention
    assert (cfg.arch, a.kind, cfg.moe) == ("deepseek_v2", "mla", None)
    assert (a.kv_lora_rank, a.q_lora_rank, a.qk_rope_head_dim, a.qk_nope_head_dim,
            a.v_head_dim) == (32, 24, 8, 16, 16)
    assert (cfg.num_heads, cfg.kv_heads, cfg.num_layers, cfg.rms_norm_eps) == (4, 4, 2, 1e-5)
    scaling = cfg.rope_scaling_dict
    assert scaling is not None and scaling["rope_type"] == "yarn" and scaling["factor"] == 4.0
    assert scaling["mscale_all_dim"] == 0.4 and cfg.rope_theta == 10000.0


def test_unsupported_moe_routing_is_a_one_line_user_error(tmp_path: Path) -> None:
    write_hf_deepseek_v2(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.update(first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=16, topk_method="noaux_tc")  # DeepSeek-V3's routing
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="unsupported MoE routing 'noaux_tc'; supported: "
                       "greedy, group_limited_greedy") as info:
        load_model({"path": str(tmp_path)})
    assert "\n" not in str(info.value)


def test_absorbed_weights_are_views_of_kv_b_proj(tmp_path: Path) -> None:
    write_hf_deepseek_v2(tmp_path)
    attn = load_model({"path": str(tmp_path)}).model.layers[0].self_attn
    w_uk, w_uv = attn.absorbed_weights()
    weight = attn.kv_b_proj.weight  # (H * (nope + v), Dl)
    assert w_uk.shape == (4, 16, 32) and w_uv.shape == (4, 16, 32)
    assert w_uk.data_ptr() == weight.data_ptr()
    assert w_uv.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    # Head 1's key rows follow head 0's 16 key + 16 value rows (transformers' layout).
    torch.testing.assert_close(w_uk[1], weight[32:48], rtol=0, atol=0)
    torch.testing.assert_close(w_uv[1], weight[48:64], rtol=0, atol=0)
