"""The parallel chunked prefill forms equal the token-by-token recurrences."""

from __future__ import annotations

import pytest
import torch

from infbench.model.linear_attention import (
    _favor_projection,
    chunked_linear_attention,
    feature_map,
    padded_layout,
)
from infbench.model.mamba import selective_scan
from kernels.linear_attention import linear_attention_decode_ref

FEATURE_MAPS = ["elu", "relu", "favor", "taylor"]


def test_padded_layout_round_trips_packed_tokens():
    cu = torch.tensor([0, 3, 4, 11])
    index, valid = padded_layout(cu, chunk=4)
    assert index.shape == (3, 8) and valid.sum() == 11
    x = torch.arange(11) + 100
    assert torch.equal((x[index] * valid)[valid], x)
    assert index[2, :7].tolist() == list(range(4, 11)) and not valid[0, 3:].any()


@pytest.mark.parametrize("chunk", [3, 64], ids=["chunk3", "chunk64"])
@pytest.mark.parametrize("kind", FEATURE_MAPS)
def test_linear_attention_chunked_equals_recurrent(kind, chunk):
    gen = torch.Generator().manual_seed(0)
    bsz, length, heads, d = 2, 10, 3, 8
    proj = _favor_projection(12, d, seed=7) if kind == "favor" else None
    q = feature_map(torch.randn(bsz, length, heads, d, generator=gen), kind, proj)
    k = feature_map(torch.randn(bsz, length, heads, d, generator=gen), kind, proj)
    v = torch.randn(bsz, length, heads, d, generator=gen)
    f = q.shape[-1]
    assert f == {"elu": d, "relu": d, "favor": 12, "taylor": 1 + d + d * (d + 1) // 2}[kind]
    # Sequence 1 continues from a non-zero state; sequence 0 starts fresh.
    s0 = torch.zeros(bsz, heads, f, d)
    z0 = torch.zeros(bsz, heads, f)
    s0[1] = torch.rand(heads, f, d, generator=gen)
    z0[1] = torch.rand(heads, f, generator=gen) + 1.0
    padded = -(-length // chunk) * chunk
    pad = padded - length

    def grow(t):  # zero padding up to a multiple of the chunk
        return torch.cat([t, t.new_zeros(bsz, pad, *t.shape[2:])], dim=1)

    out, s_last, z_last = chunked_linear_attention(grow(q), grow(k), grow(v), s0, z0, chunk)
    s_rec, z_rec = s0.clone(), z0.clone()
    slots = torch.arange(bsz)
    for t in range(length):
        step = linear_attention_decode_ref(q[:, t], k[:, t], v[:, t], s_rec, z_rec, slots)
        torch.testing.assert_close(out[:, t], step, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s_last, s_rec, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(z_last, z_rec, atol=1e-5, rtol=1e-5)


def test_feature_maps_approximate_what_they_claim():
    """taylor: phi(q).phi(k) = 1 + u + u^2/2 exactly, u = q.k/sqrt(d); favor: an unbiased
    estimate of exp(u), close with many features."""
    gen = torch.Generator().manual_seed(3)
    d = 8
    q, k = torch.randn(d, generator=gen) * 0.5, torch.randn(d, generator=gen) * 0.5
    u = (q @ k) / d**0.5
    taylor = feature_map(q, "taylor") @ feature_map(k, "taylor")
    torch.testing.assert_close(taylor, 1 + u + u * u / 2)
    proj = _favor_projection(4096, d, seed=1)
    favor = feature_map(q, "favor", proj) @ feature_map(k, "favor", proj)
    assert abs(float(favor / torch.exp(u)) - 1.0) < 0.05
    assert torch.equal(_favor_projection(24, d, seed=5), _favor_projection(24, d, seed=5))
    rows = _favor_projection(8, d, seed=5)
    gram = rows @ rows.T
    torch.testing.assert_close(gram - torch.diag(gram.diag()), torch.zeros(8, 8), atol=1e-4, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 16], ids=["chunk1", "chunk3", "chunk16"])
def test_selective_scan_equals_recurrence(chunk):
    gen = torch.Generator().manual_seed(0)
    bsz, length, ch, n = 2, 11, 6, 4
    lengths = [11, 7]  # sequence 1 ends early: padding with dt = 0 must pass its state through
    padded = -(-length // chunk) * chunk
    x = torch.randn(bsz, padded, ch, generator=gen)
    dt = torch.rand(bsz, padded, ch, generator=gen) * 0.5
    for b, n_tok in enumerate(lengths):
        x[b, n_tok:], dt[b, n_tok:] = 0.0, 0.0
    a = -torch.rand(ch, n, generator=gen) * 3
    bm = torch.randn(bsz, padded, n, generator=gen)
    cm = torch.randn(bsz, padded, n, generator=gen)
    h0 = torch.randn(bsz, ch, n, generator=gen)
    y, h_last = selective_scan(x, dt, a, bm, cm, h0, chunk)
    for b, n_tok in enumerate(lengths):  # the recurrence, float64, by hand
        h = h0[b].double()
        for t in range(n_tok):
            h = torch.exp(dt[b, t, :, None].double() * a) * h \
                + dt[b, t, :, None].double() * bm[b, t].double() * x[b, t, :, None].double()
            torch.testing.assert_close(y[b, t].double(), h @ cm[b, t].double(), atol=1e-5,
                                       rtol=1e-5)
        torch.testing.assert_close(h_last[b].double(), h, atol=1e-5, rtol=1e-5)


def test_selective_scan_matches_transformers_slow_path():
    from transformers.models.mamba.modeling_mamba import mamba_selective_scan

    gen = torch.Generator().manual_seed(1)
    bsz, length, ch, n = 2, 9, 5, 3
    x = torch.randn(bsz, length, ch, generator=gen)
    dt_raw = torch.randn(bsz, length, ch, generator=gen)
    dt_bias = torch.randn(ch, generator=gen)
    a = -torch.rand(ch, n, generator=gen) * 2
    bm, cm = torch.randn(bsz, length, n, generator=gen), torch.randn(bsz, length, n, generator=gen)
    y_hf, h_hf = mamba_selective_scan(
        x.transpose(1, 2), dt_raw.transpose(1, 2), a, bm.transpose(1, 2), cm.transpose(1, 2),
        delta_bias=dt_bias, delta_softplus=True, return_last_state=True)
    dt = torch.nn.functional.softplus(dt_raw + dt_bias)
    y, h_last = selective_scan(x, dt, a, bm, cm, torch.zeros(bsz, ch, n), chunk=3)
    torch.testing.assert_close(y, y_hf.transpose(1, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_last, h_hf, atol=1e-5, rtol=1e-5)


def test_feature_dim_is_the_true_feature_size_and_rejects_meaningless_values():
    from infbench.core.config import ModelConfig
    from infbench.core.errors import ConfigError
    from infbench.roofline.shapes import feature_dim, layer_state_entries

    tiny = ModelConfig.from_name("tiny")  # head_dim 16
    sizes = {"elu": 16, "relu": 16, "favor": 16, "taylor": 1 + 16 + 16 * 17 // 2}
    for kind, size in sizes.items():
        cfg = tiny.with_overrides(attention={"kind": "linear", "feature_map": kind})
        assert feature_dim(cfg) == size
        spec = cfg.layers()[0]
        assert layer_state_entries(cfg, spec) == [("S", (4, size, 16)), ("z", (4, size))]
    favor = tiny.with_overrides(attention={"kind": "linear", "feature_map": "favor",
                                           "feature_dim": 40})
    assert feature_dim(favor) == 40
    elu = tiny.with_overrides(attention={"kind": "linear", "feature_map": "elu", "feature_dim": 8})
    with pytest.raises(ConfigError, match="feature_dim=8 applies to feature_map 'favor' only"):
        feature_dim(elu)
