"""The decompressed MLA prefill (per-head K/V from kv_b_proj) equals the absorbed form."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
import torch
from mla_checkpoints import write_hf_deepseek_v2

from infbench.model.context import DenseContext
from infbench.model.loader import LoadedModel, load_model
from infbench.model.mla import MLAAttention

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 0.4}


@pytest.fixture(params=["tiny-mla", "hf-yarn-v12"])
def loaded(request, tmp_path: Path) -> LoadedModel:
    if request.param == "tiny-mla":
        return load_model({"preset": "tiny-mla"}, dtype="float32", device="cpu", seed=3)
    # v_head_dim != qk_nope_head_dim, low-rank q, YaRN's mscale on the softmax scale.
    write_hf_deepseek_v2(tmp_path, seed=3, q_lora_rank=24, v_head_dim=12, rope_parameters=YARN,
                         initializer_range=0.1)
    return load_model({"path": str(tmp_path)}, dtype="float32", device="cpu")


def _set_mode(model: torch.nn.Module, decompressed: bool) -> None:
    attns = [m for m in model.modules() if isinstance(m, MLAAttention)]
    assert attns
    for m in attns:
        m.decompressed_prefill = decompressed


@torch.inference_mode()
@pytest.mark.parametrize("cu_seqlens", [[0, 1], [0, 45], [0, 7, 20, 45]])
def test_decompressed_prefill_equals_absorbed(loaded: LoadedModel, cu_seqlens: list[int]) -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, loaded.config.vocab_size, (cu_seqlens[-1],), generator=g)
    positions = torch.cat([torch.arange(b - a) for a, b in pairwise(cu_seqlens)])
    out = {}
    for decompressed in (False, True):
        _set_mode(loaded.model, decompressed)
        ctx = DenseContext(cu_seqlens, loaded.config)
        out[decompressed] = loaded.model.compute_logits(loaded.model(ids, positions, ctx))
    _set_mode(loaded.model, True)
    assert out[True].abs().max() > 0.1  # not a degenerate all-zero comparison
    torch.testing.assert_close(out[True], out[False], rtol=1e-5, atol=1e-5)
