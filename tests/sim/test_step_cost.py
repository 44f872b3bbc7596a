"""The simulation's step prices are the cost model's: the linear fast path equals
`group_costs` step by step, and a step of identical sequences equals the roofline's own
stage times (prefill, a decode step) on datasheet and calibrated-style hardware."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.parallel import ParallelConfig
from infbench.hardware.spec import ATTENTION_KEY, CURVE_KEY, PREFILL_ATTENTION_KEY, get_hardware
from infbench.roofline.analysis import predict
from infbench.sim.step_cost import ExactPricer, LinearPricer, StepBatch, make_pricer

LLAMA = ModelConfig.from_name("llama3-8b")


def _calibrated():
    """h100-sxm with a matmul curve and measured attention rates, as a CPU profile has."""
    hw = get_hardware("h100-sxm")
    extra = {CURVE_KEY: {"bfloat16": [[1, 2e13], [64, 3e14], [4096, 8e14]]},
             ATTENTION_KEY: 2.5e12, PREFILL_ATTENTION_KEY: 4e14,
             "step_overhead_s": 2e-4, "layer_overhead_s": 1e-6}
    return replace(hw, name="box", extra=extra)


HARDWARE = [get_hardware("h100-sxm"), _calibrated()]


def _batches(seed: int, n: int) -> list[StepBatch]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prefill = [(q, q + rng.randrange(0, 400), rng.randrange(0, 2))
                   for q in (rng.randrange(1, 300) for _ in range(rng.randrange(0, 3)))]
        decodes = [rng.randrange(1, 2000) for _ in range(rng.randrange(0 if prefill else 1, 40))]
        verify = [(4, 4 + rng.randrange(0, 500), 4) for _ in range(rng.randrange(0, 2))]
        out.append(StepBatch(prefill, decodes, verify))
    return out


@pytest.mark.parametrize("overlap", ["full", "none"])
@pytest.mark.parametrize("hw", HARDWARE, ids=["datasheet", "profile"])
def test_linear_pricer_equals_the_cost_model_step_by_step(hw, overlap) -> None:
    fast = LinearPricer(LLAMA, hw, "bfloat16", QuantConfig(), overlap=overlap)
    exact = ExactPricer(LLAMA, hw, "bfloat16", QuantConfig(), overlap=overlap)
    for batch in _batches(0, 60):
        assert fast.seconds(batch) == pytest.approx(exact.seconds(batch), rel=1e-12)


def test_linear_pricer_under_tensor_parallel_equals_the_cost_model() -> None:
    hw, tp2 = get_hardware("h100-sxm"), ParallelConfig(tp=2)
    fast = make_pricer(LLAMA, hw, "bfloat16", QuantConfig(), tp2)
    exact = ExactPricer(LLAMA, hw, "bfloat16", QuantConfig(), tp2)
    assert isinstance(fast, LinearPricer)
    for batch in _batches(1, 30):
        assert fast.seconds(batch) == pytest.approx(exact.seconds(batch), rel=1e-12)


def test_make_pricer_takes_the_exact_path_where_the_costs_are_not_linear() -> None:
    hw = get_hardware("h100-sxm")
    sliding = LLAMA.with_overrides(attention={"kind": "sliding", "window": 256,
                                              "kv_heads": 8})
    assert isinstance(make_pricer(LLAMA, hw, "bfloat16", QuantConfig()), LinearPricer)
    assert isinstance(make_pricer(sliding, hw, "bfloat16", QuantConfig()), ExactPricer)
    assert isinstance(make_pricer(ModelConfig.from_name("mixtral-8x7b"), hw, "bfloat16",
                                  QuantConfig()), ExactPricer)


@pytest.mark.parametrize("hw", HARDWARE, ids=["datasheet", "profile"])
def test_steps_of_identical_sequences_are_the_roofline_stages(hw) -> None:
    batch, prompt = 8, 300
    p = predict(LLAMA, hw, batch=batch, prompt_len=prompt, gen_len=2, dtype="bfloat16")
    pricer = make_pricer(LLAMA, hw, "bfloat16", QuantConfig())
    prefill = pricer.seconds(StepBatch([(prompt, prompt, 1)] * batch, []))
    assert prefill == pytest.approx(p.prefill.time_s, rel=1e-9)
    # the roofline's decode step: the mean over the contexts of the two decode steps
    steps = [pricer.seconds(StepBatch([], [c] * batch)) for c in (prompt + 1, prompt + 2)]
    assert sum(steps) / 2 == pytest.approx(p.decode.time_s, rel=1e-9)
