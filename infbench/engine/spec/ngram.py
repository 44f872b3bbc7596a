"""N-gram prompt lookup (Saxena 2023; vLLM's `ngram` method): no draft model.

The last n tokens of a sequence (n from `max_n` down to `min_n`) are looked up in its
earlier tokens, prompt and output; the tokens that followed their most recent earlier
occurrence are the drafts.  It costs a search over the context on the host and nothing on
the accelerator, and it pays off where the output repeats its input (code edits,
summaries, retrieval, structured text) and proposes nothing elsewhere.
"""

from __future__ import annotations

import numpy as np

from infbench.engine.spec.base import Proposal, Proposer, SpecRequest


def lookup(tokens: list[int] | np.ndarray, num_drafts: int, max_n: int, min_n: int) -> list[int]:
    """Up to `num_drafts` tokens that followed the latest earlier match of the longest
    suffix of `tokens` of length in [min_n, max_n]; [] when none matches."""
    arr = np.asarray(tokens, dtype=np.int64)
    length = arr.shape[0]
    if num_drafts <= 0:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = arr[length - n:]
        # Windows starting at 0..length-n-1 (the suffix itself excluded).
        windows = np.lib.stride_tricks.sliding_window_view(arr[:length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the token after the latest match
            return arr[start:start + num_drafts].tolist()  # type: ignore[no-any-return]
    return []


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n

    def propose(self, requests: list[SpecRequest]) -> list[Proposal]:
        return [Proposal(lookup(r.token_ids, r.num_drafts, self.max_n, self.min_n))
                for r in requests]

    def cost_ratio_hint(self) -> float | None:
        return 0.0
