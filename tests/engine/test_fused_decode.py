"""The cpu backend's fused decode layers (kernels/csrc/decode_layer.cpp via
model/fused_decode.py): one C++ call per layer gives the per-op path's tokens, for every
softmax-attention scheme, dtype and quantized projection, and steps it cannot serve (MLA,
prefill, more than 32 decodes) keep the per-op path."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import greedy_recompute, make_engine, random_requests

from infbench.core.config import QuantConfig
from infbench.model.loader import load_model

SCHEMES = {
    "gqa": {},
    "mha": {"attention": {"kind": "mha"}},
    "cla": {"attention": {"kind": "cla", "cla_group": 2}},
    "sliding": {"num_layers": 4, "attention": {"kind": "sliding", "window": 8,
                                               "global_every": 2}},
}


class Counting:
    """Wraps a DecodeLayer and counts its calls."""

    def __init__(self, plan: Any) -> None:
        self.plan, self.calls = plan, 0

    def run(self, *args: Any) -> Any:
        self.calls += 1
        return self.plan.run(*args)


def _run(loaded, requests, fused: bool):
    dtype = str(loaded.model.embed_tokens.weight.dtype).removeprefix("torch.")
    engine = make_engine(loaded, requests, dtype=dtype, backend="cpu")
    model = engine.runner.model
    plans = model.decode_layers
    assert plans is not None
    if fused:
        model.decode_layers = [None if p is None else Counting(p) for p in plans]
    else:
        model.decode_layers = None
    out = engine.run(requests, realtime_arrivals=False).outputs
    return out, model.decode_layers


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_equals_per_op(scheme, dtype):
    loaded = load_model({"preset": "tiny"}, dtype=dtype, overrides=SCHEMES[scheme] or None)
    requests = random_requests([5, 9, 3], gen=8, vocab=loaded.config.vocab_size)
    per_op, _ = _run(loaded, requests, fused=False)
    fused, plans = _run(loaded, requests, fused=True)
    assert fused == per_op
    assert all(p is not None and p.calls > 0 for p in plans)
    if dtype == "float32":
        for r in requests:
            assert fused[r.request_id] == greedy_recompute(loaded.model, r.prompt_ids, 8,
                                                            loaded.config)


@pytest.mark.parametrize("quant", [QuantConfig(weights="int8"),
                                   QuantConfig(weights="int4", group_size=32),
                                   QuantConfig(weights="int8", activations="int8"),
                                   QuantConfig(weights="int4", group_size=32,
                                               activations="int8")],
                         ids=["int8", "int4", "int8-act8", "int4-act8"])
@pytest.mark.parametrize("lengths", [[4, 7], [6]], ids=["batch2", "batch1"])
def test_fused_quantized_projections(quant, lengths):
    """int8 activations: batch 1 runs the integer path inside the fused layer, batch 2 the
    float path on rounded activations; the per-op path does the same outside it."""
    loaded = load_model({"preset": "tiny"}, quant=quant)
    requests = random_requests(lengths, gen=6, vocab=loaded.config.vocab_size)
    per_op, _ = _run(loaded, requests, fused=False)
    fused, plans = _run(loaded, requests, fused=True)
    assert fused == per_op and all(p.calls > 0 for p in plans)


def test_layers_it_cannot_fuse_keep_the_per_op_path():
    loaded = load_model({"preset": "tiny-mla"})
    requests = random_requests([4], gen=3, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, requests, backend="cpu")
    assert engine.runner.model.decode_layers == [None] * loaded.config.num_layers
    out = engine.run(requests, realtime_arrivals=False).outputs
    assert out["r0"] == greedy_recompute(loaded.model, requests[0].prompt_ids, 3, loaded.config)


def test_more_than_32_decodes_use_the_per_op_path():
    loaded = load_model({"preset": "tiny"})
    requests = random_requests([3] * 40, gen=3, vocab=loaded.config.vocab_size)
    per_op, _ = _run(loaded, requests, fused=False)
    fused, plans = _run(loaded, requests, fused=True)
    assert fused == per_op
    assert all(p.calls == 0 for p in plans)  # every decode step had 40 sequences


def test_torch_backend_builds_no_fused_layers():
    loaded = load_model({"preset": "tiny"})
    requests = random_requests([4], gen=2, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, requests, backend="torch")
    assert getattr(engine.runner.model, "decode_layers", None) is None
