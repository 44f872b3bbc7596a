"""The C++ CPU rmsnorm, rope, silu_and_mul and store_kv (kernels/csrc) against the refs."""

from __future__ import annotations

import pytest
import torch

from kernels.activation import silu_and_mul_cpu, silu_and_mul_ref
from kernels.rmsnorm import rmsnorm_cpu, rmsnorm_ref
from kernels.rope import rope_cpu, rope_ref
from kernels.store_kv import store_kv_cpu, store_kv_ref

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _close_or_one_ulp(out: torch.Tensor, ref: torch.Tensor) -> None:
    """fp32: summation order only.  bf16/fp16: the same rounding steps as the reference, so
    at most one unit in the last place apart (where an fp32 sum in another order landed
    on the other side of a tie; 2 eps relative covers an ulp across a power of two) and
    almost everywhere bit-equal."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        return
    eps = torch.finfo(out.dtype).eps
    torch.testing.assert_close(out.float(), ref.float(), rtol=2 * eps, atol=1e-5)
    assert (out == ref).float().mean() > 0.97


@pytest.mark.parametrize("weight_fp32", [False, True], ids=["w_same", "w_fp32"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("rows,hidden", [(1, 576), (5, 37), (200, 576)],
                         ids=["decode", "tail", "parallel"])
def test_rmsnorm_matches_ref(rows, hidden, dtype, weight_fp32):
    x = _randn(rows, hidden, dtype=dtype, seed=1)
    residual = _randn(rows, hidden, dtype=dtype, seed=2)
    weight = _randn(hidden, dtype=torch.float32 if weight_fp32 else dtype, seed=3) + 1
    _close_or_one_ulp(rmsnorm_cpu(x, weight, 1e-5), rmsnorm_ref(x, weight, 1e-5))
    out, summed = rmsnorm_cpu(x, weight, 1e-5, residual)
    ref_out, ref_summed = rmsnorm_ref(x, weight, 1e-5, residual)
    assert torch.equal(summed, ref_summed)  # one rounded add: bit-equal
    _close_or_one_ulp(out, ref_out)
    assert torch.equal(x, _randn(rows, hidden, dtype=dtype, seed=1))  # inputs untouched


def test_rmsnorm_strided_rows_and_3d_input():
    wide = _randn(6, 100, dtype=torch.bfloat16)
    x = wide[:, 10:74]  # row stride 100
    w = _randn(64, dtype=torch.bfloat16, seed=4)
    _close_or_one_ulp(rmsnorm_cpu(x, w, 1e-6), rmsnorm_ref(x, w, 1e-6))
    x3 = _randn(2, 3, 64, dtype=torch.float32)
    _close_or_one_ulp(rmsnorm_cpu(x3, w.float(), 1e-6), rmsnorm_ref(x3, w.float(), 1e-6))


def _qkv(num_tokens, num_heads, num_kv_heads, head_dim, dtype, seed=0):
    """q, k views into one fused (T, (Hq + 2 Hkv) D) buffer, as the attention layer has them."""
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, seed=seed)
    q = qkv[:, :num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim].view(
        num_tokens, num_kv_heads, head_dim)
    return qkv, q, k


@pytest.mark.parametrize("cache_dtype", ["same", "fp32"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("num_tokens,head_dim,rotary_dim", [
    (1, 64, None), (7, 64, 32), (5, 80, 40), (300, 64, None)],
    ids=["decode", "partial", "half20", "parallel"])
def test_rope_in_place_on_qkv_views(num_tokens, head_dim, rotary_dim, dtype, cache_dtype):
    rot = rotary_dim or head_dim
    cache = _randn(512, rot, dtype=dtype if cache_dtype == "same" else torch.float32, seed=5)
    positions = torch.randint(0, 512, (num_tokens,), generator=torch.Generator().manual_seed(6))
    qkv, q, k = _qkv(num_tokens, 9, 3, head_dim, dtype)
    assert q._base is qkv and k._base is qkv  # views of the fused buffer, rotated in place
    ref_qkv, ref_q, ref_k = _qkv(num_tokens, 9, 3, head_dim, dtype)
    out_q, out_k = rope_cpu(q, k, positions, cache, rotary_dim)
    rope_ref(ref_q, ref_k, positions, cache, rotary_dim)
    assert out_q is q and out_k is k
    _close_or_one_ulp(qkv, ref_qkv)  # rotated dims, pass-through dims and v alike
    v_start = 12 * head_dim
    assert torch.equal(qkv[:, v_start:], ref_qkv[:, v_start:])  # v untouched
    if rot < head_dim:
        assert torch.equal(q[..., rot:], ref_q[..., rot:])


def test_rope_rejects_a_position_outside_the_cache():
    _, q, k = _qkv(2, 2, 1, 16, torch.float32)
    with pytest.raises(RuntimeError, match="outside the cache"):
        rope_cpu(q, k, torch.tensor([0, 8]), torch.ones(8, 16))


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("num_tokens,inter", [(1, 1536), (7, 37), (64, 1536)],
                         ids=["decode", "tail", "parallel"])
def test_silu_and_mul_matches_ref(num_tokens, inter, dtype):
    x = _randn(num_tokens, 2 * inter, dtype=dtype, seed=7) * 4  # through silu's curved part
    _close_or_one_ulp(silu_and_mul_cpu(x), silu_and_mul_ref(x))
    wide = _randn(num_tokens, 2 * inter + 8, dtype=dtype, seed=8)
    view = wide[:, 8:]  # row stride 2I + 8
    _close_or_one_ulp(silu_and_mul_cpu(view), silu_and_mul_ref(view))


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("block_size", [1, 5, 16])
@pytest.mark.parametrize("num_tokens", [1, 9, 600], ids=["t1", "t9", "t600"])
def test_store_kv_matches_ref_and_skips_padding(num_tokens, block_size, dtype):
    num_kv_heads, head_dim, num_blocks = 3, 24, -(-700 // block_size)
    qkv, _, key = _qkv(num_tokens, 2, num_kv_heads, head_dim, dtype)
    value = qkv[:, 5 * head_dim:].view(num_tokens, num_kv_heads, head_dim)
    gen = torch.Generator().manual_seed(9)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::4] = -1  # padding tokens
    caches = [torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"),
                         dtype=dtype) for _ in range(4)]
    store_kv_cpu(key, value, caches[0], caches[1], slots)
    store_kv_ref(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0].isnan(), caches[2].isnan())  # padding slots stay unwritten
    assert torch.equal(caches[0].nan_to_num(), caches[2].nan_to_num())
    assert torch.equal(caches[1].nan_to_num(), caches[3].nan_to_num())


def test_store_kv_rejects_a_slot_past_the_cache():
    key = torch.zeros(1, 1, 8)
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(RuntimeError, match="past the cache"):
        store_kv_cpu(key, key, cache, cache.clone(), torch.tensor([8]))
