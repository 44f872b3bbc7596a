"""Text that is not valid UTF-8 never reaches a tokenizer: undecodable bytes in `generate
--prompt` are a one-line usage error, and a lone surrogate given to any tokenizer is a
UserError, not the tokenizers library's TypeError."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from serve_helpers import byte_tokenizer

from infbench.core.errors import UserError


def test_undecodable_prompt_bytes_are_one_line_exit_2() -> None:
    proc = subprocess.run([sys.executable.encode(), b"-m", b"infbench.cli", b"generate",
                           b"--model", b"smollm2-135m", b"--prompt", b"ab\xff\xfe"],
                          capture_output=True, env={**os.environ, "COLUMNS": "200"})
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    assert proc.returncode == 2
    assert len(err) == 1 and err[0].startswith("error: --prompt: not valid UTF-8"), err


@pytest.mark.parametrize("text", ["\ud800", "ok \udfff end", "\udcff\udcfe"])
def test_tokenizer_refuses_lone_surrogates(text: str) -> None:
    with pytest.raises(UserError, match="not valid UTF-8"):
        byte_tokenizer().encode(text)


def test_tokenizer_encodes_valid_text() -> None:
    assert byte_tokenizer().encode("héllo \u2028 \U0001f600", add_special_tokens=False)
