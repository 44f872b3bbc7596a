"""Speculative decoding inside the engine (issue 13): lossless under greedy decoding for
every engine-side proposer, inside continuous batching with prefix caching, the target's
distribution under sampling, rollback, and a draft equal to the target accepting all."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from infbench.core.config import EngineConfig
from infbench.core.errors import ConfigError, UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.engine.engine import Engine, KVSizing
from infbench.engine.request import Request, SamplingParams
from infbench.model.context import DenseContext
from infbench.model.loader import load_model
from tests.engine_helpers import greedy_recompute, random_requests
from tests.spec.test_verify import CHI2_999, chi_square


def _loaded(**overrides: Any) -> Any:
    return load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=3,
                      overrides=overrides or None)


def _engine(loaded: Any, requests: list[Request], spec: SpeculativeConfig | None,
            **engine_kw: Any) -> Engine:
    cfg = EngineConfig(**{"block_size": 4, "backend": "torch", **engine_kw})
    return Engine.create(loaded, cfg, "cpu", "float32", seed=0, speculative=spec,
                         sizing=KVSizing.for_requests(requests, cfg.block_size),
                         source={"preset": "tiny"})


SPECS = [
    SpeculativeConfig("ngram", 3, ngram_max=2),
    SpeculativeConfig("draft", 2),  # the target itself
    SpeculativeConfig("draft", 4, draft_layers=1),  # layer-skipping self-draft
    SpeculativeConfig("draft", 3, draft_quant="int8"),  # the quantized target
    SpeculativeConfig("draft", 1, draft_model="tiny"),  # a separate model, other weights
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label)
def test_greedy_speculation_equals_plain_greedy(spec: SpeculativeConfig) -> None:
    loaded = _loaded()
    # Repetitive prompts give the n-gram proposer matches; 5 requests over 3 slots make
    # admissions, prefills and verifications share steps.
    requests = random_requests([5, 9, 13], 14, 256, seed=1)
    requests += [Request(f"rep{i}", (7, 8, 9, 10) * (2 + i), SamplingParams(max_tokens=12,
                                                                          ignore_eos=True))
                 for i in range(2)]
    engine = _engine(loaded, requests, spec, max_num_seqs=3, enable_prefix_caching=True)
    out = engine.run(requests, realtime_arrivals=False)
    for r in requests:
        expect = greedy_recompute(loaded.model, r.prompt_ids, r.sampling.max_tokens)
        assert out.outputs[r.request_id] == expect, r.request_id
    drafts = [d for s in out.steps for d in s.spec_drafts]
    assert drafts, "nothing was verified"
    assert max(drafts) <= spec.num_tokens
    if spec.method == "draft" and spec.draft_model is None and spec.draft_layers is None \
            and spec.draft_quant == "none":  # the target as its own draft
        assert [a for s in out.steps for a in s.spec_accepted] == drafts
    # Every block went back: nothing leaked by rollback.
    assert engine.block_manager.num_used_blocks == 0 or engine.block_manager.enable_prefix_caching


def test_rollback_leaves_the_cache_of_a_fresh_recompute() -> None:
    loaded = _loaded()
    req = random_requests([6], 30, 256, seed=4)
    # Another seed's weights: most drafts are rejected.
    engine = _engine(loaded, req, SpeculativeConfig("draft", 4, draft_model="tiny"),
                     enable_prefix_caching=False)
    seq = engine.add_request(req[0])
    rejected = 0
    for _ in range(6):
        record, _ = engine.step(lambda: 0.0)
        rejected += sum(d - a for d, a in zip(record.spec_drafts, record.spec_accepted,
                                              strict=True))
    assert rejected > 0, "the test needs rejected drafts"
    n = seq.num_computed_tokens
    bs = engine.engine_cfg.block_size
    assert len(seq.block_table) == -(-n // bs)  # slots past the kept tokens released
    # K of every layer at the kept positions equals a fresh plain prefill of those tokens.
    fresh = Engine.create(loaded, EngineConfig(block_size=bs, backend="torch"), "cpu",
                          "float32", sizing=KVSizing.for_requests(req, bs))
    fseq = fresh.add_request(Request("f", tuple(seq.token_ids[:n]),
                                     SamplingParams(max_tokens=2)))
    fresh.step(lambda: 0.0)
    assert fseq.num_computed_tokens == n
    for spec in engine.cfg.layers():
        k_spec = engine.kv.layer(spec)[0]
        k_fresh = fresh.kv.layer(spec)[0]
        for pos in range(n):
            a = k_spec[seq.block_table[pos // bs], pos % bs]
            b = k_fresh[fseq.block_table[pos // bs], pos % bs]
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _sharpen(loaded: Any, factor: float) -> None:
    """Scale the LM head so the tiny random model's distributions are far from uniform."""
    with torch.no_grad():
        loaded.model.lm_head.weight.mul_(factor)


@pytest.mark.parametrize("spec", [SpeculativeConfig("draft", 1, draft_layers=1),
                                  SpeculativeConfig("ngram", 1)],
                         ids=["sampled-draft", "one-hot-ngram"])
def test_sampling_keeps_the_target_distribution(spec: SpeculativeConfig) -> None:
    """The second generated token (the first one verification emits) follows the target's
    marginal exactly: chi-square against sum_t1 p(t1 | prompt) p(t2 | prompt, t1)."""
    vocab = 6
    loaded = _loaded(vocab_size=vocab)
    _sharpen(loaded, 5.0)
    prompt = (1, 2, 3, 1, 2)  # a repeat, so the n-gram proposer drafts
    model = loaded.model
    with torch.inference_mode():
        ids = torch.tensor(prompt)
        p1 = torch.softmax(model.compute_logits(
            model(ids, torch.arange(len(prompt)), DenseContext.single(len(prompt)))[-1:]), -1)[0]
        p2 = torch.zeros(vocab)
        for t1 in range(vocab):
            seq = torch.tensor([*prompt, t1])
            h = model(seq, torch.arange(len(seq)), DenseContext.single(len(seq)))
            p2 += p1[t1] * torch.softmax(model.compute_logits(h[-1:]), -1)[0]
    assert p2.max() < 0.9 and p2.min() > 0.01, f"pick another sharpening: {p2}"
    n = 3000
    requests = [Request(f"s{i}", prompt, SamplingParams(temperature=1.0, max_tokens=3,
                                                        seed=i, ignore_eos=True))
                for i in range(n)]
    engine = _engine(loaded, requests[:64], spec, max_num_seqs=64)
    counts = torch.zeros(vocab)
    verified = 0
    for start in range(0, n, 64):
        out = engine.run(requests[start:start + 64], realtime_arrivals=False)
        verified += sum(len(s.spec_drafts) for s in out.steps)
        for r in requests[start:start + 64]:
            counts[out.outputs[r.request_id][1]] += 1
    assert verified > n // 4  # n-gram drafts exist only after a token seen before
    assert chi_square(counts, p2) < CHI2_999[vocab - 1]


def test_bad_speculative_settings() -> None:
    loaded = _loaded()
    req = random_requests([4], 4, 256)
    with pytest.raises(ConfigError, match="num_tokens"):
        _engine(loaded, req, SpeculativeConfig("draft", 0))
    with pytest.raises(ConfigError, match="draft_layers=5"):
        _engine(loaded, req, SpeculativeConfig("draft", 2, draft_layers=5))
    other = _loaded(vocab_size=128)
    with pytest.raises(UserError, match="vocabulary"):
        _engine(other, req, SpeculativeConfig("draft", 2, draft_model="tiny"))
    mamba = load_model({"preset": "tiny"}, dtype="float32", device="cpu",
                       overrides={"attention": {"kind": "ssm"}})
    with pytest.raises(ConfigError, match="rolled back"):
        _engine(mamba, req, SpeculativeConfig("ngram", 2))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_speculation_is_exact_on_the_fused_cpu_path(dtype: str) -> None:
    """The cpu backend's fused decode layers: 8 sequences x (1 + 4) rows = 40 rows run in
    chunks of 32, the same kernels plain decoding runs, so even bf16 tokens are equal."""
    loaded = load_model({"preset": "tiny"}, dtype=dtype, device="cpu", seed=3)
    requests = random_requests([5, 7, 9, 11, 6, 8, 10, 12], 16, 256, seed=2)

    def run(spec: SpeculativeConfig | None) -> tuple[dict[str, list[int]], list[Any]]:
        cfg = EngineConfig(block_size=4, backend="cpu", max_num_seqs=8)
        engine = Engine.create(loaded, cfg, "cpu", dtype, seed=0, speculative=spec,
                               sizing=KVSizing.for_requests(requests, 4))
        out = engine.run(requests, realtime_arrivals=False)
        return out.outputs, out.steps

    plain, _ = run(None)
    spec, steps = run(SpeculativeConfig("draft", 4, draft_layers=1))
    assert spec == plain
    assert max(sum(s.query_lens) for s in steps) > 32  # the chunked path ran
