"""The sampler's greedy paths: numpy's argmax on a CPU and the all-greedy shortcut."""

from __future__ import annotations

import pytest
import torch

from infbench.engine.request import SamplingParams
from infbench.engine.sampler import Sampler, argmax_rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64],
                         ids=str)
def test_argmax_rows_is_torch_argmax_with_ties_nan_and_inf(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 301, generator=gen).to(dtype)
    logits[1, [5, 9]] = 100.0  # a tie: the first wins
    logits[2, [7, 3]] = float("nan")  # NaN counts as the maximum: the first NaN
    logits[3, 11] = float("inf")
    logits[4] = float("-inf")  # all -inf: index 0
    logits[5] = 0.0
    want = logits.argmax(dim=-1).tolist()
    assert argmax_rows(logits) == want
    assert argmax_rows(logits.t().contiguous().t()) == want  # a column-major view too
    assert want[1] == 5 and want[2] == 3 and want[3] == 11 and want[4] == 0


def test_greedy_shortcut_gives_what_sample_gives() -> None:
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(1))
    sampler = Sampler(0)
    params = [SamplingParams()] * 8
    keys = [(f"r{i}", 0) for i in range(8)]
    full = sampler.sample(logits, params, keys, [1] * 8, [0] * 8)
    assert [[t] for t in sampler.greedy(logits)] == full
