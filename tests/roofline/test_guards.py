"""Size and number guards of the analytic model: O(1) in the batch, sane limits, named fields.

`predict` prices a batch of identical sequences as one (SeqWork, count) group, so its
cost does not grow with the batch; absurd sizes are refused by name before any work.
The golden values below were produced by the per-sequence implementation this
replaced (prompt 300, gen 40, bfloat16 on h100-sxm) and must stay bit-identical.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest

from infbench.core.config import (
    MAX_BATCH,
    MAX_LAYERS,
    MAX_TOKENS,
    AttentionConfig,
    EngineConfig,
    ModelConfig,
    MoEConfig,
    QuantConfig,
)
from infbench.core.errors import ConfigError, UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.hardware.spec import HARDWARE
from infbench.roofline.analysis import mean_stage, predict
from infbench.roofline.costs import SeqWork, group_costs, step_costs
from infbench.roofline.tables import kv_rows

H100 = HARDWARE["h100-sxm"]

# (model, batch, ttft_s, time_per_token_s, decode step bytes, prefill FLOPs)
GOLDEN = [
    ("llama2-7b", 1, 0.004701791828059702, 0.0039972309205970145, 13390723584.0, 3910279168000.0),
    ("llama2-7b", 2, 0.007904344386496866, 0.004049779085373135, 13566759936.0, 7820558336000.0),
    ("llama2-7b", 3, 0.0118565165797453, 0.004102327250149254, 13742796288.0, 11730837504000.0),
    ("llama2-7b", 7, 0.027665205352739034, 0.004312519909253732, 14446941696.0, 27371954176000.0),
    ("llama2-7b", 16, 0.06323475509197493, 0.004785453392238806, 16031268864.0,
     62564466688000.0),
    ("llama2-7b", 64, 0.2529390203678997, 0.007307765301492536, 24481013760.0,
     250257866752000.0),
    ("deepseek-v2-lite", 1, 0.009902727565371854, 0.001469136792835821, 4921608256.0,
     1358374835200.0),
    ("deepseek-v2-lite", 7, 0.013808278543283582, 0.0049764764436654625, 16671196086.279297,
     9508623846400.0),
    ("deepseek-v2-lite", 64, 0.08786738372023449, 0.009594008192177643, 32139927443.795097,
     86935989452800.0),
    ("mistral-7b", 3, 0.012772579900545785, 0.004290748140895522, 14374006272.0,
     12637190553600.0),
    ("mistral-7b", 64, 0.2724817045449768, 0.005217499472238806, 17478623232.0,
     269593398476800.0),
]


@pytest.mark.parametrize("model,batch,ttft,tpot,decode_bytes,prefill_flops", GOLDEN)
def test_results_unchanged_at_small_batches(model, batch, ttft, tpot, decode_bytes,
                                            prefill_flops) -> None:
    p = predict(ModelConfig.from_name(model), H100, batch=batch, prompt_len=300, gen_len=40)
    assert (p.ttft_s, p.time_per_token_s) == (ttft, tpot)
    assert (p.decode.bytes, p.prefill.flops) == (decode_bytes, prefill_flops)


@pytest.mark.parametrize("model", ["llama2-7b", "deepseek-v2-lite", "tiny-moe", "mistral-7b"])
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_groups_equal_the_list_of_sequences(model, batch) -> None:
    cfg = ModelConfig.from_name(model)
    for sw in (SeqWork(1, 700), SeqWork(64, 64), SeqWork(4, 90, 4)):
        listed = step_costs(cfg, [sw] * batch, "bfloat16", by_layer=True)
        assert group_costs(cfg, [(sw, batch)], "bfloat16", by_layer=True) == listed
    mixed = [SeqWork(1, 50), SeqWork(8, 8), SeqWork(1, 50)]
    assert group_costs(cfg, [(SeqWork(1, 50), 2), (SeqWork(8, 8), 1)], "bfloat16") == \
        step_costs(cfg, mixed, "bfloat16")
    # mean_stage takes either form of the batch
    q = QuantConfig()
    by_list = mean_stage(cfg, H100, "bfloat16", q, lambda x: [SeqWork(1, x)] * batch, 1, 10, 40)
    by_groups = mean_stage(cfg, H100, "bfloat16", q, lambda x: [(SeqWork(1, x), batch)], 1, 10,
                           40)
    assert by_list == by_groups


def test_predict_time_does_not_grow_with_the_batch() -> None:
    cfg = ModelConfig.from_name("llama2-13b")
    t0 = time.perf_counter()
    small = predict(cfg, H100, batch=1, prompt_len=1024, gen_len=128)
    t1 = time.perf_counter()
    huge = predict(cfg, H100, batch=MAX_BATCH, prompt_len=1024, gen_len=128)
    t2 = time.perf_counter()
    assert t2 - t1 < 5.0 and t2 - t1 < 50 * (t1 - t0) + 1.0
    assert huge.batch == MAX_BATCH and not huge.fits
    assert huge.prefill.flops > small.prefill.flops * (MAX_BATCH - 1)


def test_cli_predict_batch_1e9_is_refused_fast_naming_the_limit() -> None:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "infbench.cli", "predict", "--batch",
                           "1000000000"], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "16777216" in lines[0] and "2**24" in lines[0] and "batch" in lines[0]
    assert "Traceback" not in proc.stderr
    assert elapsed < 30  # interpreter start included; the refusal itself is instant


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch=MAX_BATCH + 1), "batch must be <= 16777216"),
    (dict(prompt_len=MAX_TOKENS + 1), "prompt_len must be <= 16777216"),
    (dict(gen_len=10**12), "gen_len must be <= 16777216"),
    (dict(prompt_len=MAX_TOKENS - 1, gen_len=2), r"prompt_len \+ gen_len must be <= 16777216"),
    (dict(batch=2.5), "batch must be an integer"),
    (dict(batch=float("nan")), "batch must be an integer"),
    (dict(prompt_len=True), "prompt_len must be an integer"),
    (dict(gen_len=-1), "gen_len must be > 0"),
])
def test_predict_refuses_absurd_sizes_by_name(kwargs, match) -> None:
    args = dict(batch=1, prompt_len=8, gen_len=8) | kwargs
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=match):
        predict(ModelConfig.from_name("tiny"), H100, **args)
    assert time.perf_counter() - t0 < 1.0


def test_huge_contexts_within_the_limit_stay_fast() -> None:
    t0 = time.perf_counter()
    # The model's own context (32k) would refuse this: the speed check raises it to the limit.
    cfg = ModelConfig.from_name("mistral-7b").with_overrides(max_seq_len=MAX_TOKENS)
    p = predict(cfg, H100, batch=4096,
                prompt_len=MAX_TOKENS // 2, gen_len=MAX_TOKENS // 2,
                speculative=SpeculativeConfig("ngram", 4, 0.7, 0.1))
    assert time.perf_counter() - t0 < 5.0
    assert math.isfinite(p.time_per_token_s) and p.time_per_token_s > 0


@pytest.mark.parametrize("field,value,match", [
    ("hidden_size", float("nan"), "model.hidden_size must be an integer > 0, got nan"),
    ("hidden_size", 0, "model.hidden_size must be > 0"),
    ("num_heads", -4, "model.num_heads must be > 0"),
    ("num_layers", 10**9, "model.num_layers must be <= 65536"),
    ("num_layers", 12.0, "model.num_layers must be an integer"),
    ("vocab_size", True, "model.vocab_size must be an integer"),
    ("max_seq_len", MAX_TOKENS + 1, "model.max_seq_len must be <= 16777216"),
    ("rope_theta", float("inf"), "model.rope_theta must be a finite number > 0"),
    ("rope_theta", float("nan"), "model.rope_theta must be a finite number > 0"),
    ("rms_norm_eps", 0.0, "model.rms_norm_eps must be a finite number > 0"),
    ("intermediate_size", "4096", "model.intermediate_size must be an integer"),
])
def test_model_config_numbers_name_the_field(field, value, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_name("tiny").with_overrides(**{field: value})


def test_attention_moe_engine_and_spec_numbers() -> None:
    with pytest.raises(ConfigError, match="attention.window must be an integer"):
        AttentionConfig(kind="sliding", window=float("nan"))
    with pytest.raises(ConfigError, match="attention.window must be <= 16777216"):
        AttentionConfig(kind="sliding", window=2**30)
    with pytest.raises(ConfigError, match="moe.num_shared_experts must be >= 0"):
        MoEConfig(8, 2, 32, num_shared_experts=-1)
    with pytest.raises(ConfigError, match="engine.kv_cache_memory must be a finite number"):
        EngineConfig(kv_cache_memory=float("nan"))
    with pytest.raises(ConfigError, match="engine.max_num_seqs must be <= 16777216"):
        EngineConfig(max_num_seqs=10**9)
    with pytest.raises(ConfigError, match="speculative.draft_cost_ratio must be a finite"):
        SpeculativeConfig("ngram", 3, 0.5, float("nan"))
    with pytest.raises(ConfigError, match="speculative.acceptance must be a finite"):
        SpeculativeConfig("ngram", 3, float("nan"))
    with pytest.raises(ConfigError, match="speculative.num_tokens must be <= 1024"):
        SpeculativeConfig("ngram", 10**6, 0.5)
    with pytest.raises(ConfigError, match="query_len must be >= 1"):
        SeqWork(float("nan"), 4)  # type: ignore[arg-type]
    assert MAX_LAYERS == 2**16


def test_kv_rows_limits() -> None:
    cfg = [ModelConfig.from_name("tiny")]
    with pytest.raises(UserError, match="batch must be <= 16777216"):
        kv_rows(cfg, context_len=1024, batch=10**9, hw=H100)
    with pytest.raises(UserError, match="context_len must be <= 16777216"):
        kv_rows(cfg, context_len=10**9, batch=1, hw=H100)
    t0 = time.perf_counter()  # the model's own context would refuse MAX_TOKENS: raise it
    long = [cfg[0].with_overrides(max_seq_len=MAX_TOKENS)]
    kv_rows(long, context_len=MAX_TOKENS, batch=MAX_BATCH, hw=H100)
    assert time.perf_counter() - t0 < 1.0
