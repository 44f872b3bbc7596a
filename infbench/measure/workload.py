"""Seeded benchmark requests: lengths, arrival times and prompt tokens of one workload point.

Every random choice comes from `numpy.random.default_rng` streams spawned from the
workload seed, one stream per purpose (prompt lengths, output lengths, arrivals,
prompt tokens, per-request sampling seeds), so the same point and seed always give
identical requests, and changing one knob (say, the arrival rate) does not reshuffle
the prompts.

Prompts are random token ids (from [min(10, vocab - 1), vocab), skipping EOS) or
windows of the shipped public-domain text (`infbench/data/prose.txt`), cut at
seeded offsets and cycled for long prompts.  With `shared_prefix_len` P the first
P tokens of every prompt are one seeded "system prompt"; a drawn prompt length is
raised to P when shorter, so every prompt contains the whole prefix.
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from infbench.core.errors import ConfigError, UserError
from infbench.core.scenario import WorkloadPoint
from infbench.engine.request import Request, SamplingParams

_NUM_STREAMS = 5  # prompt lengths, output lengths, arrivals, prompt tokens, sampling seeds


def generate_requests(point: WorkloadPoint, vocab_size: int, tokenizer: Any = None,
                      eos_token_id: int | None = None) -> list[Request]:
    """The requests of one workload point, identical for the same point and seed."""
    if vocab_size <= 0:
        raise ConfigError(f"vocab_size must be > 0, got {vocab_size}")
    len_rng, gen_rng, arrival_rng, prompt_rng, seed_rng = _streams(point)
    n = point.num_prompts
    prompt_lens, gen_lens = _lengths(point, len_rng, gen_rng)
    arrivals = arrival_times(arrival_rng, point.kind, point.rate, n)
    if point.prompt_source == "text":
        prompts = _text_prompts(prompt_rng, [int(x) for x in prompt_lens], point, tokenizer,
                                vocab_size, eos_token_id)
    else:
        prompts = _random_prompts(prompt_rng, [int(x) for x in prompt_lens],
                                  point.shared_prefix_len, vocab_size, eos_token_id)
    seeds = seed_rng.integers(0, 2**31 - 1, size=n)
    stop = (eos_token_id,) if eos_token_id is not None and not point.ignore_eos else ()
    return [
        Request(
            request_id=f"r{i:04d}",
            prompt_ids=tuple(prompts[i]),
            sampling=SamplingParams(
                temperature=point.temperature, top_k=point.top_k, top_p=point.top_p,
                max_tokens=int(gen_lens[i]), seed=int(seeds[i]), stop_token_ids=stop,
                ignore_eos=point.ignore_eos,
            ),
            arrival_s=float(arrivals[i]),
            n=point.samples_per_prompt,
        )
        for i in range(n)
    ]


def request_lengths(point: WorkloadPoint) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) of the point's prompts, exactly as
    `generate_requests` draws them, without building any request: O(n) numpy work, so the
    pre-flight checks can look at a sweep of millions of requests in milliseconds."""
    len_rng, gen_rng, *_ = _streams(point)
    return _lengths(point, len_rng, gen_rng)


def _streams(point: WorkloadPoint) -> list[np.random.Generator]:
    """Independent seeded streams: lengths, output lengths, arrivals, prompts, seeds."""
    return [np.random.default_rng(s)
            for s in np.random.SeedSequence(point.seed).spawn(_NUM_STREAMS)]


def _lengths(point: WorkloadPoint, len_rng: np.random.Generator,
             gen_rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = point.num_prompts
    prompt_lens = draw_lengths(len_rng, point.prompt_len, point.prompt_len_dist,
                               point.len_spread, n)
    prompt_lens = np.maximum(prompt_lens, point.shared_prefix_len)
    gen_lens = draw_lengths(gen_rng, point.gen_len, point.gen_len_dist, point.len_spread, n)
    return prompt_lens, gen_lens


def draw_lengths(rng: np.random.Generator, mean: int, dist: str, spread: float,
                 n: int) -> np.ndarray:
    """`n` lengths around `mean` (fixed | uniform | normal | lognormal), rounded, >= 1.

    `spread` s is relative: uniform in [L(1-s), L(1+s)], normal with sigma s*L,
    lognormal with sigma s in log space and mean L.
    """
    if dist == "fixed":
        values = np.full(n, float(mean))
    elif dist == "uniform":
        values = rng.uniform(mean * (1 - spread), mean * (1 + spread), size=n)
    elif dist == "normal":
        values = rng.normal(mean, spread * mean, size=n)
    elif dist == "lognormal":
        values = rng.lognormal(math.log(mean) - spread**2 / 2, spread, size=n)
    else:
        raise ConfigError(f"workload length distribution: unknown value {dist!r}; "
                          "allowed: fixed, uniform, normal, lognormal")
    return np.maximum(np.rint(values).astype(np.int64), 1)


def arrival_times(rng: np.random.Generator, kind: str, rate: float | None,
                  n: int) -> np.ndarray:
    """Seconds from the start: all 0 (static, offline) or a Poisson process (first at 0)."""
    if kind != "poisson":
        return np.zeros(n)
    if rate is None or rate <= 0:
        raise ConfigError(f"workload.rate: required for kind 'poisson' (got {rate})")
    gaps = rng.exponential(1.0 / rate, size=n)  # mean gap 1/rate seconds
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])[:n]


# ------------------------------------------------------------------ random prompts
def _random_ids(rng: np.random.Generator, count: int, vocab_size: int,
                avoid: int | None) -> list[int]:
    low = min(10, vocab_size - 1)
    if avoid is not None and low <= avoid < vocab_size and vocab_size - low > 1:
        ids = rng.integers(low, vocab_size - 1, size=count)
        ids = ids + (ids >= avoid)  # skip over the avoided id
    else:
        ids = rng.integers(low, vocab_size, size=count)
    return [int(x) for x in ids]


def _random_prompts(rng: np.random.Generator, lengths: list[int], prefix_len: int,
                    vocab_size: int, eos: int | None) -> list[list[int]]:
    prefix = _random_ids(rng, prefix_len, vocab_size, eos)
    return [prefix + _random_ids(rng, length - prefix_len, vocab_size, eos) for length in lengths]


# ------------------------------------------------------------------ text prompts
@lru_cache(maxsize=1)
def prose() -> str:
    """The shipped public-domain text, without its header paragraph (which names the sources)."""
    text = resources.files("infbench").joinpath("data/prose.txt").read_text(encoding="utf-8")
    return text.split("\n\n", 1)[1].strip()


def _encode(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    return [int(t) for t in getattr(ids, "ids", ids)]  # tokenizers.Encoding has .ids


def _text_prompts(rng: np.random.Generator, lengths: list[int], point: WorkloadPoint,
                  tokenizer: Any, vocab_size: int, eos: int | None) -> list[list[int]]:
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        raise UserError("workload.prompt_source: 'text' needs the model's tokenizer and this "
                        "model has none; allowed for it: random")
    if point.chat:
        return _chat_prompts(rng, lengths, point.shared_prefix_len, tokenizer)
    ids = _encode(tokenizer, prose())
    bos = getattr(tokenizer, "bos_token_id", None)
    # Keep the tokenizer's own habit: if it prepends BOS, every prompt starts with BOS.
    head = [bos] if bos is not None and ids[:1] == [bos] else []
    corpus = np.asarray([t for t in ids if t not in (bos, eos)], dtype=np.int64)
    if corpus.size == 0:
        raise UserError("workload.prompt_source: the tokenizer encodes the text to nothing")
    if int(corpus.max()) >= vocab_size:
        raise UserError(f"workload.prompt_source: the tokenizer produces id {int(corpus.max())}, "
                        f"outside the model vocabulary (0..{vocab_size - 1})")

    def window(count: int) -> list[int]:
        start = int(rng.integers(0, corpus.size))
        return [int(t) for t in corpus[(start + np.arange(count)) % corpus.size]]

    fixed = head
    if point.shared_prefix_len > len(head):
        fixed = head + window(point.shared_prefix_len - len(head))
    return [fixed + window(max(length - len(fixed), 0)) for length in lengths]


def _chat_prompts(rng: np.random.Generator, lengths: list[int], prefix_len: int,
                  tokenizer: Any) -> list[list[int]]:
    """User turns cut from the text, wrapped in the chat template.

    Text is cut at word boundaries, so a prompt has the most words whose rendered chat
    fits `prompt_len` tokens (at most one word short of it).  A shared prefix becomes a
    system message of about `shared_prefix_len` tokens of text.
    """
    apply = getattr(tokenizer, "apply_chat_template", None)
    if apply is None:
        raise UserError("workload.chat: this model's tokenizer has no chat template; "
                        "set workload.chat: false")
    words = prose().split()

    def take(count: int, start: int) -> str:
        return " ".join(words[(start + k) % len(words)] for k in range(count))

    def render(messages: list[dict[str, str]]) -> list[int]:
        out = apply(messages)
        ids = _encode(tokenizer, out) if isinstance(out, str) else [int(t) for t in out]
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is not None and ids[:2] == [bos, bos]:  # template and encode both added BOS
            ids = ids[1:]
        return ids

    system: list[dict[str, str]] = []
    if prefix_len > 0:
        start = int(rng.integers(0, len(words)))
        count = _largest(lambda k: len(_encode(tokenizer, take(k, start))) <= prefix_len,
                         prefix_len)
        system = [{"role": "system", "content": take(count, start)}]
    prompts = []
    for length in lengths:
        start = int(rng.integers(0, len(words)))

        def fits(k: int, start: int = start, length: int = length) -> bool:
            return len(render(system + [{"role": "user", "content": take(k, start)}])) <= length

        if not fits(0):
            empty = len(render(system + [{"role": "user", "content": ""}]))
            raise UserError(f"workload.prompt_len: {length} tokens cannot hold the chat "
                            f"template, which alone takes {empty}; raise prompt_len or set "
                            "workload.chat: false")
        count = _largest(fits, length)
        prompts.append(render(system + [{"role": "user", "content": take(count, start)}]))
    return prompts


def _largest(fits: Any, upper: int) -> int:
    """Largest k in [0, upper] with fits(k), for a monotone predicate with fits(0) true."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
