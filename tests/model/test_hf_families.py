"""Qwen2/2.5, Qwen3, Gemma-2, Gemma-3 and Phi-3 checkpoints: logits equal transformers'.

Each case saves a tiny random transformers model (save_pretrained: config.json +
safetensors), loads it with infbench and compares the fp32 logits of a prompt longer than
the sliding window; the engine's greedy decode (torch and cpu backends: paged attention,
chunked prefill, the soft-capping fallback) must emit transformers' greedy tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import dense_logits

from infbench.checkpoint.metadata import config_from_hf_dir
from infbench.engine.llm import LLM
from infbench.engine.request import SamplingParams
from infbench.model.context import DenseContext
from infbench.model.loader import load_model

VOCAB, SEQ_LEN, TOL = 96, 19, 1e-4
_BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    rms_norm_eps=1e-6, tie_word_embeddings=False,
)
_PHI3_TOKENS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)  # defaults pass VOCAB
# case -> (transformers class names, config overrides)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2": ("Qwen2", {}),
    "qwen2-tied": ("Qwen2", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3", dict(head_dim=24)),  # head_dim decoupled from hidden / heads
    "qwen3-tied-mqa": ("Qwen3", dict(head_dim=32, num_key_value_heads=1,
                                     tie_word_embeddings=True)),
    "gemma2": ("Gemma2", dict(head_dim=16, num_hidden_layers=3, sliding_window=5,
                              query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                              final_logit_softcapping=3.0, tie_word_embeddings=True)),
    "gemma3": ("Gemma3", dict(head_dim=16, num_hidden_layers=4, sliding_window=5,
                              query_pre_attn_scalar=20, sliding_window_pattern=3,
                              tie_word_embeddings=True,
                              rope_parameters={
                                  "sliding_attention": {"rope_type": "default",
                                                        "rope_theta": 100.0},
                                  "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                     "rope_theta": 50000.0}})),
    "phi3": ("Phi3", dict(num_key_value_heads=4, sliding_window=7, **_PHI3_TOKENS)),
    "phi3-partial-rotary": ("Phi3", dict(partial_rotary_factor=0.5, **_PHI3_TOKENS)),
}


def write_hf(tmp: Path, case: str, seed: int = 0) -> Any:
    """Save a tiny random model of `case`; return the transformers model (eval, fp32)."""
    import transformers

    family, overrides = CASES[case]
    config_cls = getattr(transformers, f"{family}TextConfig" if family == "Gemma3"
                         else f"{family}Config")
    model_cls = getattr(transformers, f"{family}ForCausalLM")
    cfg = config_cls(**{**_BASE, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # random norms and biases: a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5) if family.startswith("Gemma") else p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.2)
    model.save_pretrained(tmp)
    return model


def _theirs(hf: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(ids[None]).logits[0].float()  # (T, V)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path: Path, case: str) -> None:
    hf = write_hf(tmp_path, case)
    model = load_model({"path": str(tmp_path)}).model
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    ours, ref = dense_logits(model, ids), _theirs(hf, ids)
    assert ours.shape == (SEQ_LEN, VOCAB)
    assert (ours - ref).abs().max().item() < TOL


def _hf_greedy(hf: Any, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                          min_new_tokens=new_tokens, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("case", ["qwen2", "qwen3", "gemma2", "gemma3", "phi3-partial-rotary"])
def test_engine_greedy_equals_transformers_generate(tmp_path: Path, case: str,
                                                    backend: str) -> None:
    hf = write_hf(tmp_path, case, seed=3)
    prompts = [[3, 17, 42, 5, 9, 61, 2, 8, 30], [7, 7, 1, 90, 44, 12, 13]]
    expected = [_hf_greedy(hf, p, 12) for p in prompts]  # past the windows of 5 and 7
    llm = LLM(load_model({"path": str(tmp_path)}), backend=backend, max_model_len=64,
              num_kv_blocks=32, block_size=4, max_num_batched_tokens=8)  # chunked prefill
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_config_fields(tmp_path: Path) -> None:
    write_hf(tmp_path / "g3", "gemma3")
    g3 = config_from_hf_dir(tmp_path / "g3")
    assert (g3.arch, g3.qk_norm, g3.query_pre_attn_scalar) == ("gemma3", True, 20.0)
    assert (g3.rope_theta, g3.rope_local_theta) == (50000.0, 100.0)
    assert g3.rope_scaling == (("factor", 4.0), ("rope_type", "linear"))
    assert [s.window for s in g3.layers()] == [5, 5, None, 5]
    assert g3.attn_logit_softcap is None and g3.final_logit_softcap is None
    write_hf(tmp_path / "g2", "gemma2")
    g2 = config_from_hf_dir(tmp_path / "g2")
    assert [(s.window, s.softcap) for s in g2.layers()] == [(5, 2.0), (None, 2.0), (5, 2.0)]
    assert (g2.final_logit_softcap, g2.qk_norm, g2.tie_word_embeddings) == (3.0, False, True)
    write_hf(tmp_path / "q2", "qwen2")
    q2 = config_from_hf_dir(tmp_path / "q2")
    assert (q2.arch, q2.qkv_bias, q2.attention.kind, q2.layers()[0].window) == (
        "qwen2", True, "gqa", None)
    write_hf(tmp_path / "q3", "qwen3")
    q3 = config_from_hf_dir(tmp_path / "q3")
    assert (q3.qk_norm, q3.qkv_bias, q3.dim_head, q3.head_dim) == (True, False, 24, 24)
    write_hf(tmp_path / "p3", "phi3-partial-rotary")
    p3 = config_from_hf_dir(tmp_path / "p3")
    assert (p3.arch, p3.rotary_dim, p3.rot_dim, p3.dim_head) == ("phi3", 8, 8, 16)


def test_softcap_falls_back_from_the_fused_cpu_decode_layer(tmp_path: Path) -> None:
    # A Qwen2 layer runs the fused C++ decode layer; capping its scores (no kernel does)
    # must move it to the per-op path with model/softcap.py, and the engine must then emit
    # the capped model's dense greedy tokens, not the uncapped ones.
    from infbench.model.ops import Ops

    write_hf(tmp_path, "qwen2", seed=5)
    plain = load_model({"path": str(tmp_path)})
    capped = load_model({"path": str(tmp_path)}, overrides={"attn_logit_softcap": 2.0})
    with torch.no_grad():  # sharp attention (scores of tens), so that capping them matters
        for loaded in (plain, capped):
            for layer in loaded.model.layers:
                layer.self_attn.qkv_proj.weight.mul_(8.0)
    plain.model.set_ops(Ops("cpu"))
    capped.model.set_ops(Ops("cpu"))
    assert all(plan is not None for plan in plain.model.decode_layers)
    assert all(plan is None for plan in capped.model.decode_layers)
    del plain.model.ops, capped.model.ops  # back to the dense reference path

    def dense_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(dense_logits(model, torch.tensor(ids))[-1].argmax()))
        return ids[len(prompt):]

    prompt = [3, 17, 42, 5, 9, 61, 2, 8, 30]
    expected = dense_greedy(capped.model, prompt, 10)
    assert expected != dense_greedy(plain.model, prompt, 10)
    llm = LLM(capped, backend="cpu", max_model_len=64, num_kv_blocks=16, block_size=4)
    out = llm.generate([prompt], SamplingParams(max_tokens=10, ignore_eos=True))
    assert out[0].outputs[0].token_ids == expected


@pytest.mark.parametrize("case", ["qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_analytic_weight_bytes_equal_the_loaded_parameters(tmp_path: Path, case: str) -> None:
    # The analytic model prices every bias and norm the checkpoint has (a tied head once).
    from infbench.roofline.shapes import weight_bytes

    write_hf(tmp_path, case)
    loaded = load_model({"path": str(tmp_path)})
    params = {id(p): p for p in loaded.model.parameters()}.values()
    assert loaded.weight_bytes == sum(p.numel() * 4 for p in params)
    assert weight_bytes(loaded.config, "float32") == loaded.weight_bytes


def test_unsupported_architecture_is_one_line_exit_2(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FalconForCausalLM"]}))
    proc = subprocess.run([sys.executable, "-m", "infbench.cli", "predict", "--model",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown model family 'FalconForCausalLM'" in lines[0]
    for name in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM",
                 "Gemma3ForCausalLM", "Phi3ForCausalLM", "LlamaForCausalLM"):
        assert name in lines[0]


@pytest.mark.parametrize("change, message", [
    ({"use_sliding_window": True}, "use_sliding_window=true is not supported for qwen2"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     "rope_type 'longrope' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' unsupported for qwen2"),
])
def test_what_is_refused(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    import json

    from infbench.core.errors import UserError

    write_hf(tmp_path, "qwen2")
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(UserError, match=message):
        config_from_hf_dir(tmp_path)


@pytest.mark.parametrize("case", ["qwen2", "gemma3"])
def test_int8_weights_keep_biases_and_gemma_blocks(tmp_path: Path, case: str) -> None:
    # Quantized projections keep Qwen2's biases; Gemma's GeGLU and norms are untouched.
    from infbench.core.config import QuantConfig

    write_hf(tmp_path, case)
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    exact = dense_logits(load_model({"path": str(tmp_path)}).model, ids)
    quant = load_model({"path": str(tmp_path)}, quant=QuantConfig(weights="int8"))
    assert "int8 rtn" in quant.source
    err = (dense_logits(quant.model, ids) - exact).abs().max().item()
    assert 0 < err < 0.05 * exact.abs().max().item()


def test_calibration_inputs_follow_gemma_embeddings_and_local_rope(tmp_path: Path) -> None:
    # AWQ / pruning run the layers one by one: their inputs must be the model's own.
    from infbench.model.prune import block_influence

    write_hf(tmp_path, "gemma3")
    model = load_model({"path": str(tmp_path)}).model
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(4))
    x = model.embed(ids)
    positions, ctx = torch.arange(SEQ_LEN), DenseContext.single(SEQ_LEN)
    with torch.no_grad():
        for layer, spec in zip(model.layers, model.layer_specs, strict=True):
            x = layer(x, positions, ctx, model.layer_rope(spec))
        torch.testing.assert_close(model.norm(x), model(ids, positions, ctx))
    assert len(block_influence(model, [ids])) == 4


def test_random_weights_of_a_preset_have_identity_norms_and_zero_biases() -> None:
    from infbench.core.config import PRESETS

    for name, norm_value in (("gemma-3-1b", 0.0), ("qwen2.5-0.5b", 1.0)):
        cfg = PRESETS[name].with_overrides(num_layers=1, vocab_size=64, max_seq_len=1024)
        model = load_model({"preset": name}, overrides=dict(
            num_layers=1, vocab_size=64, max_seq_len=1024)).model
        assert model.config == cfg
        attn = model.layers[0].self_attn
        assert float(model.norm.weight.abs().max()) == norm_value
        if cfg.qkv_bias:
            assert attn.qkv_proj.bias is not None and not attn.qkv_proj.bias.any()
        else:
            assert attn.q_norm is not None and float(attn.q_norm.weight.abs().max()) == 0.0


def test_gemma3_config_of_older_transformers_reads_the_same(tmp_path: Path) -> None:
    # Before rope_parameters was nested per layer type: rope_theta + rope_scaling for the
    # global layers, rope_local_base_freq for the local ones, sliding_window_pattern.
    import json

    write_hf(tmp_path, "gemma3")
    new = config_from_hf_dir(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        raw.pop(key)
    raw.update(rope_theta=50000.0, rope_local_base_freq=100.0, sliding_window_pattern=3,
               rope_scaling={"type": "linear", "factor": 4.0})
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert config_from_hf_dir(tmp_path) == new



def test_speculative_verification_rows_are_soft_capped_too(tmp_path: Path) -> None:
    # n-gram speculation verifies 1 + k decode rows per sequence through the softcap
    # fallback, each row over its own context: still the capped model's greedy tokens.
    # (Gemma's windowed + full layers do not speculate yet: a capped Qwen2 stands in.)
    from infbench.core.speculative import SpeculativeConfig

    write_hf(tmp_path, "qwen2", seed=5)
    capped = load_model({"path": str(tmp_path)}, overrides={"attn_logit_softcap": 2.0})
    with torch.no_grad():  # sharp attention, so that capping matters
        for layer in capped.model.layers:
            layer.self_attn.qkv_proj.weight.mul_(8.0)
    prompt = [7, 8, 9, 10] * 3
    ids = list(prompt)
    for _ in range(12):
        ids.append(int(dense_logits(capped.model, torch.tensor(ids))[-1].argmax()))
    llm = LLM(capped, backend="cpu", max_model_len=64, num_kv_blocks=32, block_size=4,
              speculative=SpeculativeConfig("ngram", 3, ngram_max=2))
    out = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))
    assert out[0].outputs[0].token_ids == ids[len(prompt):]
    assert sum(d for step in llm.last_steps for d in step.spec_drafts) > 0  # verified drafts


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_yarn_rope_matches_transformers_attention_factor_included(tmp_path: Path,
                                                                  family: str) -> None:
    # Qwen2.5's long-context setting: transformers scales cos/sin by 0.1 ln(factor) + 1.
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
            "rope_theta": 10000.0}
    if family == "llama":
        from model_checkpoints import write_hf_llama

        hf = write_hf_llama(tmp_path, rope_parameters=yarn)
    else:
        CASES["qwen2-yarn"] = ("Qwen2", dict(rope_parameters=yarn))
        try:
            hf = write_hf(tmp_path, "qwen2-yarn")
        finally:
            del CASES["qwen2-yarn"]
    model = load_model({"path": str(tmp_path)}).model
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    assert (dense_logits(model, ids) - _theirs(hf, ids)).abs().max().item() < TOL
