"""Qwen2.5 / Qwen3 / Gemma-2 / Gemma-3 / Phi-3 presets: sizes and what the analytic model prices."""

from __future__ import annotations

import dataclasses

import pytest

from infbench.core.config import PRESETS, ModelConfig
from infbench.roofline.costs import step_costs
from infbench.roofline.ops import SeqWork, total
from infbench.roofline.shapes import param_count

# Published total parameters: the model cards' "Number of Parameters" (Qwen), the hub's
# safetensors totals (Gemma-2, Phi-3) and the Gemma 3 report's embedding + non-embedding
# counts of the text model (1B: 302M + 698M; 4B: 675M + 3,209M, the vision encoder left out).
PUBLISHED = {
    "qwen2.5-0.5b": 0.49e9,
    "qwen2.5-1.5b": 1.54e9,
    "qwen2.5-7b": 7.61e9,
    "qwen3-0.6b": 0.6e9,
    "qwen3-8b": 8.2e9,
    "gemma-2-2b": 2.614e9,
    "gemma-2-9b": 9.242e9,
    "gemma-3-1b": 1.0e9,
    "gemma-3-4b": 3.884e9,
    "phi-3-mini": 3.821e9,
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count_matches_the_published_size(name: str) -> None:
    count = param_count(PRESETS[name]).total
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.01, count


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen3-0.6b", "gemma-2-2b", "gemma-3-1b",
                                  "phi-3-mini"])
def test_parameter_count_equals_transformers_on_the_same_shapes(name: str) -> None:
    # Exact: biases, q/k norms, Gemma's four norms per layer and tied heads all counted.
    import torch
    import transformers

    p = PRESETS[name]
    family = {"qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma2", "gemma3": "Gemma3Text",
              "phi3": "Phi3"}[p.arch]
    cfg = getattr(transformers, f"{family}Config")(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads, num_key_value_heads=p.kv_heads,
        head_dim=p.dim_head, intermediate_size=p.intermediate_size,
        tie_word_embeddings=p.tie_word_embeddings, max_position_embeddings=64, pad_token_id=0)
    model_cls = getattr(transformers, f"{family.removesuffix('Text')}ForCausalLM")
    with torch.device("meta"):
        hf = model_cls(cfg)
    assert param_count(p).total == sum(t.numel() for t in hf.parameters())


def _step(cfg: ModelConfig) -> tuple[float, float]:
    cost = total(step_costs(cfg, [SeqWork(query_len=1, context_len=3000)] * 4, "bfloat16"))
    return cost.flops, cost.bytes


def test_softcap_costs_flops_only() -> None:
    gemma = PRESETS["gemma-2-2b"]
    plain = dataclasses.replace(gemma, attn_logit_softcap=None, final_logit_softcap=None)
    (f_cap, b_cap), (f_plain, b_plain) = _step(gemma), _step(plain)
    assert b_cap == b_plain
    # 3 FLOPs per score (4 sequences x 26 layers x 8 heads x the keys each layer sees) and
    # per logit (4 x vocabulary)
    keys = sum(min(3000, s.window or 3000) for s in gemma.layers())
    assert f_cap - f_plain == pytest.approx(3 * 4 * 8 * keys + 3 * 4 * gemma.vocab_size)


@pytest.mark.parametrize("feature", ["qkv_bias", "qk_norm", "gemma_norms"])
def test_structural_extras_are_small_and_priced(feature: str) -> None:
    base = PRESETS["qwen3-8b"]
    plain = dataclasses.replace(base, qk_norm=False, arch="qwen2")
    extra = {"qkv_bias": dataclasses.replace(plain, qkv_bias=True),
             "qk_norm": dataclasses.replace(plain, qk_norm=True),
             "gemma_norms": dataclasses.replace(plain, arch="gemma2")}[feature]
    (f1, b1), (f0, b0) = _step(extra), _step(plain)
    assert f1 > f0 and b1 > b0
    assert (b1 - b0) / b0 < 1e-3 and param_count(extra).total > param_count(plain).total


def test_a_count_that_rounds_up_takes_the_next_unit() -> None:
    from infbench.commands.predict import fmt_si

    assert fmt_si(param_count(PRESETS["gemma-3-1b"]).total) == "1G"  # 999,885,952
    assert [fmt_si(x) for x in (999.4e6, 999.96e3, 1500, 12)] == ["999M", "1M", "1.5k", "12"]
