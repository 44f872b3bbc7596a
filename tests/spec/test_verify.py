"""Verification rules (engine/verify.py) and the n-gram lookup, without an engine."""

from __future__ import annotations

import pytest
import torch

from infbench.engine.spec.ngram import NgramProposer, lookup
from infbench.engine.verify import verify_greedy, verify_sampled
from infbench.measure.speculative import predicted_speedup

# chi-square critical values at p = 0.001 by degrees of freedom (tables; no scipy here)
CHI2_999 = {3: 16.27, 4: 18.47, 5: 20.52, 7: 24.32}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_greedy_accepts_the_matching_prefix_then_the_target_token() -> None:
    assert verify_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert verify_greedy([5, 9, 7, 8], [5, 6, 7]) == [5, 9]  # second rejected: correction
    assert verify_greedy([4, 6, 7, 8], [5, 6, 7]) == [4]
    assert verify_greedy([3], []) == [3]
    with pytest.raises(ValueError):
        verify_greedy([1, 2], [1, 2])


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_sampling_keeps_the_target_distribution(one_hot: bool) -> None:
    """The first emitted token follows p[0] whatever q proposes (and so does the second)."""
    gen = torch.Generator().manual_seed(0)
    v, k, n = 5, 2, 20000
    p = torch.softmax(torch.randn(k + 1, v, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(k, v, generator=gen) * 2, -1)
    first = torch.zeros(v)
    for _ in range(n):
        if one_hot:  # a deterministic proposer: always the same (unlikely-ish) drafts
            drafts, qs = [int(q[0].argmin()), 1], None
        else:
            drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
            qs = q
        out = verify_sampled(p, drafts, qs, gen)
        assert 1 <= len(out) <= k + 1
        first[out[0]] += 1
    assert chi_square(first, p[0]) < CHI2_999[v - 1]


def test_identical_draft_accepts_everything() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(4, 7, generator=gen), -1)
    for _ in range(200):
        drafts = [int(torch.multinomial(p[i], 1, generator=gen)) for i in range(3)]
        assert len(verify_sampled(p, drafts, p[:3], gen)) == 4


def test_ngram_lookup() -> None:
    assert lookup([1, 2, 3, 4, 1, 2], 3, 4, 1) == [3, 4, 1]
    assert lookup([1, 2, 3], 2, 4, 1) == []
    assert lookup([7, 1, 2, 9, 1, 2], 2, 2, 2) == [9, 1]  # the latest match wins
    assert lookup([1, 2, 3, 1], 0, 4, 1) == []
    with pytest.raises(ValueError):
        NgramProposer(max_n=1, min_n=2)


def test_predicted_speedup() -> None:
    assert predicted_speedup(0.0, 4, 0.0) == pytest.approx(1.0)
    assert predicted_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    # Leviathan et al.'s expected tokens per step (1 - a^(k+1)) / (1 - a) over the cost
    assert predicted_speedup(0.8, 3, 0.1) == pytest.approx((1 - 0.8**4) / 0.2 / 1.3)
