"""The quantized KV cache (kernels/kv_quant.py): the format's round trip, and every kernel
that writes or reads it (store_kv, paged decode, varlen prefill; Triton, C++ CPU) against
its torch reference.

Caches come from `make_paged_kv` (blocks shuffled across sequences, unused slots NaN) and
are quantized as a whole, so an unused slot's scale is NaN: a kernel that reads a slot it
must not turns its output into NaN.  Triton runs through the interpreter here, in float32
and float16 (the interpreter's bfloat16 tl.dot is wrong; bf16 runs on a GPU); the C++
kernels and the references run float32, bfloat16 and float16.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernels_test_utils import PagedKV, make_paged_kv, tolerances

from kernels.kv_quant import QMAX, dequantize_kv_ref, quantize_kv_ref
from kernels.paged_decode_attention import (
    paged_decode_attention,
    paged_decode_attention_cpu,
    paged_decode_attention_ref,
)
from kernels.prefill_attention import (
    prefill_attention,
    prefill_attention_cpu,
    prefill_attention_ref,
)
from kernels.store_kv import store_kv, store_kv_cpu, store_kv_ref

INT8, FP8 = torch.int8, torch.float8_e4m3fn
ACTS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Triton under the interpreter: float32 and float16; bfloat16 compiled on a GPU only.
TRITON_ACTS = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
               pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.skipif(
                   not torch.cuda.is_available(), reason="interpreter bf16 tl.dot is wrong"))]
# (query heads, KV heads): MHA, SmolLM2's GQA 3, MQA.
GQA = {"mha": (2, 2), "gqa3": (9, 3), "mqa": (8, 1)}
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else tolerances(dtype)


def _quantized(kv: PagedKV, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(k_cache, v_cache, k_scales, v_scales) of the whole cache; NaN slots get NaN scales."""
    kq, ks = quantize_kv_ref(kv.k_cache, dtype)
    vq, vs = quantize_kv_ref(kv.v_cache, dtype)
    return kq, vq, ks, vs


def _on(device: str, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(device) for t in tensors]


# ---- the format -------------------------------------------------------------------------
@pytest.mark.parametrize("act", list(ACTS.values()), ids=list(ACTS))
def test_int8_round_trip_within_half_a_step(act):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 40, generator=gen) * torch.logspace(-3, 3, 64)[:, None, None]
    x[5, 1, 7] = 900.0  # an outlier sets its row's scale
    x[9, 2] = 0.0  # an all-zero row
    x = x.to(act)
    q, scale = quantize_kv_ref(x, INT8)
    assert q.dtype == INT8 and scale.dtype == torch.float32 and scale.shape == x.shape[:2]
    xf = x.float()
    torch.testing.assert_close(scale, xf.abs().amax(-1) / 127, rtol=0, atol=0)
    assert int(q.abs().max()) <= 127
    assert bool((q.abs().amax(-1)[scale > 0] == 127).all())  # each row's largest is +-127
    assert scale[9, 2] == 0 and not q[9, 2].any()
    err = (dequantize_kv_ref(q, scale) - xf).abs()
    # round to nearest: at most half a step (scale / 2) per value, plus float rounding
    assert bool((err <= scale[..., None] * (0.5 + 1e-5)).all())


def test_int8_rounds_half_to_even():
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 126.5]])  # scale exactly 1
    q, scale = quantize_kv_ref(x, INT8)
    assert scale.item() == 1.0
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, 126]]


def test_fp8_round_trip_within_e4m3_precision():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(128, 2, 64, generator=gen) * torch.logspace(-2, 2, 128)[:, None, None]
    q, scale = quantize_kv_ref(x, FP8)
    assert q.dtype == FP8
    assert float(q.float().abs().max()) <= QMAX[FP8]
    err = (dequantize_kv_ref(q, scale) - x).abs()
    # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 of the value; below 2^-6 * scale the
    # values are subnormal, spaced 2^-9 * scale apart.
    bound = torch.maximum(x.abs() * 2.0 ** -4, scale[..., None] * 2.0 ** -10)
    assert bool((err <= bound * (1 + 1e-5)).all())


# ---- store_kv ---------------------------------------------------------------------------
def _store(fn, act: torch.dtype, cache_dtype: torch.dtype, device: str = "cpu"):
    """Store 9 tokens (one padding, one all-zero row) of 3 heads, D 40 / Dv 72, into a
    pool whose untouched slots keep NaN scales and 55 values; returns the four tensors."""
    gen = torch.Generator().manual_seed(2)
    wide = torch.randn(9, 3 * 40 + 16, generator=gen) * 3
    key = wide[:, 8:8 + 3 * 40].unflatten(-1, (3, 40))  # strided, as a view of fused qkv
    value = torch.randn(9, 3, 72, generator=gen)
    key[4, 1] = 0.0
    num_blocks, block_size = 5, 4
    k_cache = torch.full((num_blocks, block_size, 3, 40), 55).to(cache_dtype)
    v_cache = torch.full((num_blocks, block_size, 3, 72), 55).to(cache_dtype)
    k_scales = torch.full((num_blocks, block_size, 3), float("nan"))
    v_scales = torch.full((num_blocks, block_size, 3), float("nan"))
    slots = torch.tensor([0, 5, -1, 9, 3, 17, 12, 1, 2])
    out = _on(device, k_cache, v_cache, k_scales, v_scales)
    fn(*_on(device, key.to(act), value.to(act)), out[0], out[1], slots.to(device), out[2], out[3])
    return [t.cpu() for t in out], key.to(act), value.to(act), slots


def _same_bytes(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype
        if x.is_floating_point() and x.dtype == torch.float32:
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
        else:
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


@pytest.mark.parametrize("cache_dtype", [INT8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("act", list(ACTS.values()), ids=list(ACTS))
def test_store_kv_ref_writes_quantized_rows_and_skips_padding(act, cache_dtype):
    (kc, vc, ks, vs), key, value, slots = _store(store_kv_ref, act, cache_dtype)
    kq, kscale = quantize_kv_ref(key, cache_dtype)
    vq, vscale = quantize_kv_ref(value, cache_dtype)
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        b, o = divmod(slot, 4)
        assert torch.equal(kc[b, o].view(torch.uint8), kq[t].view(torch.uint8))
        assert torch.equal(vc[b, o].view(torch.uint8), vq[t].view(torch.uint8))
        assert torch.equal(ks[b, o], kscale[t]) and torch.equal(vs[b, o], vscale[t])
    written = {s for s in slots.tolist() if s >= 0}
    untouched = [s for s in range(20) if s not in written]
    assert bool(ks.view(-1, 3)[untouched].isnan().all())  # padding and unused slots untouched
    # token 4's head 1 is all zeros; it went to slot 3 = block 0, offset 3
    assert ks[0, 3, 1] == 0 and not kc[0, 3, 1].float().any()


@pytest.mark.parametrize("act", TRITON_ACTS)
def test_store_kv_triton_int8_equals_ref(act):
    _same_bytes(_store(store_kv, act, INT8, DEV)[0], _store(store_kv_ref, act, INT8)[0])


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the Triton interpreter converts float32 to float8e4nv wrongly "
                           "(triton 3.8: -31.3 became -16); fp8 storing is checked on a GPU")
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_store_kv_triton_fp8_equals_ref(act):
    _same_bytes(_store(store_kv, act, FP8, DEV)[0], _store(store_kv_ref, act, FP8)[0])


@pytest.mark.parametrize("act", list(ACTS.values()), ids=list(ACTS))
def test_store_kv_cpu_int8_equals_ref(act):
    _same_bytes(_store(store_kv_cpu, act, INT8)[0], _store(store_kv_ref, act, INT8)[0])


# ---- paged decode attention -------------------------------------------------------------
def _decode_case(lens, heads, dtype, cache_dtype, *, head_dim=64, v_dim=None, num_q=None,
                 block_size=16, seed=0):
    num_heads, num_kv_heads = heads
    kv = make_paged_kv(lens, num_kv_heads, head_dim, v_dim, block_size=block_size, seed=seed)
    caches = _quantized(kv, cache_dtype)
    shape = ((len(lens), num_heads, head_dim) if num_q is None
             else (len(lens), num_q, num_heads, head_dim))
    q = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return q, kv, caches


def _decode(fn, q, kv, caches, window=None, device="cpu", **kw):
    kc, vc, ks, vs = _on(device, *caches)
    q, tables, lens = _on(device, q, kv.block_tables, kv.context_lens)
    return fn(q, kc, vc, tables, lens, 1 / math.sqrt(q.shape[-1]), window,
              k_scales=ks, v_scales=vs, **kw).cpu()


def test_decode_ref_equals_float_attention_over_dequantized_values():
    """The reference dequantizes what it gathers, and only that."""
    q, kv, (kc, vc, ks, vs) = _decode_case([5, 40, 17], GQA["gqa3"], torch.float32, INT8)
    out = _decode(paged_decode_attention_ref, q, kv, (kc, vc, ks, vs))
    deq_k, deq_v = dequantize_kv_ref(kc, ks), dequantize_kv_ref(vc, vs)
    plain = paged_decode_attention_ref(q, deq_k, deq_v, kv.block_tables, kv.context_lens,
                                       1 / 8)
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)
    exact = paged_decode_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables,
                                       kv.context_lens, 1 / 8)
    assert 0 < float((out - exact).abs().max()) < 0.05  # int8 moves the output a little


@pytest.mark.parametrize("cache_dtype", [INT8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("dtype", TRITON_ACTS)
@pytest.mark.parametrize("heads", list(GQA.values()), ids=list(GQA))
@pytest.mark.parametrize("num_splits", [1, 3], ids=["splits1", "splits3"])
def test_decode_triton_equals_ref(num_splits, heads, dtype, cache_dtype):
    q, kv, caches = _decode_case([1, 17, 50, 90], heads, dtype, cache_dtype, block_size=5)
    out = _decode(paged_decode_attention, q, kv, caches, device=DEV, num_splits=num_splits)
    ref = _decode(paged_decode_attention_ref, q, kv, caches)
    assert torch.isfinite(out).all()  # no NaN-scaled slot was read
    torch.testing.assert_close(out, ref, **_tol(dtype))


@pytest.mark.parametrize("window,num_q", [(3, None), (20, 3), (None, 3)],
                         ids=["w3", "w20-q3", "q3"])
def test_decode_triton_window_and_multi_query(window, num_q):
    q, kv, caches = _decode_case([2, 17, 50], GQA["gqa3"], torch.float32, INT8, num_q=num_q)
    out = _decode(paged_decode_attention, q, kv, caches, window, device=DEV)
    ref = _decode(paged_decode_attention_ref, q, kv, caches, window)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


@pytest.mark.parametrize("dtype", list(ACTS.values()), ids=list(ACTS))
@pytest.mark.parametrize("heads", list(GQA.values()), ids=list(GQA))
@pytest.mark.parametrize("lens,block_size", [([45], 16), ([1, 17, 32, 50, 100], 16),
                                             ([3, 9, 26], 5), ([7, 64], 1)],
                         ids=["b1", "ragged", "bs5", "bs1"])
def test_decode_cpu_equals_ref(lens, block_size, heads, dtype):
    q, kv, caches = _decode_case(lens, heads, dtype, INT8, block_size=block_size)
    out = _decode(paged_decode_attention_cpu, q, kv, caches)
    ref = _decode(paged_decode_attention_ref, q, kv, caches)
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **_tol(dtype))


@pytest.mark.parametrize("window,num_q,head_dim,v_dim",
                         [(3, None, 64, None), (20, 3, 64, None), (None, 2, 40, 24),
                          (7, 2, 72, 96)],
                         ids=["w3", "w20-q3", "d40-dv24", "w7-d72-dv96"])
def test_decode_cpu_windows_multi_query_and_head_dims(window, num_q, head_dim, v_dim):
    q, kv, caches = _decode_case([2, 17, 50, 90], GQA["gqa3"], torch.float32, INT8,
                                 num_q=num_q, head_dim=head_dim, v_dim=v_dim)
    out = _decode(paged_decode_attention_cpu, q, kv, caches, window)
    ref = _decode(paged_decode_attention_ref, q, kv, caches, window)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


def test_decode_cpu_long_context_on_all_threads():
    q, kv, caches = _decode_case([1500, 900, 2100], GQA["gqa3"], torch.float32, INT8)
    torch.testing.assert_close(_decode(paged_decode_attention_cpu, q, kv, caches),
                               _decode(paged_decode_attention_ref, q, kv, caches),
                               **tolerances(torch.float32))


# ---- varlen prefill attention -----------------------------------------------------------
def _prefill_case(contexts, new_tokens, heads, dtype, cache_dtype, block_size=16):
    """Sequences with `contexts[b]` tokens in the cache, the last `new_tokens[b]` new."""
    num_heads, num_kv_heads = heads
    kv = make_paged_kv(contexts, num_kv_heads, 64, block_size=block_size, seed=3)
    caches = _quantized(kv, cache_dtype)
    cu = torch.tensor([0, *torch.tensor(new_tokens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), num_heads, 64, generator=torch.Generator().manual_seed(4))
    return q.to(dtype), kv, caches, cu


def _prefill(fn, q, kv, caches, cu, window=None, device="cpu"):
    kc, vc, ks, vs = _on(device, *caches)
    q, cu, lens, tables = _on(device, q, cu, kv.context_lens, kv.block_tables)
    return fn(q, kc, vc, cu, lens, tables, 0.125, window, k_scales=ks, v_scales=vs).cpu()


CHUNKS = {"whole": ([9, 33, 1], [9, 33, 1]), "chunked": ([40, 21, 70], [7, 21, 3])}


@pytest.mark.parametrize("cache_dtype", [INT8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("dtype", TRITON_ACTS)
@pytest.mark.parametrize("chunks", list(CHUNKS.values()), ids=list(CHUNKS))
@pytest.mark.parametrize("window", [None, 6], ids=["full", "w6"])
def test_prefill_triton_equals_ref(window, chunks, dtype, cache_dtype):
    q, kv, caches, cu = _prefill_case(*chunks, GQA["gqa3"], dtype, cache_dtype, block_size=5)
    out = _prefill(prefill_attention, q, kv, caches, cu, window, device=DEV)
    ref = _prefill(prefill_attention_ref, q, kv, caches, cu, window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", list(ACTS.values()), ids=list(ACTS))
@pytest.mark.parametrize("heads", list(GQA.values()), ids=list(GQA))
@pytest.mark.parametrize("chunks", list(CHUNKS.values()), ids=list(CHUNKS))
@pytest.mark.parametrize("window", [None, 6], ids=["full", "w6"])
def test_prefill_cpu_equals_ref(window, chunks, heads, dtype):
    q, kv, caches, cu = _prefill_case(*chunks, heads, dtype, INT8)
    out = _prefill(prefill_attention_cpu, q, kv, caches, cu, window)
    ref = _prefill(prefill_attention_ref, q, kv, caches, cu, window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **_tol(dtype))


def test_prefill_ref_equals_float_attention_over_dequantized_values():
    q, kv, (kc, vc, ks, vs), cu = _prefill_case(*CHUNKS["chunked"], GQA["gqa3"],
                                                torch.float32, INT8)
    out = _prefill(prefill_attention_ref, q, kv, (kc, vc, ks, vs), cu)
    plain = prefill_attention_ref(q, dequantize_kv_ref(kc, ks), dequantize_kv_ref(vc, vs), cu,
                                  kv.context_lens, kv.block_tables, 0.125)
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)
