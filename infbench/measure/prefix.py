"""Prefix groups, seeded: which request belongs to which group, each group's prefix length
and tokens, where the prefix goes in a prompt, and the hit rate the drawn requests mean.

`workload.prefix` (scenario/prefix.py) asks for `num_groups` groups.  The requests per group
are the shares rounded (largest remainder), and their order is one seeded permutation, so
groups interleave as independent users would.  Every random choice here comes from streams
of their own, `SeedSequence(seed, spawn_key=(PREFIX_STREAM,))`, so adding a prefix block
changes no prompt length, output length, arrival or body token the workload draws without
one, and the same seed always gives the same groups.

Where the prefix goes:

- generated prompts (random ids or text windows) and trace rows: the prefix is the first
  P tokens of the prompt, as `shared_prefix_len` always was; a drawn prompt shorter than
  its group's prefix is raised to it, so `prompt_len` stays the whole prompt's length.
- text datasets (sharegpt, jsonl): the prefix is prepended to the dataset's prompt (after
  the tokenizer's BOS, when it adds one), so the dataset's text is kept whole.

The intended hit rate is that of an ideal cache holding every group's prefix:

    sum over requests that are not their group's first of the prefix tokens they share
    with their group's first request / all prompt tokens

`target_hit_rate` derives the one length every group shares from the drawn lengths: for a
prepended prefix in closed form, P = (h * B - (N - G) * b) / ((N - G) - h * N) with B the
dataset's prompt tokens and b the BOS they start with (0 or 1); for a prefix inside the
prompt by bisection over P (the rate grows with P).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infbench.core.errors import UserError
from infbench.scenario.prefix import group_counts
from infbench.scenario.workload import WorkloadPoint

# spawn_key of the prefix streams ("pref" in ASCII): apart from the workload's own streams.
PREFIX_STREAM = 0x70726566
DrawLengths = Callable[[np.random.Generator, int, str, float, int], np.ndarray]
DrawIds = Callable[[np.random.Generator, int], list[int]]


@dataclass(frozen=True)
class PrefixPlan:
    """One point's groups: their prefix lengths and each request's group."""

    lengths: tuple[int, ...]  # tokens of each group's prefix
    group_of: tuple[int, ...]  # each request's group, requests in arrival order
    is_prepended: bool  # text datasets: before the prompt; otherwise its first tokens
    target_hit_rate: float | None = None

    def prompt_lengths(self, body_lens: np.ndarray) -> np.ndarray:
        """The prompts' lengths once their group's prefix is in place."""
        own = np.asarray(self.lengths, dtype=np.int64)[np.asarray(self.group_of, dtype=np.int64)]
        body = np.asarray(body_lens, dtype=np.int64)
        return body + own if self.is_prepended else np.maximum(body, own)

    def counts(self) -> list[int]:
        return [int(c) for c in np.bincount(self.group_of, minlength=len(self.lengths))]



def _streams(seed: int) -> list[np.random.Generator]:
    """Group lengths, the order of the groups' requests, prefix tokens."""
    seq = np.random.SeedSequence(seed, spawn_key=(PREFIX_STREAM,))
    return [np.random.default_rng(s) for s in seq.spawn(3)]


def plan(point: WorkloadPoint, body_lens: np.ndarray, draw_lengths: DrawLengths,
         head_len: int = 0) -> PrefixPlan | None:
    """The point's groups for prompts of `body_lens` tokens (a text dataset's prompts, or
    the drawn prompt lengths), None without `workload.prefix`.  `draw_lengths` is the
    workload's length sampler (measure/workload.py owns it); `head_len`: the BOS every
    text dataset prompt starts with, shared with its group beside a prepended prefix."""
    section = point.prefix
    if section is None:
        return None
    length_rng, order_rng, _ = _streams(point.seed)
    counts = group_counts(section.shares, section.num_groups, point.num_prompts)
    group_of = order_rng.permutation(np.repeat(np.arange(section.num_groups), counts))
    is_prepended = point.dataset is not None and point.dataset.kind != "trace"
    if section.lengths is not None:
        lengths = list(section.lengths)
    elif section.length is not None:
        lengths = [int(x) for x in draw_lengths(length_rng, section.length, section.length_dist,
                                                section.length_spread, section.num_groups)]
        if section.length == 0:
            lengths = [0] * section.num_groups
    else:
        assert section.target_hit_rate is not None  # scenario/prefix.check: one of the three
        lengths = [derive_length(section.target_hit_rate, counts, body_lens, is_prepended,
                                 head_len if is_prepended else 0)]
        lengths *= section.num_groups
    return PrefixPlan(tuple(lengths), tuple(int(g) for g in group_of), is_prepended,
                      section.target_hit_rate)


def derive_length(target: float, counts: Sequence[int], body_lens: np.ndarray,
                  is_prepended: bool, head_len: int = 0) -> int:
    """The one prefix length (tokens) whose ideal hit rate over these prompts is closest to
    `target` (scenario/prefix.check refused targets at or above (N - G) / N); a prepended
    prefix shares `head_len` more tokens (the BOS before it)."""
    body = np.asarray(body_lens, dtype=np.int64)
    n = int(body.size)
    num_hits = n - sum(1 for c in counts if c > 0)  # requests that are not a group's first

    def rate(p: int) -> float:
        if is_prepended:
            return num_hits * (p + head_len) / float(body.sum() + n * p)
        total = float(np.maximum(body, p).sum())
        return num_hits * p / total if total > 0 else 0.0

    if is_prepended:  # target * (B + n P) = hits * (P + head)
        exact = (target * float(body.sum()) - num_hits * head_len) / (num_hits - target * n)
        low = max(int(np.floor(exact)), 0)
    else:  # rate(p) grows with p up to (N - G) / N at the longest prompt: bisect
        lo, hi = 0, int(body.max())
        while lo < hi:
            mid = (lo + hi) // 2
            if rate(mid) < target:
                lo = mid + 1
            else:
                hi = mid
        low = max(lo - 1, 0)
    return min((low, low + 1), key=lambda p: (abs(rate(p) - target), p))


def prefix_tokens(point: WorkloadPoint, prefix_plan: PrefixPlan, draw: DrawIds) -> list[list[int]]:
    """Each group's prefix tokens, from the prefix token stream (`draw(rng, count)` gives
    random ids or a window of the text)."""
    tokens_rng = _streams(point.seed)[2]
    return [draw(tokens_rng, length) for length in prefix_plan.lengths]


def place(prefix_plan: PrefixPlan, prompts: list[list[int]], prefixes: list[list[int]],
          bos: int | None = None) -> list[list[int]]:
    """The prompts with their group's prefix in place: prepended after a leading BOS (text
    datasets), else over the prompt's first tokens after a leading BOS (a generated prompt
    was drawn at its full length, prompt_lengths)."""
    out = []
    for ids, g in zip(prompts, prefix_plan.group_of, strict=True):
        head = ids[:1] if bos is not None and ids[:1] == [bos] else []
        fix = prefixes[g]
        if prefix_plan.is_prepended:
            out.append(head + fix + ids[len(head):])
        else:  # the prefix's length counts the head, as shared_prefix_len's always did
            fix = fix[:max(len(fix) - len(head), 0)] if fix else []
            out.append(head + fix + ids[len(head) + len(fix):])
    return out


def one_group(point: WorkloadPoint) -> PrefixPlan | None:
    """`workload.shared_prefix_len` as the one group it is (for the result's summary), None
    without it or with chat prompts (their shared system message is about P tokens)."""
    if point.shared_prefix_len <= 0 or point.chat:
        return None
    return PrefixPlan((point.shared_prefix_len,), (0,) * point.num_prompts, False)


def summary(prefix_plan: PrefixPlan | None, prompts: Sequence[Sequence[int]],
            bos: int | None = None) -> dict[str, Any] | None:
    """The result's `prefix` section (results/schema.py PrefixSharing) without the measured
    rate: the groups and the intended hit rate of these drawn prompts, None without groups.

    A request's hit is the tokens it shares with its group's first request, at most its
    group's prefix span (the prefix, plus the BOS `place` kept before a prepended one), so
    it is exactly what a cache holding every group would serve; a group's first request
    serves nothing."""
    if prefix_plan is None:
        return None
    first_of: dict[int, int] = {}
    hits = 0
    for i, (ids, g) in enumerate(zip(prompts, prefix_plan.group_of, strict=True)):
        if g not in first_of:
            first_of[g] = i
            continue
        span = prefix_plan.lengths[g]
        if prefix_plan.is_prepended and span and bos is not None and ids[:1] == [bos]:
            span += 1
        hits += _common(ids, prompts[first_of[g]], span)
    total = sum(len(p) for p in prompts)
    return {
        "num_groups": len(prefix_plan.lengths),
        "lengths": list(prefix_plan.lengths),
        "num_requests": prefix_plan.counts(),
        "target_hit_rate": prefix_plan.target_hit_rate,
        "num_hit_tokens": hits,
        "num_prompt_tokens": total,
        "intended_hit_rate": hits / total if total else None,
    }


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common leading tokens of a and b, at most `limit`."""
    n = 0
    for x, y in zip(a[:limit], b[:limit], strict=False):
        if x != y:
            break
        n += 1
    return n


def check_context(prefix_plan: PrefixPlan | None, prompts: list[list[int]], gen_lens: Any,
                  max_model_len: int | None, where: str) -> None:
    """A derived (or long) prefix that pushes a prompt past the model's context: one line."""
    if prefix_plan is None or max_model_len is None:
        return
    for i, ids in enumerate(prompts):
        if len(ids) + int(gen_lens[i]) > max_model_len:
            g = prefix_plan.group_of[i]
            raise UserError(f"workload.prefix: {where}: request {i} in group {g} (prefix "
                            f"{prefix_plan.lengths[g]} tokens) has {len(ids)} prompt + "
                            f"{int(gen_lens[i])} output tokens, beyond the model context "
                            f"{max_model_len}; allowed: shorter prefixes or a lower "
                            "target_hit_rate")
