"""Recurrent decode kernels (Triton, interpreter on CPU) against their torch references."""

from __future__ import annotations

import pytest
import torch

from kernels.linear_attention import (
    linear_attention_decode,
    linear_attention_decode_cost,
    linear_attention_decode_ref,
)
from kernels.selective_scan import (
    selective_state_update,
    selective_state_update_cost,
    selective_state_update_ref,
)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
# Scattered slots; -1 is a padding row that must write nothing and return zeros.
SLOTS = [3, 0, -1, 5]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}


# feature sizes that are not powers of two and cross the kernel's 32-wide feature tiles
@pytest.mark.parametrize("heads,feat,head_dim", [(2, 16, 16), (3, 45, 24), (1, 153, 16)],
                         ids=["f16-d16", "f45-d24", "f153-d16"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_linear_attention_decode_matches_ref(heads, feat, head_dim, dtype):
    gen = torch.Generator().manual_seed(0)
    batch, num_slots = len(SLOTS), 6
    q = torch.rand(batch, heads, feat, generator=gen).to(dtype)  # positive features
    k = torch.rand(batch, heads, feat, generator=gen).to(dtype)
    v = torch.randn(batch, heads, head_dim, generator=gen).to(dtype)
    s = torch.randn(num_slots, heads, feat, head_dim, generator=gen).to(dtype)
    z = (torch.rand(num_slots, heads, feat, generator=gen) + 1.0).to(dtype)
    slots = torch.tensor(SLOTS, dtype=torch.int64)
    s_ref, z_ref, s_before = s.clone(), z.clone(), s.clone()
    out = linear_attention_decode(q, k, v, s, z, slots)
    ref = linear_attention_decode_ref(q, k, v, s_ref, z_ref, slots)
    torch.testing.assert_close(out, ref, **_tol(dtype))
    torch.testing.assert_close(s, s_ref, **_tol(dtype))
    torch.testing.assert_close(z, z_ref, **_tol(dtype))
    assert torch.count_nonzero(out[2]) == 0
    # Slots 1, 2 and 4 belong to no sequence: left exactly as they were.
    untouched = torch.tensor([1, 2, 4])
    assert torch.equal(s[untouched], s_before[untouched])
    assert not torch.equal(s[torch.tensor([0, 3, 5])], s_before[torch.tensor([0, 3, 5])])


def test_linear_attention_decode_ref_is_the_formula():
    """One step by hand in float64: S += k v^T, z += k, out = q S / (q z + eps)."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.rand(1, 1, 5, generator=gen), torch.rand(1, 1, 5, generator=gen)
    v = torch.randn(1, 1, 3, generator=gen)
    s, z = torch.randn(2, 1, 5, 3, generator=gen), torch.rand(2, 1, 5, generator=gen)
    s_new = s[1, 0].double() + k[0, 0].double()[:, None] * v[0, 0].double()[None, :]
    z_new = z[1, 0].double() + k[0, 0].double()
    expect = (q[0, 0].double() @ s_new) / (q[0, 0].double() @ z_new + 1e-6)
    out = linear_attention_decode_ref(q, k, v, s, z, torch.tensor([1]))
    torch.testing.assert_close(out[0, 0].double(), expect)
    torch.testing.assert_close(s[1, 0].double(), s_new)


def _ssm_inputs(batch, d_inner, d_state, dtype):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(batch, d_inner, generator=gen).to(dtype)
    dt = torch.randn(batch, d_inner, generator=gen).to(dtype)
    a = -torch.rand(d_inner, d_state, generator=gen) * 4  # float32, as -exp(A_log)
    b = torch.randn(batch, d_state, generator=gen).to(dtype)
    c = torch.randn(batch, d_state, generator=gen).to(dtype)
    d = torch.randn(d_inner, generator=gen).to(dtype)
    z = torch.randn(batch, d_inner, generator=gen).to(dtype)
    dt_bias = torch.randn(d_inner, generator=gen).to(dtype)
    state = torch.randn(6, d_inner, d_state, generator=gen).to(dtype)
    return x, dt, a, b, c, d, z, dt_bias, state


@pytest.mark.parametrize("d_inner,d_state", [(16, 4), (100, 16), (72, 6)],
                         ids=["c16-n4", "c100-n16", "c72-n6"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_selective_state_update_matches_ref(d_inner, d_state, dtype):
    x, dt, a, b, c, d, z, dt_bias, state = _ssm_inputs(len(SLOTS), d_inner, d_state, dtype)
    slots = torch.tensor(SLOTS, dtype=torch.int64)
    state_ref = state.clone()
    out = selective_state_update(x, dt, a, b, c, d, z, dt_bias, state, slots)
    ref = selective_state_update_ref(x, dt, a, b, c, d, z, dt_bias, state_ref, slots)
    torch.testing.assert_close(out, ref, **_tol(dtype))
    torch.testing.assert_close(state, state_ref, **_tol(dtype))
    assert torch.count_nonzero(out[2]) == 0


def test_selective_state_update_ref_matches_transformers():
    """The reference equals transformers' `mamba_selective_state_update` (its torch path)."""
    from transformers.models.mamba.modeling_mamba import mamba_selective_state_update

    x, dt, a, b, c, d, z, dt_bias, state = _ssm_inputs(3, 12, 5, torch.float32)
    slots = torch.tensor([4, 1, 0])
    hf_state = state[slots].clone()
    expect = mamba_selective_state_update(hf_state, x, dt, a, b, c, d, dt_bias=dt_bias,
                                          dt_softplus=True, z=z)
    out = selective_state_update_ref(x, dt, a, b, c, d, z, dt_bias, state, slots)
    torch.testing.assert_close(out, expect, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state[slots], hf_state, atol=1e-6, rtol=1e-6)


def test_costs():
    la = linear_attention_decode_cost(2, 4, 16, 8, dtype_bytes=2, state_bytes=4)
    assert la.flops == 2 * 4 * (4 * 16 * 8 + 3 * 16 + 8)
    assert la.bytes == 2 * (4 * (2 * (16 * 8 + 16) * 4 + (2 * 16 + 2 * 8) * 2) + 8)
    ss = selective_state_update_cost(3, 32, 16, dtype_bytes=2, state_bytes=2)
    assert ss.flops == 3 * (7 * 32 * 16 + 8 * 32)
    assert ss.bytes > 2 * 3 * 32 * 16 * 2  # at least the state, read and written
