"""The scenario's `workload.prefix:` block: prefix groups, each a shared "system prompt".

A workload with prefix sharing has `num_groups` groups; every request belongs to one, and
its prompt starts with its group's prefix tokens.  The groups' prefix lengths are one
`length` for all (drawn per group around it with `length_dist`), one per group
(`lengths`), or derived from a `target_hit_rate`; `shares` weighs how many requests each
group gets (equal by default).  measure/prefix.py draws the groups (seeded) and
measure/workload.py places the prefixes in the prompts.

The hit rate meant here is that of an ideal prefix cache holding every group:

    hit rate = prefix tokens of every request that is not its group's first (in arrival
               order) / all prompt tokens

so the first request of each group always misses, and a workload of N requests in G groups
can reach at most (N - G) / N.  `target_hit_rate` picks the one prefix length that brings the
drawn requests closest to it; the result records the hit rate of the requests actually drawn
beside the one the engine (or the server) measured (docs/prefix.md).

`workload.shared_prefix_len: P` stays what it was, one group of length P; giving both is
refused.  Checks between these keys and the rest of the workload run in `check`, called
from `WorkloadPoint.__post_init__` once per point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field

from infbench.core.errors import ConfigError
from infbench.scenario.values import NonNegInt, PosFloat, Section

PrefixLengthDist = Literal["fixed", "uniform", "normal", "lognormal"]
MAX_GROUPS = 4096  # more groups than this are a typo, not a workload


class PrefixSection(Section):
    """workload.prefix: groups of requests that share a prompt prefix (measure/prefix.py)."""

    num_groups: Annotated[int, Field(gt=0, le=MAX_GROUPS, strict=True)] = 1
    """How many prefix groups (distinct shared prefixes)."""
    length: NonNegInt | None = None
    """Tokens of every group's prefix (with length_dist: their mean)."""
    # tuples, so that a point holding the section stays hashable (frozen all the way)
    lengths: Annotated[tuple[NonNegInt, ...], Field(min_length=1)] | None = None
    """Tokens of each group's prefix, one per group (instead of length)."""
    length_dist: PrefixLengthDist = "fixed"
    """With length: each group's length drawn around it (fixed | uniform | normal |
    lognormal, seeded, the workload's length distributions)."""
    length_spread: Annotated[float, Field(ge=0, le=100, strict=True,
                                          allow_inf_nan=False)] = 0.5
    """Relative spread of length_dist (uniform: L*(1-s)..L*(1+s))."""
    shares: Annotated[tuple[PosFloat, ...], Field(min_length=1)] | None = None
    """Weights of the groups' shares of the requests, one per group (default equal);
    the counts are the shares rounded (largest remainder), in a seeded order."""
    target_hit_rate: Annotated[float, Field(gt=0, lt=1, strict=True,
                                            allow_inf_nan=False)] | None = None
    """Derive the one prefix length of every group from the drawn prompt lengths so that
    an ideal prefix cache would serve this fraction of all prompt tokens (instead of
    length or lengths)."""


def group_counts(shares: Sequence[float] | None, num_groups: int,
                 num_requests: int) -> list[int]:
    """Requests per group: the shares (equal when None) of `num_requests`, rounded by largest
    remainder (ties to the lower group index), so the counts always add up."""
    weights = shares if shares is not None else [1.0] * num_groups
    total = sum(weights)
    exact = [num_requests * w / total for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(num_groups), key=lambda g: (-(exact[g] - counts[g]), g))
    for g in order[:num_requests - sum(counts)]:
        counts[g] += 1
    return counts


def max_hit_rate(counts: list[int]) -> float:
    """The highest hit rate any prefix length reaches: (N - non-empty groups) / N."""
    n = sum(counts)
    return (n - sum(1 for c in counts if c > 0)) / n if n else 0.0


def check(prefix: PrefixSection | None, *, shared_prefix_len: int, chat: bool,
          num_prompts: int, prompt_len: int, dataset_kind: str | None) -> None:
    """The prefix block's checks against itself and the rest of its workload point (the
    point's keys are passed: scenario/workload.py imports this module)."""
    if prefix is None:
        return
    where = "workload.prefix"
    if shared_prefix_len:
        raise ConfigError(f"{where}: workload.shared_prefix_len is one prefix group of its "
                          "own; give either shared_prefix_len or workload.prefix, not both")
    given = [k for k in ("length", "lengths", "target_hit_rate")
             if getattr(prefix, k) is not None]
    if len(given) != 1:
        raise ConfigError(f"{where}: give exactly one of length, lengths, target_hit_rate "
                          f"(got {', '.join(given) or 'none'})")
    for key in ("lengths", "shares"):
        values = getattr(prefix, key)
        if values is not None and len(values) != prefix.num_groups:
            raise ConfigError(f"{where}.{key}: one value per group: {prefix.num_groups} "
                              f"(num_groups) values (got {len(values)})")
    if prefix.length_dist != "fixed" and prefix.length is None:
        raise ConfigError(f"{where}.length_dist: draws the groups' lengths around length; "
                          "allowed with length only (lengths and target_hit_rate fix them)")
    if chat:
        raise ConfigError(f"{where}: chat prompts share one system message: use "
                          "workload.shared_prefix_len with workload.chat; prefix groups take "
                          "random or text prompts or a dataset")
    counts = group_counts(prefix.shares, prefix.num_groups, num_prompts)
    best = max_hit_rate(counts)
    if prefix.target_hit_rate is not None and prefix.target_hit_rate >= best:
        raise ConfigError(
            f"{where}.target_hit_rate: {num_prompts} requests in "
            f"{sum(1 for c in counts if c > 0)} non-empty group(s) reach at most {best:.4g} "
            f"(the first request of each group misses); allowed: below {best:.4g}, or more "
            f"requests (got {prefix.target_hit_rate})")
    prepended = dataset_kind is not None and dataset_kind != "trace"
    if not prepended:  # the prefix is part of prompt_len, as shared_prefix_len is
        fixed = prefix.lengths or ([prefix.length] if prefix.length_dist == "fixed"
                                   and prefix.length is not None else [])
        if fixed and max(fixed) > prompt_len:
            raise ConfigError(f"{where}.{'lengths' if prefix.lengths else 'length'}: a prefix "
                              f"is part of the prompt: at most workload.prompt_len "
                              f"({prompt_len}) (got {max(fixed)})")

