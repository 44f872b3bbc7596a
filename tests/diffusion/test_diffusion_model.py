"""The bidirectional model against transformers' LlamaModel with a full attention mask,
through a LLaDA-format checkpoint written in the test (config.json + LLaDA weight names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infbench.core.config import ModelConfig
from infbench.core.errors import UserError
from infbench.model.diffusion import (
    LLADA_NAMES,
    LLADA_TOP,
    BidirectionalContext,
    DiffusionLM,
    check_mask_token,
    load_llada,
)

transformers = pytest.importorskip("transformers")


def _write_llada(llama: torch.nn.Module, cfg: object, root: Path, mask: int | None) -> None:
    """The Llama weights under LLaDA's names and config keys (the inverse of the loader's map)."""
    from safetensors.torch import save_file

    to_llada = {v: k for k, v in LLADA_NAMES.items()}
    top = {v: k for k, v in LLADA_TOP.items()}
    tensors = {}
    for name, tensor in llama.state_dict().items():
        if name in top:
            tensors[top[name]] = tensor.contiguous()
        else:
            _, _, index, leaf = name.split(".", 3)  # model.layers.<i>.<leaf>
            tensors[f"model.transformer.blocks.{index}.{to_llada[leaf]}"] = tensor.contiguous()
    save_file(tensors, str(root / "model.safetensors"))
    data = {
        "model_type": "llada", "d_model": cfg.hidden_size, "n_heads": cfg.num_attention_heads,
        "n_kv_heads": cfg.num_key_value_heads, "n_layers": cfg.num_hidden_layers,
        "mlp_hidden_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
        "embedding_size": cfg.vocab_size, "max_sequence_length": 64, "rope_theta": 500000.0,
        "rms_norm_eps": cfg.rms_norm_eps, "weight_tying": False, "block_type": "llama",
        "activation_type": "silu", "include_bias": False,
    }
    if mask is not None:
        data["mask_token_id"] = mask
    (root / "config.json").write_text(json.dumps(data))


@pytest.fixture(scope="module")
def llama_and_dir(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
        max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attn_implementation="eager",
    )
    llama = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 so a swapped norm is caught
        for p in llama.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    root = tmp_path_factory.mktemp("llada")
    _write_llada(llama, cfg, root, mask=95)
    return llama, root


@pytest.mark.parametrize("batch,length", [(1, 7), (3, 13)])
def test_llada_logits_match_llama_with_full_mask(llama_and_dir, batch: int, length: int) -> None:
    llama, root = llama_and_dir
    lm = load_llada(root)
    assert lm.mask_token_id == 95 and lm.config.num_kv_heads == 2
    tokens = torch.randint(0, 95, (batch, length), generator=torch.Generator().manual_seed(1))
    full = torch.zeros(batch, 1, length, length)  # additive mask: every key visible
    with torch.no_grad():
        ref = llama(input_ids=tokens, attention_mask=full).logits
        causal = llama(input_ids=tokens).logits
        ours = lm.logits(tokens)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    # The reference really is bidirectional: the causal logits differ except at the end.
    assert not torch.allclose(causal[:, 0], ref[:, 0], atol=1e-3)


def test_prefix_cache_context_is_exact_for_a_fixed_canvas(llama_and_dir) -> None:
    """With nothing changing after the prefix, cached prefix K/V give the full-run logits."""
    _, root = llama_and_dir
    lm = load_llada(root)
    tokens = torch.randint(0, 95, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ctx = BidirectionalContext(2, 12, record_prefix=5)
        full = lm.logits(tokens, ctx)
        part = lm.logits(tokens[:, 5:], BidirectionalContext(2, 7, prefix=ctx.recorded), 5)
    torch.testing.assert_close(part, full[:, 5:], rtol=1e-4, atol=1e-4)


def test_llada_config_errors(llama_and_dir, tmp_path: Path) -> None:
    _, root = llama_and_dir
    data = json.loads((root / "config.json").read_text())
    del data["mask_token_id"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    (tmp_path / "model.safetensors").write_bytes((root / "model.safetensors").read_bytes())
    with pytest.raises(UserError, match="has no mask token"):
        load_llada(tmp_path)
    assert load_llada(tmp_path, mask_token_id=3).mask_token_id == 3
    data["model_type"] = "llama"
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="expected 'llada'"):
        load_llada(tmp_path)
    for key, value in (("activation_type", "swiglu"), ("include_qkv_bias", True),
                       ("block_type", "sequential")):
        (tmp_path / "config.json").write_text(json.dumps({**data, "model_type": "llada",
                                                          key: value}))
        with pytest.raises(UserError, match=f"unsupported LLaDA options .*{key}"):
            load_llada(tmp_path)


def test_mask_token_checks() -> None:
    cfg = ModelConfig.from_name("tiny")
    with pytest.raises(UserError, match="no mask token"):
        check_mask_token(cfg, None)
    with pytest.raises(UserError, match="0..255"):
        check_mask_token(cfg, 256)
    from infbench.model.transformer import Transformer

    with pytest.raises(UserError, match="no mask token"):
        DiffusionLM(Transformer(cfg), cfg, None)  # type: ignore[arg-type]
