"""Chunks -> token counts and per-token times (client/tokens.py)."""

from __future__ import annotations

import pytest

from infbench.client.tokens import Chunk, chunk_token_counts, share_total, token_times
from infbench.measure.metrics import inter_token_latencies


@pytest.mark.parametrize(("counts", "total", "expected"), [
    ([1, 1, 1], 3, [1, 1, 1]),  # already right: unchanged
    ([1, 1, 1], 5, [2, 2, 1]),  # extra tokens over equal chunks, earliest first
    ([1, 3], 8, [2, 6]),  # in proportion to the counts
    ([1, 9], 3, [1, 2]),  # at least one token for each chunk that carried text
    ([1, 3], 6, [2, 4]),  # 1.5 : 4.5, the tie to the earlier chunk
    ([2, 2], 1, [1, 0]),  # fewer tokens than chunks
    ([4], 1, [1]),
    ([2, 5], 0, [0, 0]),
])
def test_share_total(counts: list[int], total: int, expected: list[int]) -> None:
    shared = share_total(counts, total)
    assert shared == expected
    assert sum(shared) == total


def test_first_chunk_tokens_share_its_time_later_chunks_are_spread() -> None:
    chunks = [Chunk(0.10, " a b"), Chunk(0.20, " c"), Chunk(0.50, " d e f")]
    times = token_times(chunks, [2, 1, 3])
    assert times == pytest.approx([0.10, 0.10, 0.20, 0.30, 0.40, 0.50])
    # The metrics then see TTFT at the first chunk and ITL gap / k inside a chunk.
    assert inter_token_latencies(times) == pytest.approx([0.10, 0.10, 0.10, 0.10])


def test_counts_from_ids_then_tokenizer_then_one_per_chunk() -> None:
    class Words:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            assert add_special_tokens is False
            return list(range(len(text.split())))

    chunks = [Chunk(0.0, " x y", (5, 6, 7)), Chunk(0.1, " a b"), Chunk(0.2, " ")]
    assert chunk_token_counts(chunks, Words()) == [3, 2, 1]  # a whitespace chunk: at least 1
    assert chunk_token_counts(chunks) == [3, 1, 1]
