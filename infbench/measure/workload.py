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
raised to P when shorter, so every prompt contains the whole prefix.  `workload.prefix`
groups (measure/prefix.py) generalize it: each request carries its group's prefix, at the
start of a generated prompt or a trace row, prepended to a text dataset's prompt, and
`draw_workload` returns the groups' summary (the intended hit rate) with the requests.

Arrivals: all at t=0 (static, offline, or a rate of inf), a gamma process of shape
`burstiness` and mean gap 1/rate (poisson; shape 1 is the Poisson process, drawn as
exponential gaps exactly as before burstiness existed), or a trace's timestamps (trace).

With `workload.dataset` the prompts come from a file (measure/datasets.py): text prompts
are encoded with the model's tokenizer, a ShareGPT reference reply gives the output length
(its token count), a trace gives lengths and arrivals.  Text entries whose prompt plus
output exceed the model's context are skipped before sampling, as vLLM's ShareGPT
sampler skips over-long conversations, with a note counting them (or, with
`workload.dataset.over_context: refuse`, the first is an error); a trace replay longer
than `workload.max_duration_s` is refused before the run.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from infbench.core.errors import ConfigError, UserError
from infbench.engine.request import Request, SamplingParams
from infbench.measure import datasets
from infbench.measure import prefix as prefix_mod
from infbench.scenario.workload import WorkloadPoint

_NUM_STREAMS = 5  # prompt lengths, output lengths, arrivals, prompt tokens, sampling seeds


@dataclass(frozen=True)
class DrawnWorkload:
    """A point's requests and its prefix groups (the result's `prefix` section, or None)."""

    requests: list[Request]
    prefix: dict[str, Any] | None


def generate_requests(point: WorkloadPoint, vocab_size: int, tokenizer: Any = None,
                      eos_token_id: int | None = None,
                      max_model_len: int | None = None) -> list[Request]:
    """The requests of one workload point, identical for the same point and seed.

    `max_model_len` (the model's context) filters dataset text prompts that cannot fit.
    """
    return draw_workload(point, vocab_size, tokenizer, eos_token_id, max_model_len).requests


def draw_workload(point: WorkloadPoint, vocab_size: int, tokenizer: Any = None,
                  eos_token_id: int | None = None,
                  max_model_len: int | None = None) -> DrawnWorkload:
    """`generate_requests`' requests with the summary of their prefix groups
    (measure/prefix.py: the groups and the hit rate they mean)."""
    if vocab_size <= 0:
        raise ConfigError(f"vocab_size must be > 0, got {vocab_size}")
    len_rng, gen_rng, arrival_rng, prompt_rng, seed_rng = _streams(point)
    n = point.num_prompts
    if point.dataset is not None:
        prompts, lens, entries, groups = _dataset_prompts(
            point, len_rng, prompt_rng, vocab_size, tokenizer, eos_token_id, max_model_len)
        gen_lens = np.asarray(lens, dtype=np.int64)
        arrivals = (trace_arrivals(point, entries) if point.kind == "trace" else
                    arrival_times(arrival_rng, point.kind, point.rate, n, point.burstiness))
        prompts, summary = _place_prefix(point, groups, prompts, vocab_size, tokenizer,
                                         eos_token_id)
        prefix_mod.check_context(groups, prompts, gen_lens, max_model_len, point.dataset.path)
        return DrawnWorkload(_build(point, prompts, gen_lens, arrivals, seed_rng,
                                    eos_token_id), summary)
    prompt_lens, gen_lens = _lengths(point, len_rng, gen_rng)
    groups = prefix_mod.plan(point, prompt_lens, draw_lengths)
    if groups is not None:  # a prompt shorter than its group's prefix is raised to it
        prompt_lens = groups.prompt_lengths(prompt_lens)
    arrivals = arrival_times(arrival_rng, point.kind, point.rate, n, point.burstiness)
    if point.prompt_source == "text":
        prompts = _text_prompts(prompt_rng, [int(x) for x in prompt_lens], point, tokenizer,
                                vocab_size, eos_token_id)
    else:
        prompts = _random_prompts(prompt_rng, [int(x) for x in prompt_lens],
                                  point.shared_prefix_len, vocab_size, eos_token_id)
    prompts, summary = _place_prefix(point, groups, prompts, vocab_size, tokenizer, eos_token_id)
    return DrawnWorkload(_build(point, prompts, gen_lens, arrivals, seed_rng, eos_token_id),
                         summary)


def _place_prefix(point: WorkloadPoint, groups: prefix_mod.PrefixPlan | None,
                  prompts: list[list[int]], vocab_size: int, tokenizer: Any,
                  eos: int | None) -> tuple[list[list[int]], dict[str, Any] | None]:
    """The prompts with their group's prefix in place, and the groups' summary (without
    workload.prefix: shared_prefix_len's one group, already in the prompts, or None)."""
    if groups is None:
        return prompts, prefix_mod.summary(prefix_mod.one_group(point), prompts)
    is_text = point.prompt_source == "text" or groups.is_prepended
    bos = getattr(tokenizer, "bos_token_id", None) if is_text else None
    if is_text:  # windows of the shipped text, as the tokenizer encodes it
        corpus = _corpus(tokenizer, vocab_size, eos, "workload.prefix")[1]
        prefixes = prefix_mod.prefix_tokens(point, groups,
                                            lambda rng, k: _window(rng, corpus, k))
    else:
        prefixes = prefix_mod.prefix_tokens(point, groups,
                                            lambda rng, k: _random_ids(rng, k, vocab_size, eos))
    placed = prefix_mod.place(groups, prompts, prefixes, bos)
    return placed, prefix_mod.summary(groups, placed, bos)


def client_concurrency(workload: WorkloadPoint) -> int | None:
    """The client-side cap on outstanding requests: workload.max_concurrency, or for kind
    static batch_size (num_requests run batch_size at a time); None: no cap."""
    if workload.kind == "static":
        return workload.batch_size if workload.num_prompts > workload.batch_size else None
    return workload.max_concurrency


def _build(point: WorkloadPoint, prompts: list[list[int]], gen_lens: np.ndarray,
           arrivals: np.ndarray, seed_rng: np.random.Generator,
           eos_token_id: int | None) -> list[Request]:
    n = point.num_prompts
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
    if point.dataset is not None:  # text prompts: whitespace words, a token estimate
        entries = _sampled_entries(point, len_rng, None)
        if point.kind == "trace":  # refused here, before any model is loaded
            trace_arrivals(point, entries)
        prompts = [e.prompt_len if e.prompt is None else datasets.word_count(e.prompt)
                   for e in entries]
        outs = [e.output_len if e.output_len is not None else
                datasets.word_count(e.reference) if e.reference is not None else point.gen_len
                for e in entries]
        return (_with_prefix(point, np.asarray(prompts, dtype=np.int64)),
                np.asarray(outs, dtype=np.int64))
    prompt_lens, gen_lens = _lengths(point, len_rng, gen_rng)
    return _with_prefix(point, prompt_lens), gen_lens


def _with_prefix(point: WorkloadPoint, prompt_lens: np.ndarray) -> np.ndarray:
    """Prompt lengths with their prefix group's prefix (unchanged without workload.prefix)."""
    groups = prefix_mod.plan(point, prompt_lens, draw_lengths)
    return prompt_lens if groups is None else groups.prompt_lengths(prompt_lens)


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
                  n: int, burstiness: float = 1.0) -> np.ndarray:
    """Seconds from the start: all 0 (static, offline, rate inf) or, for poisson, gaps
    drawn from a gamma distribution of shape `burstiness` and mean 1/rate (first at 0).

    vLLM's definition: the coefficient of variation of the gaps is 1/sqrt(burstiness), so
    1.0 is a Poisson process, below 1 burstier, above 1 more regular.
    """
    if kind != "poisson":
        return np.zeros(n)
    if rate is None or not rate > 0:
        raise ConfigError(f"workload.rate: required for kind 'poisson' (got {rate})")
    if not burstiness > 0 or not math.isfinite(burstiness):
        raise ConfigError(f"workload.burstiness: must be a finite number > 0 (got {burstiness})")
    if math.isinf(rate):
        return np.zeros(n)
    if burstiness == 1.0:  # the same stream as before burstiness existed: same arrivals
        gaps = rng.exponential(1.0 / rate, size=n)  # mean gap 1/rate seconds
    else:
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)  # mean shape*scale
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])[:n]


def arrivals_before(point: WorkloadPoint, duration_s: float, limit: int) -> int:
    """How many of a poisson point's arrivals come before `duration_s` (at most `limit`):
    the first arrivals `generate_requests` draws from the same seeded stream, whatever its
    count (numpy draws a longer array as the shorter one plus more), so a point with
    num_requests set to this count arrives exactly as the time-based run asks."""
    count = max(1, min(limit, math.ceil((point.rate or 0) * duration_s * 1.2) + 16))
    while True:
        arrival_rng = _streams(point)[2]
        arrivals = arrival_times(arrival_rng, point.kind, point.rate, count, point.burstiness)
        before = int(np.searchsorted(arrivals, duration_s, side="left"))
        if before < count or count >= limit:
            return min(before, limit)
        count = min(limit, count * 2)


def trace_arrivals(point: WorkloadPoint, entries: list[datasets.DatasetEntry]) -> np.ndarray:
    """A trace's arrivals, gaps scaled; a replay longer than workload.max_duration_s (or one
    whose scaled gaps overflow) is a one-line error, as a poisson rate too low is at load."""
    assert point.dataset is not None
    with np.errstate(over="ignore", invalid="ignore"):
        arrivals = datasets.trace_arrivals(entries, point.dataset.time_scale)
    span = float(arrivals[-1]) if arrivals.size else 0.0
    if not math.isfinite(span) or span > point.max_duration_s:
        raise UserError(f"workload.dataset: {point.dataset.path}: the {len(entries)} rows drawn "
                        f"span {span:.6g} s at time_scale {point.dataset.time_scale:g}, beyond "
                        f"workload.max_duration_s {point.max_duration_s:g}; allowed: raise "
                        "max_duration_s (a run that long is meant) or lower time_scale")
    return arrivals


# ------------------------------------------------------------------ dataset prompts
def _sampled_entries(point: WorkloadPoint, rng: np.random.Generator, fits: Any,
                     max_model_len: int | None = None) -> list[datasets.DatasetEntry]:
    """The point's num_requests entries of its dataset, seeded (`fits` filters first, by
    workload.dataset.over_context: drop with a note, or refuse)."""
    assert point.dataset is not None
    entries = datasets.load_dataset(point.dataset.kind, point.dataset.path)
    if fits is not None:
        context = f"{max_model_len} tokens" if max_model_len else "the model's"
        usable, dropped = datasets.fit_entries(entries, fits,
                                               point.dataset.over_context == "refuse",
                                               point.dataset.path, context)
        if dropped:
            print(f"note: workload.dataset {point.dataset.path}: dropped {dropped} of "
                  f"{len(entries)} entries longer than the model context ({context}, prompt + "
                  "output); workload.dataset.over_context: refuse makes them an error",
                  file=sys.stderr)
        entries = usable
    indices = datasets.sample_indices(len(entries), point.num_prompts, rng,
                                      contiguous=point.dataset.kind == "trace")
    return [entries[int(i)] for i in indices]


def _dataset_prompts(point: WorkloadPoint, pick_rng: np.random.Generator,
                     prompt_rng: np.random.Generator, vocab_size: int, tokenizer: Any,
                     eos: int | None, max_model_len: int | None
                     ) -> tuple[list[list[int]], list[int], list[datasets.DatasetEntry],
                                prefix_mod.PrefixPlan | None]:
    """(prompt ids, output lengths, entries, prefix groups) of the sampled entries.  Text
    entries that do not fit the context are skipped before sampling; trace rows never are
    (that would change the trace's timing), so an over-long row is the engine's one-line
    error.  A text prompt's prefix is placed later (_place_prefix); a trace row's length
    is raised to its group's prefix here, as a generated prompt's is."""
    assert point.dataset is not None
    cfg = point.dataset
    if cfg.kind != "trace" and (tokenizer is None or not hasattr(tokenizer, "encode")):
        raise UserError(f"workload.dataset: {cfg.kind} prompts are text and need the model's "
                        f"tokenizer, and this model has none ({cfg.path}); allowed without "
                        "one: kind trace")
    encoded: dict[str, list[int]] = {}

    def ids(text: str) -> list[int]:
        if text not in encoded:
            encoded[text] = _encode(tokenizer, text)
        return encoded[text]

    def output_len(entry: datasets.DatasetEntry) -> int:
        if entry.output_len is not None:
            return entry.output_len
        if entry.reference is not None:
            return max(len(ids(entry.reference)), 1)
        return point.gen_len

    def fits(entry: datasets.DatasetEntry) -> bool:
        size = len(ids(entry.prompt)) if entry.prompt is not None else entry.prompt_len or 0
        return size >= 1 and (max_model_len is None or size + output_len(entry) <= max_model_len)

    entries = _sampled_entries(point, pick_rng, None if cfg.kind == "trace" else fits,
                               max_model_len)
    outs = [output_len(e) for e in entries]
    if cfg.kind != "trace":
        prompts = [ids(e.prompt or "") for e in entries]
        top = max(max(p) for p in prompts)
        if top >= vocab_size:
            raise UserError(f"workload.dataset: the tokenizer produces id {top}, outside the "
                            f"model vocabulary (0..{vocab_size - 1})")
        bos = getattr(tokenizer, "bos_token_id", None)
        head = int(bos is not None and all(p[:1] == [bos] for p in prompts))
        groups = prefix_mod.plan(point, np.asarray([len(p) for p in prompts]), draw_lengths,
                                 head)
        return prompts, outs, entries, groups
    lengths = [int(e.prompt_len or 1) for e in entries]
    groups = prefix_mod.plan(point, np.asarray(lengths, dtype=np.int64), draw_lengths)
    if groups is not None:
        lengths = [int(x) for x in groups.prompt_lengths(np.asarray(lengths))]
    if point.prompt_source == "text":
        return (_text_prompts(prompt_rng, lengths, point, tokenizer, vocab_size, eos), outs,
                entries, groups)
    return _random_prompts(prompt_rng, lengths, 0, vocab_size, eos), outs, entries, groups


# ------------------------------------------------------------------ random prompts
def _random_ids(rng: np.random.Generator, count: int, vocab_size: int,
                avoid: int | None) -> list[int]:
    low = min(10, vocab_size - 1)
    if avoid is not None and low <= avoid < vocab_size and vocab_size - low > 1:
        ids = rng.integers(low, vocab_size - 1, size=count)
        ids = ids + (ids >= avoid)  # skip over the avoided id
    else:
        ids = rng.integers(low, vocab_size, size=count)
    values: list[int] = ids.tolist()  # Python ints, converted at C speed
    return values


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


def _corpus(tokenizer: Any, vocab_size: int, eos: int | None,
            key: str) -> tuple[list[int], np.ndarray]:
    """(the BOS head every prompt keeps, the text's token ids without BOS and EOS)."""
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        raise UserError(f"{key}: text prompts need the model's tokenizer and this model has "
                        "none; allowed for it: random")
    ids = _encode(tokenizer, prose())
    bos = getattr(tokenizer, "bos_token_id", None)
    # Keep the tokenizer's own habit: if it prepends BOS, every prompt starts with BOS.
    head = [bos] if bos is not None and ids[:1] == [bos] else []
    corpus = np.asarray([t for t in ids if t not in (bos, eos)], dtype=np.int64)
    if corpus.size == 0:
        raise UserError(f"{key}: the tokenizer encodes the text to nothing")
    if int(corpus.max()) >= vocab_size:
        raise UserError(f"{key}: the tokenizer produces id {int(corpus.max())}, "
                        f"outside the model vocabulary (0..{vocab_size - 1})")
    return head, corpus


def _window(rng: np.random.Generator, corpus: np.ndarray, count: int) -> list[int]:
    """`count` tokens of the text from a seeded offset (cycled past its end)."""
    start = int(rng.integers(0, corpus.size))
    return [int(t) for t in corpus[(start + np.arange(count)) % corpus.size]]


def _text_prompts(rng: np.random.Generator, lengths: list[int], point: WorkloadPoint,
                  tokenizer: Any, vocab_size: int, eos: int | None) -> list[list[int]]:
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        raise UserError("workload.prompt_source: 'text' needs the model's tokenizer and this "
                        "model has none; allowed for it: random")
    if point.chat:
        return _chat_prompts(rng, lengths, point.shared_prefix_len, tokenizer)
    head, corpus = _corpus(tokenizer, vocab_size, eos, "workload.prompt_source")

    def window(count: int) -> list[int]:
        return _window(rng, corpus, count)

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
