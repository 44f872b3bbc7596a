"""The presets of the models deployed today against their published config.json and model cards.

One row per preset (PUBLISHED): the shape keys of the model's published config.json and
the model card's total / active parameter figures. Each row checks that

- infbench's config.json reader turns the published keys into exactly the preset;
- transformers' own model of that config, built on the meta device, has the parameter
  count infbench computes (within 1%; exact for the families here);
- the total and active counts are the model card's figures, to the card's precision.

A family helper adds a row for each new preset (deepseek-v3, kimi-k2, gpt-oss-*, llama-4-*).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infbench.checkpoint.metadata import config_from_hf_dir
from infbench.core.config import PRESETS
from infbench.roofline.shapes import ParamCount, param_count


@dataclass(frozen=True)
class Published:
    """A preset's published config.json keys and its model card's parameter figures."""

    preset: str
    config: dict[str, Any]  # config.json as published (architectures and model_type included)
    total: str  # "30.5B": the card's figure, as precise as the card states it
    active: str | None = None  # MoE: activated parameters per token
    # The card's active figure counts the input embedding (Qwen, Mistral do); infbench's
    # ParamCount.active leaves a gathered embedding out (DeepSeek's convention).
    active_counts_embedding: bool = True


_LLAMA31 = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
                num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
                rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
                attention_bias=False, mlp_bias=False,
                rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192,
                              "rope_type": "llama3"})
_MIXTRAL = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=32000,
                num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                rope_theta=1e6, rms_norm_eps=1e-5, sliding_window=None,
                tie_word_embeddings=False, hidden_act="silu")
_QWEN3_MOE = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                  vocab_size=151936, num_key_value_heads=4, head_dim=128,
                  max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
                  num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                  decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                  sliding_window=None)
# openai/gpt-oss-{20b,120b}'s config.json (the quantization_config left out: transformers
# would quantize the meta model; tests/moe/test_gpt_oss.py reads it)
_GPT_OSS = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=201088,
                hidden_size=2880, intermediate_size=2880, head_dim=64, num_attention_heads=64,
                num_key_value_heads=8, num_experts_per_tok=4, experts_per_token=4,
                attention_bias=True, hidden_act="silu", initial_context_length=4096,
                max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=150000,
                rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                              "original_max_position_embeddings": 4096, "rope_type": "yarn",
                              "truncate": False},
                sliding_window=128, swiglu_limit=7.0, tie_word_embeddings=False)

# meta-llama/Llama-4-{Scout-17B-16E,Maverick-17B-128E}: the text_config of their (multimodal)
# config.json, as a Llama4ForCausalLM config
_LLAMA4 = dict(architectures=["Llama4ForCausalLM"], model_type="llama4_text",
               vocab_size=202048, hidden_size=5120, intermediate_size=8192,
               intermediate_size_mlp=16384, num_hidden_layers=48, num_attention_heads=40,
               num_key_value_heads=8, head_dim=128, num_experts_per_tok=1, hidden_act="silu",
               attention_bias=False, attention_chunk_size=8192, attn_temperature_tuning=True,
               floor_scale=8192, attn_scale=0.1, rms_norm_eps=1e-5, rope_theta=500000.0,
               tie_word_embeddings=False, no_rope_layers=[int((i + 1) % 4 != 0)
                                                          for i in range(48)])
PUBLISHED = [
    # Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B: "30.5B in total and 3.3B activated",
    # "235B in total and 22B activated"
    Published("qwen3-30b-a3b", dict(_QWEN3_MOE, hidden_size=2048, num_hidden_layers=48,
                                    num_attention_heads=32, intermediate_size=6144,
                                    moe_intermediate_size=768), "30.5B", "3.3B"),
    Published("qwen3-235b-a22b", dict(_QWEN3_MOE, hidden_size=4096, num_hidden_layers=94,
                                      num_attention_heads=64, intermediate_size=12288,
                                      moe_intermediate_size=1536), "235B", "22B"),
    # meta-llama/Llama-3.1-{8B,70B,405B}
    Published("llama-3.1-8b", dict(_LLAMA31, hidden_size=4096, num_hidden_layers=32,
                                   num_attention_heads=32, intermediate_size=14336), "8.0B"),
    Published("llama-3.1-70b", dict(_LLAMA31, hidden_size=8192, num_hidden_layers=80,
                                    num_attention_heads=64, intermediate_size=28672), "70B"),
    Published("llama-3.1-405b", dict(_LLAMA31, hidden_size=16384, num_hidden_layers=126,
                                     num_attention_heads=128, intermediate_size=53248),
              "405B"),
    # mistralai/Mixtral-8x7B-v0.1 ("46.7B total parameters ... 12.9B parameters per token"),
    # mistralai/Mixtral-8x22B-v0.1 ("141B parameters ... 39B active")
    Published("mixtral-8x7b", dict(_MIXTRAL, hidden_size=4096, num_hidden_layers=32,
                                   num_attention_heads=32, intermediate_size=14336,
                                   max_position_embeddings=32768), "46.7B", "12.9B"),
    Published("mixtral-8x22b", dict(_MIXTRAL, hidden_size=6144, num_hidden_layers=56,
                                    num_attention_heads=48, intermediate_size=16384,
                                    max_position_embeddings=65536), "141B", "39B"),
    # "17B active, 109B total" (Scout) / "17B active, 400B total" (Maverick): the cards'
    # totals count the vision encoder too, which is not part of the text model (Scout's
    # decoder alone is 107.77B, the figure pinned here; Maverick's 400.7B rounds to 400B).
    Published("llama-4-scout", dict(
        _LLAMA4, num_local_experts=16, interleave_moe_layer_step=1, use_qk_norm=True,
        max_position_embeddings=10485760, rope_scaling={
            "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
        "107.8B", "17B"),
    Published("llama-4-maverick", dict(
        _LLAMA4, num_local_experts=128, interleave_moe_layer_step=2, use_qk_norm=False,
        max_position_embeddings=1048576), "400B", "17B"),
    # OpenAI's gpt-oss model card: 20.91B total / 3.61B active, 116.83B / 5.13B (the active
    # figures count the unembedding, not the input embedding)
    Published("gpt-oss-20b", dict(_GPT_OSS, num_hidden_layers=24, num_local_experts=32,
                                  layer_types=["sliding_attention", "full_attention"] * 12),
              "20.91B", "3.61B", active_counts_embedding=False),
    Published("gpt-oss-120b", dict(_GPT_OSS, num_hidden_layers=36, num_local_experts=128,
                                   layer_types=["sliding_attention", "full_attention"] * 18),
              "116.83B", "5.13B", active_counts_embedding=False),
]
_IDS = [row.preset for row in PUBLISHED]


def _figure(text: str) -> tuple[float, float]:
    """'3.3B' -> (3.3e9, 1e8): the value and one unit of its last stated digit."""
    number = text.removesuffix("B")
    decimals = len(number.partition(".")[2])
    return float(number) * 1e9, 10.0 ** -decimals * 1e9


def _matches_card(count: int, text: str) -> bool:
    """The card's figure is the count rounded or truncated at its precision (within one
    unit of its last digit), and within 2% of it."""
    value, unit = _figure(text)
    return abs(count - value) < unit and abs(count - value) / value < 0.02


def _active(row: Published, counts: ParamCount) -> int:
    gathered = 0 if PRESETS[row.preset].tie_word_embeddings else counts.embedding
    return counts.active + (gathered if row.active_counts_embedding else 0)


@pytest.mark.parametrize("row", PUBLISHED, ids=_IDS)
def test_the_published_config_json_reads_as_the_preset(row: Published, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(row.config))
    preset = PRESETS[row.preset]
    assert dataclasses.replace(config_from_hf_dir(tmp_path), name=preset.name) == preset


@pytest.mark.parametrize("row", PUBLISHED, ids=_IDS)
def test_parameter_count_equals_transformers_on_the_meta_device(row: Published) -> None:
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**row.config)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(cfg)
    assert type(hf).__name__ == row.config["architectures"][0]
    theirs = sum(p.numel() for p in hf.parameters())
    ours = param_count(PRESETS[row.preset]).total
    assert abs(ours - theirs) / theirs < 0.01, (ours, theirs)


@pytest.mark.parametrize("row", PUBLISHED, ids=_IDS)
def test_total_and_active_parameters_are_the_model_cards(row: Published) -> None:
    counts = param_count(PRESETS[row.preset])
    assert _matches_card(counts.total, row.total), counts.total
    if row.active is None:  # a dense model: every parameter is active
        assert _active(row, counts) == counts.total
    else:
        assert _matches_card(_active(row, counts), row.active), _active(row, counts)


def test_a_card_figure_is_checked_to_its_precision() -> None:
    assert _figure("3.3B") == (3.3e9, pytest.approx(1e8))
    assert _matches_card(3_353_000_000, "3.3B") and not _matches_card(3_041_000_000, "3.3B")
    assert not _matches_card(8_900_000_000, "8B")  # within one unit, but 11% off
