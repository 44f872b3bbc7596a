"""gpt-oss (GptOssForCausalLM): config.json and presets -> ModelConfig, the analytic counts,
and the engine against transformers on tiny random checkpoints.

The tiny checkpoint (gpt_oss_checkpoints.py) alternates sliding (window 4) and full
attention over four layers, with attention sinks, q/k/v/o biases, a biased router picking
the top 2 of 8 experts, expert biases and a SwiGLU limit that clamps; every prompt here
is longer than the window.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from gpt_oss_checkpoints import VOCAB, WINDOW, write_gpt_oss

from infbench.checkpoint.metadata import config_from_hf_dir, native_quant
from infbench.core.config import PRESETS, ModelConfig, MoEConfig, QuantConfig
from infbench.core.errors import ConfigError, UserError
from infbench.engine.llm import LLM
from infbench.engine.request import SamplingParams
from infbench.model.context import DenseContext
from infbench.model.loader import load_model
from infbench.model.moe import MoEMLP
from infbench.roofline.shapes import (
    _all_weights,
    kv_bytes_per_token,
    kv_cache_bytes,
    param_count,
    weight_bytes,
)

TOL = 1e-4
PROMPTS = [[3, 17, 42, 5, 9, 61, 2, 8, 30, 11, 70], [7, 7, 1, 90, 44, 12, 13]]
NEW_TOKENS = 10

# The model card (OpenAI, "gpt-oss-120b & gpt-oss-20b", Aug 2025): total and active
# parameters (active: the top-4 experts, attention, router and unembedding per token).
PUBLISHED = {"gpt-oss-20b": (20.91e9, 3.61e9), "gpt-oss-120b": (116.83e9, 5.13e9)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("gpt_oss")
    return path, write_gpt_oss(path)


def _hf_greedy(hf: Any, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                          min_new_tokens=new_tokens, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


@pytest.fixture(scope="module")
def expected(checkpoint: tuple[Path, Any]) -> list[list[int]]:
    return [_hf_greedy(checkpoint[1], p) for p in PROMPTS]


# ------------------------------------------------------------------ analytic side
@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_have_the_published_total_and_active_parameters(name: str) -> None:
    count = param_count(PRESETS[name])
    total, active = PUBLISHED[name]
    assert abs(count.total - total) / total < 0.01, count
    assert abs(count.active - active) / active < 0.01, count


def _hf_config(p: ModelConfig) -> Any:
    import transformers

    assert p.moe is not None
    return transformers.GptOssConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads, num_key_value_heads=p.kv_heads, head_dim=p.dim_head,
        intermediate_size=p.moe.moe_intermediate_size, num_local_experts=p.moe.num_experts,
        num_experts_per_tok=p.moe.num_experts_per_tok, sliding_window=p.attention.window,
        max_position_embeddings=p.max_seq_len)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count_equals_transformers_on_the_same_shapes(name: str) -> None:
    # Exact: q/k/v/o biases, sinks, router bias and expert biases all counted.
    import transformers

    with torch.device("meta"):
        hf = transformers.GptOssForCausalLM(_hf_config(PRESETS[name]))
    assert param_count(PRESETS[name]).total == sum(t.numel() for t in hf.parameters())


def test_kv_bytes_cap_the_sliding_layers_at_their_window() -> None:
    cfg = PRESETS["gpt-oss-120b"]
    assert [s.window for s in cfg.layers()[:4]] == [128, None, 128, None]
    per_layer = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64 dims, bf16
    assert kv_bytes_per_token(cfg, "bfloat16") == 36 * per_layer
    for length in (100, 4096, 131072):
        held = 18 * length + 18 * min(length, 128)
        assert kv_cache_bytes(cfg, "bfloat16", None, length, 3) == 3 * held * per_layer


# The released openai/gpt-oss-120b config.json (transformers 4.55 spelling: rope_scaling
# and a top-level rope_theta), less the tokenizer ids.
RELEASED_120B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "num_local_experts": 128, "quantization_config": {
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "vocab_size": 201088,
}


def _write_config(tmp: Path, raw: dict[str, Any]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(raw))
    return tmp


def test_the_released_config_json_reads_as_the_preset(tmp_path: Path) -> None:
    cfg = config_from_hf_dir(_write_config(tmp_path / "gpt-oss-120b", RELEASED_120B))
    assert cfg == dataclasses.replace(PRESETS["gpt-oss-120b"], name="gpt-oss-120b")
    twenty = dict(RELEASED_120B, num_hidden_layers=24, num_local_experts=32,
                  layer_types=["sliding_attention", "full_attention"] * 12)
    cfg = config_from_hf_dir(_write_config(tmp_path / "gpt-oss-20b", twenty))
    assert cfg == dataclasses.replace(PRESETS["gpt-oss-20b"], name="gpt-oss-20b")


def test_tiny_checkpoint_config_and_counts(checkpoint: tuple[Path, Any]) -> None:
    path, hf = checkpoint
    cfg = config_from_hf_dir(path)
    assert cfg.arch == "gpt_oss" and cfg.attention_bias and cfg.attention_sinks
    assert [(s.window, s.sinks) for s in cfg.layers()] == [(WINDOW, True), (None, True)] * 2
    assert cfg.moe == MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                scoring="topk_softmax", router_bias=True, expert_bias=True,
                                activation="clamped_swiglu", swiglu_alpha=1.702,
                                swiglu_limit=0.4)
    assert dict(cfg.rope_scaling or ())["truncate"] is False
    assert param_count(cfg).total == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize(("change", "message"), [
    (dict(layer_types=["full_attention", "sliding_attention"] * 18),
     "is not a repeating pattern"),
    (dict(swiglu_limit="7"), "swiglu_limit: must be a finite number > 0"),
    (dict(swiglu_limit=0), "swiglu_limit: must be a finite number > 0"),
    (dict(num_experts_per_tok=200), "exceeds moe.num_experts"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 2.0}), "rope_type 'longrope'"),
])
def test_bad_config_json_is_one_line_naming_the_file(tmp_path: Path, change: dict[str, Any],
                                                     message: str) -> None:
    path = _write_config(tmp_path / "bad", {**RELEASED_120B, **change})
    with pytest.raises(UserError, match=message) as err:
        config_from_hf_dir(path)
    assert str(path / "config.json") in str(err.value)
    res = subprocess.run([sys.executable, "-m", "infbench.cli", "predict", "--model", str(path)],
                         capture_output=True, text=True, check=False, timeout=300)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert message in lines[0]


@pytest.mark.parametrize(("build", "message"), [
    (lambda: PRESETS["tiny-mla"].with_overrides(attention_sinks=True),
     "model.attention_sinks: attention.kind 'mla'"),
    (lambda: PRESETS["tiny"].with_overrides(attention_sinks=True, attn_logit_softcap=30.0),
     "does not combine with model.attn_logit_softcap"),
    (lambda: MoEConfig(8, 2, 16, scoring="topk_softmax", n_group=2, topk_group=1),
     "topk_softmax does not combine with group-limited"),
    (lambda: MoEConfig(8, 2, 16, activation="gelu"), "moe.activation: unsupported"),
    (lambda: MoEConfig(8, 2, 16, swiglu_limit=-1.0), "moe.swiglu_limit must be"),
])
def test_refused_combinations_name_the_key(build: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_native_weights_price_the_mxfp4_experts_and_bf16_elsewhere(tmp_path: Path,
                                                                   name: str) -> None:
    """quant.weights: native of a preset and of the released config.json: the experts at
    4.25 bits a weight (E2M1 + one E8M0 per 32), everything else in bf16 as stored."""
    cfg = PRESETS[name]
    layers = cfg.num_layers
    rows = (("moe_experts", "mxfp4", layers), ("o_proj", "float", layers),
            ("qkv_proj", "float", layers))
    native = QuantConfig(weights="native")
    preset = native_quant(native, {"preset": name})
    raw = RELEASED_120B if name == "gpt-oss-120b" else dict(
        RELEASED_120B, num_hidden_layers=24, num_local_experts=32,
        layer_types=["sliding_attention", "full_attention"] * 12)
    path = _write_config(tmp_path / name, raw)
    directory = native_quant(native, {"path": str(path)})
    assert preset.native_mix == directory.native_mix == rows
    weights = _all_weights(cfg)
    mxfp4 = sum(w.numel for w in weights if w.expert and w.quantized)
    rest = sum(w.numel for w in weights) - mxfp4
    expected = mxfp4 * 4.25 / 8 + rest * 2
    assert weight_bytes(cfg, "bfloat16", preset) == pytest.approx(expected, abs=1)
    # the released repositories: about 13.8 GB (20b) and 65.3 GB (120b) of safetensors
    assert weight_bytes(cfg, "bfloat16", preset) / 1e9 == pytest.approx(
        {"gpt-oss-20b": 13.76, "gpt-oss-120b": 65.25}[name], abs=0.01)


def test_mxfp4_blocks_without_their_scales_are_refused(checkpoint: tuple[Path, Any],
                                                       tmp_path: Path) -> None:
    """The MXFP4 format itself loads (tests/moe/test_gpt_oss_mxfp4.py); blocks alone do not."""
    from safetensors.torch import save_file

    copy = tmp_path / "mxfp4"
    shutil.copytree(checkpoint[0], copy)
    save_file({"model.layers.0.mlp.experts.gate_up_proj_blocks":
               torch.zeros(8, 64, 2, 16, dtype=torch.uint8)}, copy / "a.safetensors")
    with pytest.raises(UserError, match="gate_up_proj_scales' U8 .*found U8 .* and None"):
        load_model({"path": str(copy)})


# ------------------------------------------------------------------ the engine
def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(ids, torch.arange(ids.numel()), DenseContext.single(ids.numel()))
        return model.compute_logits(hidden)  # (T, V)


def test_logits_match_transformers(checkpoint: tuple[Path, Any]) -> None:
    path, hf = checkpoint
    loaded = load_model({"path": str(path)})
    ids = torch.randint(0, VOCAB, (19,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    out = _logits(loaded.model, ids)
    assert (out - ref).abs().max().item() < TOL
    assert loaded.weight_bytes == weight_bytes(loaded.config, "float32")
    moe = [m for m in loaded.model.modules() if isinstance(m, MoEMLP)]
    assert len(moe) == 4 and all(int((m.expert_counts > 0).sum()) > 2 for m in moe)
    # The sinks are loaded and used: without them the logits move well past the tolerance.
    with torch.no_grad():
        for layer in loaded.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
    assert (_logits(loaded.model, ids) - ref).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_engine_greedy_equals_transformers_generate(checkpoint: tuple[Path, Any],
                                                    expected: list[list[int]],
                                                    backend: str) -> None:
    """Paged decode and chunked prefill (8 tokens a step) on each backend: `triton` runs the
    sink-aware attention kernels and the fused MoE kernel (interpreted here), `cpu` the
    torch references where the C++ kernels have no sinks."""
    llm = LLM(load_model({"path": str(checkpoint[0])}), backend=backend, max_model_len=64,
              num_kv_blocks=32, block_size=4, max_num_batched_tokens=8)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == expected


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infbench.cli", *args], capture_output=True,
                          text=True, check=False, timeout=600)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_generate_cli_emits_transformers_greedy_tokens(checkpoint: tuple[Path, Any],
                                                       expected: list[list[int]],
                                                       backend: str) -> None:
    res = _cli("generate", "--model", str(checkpoint[0]), "--prompt-ids",
               ",".join(map(str, PROMPTS[0])), "--max-tokens", str(NEW_TOKENS),
               "--output-ids", "--device", "cpu", "--dtype", "float32", "--backend", backend)
    assert res.returncode == 0, res.stderr
    assert [int(t) for t in res.stdout.replace(",", " ").split()] == expected[0]


def test_run_cli_allocates_the_predicted_kv(checkpoint: tuple[Path, Any],
                                            tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: gpt_oss\ndevice: cpu\ndtype: float32\nhardware: cpu\n"
        f"model: {{path: {checkpoint[0]}}}\n"
        "workload: {kind: static, batch_size: 2, prompt_len: 12, gen_len: 4, seed: 0}\n"
        "engine: {block_size: 4, max_num_seqs: 4, max_num_batched_tokens: 64, backend: cpu}\n"
        "measure: {warmup: 0, repeats: 1}\n")
    run = _cli("run", str(scenario), "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    kv = _cli("kv", "--results", str(tmp_path / "out"), "--hardware", "cpu", "--json")
    assert kv.returncode == 0, kv.stderr
    (row,) = json.loads(kv.stdout)
    assert row["attention"] == "sliding"
    assert row["kv_bytes_per_token_measured"] == row["kv_bytes_per_token_predicted"], row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_completes_with_transformers_greedy_tokens(checkpoint: tuple[Path, Any],
                                                         expected: list[list[int]]) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "infbench.cli", "serve", "--model", str(checkpoint[0]),
         "--device", "cpu", "--dtype", "float32", "--backend", "cpu", "--port", str(port),
         "--max-model-len", "64", "--max-num-seqs", "2"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"on http://127.0.0.1:{port}" in line, line
        for prompt, tokens in zip(PROMPTS, expected, strict=True):
            body = json.dumps({"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0,
                               "ignore_eos": True, "return_token_ids": True}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                answer = json.loads(resp.read())
            assert answer["choices"][0]["token_ids"] == tokens, answer
    finally:
        proc.terminate()
        proc.wait(60)
