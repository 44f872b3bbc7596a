"""Cost model: parameter counts, KV/state sizes and per-operator FLOPs/bytes of a step."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.errors import ConfigError
from infbench.roofline.costs import (
    SeqWork,
    kv_bytes_per_token,
    kv_cache_bytes,
    merge_by_name,
    param_count,
    state_bytes_per_seq,
    step_costs,
    total,
    weight_bytes,
)
from infbench.roofline.layer_costs import (
    attended_pairs,
    kv_tokens_read,
    mla_absorbed_is_cheaper,
)

BF16 = "bfloat16"


def ops_by_name(cfg: ModelConfig, seqs: list[SeqWork], **kw: object) -> dict:
    return {op.name: op for op in step_costs(cfg, seqs, BF16, **kw)}


def decode(batch: int, context: int) -> list[SeqWork]:
    return [SeqWork(1, context)] * batch


# ------------------------------------------------------------------ sizes
@pytest.mark.parametrize(
    ("preset", "expected"),
    [("llama2-7b", 6_738_415_616), ("llama3-8b", 8_030_261_248),
     ("llama2-13b", 13_015_864_320), ("smollm2-135m", 134_515_008)],
)
def test_param_count_matches_hugging_face(preset: str, expected: int) -> None:
    assert param_count(ModelConfig.from_name(preset)).total == expected


def test_moe_param_counts_total_and_active() -> None:
    v2 = param_count(ModelConfig.from_name("deepseek-v2"))
    lite = param_count(ModelConfig.from_name("deepseek-v2-lite"))
    # DeepSeek-V2: 236B total, 21B activated; Lite: 15.7B total, 2.4B activated.
    assert v2.total == pytest.approx(236e9, rel=0.01)
    assert v2.active == pytest.approx(21e9, rel=0.03)
    assert lite.total == pytest.approx(15.7e9, rel=0.01)
    assert lite.active == pytest.approx(2.4e9, rel=0.03)
    dense = param_count(ModelConfig.from_name("llama2-7b"))
    assert dense.total - dense.active == dense.embedding == 32000 * 4096


def test_weight_bytes_follow_dtype_and_quantization() -> None:
    cfg = ModelConfig.from_name("llama2-7b")
    n = param_count(cfg).total
    assert weight_bytes(cfg, BF16) == 2 * n
    assert weight_bytes(cfg, "float32") == 4 * n
    int8 = weight_bytes(cfg, BF16, QuantConfig(weights="int8"))
    int4 = weight_bytes(cfg, BF16, QuantConfig(weights="int4", group_size=128))
    embed_and_head = 2 * 2 * 32000 * 4096  # stay in bf16
    linear = n - 2 * 32000 * 4096 - (2 * 32 + 1) * 4096  # block matrices
    assert int8 == pytest.approx(embed_and_head + linear, rel=0.01)
    assert int4 == pytest.approx(embed_and_head + linear * 4.25 / 8, rel=0.01)


def test_kv_bytes_per_token_published_values() -> None:
    assert kv_bytes_per_token(ModelConfig.from_name("llama2-7b"), BF16) == 524_288
    assert kv_bytes_per_token(ModelConfig.from_name("llama3-8b"), BF16) == 131_072
    assert kv_bytes_per_token(ModelConfig.from_name("llama2-13b"), BF16) == 819_200
    # MLA caches the 512-dim latent plus the 64-dim shared RoPE key per layer.
    assert kv_bytes_per_token(ModelConfig.from_name("deepseek-v2"), BF16) == (512 + 64) * 2 * 60
    # One byte per value plus a float32 scale per token per KV head for K and for V
    # (kernels/kv_quant.py): 32 layers x 2 x 32 heads x (128 + 4) bytes.
    for kv in ("fp8", "int8"):
        assert kv_bytes_per_token(ModelConfig.from_name("llama2-7b"), BF16,
                                  QuantConfig(kv=kv)) == 524_288 // 2 + 32 * 2 * 32 * 4
    # MLA: one scale per latent row.
    assert kv_bytes_per_token(ModelConfig.from_name("deepseek-v2"), BF16,
                              QuantConfig(kv="int8")) == (512 + 64 + 4) * 60


def test_quantized_kv_reads_and_writes_price_the_scales() -> None:
    """Decode attention reads, and the QKV projection writes, values plus their scales."""
    cfg = ModelConfig.from_name("llama3-8b")  # 32 layers, 8 KV heads of 128
    plain = ops_by_name(cfg, decode(4, 2000))
    int8 = ops_by_name(cfg, decode(4, 2000), quant=QuantConfig(kv="int8"))
    per_row = 128 + 4  # int8 values + a float32 scale, per token per KV head
    assert int8["attn_score"].kv_read_bytes == 4 * 2000 * 32 * 8 * per_row
    assert int8["attn_score"].kv_read_bytes * 256 == plain["attn_score"].kv_read_bytes * per_row
    assert int8["qkv_proj"].kv_write_bytes == 4 * 32 * 2 * 8 * per_row


def test_sliding_window_caps_the_cache() -> None:
    mistral = ModelConfig.from_name("mistral-7b")  # window 4096 on every layer
    per_token = kv_bytes_per_token(mistral, BF16)
    assert kv_cache_bytes(mistral, BF16, None, 1000, 2) == per_token * 1000 * 2
    assert kv_cache_bytes(mistral, BF16, None, 20_000, 1) == per_token * 4096
    hybrid = mistral.with_overrides(attention={"global_every": 4})  # 8 global of 32
    assert kv_cache_bytes(hybrid, BF16, None, 20_000, 1) == per_token // 32 * (
        24 * 4096 + 8 * 20_000)


def test_cla_two_halves_the_kv_cache() -> None:
    gqa = ModelConfig.from_name("llama3-8b")
    cla = gqa.with_overrides(attention={"kind": "cla", "cla_group": 2, "kv_heads": 8})
    assert kv_bytes_per_token(cla, BF16) * 2 == kv_bytes_per_token(gqa, BF16)
    g, c = ops_by_name(gqa, decode(4, 2000)), ops_by_name(cla, decode(4, 2000))
    # Layers without their own cache write nothing but still read their owner's KV.
    assert c["qkv_proj"].kv_write_bytes * 2 == g["qkv_proj"].kv_write_bytes
    assert c["attn_score"].kv_read_bytes == g["attn_score"].kv_read_bytes
    assert c["qkv_proj"].weight_bytes < g["qkv_proj"].weight_bytes


@pytest.mark.parametrize("kind", ["ssm", "linear"])
def test_recurrent_mixers_have_constant_state_and_no_kv(kind: str) -> None:
    cfg = ModelConfig.from_name("llama-small").with_overrides(attention={"kind": kind})
    assert kv_bytes_per_token(cfg, BF16) == 0
    assert kv_cache_bytes(cfg, BF16, None, 100_000, 4) == 0
    if kind == "ssm":  # conv state (d_inner x d_conv) + SSM state (d_inner x d_state)
        expected = 12 * (2048 * 4 + 2048 * 16) * 2
    else:  # S (heads x feature_dim x head_dim) + z (heads x feature_dim)
        expected = 12 * (16 * 64 * 64 + 16 * 64) * 2
    assert state_bytes_per_seq(cfg, BF16) == expected
    short, long = total(step_costs(cfg, decode(2, 10), BF16)), total(
        step_costs(cfg, decode(2, 50_000), BF16))
    assert short.bytes == long.bytes and short.flops == long.flops
    assert short.state_bytes == 2 * 2 * expected  # read and written back, two sequences


def test_hybrid_ssm_keeps_kv_only_in_attention_layers() -> None:
    cfg = ModelConfig.from_name("llama-small").with_overrides(
        attention={"kind": "ssm", "attn_every": 4, "kv_heads": 4})
    per_layer = 2 * 4 * 64 * 2
    assert kv_bytes_per_token(cfg, BF16) == 3 * per_layer  # layers 2, 6, 10 attend


# ------------------------------------------------------------------ step costs
def test_decode_reads_every_weight_once_and_only_embedding_rows() -> None:
    cfg = ModelConfig.from_name("llama2-7b")
    for batch in (1, 32):
        step = total(step_costs(cfg, decode(batch, 512), BF16))
        table = 32000 * 4096 * 2
        assert step.weight_bytes == weight_bytes(cfg, BF16) - table + batch * 4096 * 2


def test_decode_matmul_intensity_is_about_the_batch() -> None:
    cfg = ModelConfig.from_name("llama2-13b")
    for batch in (1, 8, 64):
        ops = ops_by_name(cfg, decode(batch, 1024))
        for name in ("qkv_proj", "o_proj", "mlp"):
            assert ops[name].intensity == pytest.approx(batch, rel=0.05), (name, batch)


def test_decode_attention_intensity_is_about_one_whatever_the_batch() -> None:
    cfg = ModelConfig.from_name("llama2-13b")
    one, many = ops_by_name(cfg, decode(1, 1024)), ops_by_name(cfg, decode(64, 1024))
    for name in ("attn_score", "attn_value"):
        assert one[name].intensity == pytest.approx(1.0, abs=0.01)
        assert many[name].intensity == pytest.approx(one[name].intensity, rel=1e-12)
    # GQA: each KV head serves num_heads / kv_heads query heads.
    gqa = ops_by_name(ModelConfig.from_name("llama3-8b"), decode(16, 1024))
    assert gqa["attn_score"].intensity == pytest.approx(4.0, rel=0.01)


def test_prefill_attention_intensity_grows_with_sequence_length() -> None:
    cfg = ModelConfig.from_name("llama2-13b")
    values = [ops_by_name(cfg, [SeqWork(s, s)])["attn_score"].intensity
              for s in (256, 1024, 4096)]
    assert values[0] < values[1] < values[2]
    assert values[2] / values[1] == pytest.approx(4.0, rel=0.05)  # about S / 2


def test_attended_pairs_and_keys() -> None:
    assert attended_pairs(4, 4, None) == 10  # causal triangle
    assert attended_pairs(100, 1, None) == 100
    assert attended_pairs(100, 1, 8) == 8
    assert attended_pairs(10, 3, 4) == 12
    assert kv_tokens_read(100, 1, 8) == 8 and kv_tokens_read(10, 3, 4) == 6
    assert kv_tokens_read(5, 5, 100) == 5


def test_counts_agree_with_the_kernels_declared_costs() -> None:
    """One meaning per name: the cost model and the kernels count pairs and keys alike."""
    from kernels import _paged_attention as kernel_counts

    for c in range(1, 40):
        for q in range(1, c + 1):
            for w in (None, 1, 3, 8, 64):
                assert attended_pairs(c, q, w) == kernel_counts.attended_pairs(c, q, w)
                assert kv_tokens_read(c, q, w) == kernel_counts.kv_tokens_read(c, q, w)


def test_sliding_window_caps_the_context_read() -> None:
    cfg = ModelConfig.from_name("mistral-7b")
    a, b = ops_by_name(cfg, decode(2, 6000)), ops_by_name(cfg, decode(2, 60_000))
    assert a["attn_score"].kv_read_bytes == b["attn_score"].kv_read_bytes
    assert a["attn_score"].flops == b["attn_score"].flops
    assert a["attn_score"].kv_read_bytes == 2 * 4096 * kv_bytes_per_token(cfg, BF16) / 2


def test_mla_decode_reads_the_latent_cache_and_absorbs_weights() -> None:
    cfg = ModelConfig.from_name("deepseek-v2-lite")
    ops = step_costs(cfg, decode(8, 3000), BF16)
    kv_read = sum(op.kv_read_bytes for op in ops)
    assert kv_read == 8 * 3000 * kv_bytes_per_token(cfg, BF16)
    assert mla_absorbed_is_cheaper(cfg, SeqWork(1, 3000), None)
    assert not mla_absorbed_is_cheaper(cfg, SeqWork(4096, 4096), None)
    # Absorbed attention shares one latent among all heads: intensity about the head count.
    score = next(op for op in ops if op.name == "attn_score")
    assert score.intensity > 10


def test_moe_weights_follow_distinct_experts_and_flops_top_k() -> None:
    cfg = ModelConfig.from_name("tiny-moe")
    moe = cfg.moe
    assert moe is not None
    experts_bytes = 2 * moe.num_experts * 3 * cfg.hidden_size * moe.moe_intermediate_size
    for tokens in (1, 3, 1000):
        op = ops_by_name(cfg, decode(tokens, 10))["moe_experts"]
        distinct = moe.expected_distinct_experts(tokens)
        assert op.weight_bytes == pytest.approx(
            cfg.num_layers * experts_bytes * distinct / moe.num_experts)
        per_token = 6 * cfg.hidden_size * moe.moe_intermediate_size + 4 * moe.moe_intermediate_size
        assert op.flops == cfg.num_layers * tokens * moe.num_experts_per_tok * per_token
    one = ops_by_name(cfg, decode(1, 10))["moe_experts"]
    assert one.weight_bytes == pytest.approx(cfg.num_layers * experts_bytes * 2 / 8)


def test_lm_head_only_for_tokens_that_need_logits() -> None:
    cfg = ModelConfig.from_name("llama2-7b")
    ops = ops_by_name(cfg, [SeqWork(100, 100), SeqWork(7, 20)])
    assert ops["lm_head"].flops == 2 * 2 * 4096 * 32000
    chunk = ops_by_name(cfg, [SeqWork(64, 64, num_logits=0)])
    assert "lm_head" not in chunk
    verify = ops_by_name(cfg, [SeqWork(5, 105, num_logits=5)])
    assert verify["lm_head"].flops == 5 * 2 * 4096 * 32000


@pytest.mark.parametrize("preset", ["llama2-7b", "mistral-7b", "deepseek-v2-lite", "tiny-moe"])
def test_per_layer_costs_sum_exactly_to_the_aggregate(preset: str) -> None:
    cfg = ModelConfig.from_name(preset)
    seqs = [SeqWork(1, 300), SeqWork(1, 5000), SeqWork(40, 90)]
    per_layer = step_costs(cfg, seqs, BF16, by_layer=True)
    assert {op.layer for op in per_layer} == {None, *range(cfg.num_layers)}
    assert merge_by_name(per_layer) == step_costs(cfg, seqs, BF16)


def test_seqwork_validation() -> None:
    with pytest.raises(ConfigError):
        SeqWork(0, 10)
    with pytest.raises(ConfigError):
        SeqWork(5, 4)
    with pytest.raises(ConfigError):
        SeqWork(2, 4, num_logits=3)
    with pytest.raises(ConfigError):
        step_costs(ModelConfig.from_name("tiny"), [], BF16)
    with pytest.raises(ConfigError, match="unknown dtype"):
        step_costs(ModelConfig.from_name("tiny"), decode(1, 2), "int3")


# ------------------------------------------------------------------ properties
_MODELS = [
    ModelConfig.from_name("tiny"),
    ModelConfig.from_name("tiny-mla"),
    ModelConfig.from_name("tiny-moe"),
    ModelConfig.from_name("tiny").with_overrides(attention={"kind": "sliding", "window": 16}),
    ModelConfig.from_name("tiny").with_overrides(attention={"kind": "cla", "kv_heads": 2}),
    ModelConfig.from_name("tiny").with_overrides(attention={"kind": "ssm", "attn_every": 2}),
    ModelConfig.from_name("tiny").with_overrides(attention={"kind": "linear"}),
]


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(_MODELS), query=st.integers(1, 64), context=st.integers(0, 400),
       extra=st.integers(1, 200), batch=st.integers(1, 8))
@example(model=_MODELS[1], query=22, context=22, extra=4, batch=1)  # MLA switches form
def test_bytes_and_flops_never_decrease_with_context(model: ModelConfig, query: int,
                                                     context: int, extra: int,
                                                     batch: int) -> None:
    short_seq, long_seq = SeqWork(query, query + context), SeqWork(query, query + context + extra)
    shorter = total(step_costs(model, [short_seq] * batch, BF16))
    longer = total(step_costs(model, [long_seq] * batch, BF16))
    assert longer.flops >= shorter.flops
    # MLA prices the form with fewer FLOPs (absorbed or expanded); where a longer context
    # switches the form, the bytes may drop (the expanded form's decompressed K/V go), so
    # bytes are monotonic within one form (found by hypothesis: query 22, context 44 -> 48)
    if not any(spec.mixer == "mla" for spec in model.layers()) or (
            mla_absorbed_is_cheaper(model, short_seq, None)
            == mla_absorbed_is_cheaper(model, long_seq, None)):
        assert longer.bytes >= shorter.bytes
