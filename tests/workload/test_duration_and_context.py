"""workload.max_duration_s (a rate or a trace that would run for decades is refused before
the run) and workload.dataset.over_context (entries longer than the context: drop or refuse)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infbench.core.errors import UserError
from infbench.measure.workload import generate_requests, request_lengths
from infbench.scenario.schema import scenario_from_document
from infbench.scenario.workload import DatasetSection, WorkloadPoint


def points(workload: dict[str, Any]) -> list[Any]:
    doc = {"name": "x", "model": {"preset": "tiny"}, "workload": workload}
    return scenario_from_document(doc, "s.yaml").points()


def test_a_rate_that_would_run_for_years_is_refused_at_load() -> None:
    with pytest.raises(UserError) as exc:
        points({"kind": "poisson", "rate": 1e-9, "num_requests": 10})
    assert str(exc.value) == (
        "s.yaml: workload.rate: 10 requests at 1e-09/s arrive over about 9e+09 s (285 years), "
        "beyond workload.max_duration_s 86400 (24 h); allowed: a higher rate, fewer requests, "
        "or max_duration_s up to 31536000 when a run that long is meant")


def test_the_bound_is_per_sweep_point_and_can_be_raised() -> None:
    with pytest.raises(UserError, match=r"100 requests at 0.001/s arrive over about 9.9e\+04 s "
                                        r"\(27.5 h\).*\(at rate=0.001\)$"):
        points({"kind": "poisson", "rate": [10, 0.001], "num_requests": 100})
    ok = points({"kind": "poisson", "rate": [10, 0.001], "num_requests": 100,
                 "max_duration_s": 100_000})
    assert [p.workload.max_duration_s for p in ok] == [100_000, 100_000]
    assert points({"kind": "poisson", "rate": 1e-9, "num_requests": 1})  # one arrival, at t=0
    assert points({"kind": "poisson", "rate": "inf", "num_requests": 10})
    with pytest.raises(UserError, match=r"workload.max_duration_s: must be <= 31536000"):
        points({"kind": "poisson", "rate": 1e-9, "max_duration_s": 1e12})
    with pytest.raises(UserError, match=r"workload.max_duration_s: must be > 0"):
        points({"kind": "offline", "max_duration_s": 0})


def trace(tmp_path: Path, stamps: list[float]) -> Path:
    file = tmp_path / "t.csv"
    file.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    + "".join(f"{t},4,2\n" for t in stamps))
    return file


def test_a_trace_whose_span_exceeds_the_bound_is_refused_before_the_run(tmp_path: Path) -> None:
    file = trace(tmp_path, [0, 5, 1e6])
    point = WorkloadPoint(kind="trace", num_requests=3,
                          dataset=DatasetSection(kind="trace", path=str(file)))
    message = (rf"^workload.dataset: {file}: the 3 rows drawn span 1e\+06 s at time_scale 1, "
               r"beyond workload.max_duration_s 86400; allowed: raise max_duration_s")
    with pytest.raises(UserError, match=message):
        request_lengths(point)  # what the pre-flight checks draw: before any model loads
    with pytest.raises(UserError, match=message):
        generate_requests(point, vocab_size=100)
    faster = WorkloadPoint(kind="trace", num_requests=3,
                           dataset=DatasetSection(kind="trace", path=str(file), time_scale=0.01))
    arrivals = [r.arrival_s for r in generate_requests(faster, vocab_size=100)]
    assert arrivals == pytest.approx([0.0, 0.05, 1e4])
    # A time_scale the scenario refuses (> 2**24), built unvalidated: the span check holds.
    huge = WorkloadPoint(kind="trace", num_requests=2, dataset=DatasetSection.model_construct(
        kind="trace", path=str(trace(tmp_path, [0, 9e10])), time_scale=1e300))
    with pytest.raises(UserError, match=r"span inf s at time_scale 1e\+300"):
        generate_requests(huge, vocab_size=100)


class Words:
    def encode(self, text: str) -> list[int]:
        return [10 + len(w) for w in text.split()]


def test_entries_longer_than_the_context_are_dropped_with_a_count_or_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "p.jsonl"
    file.write_text('{"prompt": "a b", "output_len": 2}\n'
                    '{"prompt": "' + "w " * 50 + '", "output_len": 2}\n'
                    '{"prompt": "c d e", "output_len": 3}\n'
                    '{"prompt": "x", "output_len": 90}\n')
    drop = WorkloadPoint(kind="offline", num_requests=4,
                         dataset=DatasetSection(kind="jsonl", path=str(file)))
    reqs = generate_requests(drop, vocab_size=100, tokenizer=Words(), max_model_len=10)
    assert sorted(len(r.prompt_ids) for r in reqs) == [2, 2, 3, 3]  # two entries, cycled
    err = capsys.readouterr().err
    assert err == (f"note: workload.dataset {file}: dropped 2 of 4 entries longer than the "
                   "model context (10 tokens, prompt + output); workload.dataset.over_context: "
                   "refuse makes them an error\n")
    refuse = WorkloadPoint(kind="offline", num_requests=4, dataset=DatasetSection(
        kind="jsonl", path=str(file), over_context="refuse"))
    with pytest.raises(UserError) as exc:
        generate_requests(refuse, vocab_size=100, tokenizer=Words(), max_model_len=10)
    assert str(exc.value) == (
        f"{file}: line 2: prompt + output tokens exceed the model context (10 tokens); "
        "allowed: workload.dataset.over_context: drop to skip such entries")
    with pytest.raises(UserError, match="no entry fits the model context"):
        generate_requests(drop, vocab_size=100, tokenizer=Words(), max_model_len=2)
    with pytest.raises(UserError, match=r"over_context: unknown value 'keep'; allowed: drop, "
                                        r"refuse"):
        points({"kind": "offline", "dataset": {"kind": "jsonl", "path": str(file),
                                               "over_context": "keep"}})
