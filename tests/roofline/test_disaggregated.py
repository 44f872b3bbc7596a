"""Disaggregated prefill and decode (`parallel.disaggregated`): TTFT from the prefill pool plus
the KV transfer, TPOT from the decode pool, the throughput of the slower pool over both
pools' devices, checked against numbers worked out by hand for the tiny MoE preset."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from infbench.core.config import ModelConfig as M
from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.core.parallel import Disaggregation
from infbench.core.parallel import ParallelConfig as P
from infbench.hardware.spec import get_hardware
from infbench.measure.prediction import PricedWorkload, price
from infbench.roofline.analysis import max_batch, predict

H100 = get_hardware("h100-sxm")
TINY = M.from_name("tiny-moe")  # 256 bytes of KV per token (2 layers, K+V, 2 heads of 16)
KV_PER_TOKEN = 256


def pools(prefill: P, decode: P) -> P:
    return P(disaggregated=Disaggregation(prefill, decode))


def test_ttft_tpot_and_throughput_by_hand() -> None:
    par = pools(P(tp=2), P(tp=4, replicas=2))
    p = predict(TINY, H100, batch=4, prompt_len=100, gen_len=10, parallel=par)
    pre = predict(TINY, H100, batch=4, prompt_len=100, gen_len=1, parallel=P(tp=2))
    dec = predict(TINY, H100, batch=4, prompt_len=100, gen_len=10, parallel=P(tp=4, replicas=2))
    d = p.disaggregated
    assert d is not None
    # the 4 prompts' cache, 4 x 100 tokens x 256 bytes, from 2 prefill devices to 4 decode
    # devices: 2 links at once, 6 devices in one 8-GPU NVLink domain: 450 GB/s each
    assert d.transfer.bytes == 4 * 100 * KV_PER_TOKEN == 102400
    assert (d.transfer.tier, d.transfer.links) == ("nvlink4", 2)
    assert d.transfer.time_s == pytest.approx(102400 / 2 / 450e9 + 1e-6)
    assert p.ttft_s == pytest.approx(pre.ttft_s + d.transfer.time_s)
    assert p.time_per_token_s == dec.time_per_token_s
    assert p.e2e_s == pytest.approx(p.ttft_s + 9 * dec.time_per_token_s)
    # capacity: 1 prefill instance x 4 requests per prefill; 2 decode instances x 4 requests
    # per 9 decode steps
    prefill_rate = 4 / max(pre.prefill.time_s, d.transfer.time_s)
    decode_rate = 2 * 4 / (9 * dec.time_per_token_s)
    assert d.prefill.requests_per_s == pytest.approx(prefill_rate)
    assert d.decode.requests_per_s == pytest.approx(decode_rate)
    assert d.requests_per_s == pytest.approx(min(prefill_rate, decode_rate))
    assert d.bound == ("decode" if decode_rate < prefill_rate else "prefill")
    assert d.devices == 2 + 8 == par.devices
    out = d.to_dict(10)
    assert out["output_tokens_per_s_per_device"] == pytest.approx(
        min(prefill_rate, decode_rate) * 10 / 10)
    # memory: the prefill pool holds the prompts, the decode pool prompt + generation
    assert d.prefill.memory_bytes == pre.memory_bytes and d.decode.memory_bytes == dec.memory_bytes
    assert p.max_batch == min(pre.max_batch, dec.max_batch)


def test_waves_are_pipelined_through_the_pools() -> None:
    par = pools(P(tp=2), P(tp=4))
    w = PricedWorkload(4, 12, 100, 10, "bfloat16", QuantConfig(), parallel=par)
    priced = price(TINY, H100, w)
    p = priced.prediction
    assert p is not None and p.disaggregated is not None
    # 3 waves: the first one's E2E, then one per 4 / (the slower pool's requests/s)
    wall = p.e2e_s + 2 * 4 / p.disaggregated.requests_per_s
    assert priced.to_dict()["output_tokens_per_s"] == pytest.approx(12 * 10 / wall)


def test_the_link_between_pools_follows_their_span() -> None:
    big = pools(P(tp=4), P(tp=4))  # 8 devices: one HGX board
    p = predict(TINY, H100, batch=8, prompt_len=50, gen_len=4, parallel=big)
    assert p.disaggregated is not None and p.disaggregated.transfer.tier == "nvlink4"
    wide = pools(P(tp=4, replicas=3), P(tp=4, pp=2))  # 4 + 8 devices: past the board
    p = predict(TINY, H100, batch=8, prompt_len=50, gen_len=4, parallel=wide)
    t = p.disaggregated.transfer if p.disaggregated else None
    assert t is not None and (t.tier, t.links) == ("network", 4)
    assert t.time_s == pytest.approx(8 * 50 * KV_PER_TOKEN / 4 / 50e9 + 5e-6)
    # the same 12 devices inside a GB200 NVL72 rack stay on NVLink 5
    p = predict(TINY, get_hardware("gb200"), batch=8, prompt_len=50, gen_len=4, parallel=wide)
    assert p.disaggregated is not None and p.disaggregated.transfer.tier == "nvlink5"


def test_one_output_token_needs_no_transfer() -> None:
    p = predict(TINY, H100, batch=2, prompt_len=30, gen_len=1, parallel=pools(P(tp=2), P(tp=2)))
    pre = predict(TINY, H100, batch=2, prompt_len=30, gen_len=1, parallel=P(tp=2))
    assert p.disaggregated is not None and p.disaggregated.transfer.bytes == 0
    assert p.ttft_s == pre.ttft_s and p.disaggregated.decode.requests_per_s == 0.0


@pytest.mark.parametrize(("make", "message"), [
    (lambda: P(tp=2, disaggregated=Disaggregation(P(), P())),
     "parallel.tp=2 next to parallel.disaggregated: each pool sets its own layout; allowed: "
     "disaggregated.prefill.tp and disaggregated.decode.tp"),
    (lambda: P(dispatch_dtype="float8", disaggregated=Disaggregation(P(), P())),
     "parallel.dispatch_dtype=float8 next to parallel.disaggregated"),
    (lambda: pools(P(disaggregated=Disaggregation(P(), P())), P()),
     "parallel.disaggregated.prefill.disaggregated: a pool is one layout"),
])
def test_layouts_of_pools_are_checked(make, message) -> None:
    with pytest.raises(ConfigError) as exc:
        make()
    assert message in str(exc.value)


def test_a_pool_that_does_not_divide_is_named() -> None:
    with pytest.raises(ConfigError, match="parallel.disaggregated.decode.tp=8 must divide the 4 "
                                          "attention heads of tiny-moe; allowed: 1, 2, 4"):
        predict(TINY, H100, batch=1, prompt_len=10, gen_len=2, parallel=pools(P(), P(tp=8)))
    with pytest.raises(ConfigError, match="each pool has its own memory"):
        max_batch(TINY, H100, "bfloat16", None, 100, pools(P(), P()))


def test_scenario_keys_and_output(monkeypatch, capsys) -> None:
    args = ["predict", "--model", "tiny-moe", "--batch", "4", "--prompt", "100", "--gen", "10",
            "--set", "parallel.disaggregated.prefill.tp=2",
            "--set", "parallel.disaggregated.decode={tp: 4, replicas: 2}"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "P 2x1 + D 4x1 x2" in out
    assert "disaggregated: KV transfer 0.00 GB over nvlink4 on 2 links" in out
    code, out, err = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    row = json.loads(out)[0]
    assert row["parallel"]["devices"] == 10
    assert row["parallel"]["disaggregated"]["decode"]["replicas"] == 2
    assert row["disaggregated"]["transfer"]["bytes"] == 102400
    assert row["disaggregated"]["devices"] == 10


@pytest.mark.parametrize(("sets", "message"), [
    (["parallel.disaggregated.prefill.tp=2"], "parallel.disaggregated.decode: required key"),
    (["parallel.disaggregated.prefill.tp=2", "parallel.disaggregated.decode.tq=2"],
     "parallel.disaggregated.decode.tq: unknown key"),
    (["parallel.tp=2", "parallel.disaggregated.prefill.tp=2",
      "parallel.disaggregated.decode.tp=2"], "parallel.tp=2 next to parallel.disaggregated"),
])
def test_bad_pools_are_one_line(sets, message, monkeypatch, capsys) -> None:
    args = ["predict", "--model", "tiny-moe"]
    for item in sets:
        args += ["--set", item]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
