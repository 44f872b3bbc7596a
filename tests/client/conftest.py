"""Shared fixtures of the client tests: a word-level tokenizer directory and the mock server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from infbench.client.mock_server import WORDS, MockConfig, MockServer

# The mock's words first (ids 2..11), then filler words, so random prompt ids decode to text.
VOCAB = ["[UNK]", "[EOS]", *WORDS, *(f"w{i}" for i in range(52))]


def write_tokenizer(root: Path) -> Path:
    """An HF tokenizer directory (tokenizer.json + tokenizer_config.json): one word, one id."""
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    root.mkdir(parents=True, exist_ok=True)
    backend.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "[EOS]"}))
    return root


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "words")


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer(MockConfig()) as server:
        yield server
