"""Attention data parallelism with expert-parallel MoE layers (`parallel.attention_dp`): the
per-device operators, the all-to-all sizes, the memory per device and the refusals, checked
against numbers worked out by hand for the tiny MoE preset."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from cli_helpers import run_cli

from infbench.core.config import ModelConfig as M
from infbench.core.errors import ConfigError
from infbench.core.parallel import ParallelConfig as P
from infbench.hardware.spec import get_hardware
from infbench.roofline.analysis import device_memory, max_batch, predict
from infbench.roofline.costs import SeqWork, group_costs
from infbench.roofline.parallel import all_gather_s, all_reduce_s, all_to_all_plan, device_ops

H100 = get_hardware("h100-sxm")
# tiny-moe: hidden 64, 2 layers (both MoE), 4 heads / 2 KV heads of 16, 8 experts top-2 of
# width 32, one shared expert of 32, vocabulary 256 (untied), 169,280 parameters
TINY = M.from_name("tiny-moe")


def test_ep_follows_the_group_and_the_rank_shape() -> None:
    par = P(tp=4, attention_dp=2)
    assert (par.ep, par.attention_tp, par.rank_batch(7)) == (4, 2, 4)
    assert P(tp=4, attention_dp=4, ep=4).ep == 4
    assert P(tp=4).attention_tp == 4 and P(tp=4).ep == 1


# tiny-moe on 4 devices of one NVLink node: each rank holds 2 of the 8 experts; a token's
# top-2 misses a rank with probability C(6, 2) / C(8, 2) = 15/28, so it is sent to the
# 3 other ranks 3 x 13/28 = 39/28 times (not top-2 x 3/4 = 1.5 copies)
SENDS = 39 / 28
A2A = 2 * (2 * 64 * 2 * SENDS / 450e9 + 1e-6)  # dispatch + combine of 2 tokens, one hop each


def test_all_to_all_bytes_by_hand() -> None:
    # 8 sequences over 4 ranks of one device: each device dispatches 2 decode tokens, each
    # copy 64 hidden x 2 bytes: 2 x 128 x 39/28 = 356.6 bytes, and as many back
    decode = [(SeqWork(1, 20), 8)]
    plan = all_to_all_plan(TINY, P(tp=4, attention_dp=4), H100, "bfloat16", decode)
    assert plan is not None
    assert (plan.tokens, plan.top_k, plan.group, plan.moe_layers) == (2, 2, 4, 2)
    assert (plan.nodes, plan.remote_nodes, plan.network_bytes) == (1, 0.0, 0.0)
    assert plan.link_sends == pytest.approx(SENDS)
    assert plan.dispatch_bytes == pytest.approx(256 * SENDS)
    assert plan.combine_bytes == pytest.approx(256 * SENDS)
    assert plan.copies_bytes == 512  # every top-2 copy: the upper bound
    assert plan.tier == plan.link_tier == "nvlink4" and plan.dispatch_dtype == "bfloat16"
    assert plan.time_s == pytest.approx(A2A)
    # FP8 dispatch: one byte per value plus a float32 scale per 128: 128 x (1 + 4/128) = 132
    fp8 = all_to_all_plan(TINY, P(tp=4, attention_dp=4, dispatch_dtype="float8"), H100,
                          "bfloat16", decode)
    assert fp8 is not None and fp8.dispatch_bytes == pytest.approx(132 * SENDS)
    assert fp8.combine_bytes == pytest.approx(256 * SENDS) and fp8.copies_bytes == 264
    # 2 ranks of 2 devices: a rank holds 4 sequences, each of its devices dispatches 2
    half = all_to_all_plan(TINY, P(tp=4, attention_dp=2), H100, "bfloat16", decode)
    assert half is not None and half.tokens == 2 and half.copies_bytes == 512
    # 7 sequences: the fullest rank has 2; a 10-token prompt each: 20 tokens, 5,120 bytes
    prefill = all_to_all_plan(TINY, P(tp=4, attention_dp=4), H100, "bfloat16",
                              [(SeqWork(10, 10), 7)])
    assert prefill is not None and (prefill.tokens, prefill.copies_bytes) == (20, 5120)
    # no expert parallelism, no all-to-all
    assert all_to_all_plan(TINY, P(tp=4), H100, "bfloat16", decode) is None


def test_all_to_all_across_nodes_by_hand() -> None:
    # tiny-moe, ep 4 over 16 H100s (2 nodes of 8, 2 devices per expert rank): a node holds
    # 4 experts, missed by a token with C(4, 2) / C(8, 2) = 6/28, so the token crosses to the
    # other node 22/28 times; a rank is touched 13/28 of the time and 4 - 2 = 2 ranks take
    # a forward over NVLink: 26/28.  The network part is the slower one.
    par = P(tp=16, ep=4)
    decode = [(SeqWork(1, 20), 3)]  # tensor-parallel attention: a device holds all 3 tokens
    plan = all_to_all_plan(TINY, par, H100, "bfloat16", decode)
    assert plan is not None and (plan.nodes, plan.tier, plan.link_tier) == \
        (2, "network", "nvlink4")
    assert plan.remote_nodes == pytest.approx(22 / 28)
    assert plan.link_sends == pytest.approx(26 / 28)
    row = 3 * 64 * 2
    assert plan.network_bytes == pytest.approx(2 * row * 22 / 28)
    assert plan.dispatch_bytes == pytest.approx(row * 48 / 28)
    net = row * 22 / 28 / 50e9 + 5e-6
    assert net > row * 26 / 28 / 450e9 + 1e-6
    # each expert is sliced over 16 / 4 = 4 devices: the slice all-reduce of the top-2 outputs
    reduce = all_reduce_s(row * 2 / 4, 4, H100, span=16)
    assert plan.time_s == pytest.approx(2 * net + reduce)
    assert plan.copies_bytes == row * 2


def test_touch_probability_by_hand() -> None:
    # ungrouped: 8 experts top-2, a destination of 2 is missed C(6, 2) / C(8, 2) = 15/28
    assert TINY.moe is not None
    assert TINY.moe.touch_probability(2) == pytest.approx(13 / 28)
    # group-limited: 8 experts in 4 groups of 2, top-2 from 2 kept groups (M = 4 experts).
    # A one-expert destination: its group kept 1/2, then missed C(3, 2) / C(4, 2) = 1/2
    grouped = replace(TINY.moe, n_group=4, topk_group=2)
    assert grouped.touch_probability(1) == pytest.approx(1 / 2 * 1 / 2)
    # a node of 2 groups: j of its groups kept, hypergeometric (1/6, 4/6, 1/6); missed with
    # C(4 - 2j, 2) / C(4, 2) = 1, 1/6, 0: touched 1 - 1/6 - 4/6 x 1/6 = 13/18
    assert grouped.touch_probability(4) == pytest.approx(13 / 18)
    # a group-limited token reaches at most topk_group of the 4 one-group destinations
    assert 4 * grouped.touch_probability(2) <= 2 + 1e-12
    # misaligned (3 experts: neither whole groups nor inside one): priced as ungrouped
    assert grouped.touch_probability(3) == pytest.approx(1 - 10 / 28)


def test_decode_communication_by_hand() -> None:
    p = predict(TINY, H100, batch=8, prompt_len=10, gen_len=5, parallel=P(tp=4, attention_dp=4),
                overlap="full")
    a2a = A2A
    # a rank is one device: no all-reduce; both layers pay the all-to-all; the head gathers
    # the 8 sequences' hidden states (8 x 64 x 2 bytes) and their logits (8 x 256 x 2)
    assert p.decode_comm.all_reduce_s == 0.0
    assert p.decode_comm.all_to_all_s == pytest.approx(2 * a2a)
    assert p.decode_comm.all_gather_s == pytest.approx(
        all_gather_s(8 * 64 * 2, 4, H100) + all_gather_s(8 * 256 * 2, 4, H100))
    assert p.decode_all_to_all is not None and p.decode_all_to_all.copies_bytes == 512
    assert p.prefill_all_to_all is not None and p.prefill_all_to_all.tokens == 20
    assert p.parallel.ep == 4


def test_operators_split_between_the_rank_and_the_group() -> None:
    par = P(tp=4, attention_dp=4)
    batch = [(SeqWork(1, 20), 8)]
    mine = {op.name: op for op in device_ops(TINY, batch, "bfloat16", None, par, stage="step")}
    rank = {op.name: op for op in group_costs(TINY, [(SeqWork(1, 20), 2)], "bfloat16")}
    whole = {op.name: op for op in group_costs(TINY, batch, "bfloat16")}
    # the attention side: the rank's 2 sequences, whole on its one device
    for name in ("qkv_proj", "attn_score", "attn_value", "o_proj", "moe_router", "moe_shared",
                 "embed", "norm"):
        assert mine[name] == rank[name], name
    # the group side: all 8 sequences, a quarter each (the experts: 2 of the 8 per device)
    for name in ("moe_experts", "lm_head"):
        assert mine[name].flops == pytest.approx(whole[name].flops / 4)
        assert mine[name].weight_bytes == pytest.approx(whole[name].weight_bytes / 4)


def test_memory_per_device_by_hand() -> None:
    # per layer: norms 128, q/k/v 8,192, o 4,096, router 512, shared expert 6,144 (all held
    # whole under attention dp 4 of 1 device each) and the 8 experts' 49,152 / 4 = 12,288:
    # 31,360; two layers 62,720 + embedding 16,384 (replicated) + final norm 64 + the head's
    # 16,384 / 4 = 4,096 -> 83,264 parameters, 166,528 bytes in bfloat16
    ctx = 30
    dp4 = device_memory(TINY, H100, "bfloat16", None, ctx, 8, P(tp=4, attention_dp=4))
    assert dp4.weight_bytes == 83264 * 2
    # each device caches its 2 sequences: 2 x 30 tokens x 256 bytes (2 layers, K and V,
    # 2 KV heads of 16, bfloat16)
    assert dp4.kv_cache_bytes == 2 * ctx * 256
    # 2 ranks of 2 devices: a rank's 4 sequences, each device one of the 2 KV heads; the
    # attention side split in two (8,192 / 2 + 4,096 / 2 + 6,144 / 2 per layer)
    dp2 = device_memory(TINY, H100, "bfloat16", None, ctx, 8, P(tp=4, attention_dp=2))
    assert dp2.kv_cache_bytes == 4 * ctx * 256 // 2
    per_layer = 128 + 512 + (8192 + 4096 + 6144) // 2 + 49152 // 4
    assert dp2.weight_bytes == (2 * per_layer + 16384 + 64 + 4096) * 2
    # tensor parallel for comparison: all 8 sequences' KV split over 2 KV heads
    tp4 = device_memory(TINY, H100, "bfloat16", None, ctx, 8, P(tp=4, ep=4))
    assert tp4.kv_cache_bytes == 8 * ctx * 256 // 2


def test_max_batch_counts_the_sequences_of_a_rank() -> None:
    par = P(tp=4, attention_dp=4)
    ctx = 1000
    n = max_batch(TINY, H100, "bfloat16", None, ctx, par)
    assert device_memory(TINY, H100, "bfloat16", None, ctx, n, par).fits
    assert not device_memory(TINY, H100, "bfloat16", None, ctx, n + 1, par).fits


@pytest.mark.parametrize(("cfg", "par", "message"), [
    (TINY, P(tp=8, attention_dp=1), "parallel.tp=8 must divide the 4 attention heads of "
                                    "tiny-moe; allowed: 1, 2, 4"),
    (TINY, P(tp=16, attention_dp=2), "parallel.tp / attention_dp = 16 / 2 = 8 must divide the "
                                     "4 attention heads of tiny-moe; allowed: 1, 2, 4"),
    (TINY.with_overrides(num_heads=6, num_kv_heads=3, hidden_size=96), P(tp=4, attention_dp=2),
     "parallel.tp / attention_dp = 4 / 2 = 2 and the 3 KV heads of tiny-moe must divide one "
     "another; allowed: 1, 3, 6"),
    (TINY, P(tp=16, attention_dp=16), "parallel.ep=16 (attention_dp=16: ep is all tp=16 "
                                      "devices) must divide the 8 routed experts of tiny-moe; "
                                      "allowed: 1, 2, 4, 8"),
    (M.from_name("llama2-7b"), P(tp=4, attention_dp=4),
     "parallel.attention_dp=4 needs a mixture-of-experts model"),
])
def test_layouts_that_do_not_divide_are_refused(cfg, par, message) -> None:
    with pytest.raises(ConfigError) as exc:
        par.check_model(cfg)
    assert message in str(exc.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(tp=8, attention_dp=3), "attention_dp=3 must divide parallel.tp=8 (each attention "
                                 "rank is tp / attention_dp devices); allowed: 1, 2, 4, 8"),
    (dict(tp=8, attention_dp=2, ep=4), "parallel.ep=4 with attention_dp=2: the MoE layers run "
                                       "expert parallel over all tp=8 devices; allowed: ep 8"),
    (dict(tp=4, dispatch_dtype="fp4"), "parallel.dispatch_dtype: unknown value 'fp4'; allowed: "
                                       "model, float8"),
    (dict(tp=4, attention_dp=0), "parallel.attention_dp"),
])
def test_bad_degrees_are_refused(kwargs, message) -> None:
    with pytest.raises(ConfigError) as exc:
        P(**kwargs)
    assert message in str(exc.value)


def test_cli_flag_prints_the_all_to_all(monkeypatch, capsys) -> None:
    args = ["predict", "--model", "tiny-moe", "--batch", "8", "--prompt", "10", "--gen", "5",
            "--tp", "4", "--attention-dp", "4", "--dispatch-dtype", "float8"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "4x1 dp4" in out and "attention dp 4" in out
    assert "decode all-to-all per MoE layer (2 layers), per device: 2 tokens x top-2, " \
           "dispatch 184B (float8) + combine 357B over nvlink4 (ep 4)" in out
    code, out, err = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    row = json.loads(out)[0]
    assert row["parallel"]["attention_dp"] == 4 and row["parallel"]["ep"] == 4
    assert row["all_to_all"]["decode"]["dispatch_bytes"] == pytest.approx(132 * SENDS)
    assert row["all_to_all"]["prefill"]["tokens"] == 20
    # the scenario key is the same setting
    code, out2, err = run_cli(monkeypatch, capsys, *args[:11], "--json", "--set",
                              "parallel.attention_dp=4", "--set",
                              "parallel.dispatch_dtype=float8")
    assert code == 0, err
    assert json.loads(out2)[0]["all_to_all"] == row["all_to_all"]


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "tiny-moe", "--tp", "4", "--attention-dp", "3"],
     "parallel.attention_dp=3 must divide parallel.tp=4"),
    (["--model", "llama2-7b", "--tp", "4", "--attention-dp", "2"],
     "needs a mixture-of-experts model"),
    (["--model", "tiny-moe", "--tp", "4", "--dispatch-dtype", "int4"],
     "--dispatch-dtype: unknown value 'int4'; allowed: model, float8"),
    (["--model", "tiny-moe", "--tp", "4", "--set", "parallel.attention_dp=3"],
     "parallel.attention_dp=3 must divide parallel.tp=4"),
])
def test_cli_refusals_are_one_line(args, message, monkeypatch, capsys) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "predict", *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


# tiny-moe with its first layer dense: a SwiGLU of the model's intermediate size
DENSE1 = replace(TINY, moe=replace(TINY.moe, first_k_dense=1)) if TINY.moe else TINY


def test_dense_dp_runs_the_dense_mlp_on_the_rank_by_hand() -> None:
    batch = [(SeqWork(1, 20), 8)]
    par = P(tp=4, attention_dp=4, dense_dp=True)
    mine = {(op.name, op.layer): op
            for op in device_ops(DENSE1, batch, "bfloat16", None, par, stage="step",
                                 by_layer=True)}
    rank = {(op.name, op.layer): op
            for op in group_costs(DENSE1, [(SeqWork(1, 20), 2)], "bfloat16", by_layer=True)}
    # the dense MLP: the rank's 2 sequences, whole on its one device (replicated)
    assert mine[("mlp", 0)] == rank[("mlp", 0)]
    kw = dict(batch=8, prompt_len=10, gen_len=5, overlap="full")
    gathered = predict(DENSE1, H100, parallel=P(tp=4, attention_dp=4), **kw)
    dense = predict(DENSE1, H100, parallel=par, **kw)
    # no all-gather of the 8 tokens (8 x 64 x 2 bytes) before it nor reduce-scatter after
    assert gathered.decode_comm.all_gather_s - dense.decode_comm.all_gather_s == \
        pytest.approx(2 * all_gather_s(8 * 64 * 2, 4, H100))
    assert dense.decode_comm.all_reduce_s == 0.0  # a rank of one device reduces nothing
    # the dense MLP's weights are held whole: 3/4 of them more per device
    mlp = sum(op.weight_bytes for (name, _), op in rank.items() if name == "mlp")
    assert dense.weight_bytes - gathered.weight_bytes == pytest.approx(mlp * 3 / 4, abs=1)
    # ranks of 2 devices: the MLP split 2 ways, one rank all-reduce of its 4 tokens after it
    two = predict(DENSE1, H100, parallel=P(tp=4, attention_dp=2, dense_dp=True), **kw)
    two_gathered = predict(DENSE1, H100, parallel=P(tp=4, attention_dp=2), **kw)
    assert two.decode_comm.all_reduce_s - two_gathered.decode_comm.all_reduce_s == \
        pytest.approx(all_reduce_s(4 * 64 * 2, 2, H100, span=2))


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(tp=4, dense_dp=True), "parallel.dense_dp needs attention data parallelism"),
    (dict(tp=4, attention_dp=4, dense_dp="yes"), "parallel.dense_dp: 'yes' is not a boolean; "
                                                 "allowed: true, false"),
])
def test_bad_dense_dp_is_refused(kwargs, message) -> None:
    with pytest.raises(ConfigError) as exc:
        P(**kwargs)
    assert message in str(exc.value)


def test_dense_dp_flag_and_key(monkeypatch, capsys) -> None:
    args = ["predict", "--model", "tiny-moe", "--batch", "8", "--prompt", "10", "--gen", "5",
            "--tp", "4", "--attention-dp", "4", "--json"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--dense-dp")
    assert code == 0, err
    row = json.loads(out)[0]
    assert row["parallel"]["dense_dp"] is True
    code, out2, err = run_cli(monkeypatch, capsys, *args, "--set", "parallel.dense_dp=true")
    assert code == 0, err
    assert json.loads(out2)[0]["parallel"] == row["parallel"]
    code, out, err = run_cli(monkeypatch, capsys, "predict", "--model", "tiny-moe", "--tp",
                             "4", "--dense-dp")
    assert code == 2 and "parallel.dense_dp needs attention data parallelism" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_prints_the_network_part_across_nodes(monkeypatch, capsys) -> None:
    # DeepSeek-V2-Lite, 64 experts top-6 over 16 H100s (2 nodes): a node of 32 experts is
    # missed with C(32, 6) / C(64, 6), so a token crosses to the other node that often less
    code, out, err = run_cli(monkeypatch, capsys, "predict", "--model", "deepseek-v2-lite",
                             "--batch", "4", "--prompt", "16", "--gen", "2", "--tp", "16",
                             "--ep", "16")
    assert code == 0, err
    remote = 1 - math.comb(32, 6) / math.comb(64, 6)
    text = " ".join(out.split())  # the console wraps long lines
    assert f"over network between 2 nodes ({remote:.3g} per token, " in text
    assert "and nvlink4 in them (ep 16)" in text
