"""Predictions: the lecture's Llama-2-13B figures, exact decode means, speculation, memory."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infbench.core.config import ModelConfig
from infbench.core.errors import UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.hardware.spec import HardwareSpec, get_hardware
from infbench.roofline.analysis import (
    max_batch,
    mean_stage,
    predict,
    roofline_time,
    step_time,
)
from infbench.roofline.costs import SeqWork, step_costs

H100 = get_hardware("h100-sxm")
LLAMA13 = ModelConfig.from_name("llama2-13b")


# ------------------------------------------------ the lecture (Llama 2 13B on an H100)
# The lecture's S = 1024 is the KV the cache holds: prompt + generated tokens = 1024
# (scenarios/lecture_llama2_13b.yaml: 896 + 128).  Its latency is memory / bandwidth.
def lecture(batch: int, cfg: ModelConfig = LLAMA13):
    return predict(cfg, H100, batch=batch, prompt_len=896, gen_len=128)


def test_lecture_batch_one_latency_and_throughput() -> None:
    p = lecture(1)
    # The lecture's own formula on infbench's memory figure: 26.87 GB / 3.35 TB/s = 8.02 ms.
    assert round(p.memory_bytes / H100.bandwidth * 1e3, 2) == 8.02
    # The roofline reads only the embedding rows it gathers (the lecture charges the whole
    # 0.33 GB table) and the KV each step holds (mean context 960, not 1024): 1.4% less.
    embedding = LLAMA13.vocab_size * LLAMA13.hidden_size * 2
    mean_kv_saved = (1024 - 960.5) * p.kv_bytes_per_token
    assert p.time_per_token_s * H100.bandwidth == pytest.approx(
        p.memory_bytes - embedding - mean_kv_saved, rel=0.002)
    assert p.time_per_token_s == pytest.approx(8.02e-3, rel=0.015)
    assert 1 / p.time_per_token_s == pytest.approx(124, rel=0.03)
    assert p.decode.bound == "memory"
    assert p.prefill.bound == "compute"


def test_lecture_memory_at_batch_1_and_64() -> None:
    one, sixty_four = lecture(1), lecture(64)
    assert round(one.memory_bytes / 1e9, 2) == 26.87
    assert round(sixty_four.memory_bytes / 1e9, 2) == 79.72
    # 81,559 MiB x 0.95 utilization, less the workspace: 80.86 GB usable; 65 sequences fit.
    assert sixty_four.fits and sixty_four.max_batch == 65
    assert not lecture(66).fits
    assert sixty_four.tokens_per_s > 15 * one.tokens_per_s  # batching buys throughput
    assert sixty_four.time_per_token_s > 2 * one.time_per_token_s  # and costs latency


def test_lecture_gqa_fits_batch_256_and_multiplies_throughput() -> None:
    gqa = LLAMA13.with_overrides(attention={"kind": "gqa", "kv_heads": 8})
    p = lecture(256, gqa)
    assert p.fits and p.memory_bytes < 80e9
    mha_best = lecture(lecture(1).max_batch)
    assert mha_best.fits and not lecture(mha_best.batch + 1).fits
    assert p.tokens_per_s > 3 * mha_best.tokens_per_s


# ------------------------------------------------ definitions
def test_ttft_is_the_prefill_step_and_e2e_adds_the_decode_steps() -> None:
    p = predict(LLAMA13, H100, batch=4, prompt_len=512, gen_len=64)
    prefill = step_costs(LLAMA13, [SeqWork(512, 512)] * 4, "bfloat16")
    assert p.ttft_s == step_time(prefill, H100, "bfloat16")
    assert p.e2e_s == pytest.approx(p.ttft_s + 63 * p.time_per_token_s)
    assert p.tokens_per_s == pytest.approx(4 / p.time_per_token_s)
    assert p.kv_cache_bytes == 4 * (512 + 64) * 819_200
    assert p.memory_bytes == p.weight_bytes + p.kv_cache_bytes


def test_max_batch_and_weights_that_do_not_fit() -> None:
    l40s = get_hardware("l40s")  # 48 GB
    big = ModelConfig.from_name("llama3-70b")
    assert max_batch(big, l40s, "bfloat16", None, 4096) == 0
    p = predict(big, l40s, batch=1, prompt_len=128, gen_len=8)
    assert not p.fits and p.max_batch == 0
    # Constant state: the largest batch does not depend on the context.
    ssm = ModelConfig.from_name("llama-small").with_overrides(attention={"kind": "ssm"})
    short = max_batch(ssm, H100, "bfloat16", None, 10)
    assert short == max_batch(ssm, H100, "bfloat16", None, 1_000_000) > 1000


def _brute_mean(cfg, hw, dtype, batch, lo, hi, query=1):
    times, op_times = [], {}
    for x in range(lo, hi + 1):
        ops = step_costs(cfg, [SeqWork(query, x + query - 1, query)] * batch, dtype)
        times.append(step_time(ops, hw, dtype))
        for op in ops:
            op_times.setdefault(op.name, []).append(roofline_time(op.flops, op.bytes, hw, dtype))
    count = hi - lo + 1
    return sum(times) / count, {k: sum(v) / count for k, v in op_times.items()}


# A toy part whose ridge (4 FLOP/B) sits between the tiny model's batch-64 decode step
# intensity at short context (about 8) and at long context (about 2, attention): the
# step crosses from compute- to memory-bound inside the averaged range.
TOY = HardwareSpec("toy", "toy", {"float32": 4e11}, 1e11, 1e12)


@pytest.mark.parametrize(
    ("cfg", "hw", "batch", "prompt", "gen", "query"),
    [
        (ModelConfig.from_name("tiny"), TOY, 64, 1, 400, 1),
        (ModelConfig.from_name("tiny").with_overrides(
            attention={"kind": "sliding", "window": 50}), TOY, 64, 10, 200, 1),
        (ModelConfig.from_name("tiny").with_overrides(
            attention={"kind": "sliding", "window": 50, "global_every": 2}), TOY, 8, 1, 120, 4),
        (ModelConfig.from_name("tiny-mla"), TOY, 16, 3, 150, 1),
        (ModelConfig.from_name("tiny-moe"), TOY, 32, 5, 60, 3),
        (ModelConfig.from_name("llama2-7b"), H100, 8, 100, 50, 1),
    ],
    ids=["tiny-crossing", "sliding", "sliding-global-verify", "mla", "moe-verify", "llama2-7b"],
)
def test_decode_mean_is_exact(cfg, hw, batch, prompt, gen, query) -> None:
    dtype = "float32" if hw is TOY else "bfloat16"
    lo, hi = prompt + 1, prompt + gen
    stage = mean_stage(cfg, hw, dtype, None,
                       lambda x: [SeqWork(query, x + query - 1, query)] * batch, query, lo, hi)
    expected, expected_ops = _brute_mean(cfg, hw, dtype, batch, lo, hi, query)
    assert stage.time_s == pytest.approx(expected, rel=1e-9)
    for op in stage.ops:
        assert op.time_s == pytest.approx(expected_ops[op.cost.name], rel=1e-9, abs=1e-18)


def test_toy_decode_really_crosses_the_ridge() -> None:
    cfg = ModelConfig.from_name("tiny")
    first = step_costs(cfg, [SeqWork(1, 2)] * 64, "float32")
    last = step_costs(cfg, [SeqWork(1, 401)] * 64, "float32")
    ridge = TOY.ridge_point("float32")
    intensity = [sum(o.flops for o in ops) / sum(o.bytes for o in ops) for ops in (first, last)]
    assert intensity[0] > ridge > intensity[1]


# ------------------------------------------------ speculative decoding
def test_expected_tokens_per_step() -> None:
    assert SpeculativeConfig("ngram", 4, 0.0).expected_tokens == 1.0
    assert SpeculativeConfig("ngram", 4, 1.0).expected_tokens == 5.0
    assert SpeculativeConfig("ngram", 4, 0.8).expected_tokens == pytest.approx(3.3616)


def test_speculative_time_per_token() -> None:
    spec = SpeculativeConfig("ngram", 4, 0.8, 0.05)
    p = predict(LLAMA13, H100, batch=1, prompt_len=1000, gen_len=100, speculative=spec)
    s = p.speculative
    assert s is not None
    assert s.draft_time_s == pytest.approx(4 * 0.05 * p.decode.time_s)
    assert s.time_per_token_s == pytest.approx((s.draft_time_s + s.verify_time_s) / 3.3616)
    assert p.time_per_token_s == s.time_per_token_s
    # Memory-bound: verifying 5 tokens costs about as much as decoding one.
    assert s.verify_time_s == pytest.approx(p.decode.time_s, rel=0.02)
    assert s.speedup == pytest.approx(3.3616 / 1.2, rel=0.02)


# ------------------------------------------------ validation and output
@pytest.mark.parametrize("kwargs", [dict(batch=0), dict(prompt_len=-3), dict(gen_len=0)])
def test_non_positive_sizes_are_user_errors(kwargs) -> None:
    args = dict(batch=1, prompt_len=8, gen_len=8) | kwargs
    with pytest.raises(UserError, match="must be > 0"):
        predict(LLAMA13, H100, **args)


def test_prediction_dict_is_json_with_the_documented_keys() -> None:
    d = predict(LLAMA13, H100, batch=2, prompt_len=64, gen_len=16).to_dict()
    json.dumps(d)
    for key in ("model", "hardware", "batch", "prompt_len", "gen_len", "params", "weight_bytes",
                "kv_bytes_per_token", "kv_cache_bytes", "memory_bytes", "fits", "max_batch",
                "ttft_s", "prefill", "decode", "ops"):
        assert key in d
    assert set(d["prefill"]) >= {"flops", "bytes", "intensity", "time_s", "bound"}
    assert set(d["decode"]) >= {"flops", "bytes", "intensity", "time_per_token_s", "bound"}
    assert "tokens_per_s" not in d["decode"]  # decode-only rate: decode_tokens_per_s
    assert {op["stage"] for op in d["ops"]} == {"prefill", "decode"}
    for op in d["ops"]:
        assert set(op) >= {"name", "stage", "flops", "bytes", "intensity", "time_s", "bound"}


@settings(max_examples=25, deadline=None)
@given(preset=st.sampled_from(["tiny", "tiny-mla", "tiny-moe", "llama2-7b", "mistral-7b"]),
       batch=st.integers(1, 128), extra=st.integers(1, 64), prompt=st.integers(1, 300),
       gen=st.integers(1, 40))
def test_decode_time_never_decreases_with_batch(preset, batch, extra, prompt, gen) -> None:
    cfg = ModelConfig.from_name(preset)
    small = predict(cfg, H100, batch=batch, prompt_len=prompt, gen_len=gen)
    large = predict(cfg, H100, batch=batch + extra, prompt_len=prompt, gen_len=gen)
    assert large.decode.time_s >= small.decode.time_s
    assert large.ttft_s >= small.ttft_s
