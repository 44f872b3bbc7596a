"""The paged engine on MLA models: latent cache, absorbed decode, chunked prefill, backends.

The reference is greedy full recompute through DenseContext (no cache at all).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from engine_helpers import greedy_recompute as _greedy_recompute
from engine_helpers import make_engine as _engine
from engine_helpers import random_requests as _requests
from mla_checkpoints import write_hf_deepseek_v2

from infbench.core.config import ModelConfig, QuantConfig
from infbench.engine.kv_cache import KVCache, kv_bytes_per_token_for
from infbench.model.loader import LoadedModel, load_model
from infbench.roofline.costs import kv_bytes_per_token


@pytest.fixture(params=["tiny-mla", "hf-deepseek-v2"])
def loaded(request, tmp_path: Path) -> LoadedModel:
    if request.param == "tiny-mla":
        return load_model({"preset": "tiny-mla"}, dtype="float32", device="cpu", seed=1)
    # q_lora_rank set: the preset covers the full-rank query path.
    write_hf_deepseek_v2(tmp_path, q_lora_rank=24, initializer_range=0.1)
    return load_model({"path": str(tmp_path)}, dtype="float32", device="cpu")


def test_prefill_then_decode_equals_full_recompute(loaded: LoadedModel) -> None:
    reqs = _requests([5, 11, 17], gen=8, vocab=loaded.config.vocab_size)
    engine = _engine(loaded, reqs, backend="torch")
    res = engine.run(reqs)
    assert any(s.num_decode_seqs > 1 for s in res.steps)  # batched decode over the latent
    for r in reqs:
        assert res.outputs[r.request_id] == _greedy_recompute(loaded.model, list(r.prompt_ids), 8)


def test_chunked_prefill_equals_one_shot(loaded: LoadedModel) -> None:
    reqs = _requests([9, 14, 6], gen=6, vocab=loaded.config.vocab_size, seed=3)
    one_shot = _engine(loaded, reqs, backend="torch", max_num_batched_tokens=64).run(reqs)
    chunked = _engine(loaded, reqs, backend="torch", max_num_batched_tokens=5).run(reqs)
    assert chunked.outputs == one_shot.outputs
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in chunked.steps) <= 5
    # a prompt continued over earlier chunks in the cache, next to other sequences' decodes
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in chunked.steps)
    assert max(s.num_prefill_tokens for s in one_shot.steps) == 9 + 14 + 6


def test_kv_bytes_per_token_match_the_analytic_model() -> None:
    loaded = load_model({"preset": "tiny-mla"}, dtype="float32", device="cpu", seed=1)
    cfg = loaded.config
    engine = _engine(loaded, _requests([4], gen=2, vocab=cfg.vocab_size), backend="torch")
    assert engine.kv.bytes_per_token == kv_bytes_per_token(cfg, "float32", QuantConfig())
    assert engine.kv.bytes_per_token == cfg.num_layers * (32 + 8) * 4  # the latent row only
    assert all(t.shape[2:] == (1, 40) for t in engine.kv.tensors())
    # DeepSeek-V2's dims (MoE does not touch the cache): 60 layers x (512 + 64) values.
    big = ModelConfig.from_name("deepseek-v2")
    for dtype, torch_dtype, size in [("bfloat16", torch.bfloat16, 2),
                                     ("float32", torch.float32, 4)]:
        pool = KVCache(big, 1, 1, torch_dtype, torch.device("cpu"))
        expected = kv_bytes_per_token(big, dtype, QuantConfig())
        assert pool.bytes_per_token == kv_bytes_per_token_for(big, size) == expected
        assert expected == 60 * (512 + 64) * size


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="needs the Triton interpreter or a GPU")
def test_triton_backend_equals_torch_backend() -> None:
    loaded = load_model({"preset": "tiny-mla"}, dtype="float32", device="cpu", seed=2,
                        overrides={"num_layers": 1})
    reqs = _requests([5, 7], gen=4, vocab=loaded.config.vocab_size, seed=5)
    runs = {b: _engine(loaded, reqs, backend=b, max_num_batched_tokens=8) for b in
            ("triton", "torch")}
    outs = {b: e.run(reqs) for b, e in runs.items()}
    assert runs["triton"].ops.name == "triton" and runs["torch"].ops.name == "torch"
    assert outs["triton"].outputs == outs["torch"].outputs
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in outs["triton"].steps)
    r = reqs[0]
    assert outs["triton"].outputs[r.request_id] == _greedy_recompute(
        loaded.model, list(r.prompt_ids), 4)
