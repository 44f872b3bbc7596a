"""workload.prefix: seeded prefix groups (shares, lengths, a target hit rate), with generated
prompts, text datasets and traces; the intended hit rate; the one-line refusals."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from infbench.core.errors import UserError
from infbench.measure.workload import draw_workload, generate_requests, request_lengths
from infbench.scenario.prefix import PrefixSection, group_counts
from infbench.scenario.schema import scenario_from_document
from infbench.scenario.workload import DatasetSection, WorkloadPoint

JSONL = DatasetSection(kind="jsonl", path="infbench:samples/prompts_small.jsonl")
TRACE = DatasetSection(kind="trace", path="infbench:samples/azure_trace_small.csv")


class BosWords:
    """One id per distinct word (ids from 10), BOS 1 before every text."""

    bos_token_id = 1
    eos_token_id = 2

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [1] + [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]


def point(**kw: Any) -> WorkloadPoint:
    kw.setdefault("kind", "offline")
    return WorkloadPoint(**kw)


def test_shares_round_by_largest_remainder() -> None:
    assert group_counts(None, 3, 10) == [4, 3, 3]
    assert group_counts([2, 1, 1], 3, 10) == [5, 3, 2]  # 5, 2.5, 2.5: the tie to the first
    assert group_counts([1, 1, 100], 3, 10) == [0, 0, 10]
    assert sum(group_counts([0.3, 0.7], 2, 7)) == 7


def test_groups_share_their_prefix_and_the_intended_rate_counts_first_misses() -> None:
    p = point(num_requests=20, prompt_len=64,
              prefix=PrefixSection(num_groups=3, length=32, shares=[2, 1, 1]))
    drawn = draw_workload(p, 1000, eos_token_id=5)
    reqs = drawn.requests
    heads = [r.prompt_ids[:32] for r in reqs]
    assert len(set(heads)) == 3 and sorted(heads.count(h) for h in set(heads)) == [5, 5, 10]
    assert len({r.prompt_ids[32:] for r in reqs}) == 20  # the rest is every prompt's own
    assert all(len(r.prompt_ids) == 64 and 5 not in r.prompt_ids for r in reqs)
    assert drawn.prefix == {"num_groups": 3, "lengths": [32, 32, 32], "num_requests": [10, 5, 5],
                            "target_hit_rate": None, "num_hit_tokens": 17 * 32,
                            "num_prompt_tokens": 20 * 64, "intended_hit_rate": 17 * 32 / 1280}
    # Groups interleave (a seeded order), the same for the same seed, not for another.
    first = [heads.index(h) for h in heads]
    assert first != sorted(first)
    assert draw_workload(p, 1000, eos_token_id=5) == drawn
    other = draw_workload(dataclasses.replace(p, seed=1), 1000, eos_token_id=5).requests
    assert [r.prompt_ids for r in other] != [r.prompt_ids for r in reqs]


def test_a_prefix_block_changes_no_arrival_output_length_or_sampling_seed() -> None:
    base = point(kind="poisson", rate=5.0, num_requests=12, prompt_len=40,
                 prompt_len_dist="uniform", gen_len_dist="normal")
    plain = generate_requests(base, 500)
    grouped = draw_workload(dataclasses.replace(
        base, prefix=PrefixSection(num_groups=2, lengths=[8, 30])), 500)
    heads = {r.prompt_ids[:30] for r in grouped.requests}
    for a, b in zip(plain, grouped.requests, strict=True):
        assert (a.arrival_s, a.sampling) == (b.arrival_s, b.sampling)
        own = 30 if b.prompt_ids[:30] in heads and len(b.prompt_ids) >= 30 else 8
        assert len(b.prompt_ids) in (len(a.prompt_ids), max(len(a.prompt_ids), own))
    assert grouped.prefix is not None and sum(grouped.prefix["num_requests"]) == 12


def test_per_group_lengths_drawn_lengths_and_short_prompts_raised() -> None:
    p = point(num_requests=30, prompt_len=20, prompt_len_dist="uniform", len_spread=0.9,
              prefix=PrefixSection(num_groups=2, lengths=[4, 18]))
    drawn = draw_workload(p, 1000)
    assert drawn.prefix is not None and drawn.prefix["lengths"] == [4, 18]
    long_head = {r.prompt_ids[:18] for r in drawn.requests}
    assert all(len(r.prompt_ids) >= 4 for r in drawn.requests)
    assert sum(1 for r in drawn.requests if len(r.prompt_ids) >= 18) >= 15
    assert len(long_head) < 30  # the 18-token group shares its head
    # The pre-flight checks see the same (raised) lengths without building prompts.
    lens, _ = request_lengths(p)
    assert list(lens) == [len(r.prompt_ids) for r in drawn.requests]
    dist = point(num_requests=8, prompt_len=64, prefix=PrefixSection(
        num_groups=4, length=16, length_dist="uniform", length_spread=0.5))
    lengths = draw_workload(dist, 1000).prefix["lengths"]  # type: ignore[index]
    assert len(set(lengths)) > 1 and all(8 <= n <= 24 for n in lengths)


@pytest.mark.parametrize("target", [0.2, 0.5, 0.8])
def test_a_target_hit_rate_derives_the_prefix_length(target: float) -> None:
    p = point(num_requests=40, prompt_len=50, prompt_len_dist="lognormal",
              prefix=PrefixSection(num_groups=4, target_hit_rate=target))
    summary = draw_workload(p, 1000).prefix
    assert summary is not None and len(set(summary["lengths"])) == 1
    assert summary["intended_hit_rate"] == pytest.approx(target, abs=0.01)
    assert summary["target_hit_rate"] == target


def test_text_dataset_prompts_get_the_prefix_prepended_after_bos() -> None:
    tok = BosWords()
    p = point(num_requests=24, dataset=JSONL, prefix=PrefixSection(num_groups=2, length=12))
    plain = generate_requests(dataclasses.replace(p, prefix=None), 100_000, tokenizer=tok)
    drawn = draw_workload(p, 100_000, tokenizer=tok)
    for a, b in zip(plain, drawn.requests, strict=True):
        assert b.prompt_ids[0] == 1 and b.prompt_ids[13:] == a.prompt_ids[1:]  # kept whole
        assert len(b.prompt_ids) == len(a.prompt_ids) + 12
    assert len({r.prompt_ids[:13] for r in drawn.requests}) == 2
    s = drawn.prefix
    assert s is not None and s["num_hit_tokens"] == 22 * 13  # the BOS is shared too
    assert s["num_prompt_tokens"] == sum(len(r.prompt_ids) for r in drawn.requests)
    target = dataclasses.replace(p, prefix=PrefixSection(num_groups=2, target_hit_rate=0.6))
    assert draw_workload(target, 100_000, tokenizer=tok).prefix["intended_hit_rate"] == \
        pytest.approx(0.6, abs=0.01)  # type: ignore[index]
    with pytest.raises(UserError, match=r"^workload.prefix: .*beyond the model context 30; "):
        draw_workload(p, 100_000, tokenizer=tok, max_model_len=30)


def test_trace_rows_keep_their_length_and_text_prompts_take_text_prefixes() -> None:
    p = point(kind="trace", num_requests=10, dataset=TRACE,
              prefix=PrefixSection(num_groups=1, length=40))
    plain = generate_requests(dataclasses.replace(p, prefix=None), 1000)
    reqs = generate_requests(p, 1000)
    assert [len(r.prompt_ids) for r in reqs] == [max(len(r.prompt_ids), 40) for r in plain]
    assert len({r.prompt_ids[:40] for r in reqs}) == 1
    text = point(num_requests=6, prompt_len=30, prompt_source="text",
                 prefix=PrefixSection(num_groups=2, length=10))
    tok = BosWords()
    drawn = draw_workload(text, 100_000, tokenizer=tok)
    assert all(r.prompt_ids[0] == 1 and len(r.prompt_ids) == 30 for r in drawn.requests)
    assert len({r.prompt_ids[:10] for r in drawn.requests}) == 2
    assert drawn.prefix is not None and drawn.prefix["num_hit_tokens"] == 4 * 10


def test_shared_prefix_len_is_recorded_as_one_group() -> None:
    drawn = draw_workload(point(num_requests=5, prompt_len=20, shared_prefix_len=8), 1000)
    assert drawn.prefix is not None
    assert (drawn.prefix["num_groups"], drawn.prefix["lengths"]) == (1, [8])
    assert drawn.prefix["intended_hit_rate"] == pytest.approx(4 * 8 / 100)
    assert draw_workload(point(num_requests=5), 1000).prefix is None


@pytest.mark.parametrize(("prefix", "extra", "message"), [
    ({"num_groups": 2, "length": 4}, {"shared_prefix_len": 4},
     "workload.prefix: workload.shared_prefix_len is one prefix group of its own; give either"),
    ({"num_groups": 2}, {}, "workload.prefix: give exactly one of length, lengths, "
                            "target_hit_rate (got none)"),
    ({"length": 4, "target_hit_rate": 0.5}, {}, "(got length, target_hit_rate)"),
    ({"num_groups": 3, "lengths": [1, 2]}, {},
     "workload.prefix.lengths: one value per group: 3 (num_groups) values (got 2)"),
    ({"num_groups": 2, "length": 4, "shares": [1]}, {}, "workload.prefix.shares: one value"),
    ({"num_groups": 4, "target_hit_rate": 0.7}, {"num_requests": 10},
     "workload.prefix.target_hit_rate: 10 requests in 4 non-empty group(s) reach at most 0.6 "
     "(the first request of each group misses); allowed: below 0.6"),
    ({"length": 200}, {"prompt_len": 128}, "workload.prefix.length: a prefix is part of the "
                                           "prompt: at most workload.prompt_len (128) (got 200)"),
    ({"lengths": [4], "length_dist": "uniform"}, {}, "workload.prefix.length_dist: draws"),
    ({"length": 4}, {"prompt_source": "text", "chat": True}, "workload.prefix: chat prompts"),
    ({"length": 4, "shares": [0]}, {}, "workload.prefix.shares[0]: must be > 0 (got 0)"),
    ({"target_hit_rate": 1.0}, {}, "workload.prefix.target_hit_rate: must be < 1 (got 1.0)"),
    ({"length": 4, "groups": 2}, {}, "workload.prefix.groups: unknown key"),
])
def test_bad_prefix_blocks_are_one_line_errors(prefix: dict[str, Any], extra: dict[str, Any],
                                                message: str) -> None:
    doc = {"name": "x", "model": {"preset": "tiny"},
           "workload": {"kind": "offline", "num_requests": 8, **extra, "prefix": prefix}}
    with pytest.raises(UserError) as info:
        scenario_from_document(doc, "s.yaml").points()
    text = str(info.value)
    assert text.startswith("s.yaml: ") and "\n" not in text
    assert message in text, text


def test_a_sweep_of_target_hit_rates_gives_one_point_each() -> None:
    doc = {"name": "x", "model": {"preset": "tiny"},
           "workload": {"kind": "offline", "num_requests": 8,
                        "prefix": {"num_groups": 1, "target_hit_rate": 0.25}},
           "sweep": {"workload.prefix.target_hit_rate": [0.25, 0.5]}}
    points = scenario_from_document(doc, "s.yaml").points()
    rates = [draw_workload(p.workload, 1000).prefix for p in points]
    assert [r["target_hit_rate"] for r in rates] == [0.25, 0.5]  # type: ignore[index]
    assert points[1].to_dict()["workload"]["prefix"]["target_hit_rate"] == 0.5
    grouped = dataclasses.replace(points[0].workload, prefix=PrefixSection(
        num_groups=2, lengths=[4, 8], shares=[1, 3]))
    assert hash(grouped) and grouped.prefix is not None  # a point stays hashable (tuples)
    assert grouped.prefix.model_dump(mode="json")["lengths"] == [4, 8]
    assert [r["intended_hit_rate"] for r in rates] == pytest.approx(  # type: ignore[index]
        [0.25, 0.5], abs=0.01)
