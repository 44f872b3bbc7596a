"""Streamed chunks -> per-token timestamps, the way the in-process engine records them.

A server streams text, not tokens: usually one token per chunk, but a chunk can carry
several (detokenizers hold back partial UTF-8 characters or stop-string prefixes,
speculative decoding accepts several tokens a step, and a slow client reads merged
chunks).  Each chunk's token count comes from, in order of trust:

1. token ids the chunk carries (`token_ids`, as some servers send);
2. the tokenizer: the chunk's text encoded alone (no special tokens), at least 1;
3. without a tokenizer: 1 per chunk.

When the server reports `usage.completion_tokens`, that total wins and is shared over the
chunks in proportion to their counts (largest remainders), so token counts are exact
even where encoding a chunk alone is not.  A reasoning model's stream has reasoning chunks
before its content chunks; with `usage.completion_tokens_details.reasoning_tokens` the two
totals are shared over their own chunks (`split_counts`), else the one total over all.

Timestamps: the tokens of the first chunk all arrive at the first chunk's time (TTFT is
the time to the first non-empty chunk, and ITL does not count tokens that came with the
first one).  The k tokens of a later chunk are spread evenly over the gap since the
previous chunk, the last one at the chunk's own arrival, so each gets gap / k as its ITL.
That is the caveat: inside a multi-token chunk the per-token times are interpolated, not
observed (their sum, TPOT and E2E are exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Chunk:
    """One non-empty chunk: when its bytes arrived, its text, ids when sent, and whether it
    was reasoning (`delta.reasoning_content` / `delta.reasoning`) rather than content."""

    time_s: float
    text: str
    token_ids: tuple[int, ...] | None = None
    is_reasoning: bool = False


def chunk_token_counts(chunks: Sequence[Chunk], tokenizer: Any = None) -> list[int]:
    """How many tokens each chunk carries, before any `usage` total is applied."""
    counts = []
    for chunk in chunks:
        if chunk.token_ids is not None:
            counts.append(len(chunk.token_ids))
        elif tokenizer is not None:
            counts.append(max(1, len(tokenizer.encode(chunk.text, add_special_tokens=False))))
        else:
            counts.append(1)
    return counts


def share_total(counts: Sequence[int], total: int) -> list[int]:
    """`total` tokens over the chunks in proportion to `counts` (largest remainders).

    Returns `counts` unchanged when they already sum to `total`.  With as many tokens as
    chunks or more, every chunk keeps at least one token (it did carry text).
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    have = sum(counts)
    if have == total or not counts:
        return list(counts)
    weights = list(counts) if have > 0 else [1] * len(counts)
    wsum = sum(weights)
    exact = [total * w / wsum for w in weights]
    shares = [int(x) for x in exact]
    order = sorted(range(len(counts)), key=lambda i: (shares[i] - exact[i], i))
    for i in order[:total - sum(shares)]:
        shares[i] += 1
    if total >= len(counts):  # every chunk carried text: at least one token each
        for i in range(len(shares)):
            if shares[i] == 0:
                donor = max(range(len(shares)), key=lambda j: shares[j])
                shares[donor] -= 1
                shares[i] = 1
    return shares


def token_times(chunks: Sequence[Chunk], counts: Sequence[int]) -> list[float]:
    """One timestamp per token: the first chunk's tokens at its time, later chunks' spread
    evenly over the gap since the previous chunk that carried tokens."""
    times: list[float] = []
    prev: float | None = None
    for chunk, k in zip(chunks, counts, strict=True):
        if k <= 0:
            continue
        if prev is None:
            times.extend([chunk.time_s] * k)
        else:
            gap = chunk.time_s - prev
            times.extend(prev + gap * (j + 1) / k for j in range(k))
        prev = chunk.time_s
    return times


def split_counts(chunks: Sequence[Chunk], counts: Sequence[int], total: int | None,
                 reasoning_total: int | None) -> tuple[list[int], int]:
    """Per-chunk token counts with the server's totals applied, and the reasoning tokens.

    `total` is `usage.completion_tokens` (None: not sent) and `reasoning_total` its
    `completion_tokens_details.reasoning_tokens`.  The two totals are shared over the
    reasoning and the content chunks separately when they fit them (at least one token per
    chunk of each kind); otherwise `total` is shared over all chunks and the reasoning
    tokens are those that fell on reasoning chunks.
    """
    is_reasoning = [c.is_reasoning for c in chunks]
    num_r = sum(is_reasoning)
    if total is None:
        shared = list(counts)
    elif (reasoning_total is not None and num_r <= reasoning_total <= total
          and total - reasoning_total >= len(chunks) - num_r
          and (reasoning_total == 0) == (num_r == 0)):
        r = iter(share_total([k for k, f in zip(counts, is_reasoning, strict=True) if f],
                             reasoning_total))
        c = iter(share_total([k for k, f in zip(counts, is_reasoning, strict=True) if not f],
                             total - reasoning_total))
        shared = [next(r) if f else next(c) for f in is_reasoning]
    else:
        shared = share_total(counts, total)
    return shared, sum(k for k, f in zip(shared, is_reasoning, strict=True) if f)
