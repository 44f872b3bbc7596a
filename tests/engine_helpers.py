"""Helpers shared by the engine-level tests (tests/engine, tests/mla, tests/recurrent).

The reference for engine outputs is always the same: greedy decoding by full recompute
of the whole sequence through DenseContext, with no cache at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from infbench.core.config import EngineConfig, ModelConfig
from infbench.engine.engine import Engine, KVSizing
from infbench.engine.request import Request, SamplingParams
from infbench.model.context import DenseContext


def dense_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Logits (T, V) of one sequence `ids` through the model's dense (non-paged) path."""
    with torch.no_grad():
        hidden = model(ids, torch.arange(ids.shape[0]), DenseContext.single(ids.shape[0]))
        return model.compute_logits(hidden)  # type: ignore[no-any-return]


def make_engine(loaded: Any, requests: Sequence[Request], dtype: str = "float32",
                kv_quant: str = "none", **engine_kw: Any) -> Engine:
    """A CPU engine with block size 4 sized for `requests` (or for `kv_cache_memory` bytes);
    `kv_quant` is model.quant.kv (none | int8)."""
    cfg = EngineConfig(**{"block_size": 4, **engine_kw})
    sizing = KVSizing.for_requests(requests, cfg.block_size,
                                   capped="kv_cache_memory" not in engine_kw)
    return Engine.create(loaded, cfg, "cpu", dtype, sizing=sizing, seed=0, kv_quant=kv_quant)


@torch.inference_mode()
def greedy_recompute(model: Any, prompt: Sequence[int], n: int,
                     config: ModelConfig | None = None) -> list[int]:
    """`n` greedy tokens, each from a full forward over the whole sequence so far."""
    ids = list(prompt)
    for _ in range(n):
        ctx = DenseContext.single(len(ids), config)  # recurrent layers need the config
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), ctx)
        ids.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
    return ids[len(prompt):]


def random_requests(lengths: Sequence[int], gen: int, vocab: int, seed: int = 0,
                    prefix: Sequence[int] = ()) -> list[Request]:
    """Seeded random prompts of the given lengths (after an optional shared prefix)."""
    g = torch.Generator().manual_seed(seed)
    return [Request(f"r{i}", tuple(prefix) + tuple(torch.randint(3, vocab, (n,),
                                                                  generator=g).tolist()),
                    SamplingParams(max_tokens=gen, ignore_eos=True))
            for i, n in enumerate(lengths)]
