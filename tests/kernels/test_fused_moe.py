"""fused_moe (Triton, interpreter on CPU) against its torch reference and a per-token loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernels_test_utils import DTYPES, tolerances

from kernels.fused_moe import ExpertAct, fused_moe, fused_moe_cost, fused_moe_ref, moe_align

# (tokens, hidden, inter, experts, top_k): lengths that are not multiples of the tiles
SHAPES = {"t1-e4-k2": (1, 32, 24, 4, 2), "t7-e8-k3": (7, 40, 20, 8, 3),
          "t19-e6-k1": (19, 48, 36, 6, 1)}


def _inputs(shape, dtype, skew=False):
    t, h, i, e, k = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(t, h, generator=gen).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=gen) / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, i, generator=gen) / i**0.5).to(dtype)
    scores = torch.randn(t, e, generator=gen)
    if skew:  # every token prefers expert 0: one long slice, several empty experts
        scores[:, 0] += 10
    weights, ids = scores.softmax(-1).topk(k, dim=-1)
    return x, w13, w2, weights, ids


def _per_token(x, w13, w2, weights, ids):
    inter = w13.shape[1] // 2
    rows = []
    for t in range(x.shape[0]):
        acc = torch.zeros(x.shape[1], dtype=torch.float64)
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w13[e].double() @ x[t].double()).split(inter)
            acc += weights[t, j].double() * (w2[e].double() @ (F.silu(gate) * up))
        rows.append(acc)
    return torch.stack(rows)


@pytest.mark.parametrize("skew", [False, True], ids=["random", "skewed"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_ref_matches_per_token_loop(shape, skew):
    args = _inputs(shape, torch.float32, skew)
    torch.testing.assert_close(fused_moe_ref(*args).double(), _per_token(*args),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("skew", [False, True], ids=["random", "skewed"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_kernel_matches_ref(shape, skew, dtype):
    args = _inputs(shape, dtype, skew)
    out = fused_moe(*args)
    assert out.dtype == dtype and out.shape == args[0].shape
    torch.testing.assert_close(out, fused_moe_ref(*args), **tolerances(dtype))


def test_align_groups_pairs_by_expert_in_padded_tiles():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 3]])
    a = moe_align(ids, num_experts=5, block_m=4)
    pairs = a.sorted_pairs.tolist()
    experts = a.block_expert.tolist()
    sentinel = ids.numel()
    # expert 0: pairs 1, 4; expert 1: pair 3; expert 2: pairs 0, 2, 5, 6; expert 3: pair 7
    assert pairs[:16] == [1, 4, sentinel, sentinel, 3, sentinel, sentinel, sentinel,
                          0, 2, 5, 6, 7, sentinel, sentinel, sentinel]
    assert experts[:4] == [0, 1, 2, 3] and all(e == -1 for e in experts[4:])
    assert a.counts.tolist() == [2, 1, 4, 1, 0]


def test_a_tokens_result_does_not_depend_on_the_batch():
    x, w13, w2, weights, ids = _inputs((9, 32, 24, 4, 2), torch.float32)
    full = fused_moe(x, w13, w2, weights, ids)
    for t in (0, 4, 8):
        one = fused_moe(x[t:t + 1].contiguous(), w13, w2, weights[t:t + 1], ids[t:t + 1])
        torch.testing.assert_close(one[0], full[t], atol=1e-6, rtol=1e-6)
        ref_one = fused_moe_ref(x[t:t + 1], w13, w2, weights[t:t + 1], ids[t:t + 1])
        # CPU GEMMs block rows differently for other row counts: equal to rounding
        torch.testing.assert_close(ref_one[0], fused_moe_ref(x, w13, w2, weights, ids)[t],
                                   atol=1e-6, rtol=1e-6)


def test_cost_counts_touched_experts_once():
    c = fused_moe_cost(num_tokens=10, top_k=2, hidden=64, inter=32, experts_touched=3,
                       dtype_bytes=2)
    assert c.flops == 20 * (6.0 * 64 * 32 + 4.0 * 32)
    weight_bytes = 3 * 3 * 64 * 32 * 2
    acts = 20 * (64 + 64) * 2 + 20 * 64 * 4 + 10 * 64 * 2
    assert c.bytes == weight_bytes + acts


def _gpt_oss_act(shape, limit):
    """gpt-oss expert biases (wide enough to matter) and its clamped SwiGLU."""
    _, h, i, e, _ = shape
    gen = torch.Generator().manual_seed(1)
    return ExpertAct("clamped_swiglu", alpha=1.702, limit=limit,
                     b13=torch.randn(e, 2 * i, generator=gen) * 0.5,
                     b2=torch.randn(e, h, generator=gen) * 0.5)


def _gpt_oss_per_token(x, w13, w2, weights, ids, act):
    """transformers' GptOssExperts formula, token by token in float64."""
    inter = w13.shape[1] // 2
    rows = []
    for t in range(x.shape[0]):
        acc = torch.zeros(x.shape[1], dtype=torch.float64)
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate_up = w13[e].double() @ x[t].double() + act.b13[e].double()
            gate = gate_up[:inter].clamp(max=act.limit)
            up = gate_up[inter:].clamp(-act.limit, act.limit)
            glu = gate * torch.sigmoid(gate * act.alpha)
            acc += weights[t, j].double() * (w2[e].double() @ ((up + 1) * glu)
                                             + act.b2[e].double())
        rows.append(acc)
    return torch.stack(rows)


@pytest.mark.parametrize("limit", [7.0, 0.3], ids=["limit7", "limit0.3-clamps"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_gpt_oss_experts_ref_and_kernel_match_the_formula(shape, limit):
    args = _inputs(shape, torch.float32)
    act = _gpt_oss_act(shape, limit)
    expected = _gpt_oss_per_token(*args, act)
    ref = fused_moe_ref(*args, act)
    torch.testing.assert_close(ref.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_moe(*args, act), ref, atol=1e-5, rtol=1e-5)
    # a clamp that bites changes the result: the test could tell a missing clamp
    plain = ExpertAct("clamped_swiglu", limit=1e6, b13=act.b13, b2=act.b2)
    if limit < 1:
        assert not torch.allclose(fused_moe_ref(*args, plain), ref, atol=1e-3)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_gpt_oss_experts_kernel_matches_ref_in_each_dtype(dtype):
    shape = SHAPES["t7-e8-k3"]
    x, w13, w2, weights, ids = _inputs(shape, dtype)
    act = _gpt_oss_act(shape, 0.5)
    act = ExpertAct(act.kind, act.alpha, act.limit, act.b13.to(dtype), act.b2.to(dtype))
    out = fused_moe(x, w13, w2, weights, ids, act)
    torch.testing.assert_close(out, fused_moe_ref(x, w13, w2, weights, ids, act),
                               **tolerances(dtype))
