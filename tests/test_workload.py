"""Seeded request generation: lengths, arrivals, prompts (random and text), reproducibility."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from infbench.core.errors import ConfigError, UserError
from infbench.measure.workload import draw_lengths, generate_requests, prose
from infbench.scenario.point import WorkloadPoint


class WordTokenizer:
    """A duck-typed tokenizer: one id per distinct word, BOS optional, a toy chat template."""

    def __init__(self, add_bos: bool = False, bos_token_id: int = 1) -> None:
        self.vocab: dict[str, int] = {}
        self.add_bos = add_bos
        self.bos_token_id = bos_token_id
        self.chat_calls = 0

    def encode(self, text: str) -> list[int]:
        ids = [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]
        return ([self.bos_token_id] if self.add_bos else []) + ids

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        self.chat_calls += 1
        parts = [f"<|{m['role']}|> {m['content']} <|end|>" for m in messages]
        return " ".join(parts) + " <|assistant|>"


def point(**kw: object) -> WorkloadPoint:
    return dataclasses.replace(WorkloadPoint(), **kw)  # type: ignore[arg-type]


def test_static_fixed_lengths_all_arrive_at_zero() -> None:
    reqs = generate_requests(point(batch_size=5, prompt_len=17, gen_len=9), vocab_size=1000)
    assert len(reqs) == 5
    assert [r.request_id for r in reqs] == ["r0000", "r0001", "r0002", "r0003", "r0004"]
    assert all(len(r.prompt_ids) == 17 and r.sampling.max_tokens == 9 for r in reqs)
    assert all(r.arrival_s == 0.0 and r.n == 1 for r in reqs)
    assert all(r.sampling.ignore_eos and r.sampling.is_greedy for r in reqs)
    assert len({r.prompt_ids for r in reqs}) == 5  # prompts differ


def test_offline_uses_num_requests() -> None:
    reqs = generate_requests(point(kind="offline", batch_size=3, num_requests=11), 500)
    assert len(reqs) == 11 and all(r.arrival_s == 0.0 for r in reqs)


def test_same_point_same_requests_and_seed_changes_them() -> None:
    p = point(kind="poisson", rate=5.0, num_requests=20, prompt_len_dist="lognormal",
              gen_len_dist="uniform", shared_prefix_len=4, temperature=0.8, top_k=20, top_p=0.9)
    a, b = generate_requests(p, 300), generate_requests(p, 300)
    assert a == b
    c = generate_requests(dataclasses.replace(p, seed=1), 300)
    assert [r.prompt_ids for r in c] != [r.prompt_ids for r in a]
    assert [r.arrival_s for r in c] != [r.arrival_s for r in a]


def test_changing_the_rate_keeps_the_prompts() -> None:
    p = point(kind="poisson", rate=5.0, num_requests=8)
    a = generate_requests(p, 300)
    b = generate_requests(dataclasses.replace(p, rate=50.0), 300)
    assert [r.prompt_ids for r in a] == [r.prompt_ids for r in b]
    assert [r.arrival_s for r in a] != [r.arrival_s for r in b]


def test_random_ids_avoid_special_ids_and_eos() -> None:
    reqs = generate_requests(point(batch_size=4, prompt_len=500), vocab_size=20, eos_token_id=15)
    ids = np.array([t for r in reqs for t in r.prompt_ids])
    assert ids.min() >= 10 and ids.max() < 20 and 15 not in ids
    assert set(ids.tolist()) == {10, 11, 12, 13, 14, 16, 17, 18, 19}
    tiny = generate_requests(point(batch_size=1, prompt_len=8), vocab_size=3)
    assert set(tiny[0].prompt_ids) <= {2}


def test_poisson_arrivals_have_the_requested_rate() -> None:
    reqs = generate_requests(point(kind="poisson", rate=4.0, num_requests=4000), 100)
    arrivals = np.array([r.arrival_s for r in reqs])
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    gaps = np.diff(arrivals)
    assert gaps.mean() == pytest.approx(0.25, rel=0.06)
    assert np.std(gaps) == pytest.approx(0.25, rel=0.1)  # exponential: std == mean


@pytest.mark.parametrize("dist", ["uniform", "normal", "lognormal"])
def test_length_distributions(dist: str) -> None:
    rng = np.random.default_rng(0)
    lengths = draw_lengths(rng, 200, dist, 0.5, 20000)
    assert lengths.min() >= 1 and lengths.dtype == np.int64
    assert lengths.mean() == pytest.approx(200, rel=0.03)
    if dist == "uniform":
        assert lengths.min() >= 100 and lengths.max() <= 300
    assert len(set(lengths.tolist())) > 50


def test_lengths_clip_to_one_and_fixed() -> None:
    rng = np.random.default_rng(0)
    assert draw_lengths(rng, 2, "normal", 3.0, 1000).min() == 1
    assert draw_lengths(rng, 7, "fixed", 0.5, 3).tolist() == [7, 7, 7]
    with pytest.raises(ConfigError):
        draw_lengths(rng, 7, "zipf", 0.5, 3)


def test_drawn_lengths_reach_the_requests() -> None:
    reqs = generate_requests(point(batch_size=50, prompt_len=40, prompt_len_dist="uniform",
                                   gen_len=20, gen_len_dist="uniform", len_spread=0.5), 1000)
    plens = [len(r.prompt_ids) for r in reqs]
    glens = [r.sampling.max_tokens for r in reqs]
    assert min(plens) >= 20 and max(plens) <= 60 and len(set(plens)) > 5
    assert min(glens) >= 10 and max(glens) <= 30 and len(set(glens)) > 5


def test_shared_prefix_is_identical_and_the_rest_differs() -> None:
    reqs = generate_requests(point(batch_size=6, prompt_len=32, shared_prefix_len=12), 5000)
    prefixes = {r.prompt_ids[:12] for r in reqs}
    assert len(prefixes) == 1
    assert len({r.prompt_ids[12:] for r in reqs}) == 6
    # Drawn lengths shorter than the prefix are raised to it: the prefix is always whole.
    short = generate_requests(point(batch_size=40, prompt_len=10, shared_prefix_len=10,
                                    prompt_len_dist="normal", len_spread=0.5), 5000)
    assert min(len(r.prompt_ids) for r in short) == 10
    assert len({r.prompt_ids[:10] for r in short}) == 1


def test_samples_and_sampling_params() -> None:
    reqs = generate_requests(point(batch_size=3, samples_per_prompt=4, temperature=0.7,
                                   top_k=50, top_p=0.95, ignore_eos=False), 100, eos_token_id=2)
    assert all(r.n == 4 for r in reqs)
    s = reqs[0].sampling
    assert (s.temperature, s.top_k, s.top_p, s.ignore_eos) == (0.7, 50, 0.95, False)
    assert s.stop_token_ids == (2,)
    assert len({r.sampling.seed for r in reqs}) == 3
    ignored = generate_requests(point(batch_size=1), 100, eos_token_id=2)
    assert ignored[0].sampling.stop_token_ids == ()


def test_text_prompts_are_windows_of_the_shipped_text() -> None:
    tok = WordTokenizer()
    reqs = generate_requests(point(batch_size=4, prompt_len=30, prompt_source="text"),
                             vocab_size=10_000, tokenizer=tok)
    corpus = tok.encode(prose())
    inverse = {v: k for k, v in tok.vocab.items()}
    text = " ".join(prose().split())
    for r in reqs:
        assert len(r.prompt_ids) == 30
        window = " ".join(inverse[t] for t in r.prompt_ids)
        assert window in text + " " + text  # a contiguous (possibly wrapped) window
    assert len(corpus) > 2000


def test_long_text_prompts_cycle_the_text() -> None:
    tok = WordTokenizer()
    n = len(tok.encode(prose()))
    reqs = generate_requests(point(batch_size=1, prompt_len=2 * n + 5, prompt_source="text"),
                             vocab_size=10_000, tokenizer=tok)
    ids = reqs[0].prompt_ids
    assert len(ids) == 2 * n + 5 and ids[:n] == ids[n:2 * n]


def test_text_prompts_keep_the_tokenizers_bos_and_shared_prefix() -> None:
    tok = WordTokenizer(add_bos=True)
    reqs = generate_requests(point(batch_size=5, prompt_len=25, shared_prefix_len=8,
                                   prompt_source="text"), vocab_size=10_000, tokenizer=tok)
    assert all(r.prompt_ids[0] == 1 and 1 not in r.prompt_ids[1:] for r in reqs)
    assert all(len(r.prompt_ids) == 25 for r in reqs)
    assert len({r.prompt_ids[:8] for r in reqs}) == 1


def test_text_prompts_need_a_tokenizer_and_a_fitting_vocab() -> None:
    with pytest.raises(UserError, match="prompt_source: 'text' needs the model's tokenizer"):
        generate_requests(point(prompt_source="text"), 100)
    with pytest.raises(UserError, match="outside the model vocabulary"):
        generate_requests(point(prompt_source="text"), 50, tokenizer=WordTokenizer())


def test_chat_prompts_apply_the_template() -> None:
    tok = WordTokenizer()
    reqs = generate_requests(point(batch_size=3, prompt_len=40, prompt_source="text",
                                   chat=True, shared_prefix_len=10), 10_000, tokenizer=tok)
    assert tok.chat_calls > 0
    inverse = {v: k for k, v in tok.vocab.items()}
    for r in reqs:
        words = [inverse[t] for t in r.prompt_ids]
        assert words[0] == "<|system|>" and words[-1] == "<|assistant|>"
        assert "<|user|>" in words
        assert 38 <= len(r.prompt_ids) <= 40  # whole words: within one word of prompt_len
    assert len({r.prompt_ids[:10] for r in reqs}) == 1


def test_chat_errors_are_explicit() -> None:
    class NoTemplate:
        def encode(self, text: str) -> list[int]:
            return [10] * len(text.split())

    with pytest.raises(UserError, match="no chat template"):
        generate_requests(point(prompt_source="text", chat=True), 100, tokenizer=NoTemplate())
    with pytest.raises(UserError, match="cannot hold the chat template"):
        generate_requests(point(prompt_len=2, prompt_source="text", chat=True), 10_000,
                          tokenizer=WordTokenizer())
    with pytest.raises(ConfigError, match="workload.chat"):
        point(chat=True)


def test_prose_is_long_public_domain_text() -> None:
    text = prose()
    assert len(text.split()) >= 2000
    assert text.startswith("In Congress, July 4, 1776.")
    assert "government of the people, by the people, for the people" in text
