"""SentencePiece-type GGUF tokenizers (`tokenizer.ggml.model == "llama"`) for `tokenizers`.

A llama-type GGUF stores a SentencePiece BPE vocabulary as three parallel arrays: the
pieces (`tokenizer.ggml.tokens`, spaces spelled U+2581 "▁"), their scores
(`tokenizer.ggml.scores`) and their kinds (`tokenizer.ggml.token_type`: 1 normal,
2 unknown, 3 control, 4 user-defined, 6 byte `<0x00>`..`<0xFF>`).  There are no merges: a
SentencePiece BPE model merges the adjacent pair whose joined piece scores highest, which
is a BPE whose merge ranks are the pieces' scores (highest first).  llama.cpp's SPM
tokenizer and transformers' GGUF conversion both read the file this way; `spm_backend`
builds the same `tokenizers` pipeline:

    pre-tokenizer  Metaspace "▁", one "▁" before the text when add_space_prefix (the
                   default), no splitting: spaces become "▁" and merge like any piece
    model          BPE, merges ranked by score, byte fallback (a character without a
                   piece becomes its UTF-8 bytes' <0xXX> tokens), unknown = the unk id
    added tokens   control pieces matched whole as special tokens, user-defined ones
                   matched whole as plain tokens
    decoder        "▁" -> " ", <0xXX> bytes -> UTF-8, the prefix space stripped

Equal scores (rare outside the byte and control pieces) are ranked by the longer left
piece, then the longer right piece, then the piece's id, the order transformers uses, so
ids agree with its conversion (`tests/model/test_gguf_spm_tokenizer.py`).  Where that
conversion and llama.cpp differ, this follows transformers: Metaspace adds no "▁" to text
that already starts with a space, nor after a control token inside the text (llama.cpp
prepends a space to both); `add_space_prefix: false` is honoured (transformers ignores it).

Importing nothing from `model.tokenizer`, this module returns a bare backend;
`Tokenizer.from_gguf` adds the BOS/EOS template.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

SPACE = "\u2581"  # SentencePiece's visible space
# llama.cpp token types (tokenizer.ggml.token_type)
UNKNOWN, CONTROL, USER_DEFINED, BYTE = 2, 3, 4, 6


def score_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges of a scored SentencePiece vocabulary, best first: every split of a piece
    into two pieces of the vocabulary, ranked by the joined piece's score."""
    index = {tok: i for i, tok in enumerate(tokens)}  # a repeated spelling: its last id
    ranked: list[tuple[float, int, int, int, int, int, str, str]] = []
    for i, tok in enumerate(tokens):
        if index[tok] != i:
            continue
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in index and right in index:
                ranked.append((-float(scores[i]), -len(left), -len(right), i, index[left],
                               index[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def spm_backend(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int],
                unk_id: int | None, add_space_prefix: bool) -> Backend:
    """The `tokenizers` backend of a SentencePiece BPE vocabulary (see the module doc)."""
    if len(scores) != len(tokens) or len(types) != len(tokens):
        raise ValueError(f"tokenizer.ggml.scores ({len(scores)}) and token_type "
                         f"({len(types)}) must have one entry per token ({len(tokens)})")
    vocab = {tok: i for i, tok in enumerate(tokens)}  # as llama.cpp: the last id of a spelling
    unk = tokens[unk_id] if unk_id is not None else None
    backend = Backend(models.BPE(vocab=vocab, merges=score_merges(tokens, scores),
                                 unk_token=unk, fuse_unk=True, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme="first" if add_space_prefix else "never",
        split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    typed = list(zip(tokens, types, strict=True))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in typed if k == CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in typed if k == USER_DEFINED])
    return backend
