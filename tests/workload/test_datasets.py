"""Dataset loaders on the shipped sample files and on bad files (one-line errors, exit 2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infbench.core.errors import UserError
from infbench.measure.datasets import load_dataset, sample_names
from infbench.measure.workload import generate_requests, request_lengths
from infbench.scenario.schema import scenario_from_document
from infbench.scenario.workload import DatasetSection, WorkloadPoint


class WordTokenizer:
    """One id per distinct word (ids from 10), no BOS."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]


def test_the_samples_ship_and_load() -> None:
    assert sample_names() == ["azure_trace_small.csv", "prompts_small.jsonl",
                              "sessions_small.jsonl", "sharegpt_small.json"]
    share = load_dataset("sharegpt", "infbench:samples/sharegpt_small.json")
    assert len(share) == 32  # the unanswered conversation is skipped
    assert share[0].prompt == "What is the boiling point of water at sea level?"
    assert share[0].reference is not None and share[0].reference.startswith("At sea level")
    prompts = load_dataset("jsonl", "infbench:samples/prompts_small.jsonl")
    assert len(prompts) == 32 and prompts[0].output_len == 8 and prompts[2].output_len is None
    trace = load_dataset("trace", "infbench:samples/azure_trace_small.csv")
    assert len(trace) == 100 and trace[0].timestamp_s == 0.0
    assert (trace[0].prompt_len, trace[0].output_len) == (54, 22)
    assert trace[1].timestamp_s == pytest.approx(46.0766776 - 46.0028244)


def test_sharegpt_requests_take_the_reference_reply_length_and_are_seeded() -> None:
    tok = WordTokenizer()
    point = WorkloadPoint(kind="offline", num_requests=40,
                          dataset=DatasetSection(kind="sharegpt",
                                                 path="infbench:samples/sharegpt_small.json"))
    reqs = generate_requests(point, vocab_size=5000, tokenizer=tok)
    share = load_dataset("sharegpt", "infbench:samples/sharegpt_small.json")
    by_prompt = {tuple(tok.encode(e.prompt or "")): e for e in share}
    assert len(reqs) == 40  # more requests than entries: a second seeded pass
    for r in reqs:
        entry = by_prompt[r.prompt_ids]
        assert r.sampling.max_tokens == len((entry.reference or "").split())
    assert reqs == generate_requests(point, vocab_size=5000, tokenizer=tok)
    other = generate_requests(dataclasses.replace(point, seed=1), 5000, tokenizer=tok)
    assert [r.prompt_ids for r in other] != [r.prompt_ids for r in reqs]
    # The model's context filters over-long conversations before sampling.
    short = generate_requests(point, 5000, tokenizer=tok, max_model_len=40)
    assert all(len(r.prompt_ids) + r.sampling.max_tokens <= 40 for r in short)


def test_jsonl_output_len_defaults_to_gen_len_and_lengths_estimate_words() -> None:
    point = WorkloadPoint(kind="offline", num_requests=32, gen_len=5,
                          dataset=DatasetSection(kind="jsonl",
                                                 path="infbench:samples/prompts_small.jsonl"))
    reqs = generate_requests(point, vocab_size=5000, tokenizer=WordTokenizer())
    entries = {e.prompt: e for e in load_dataset("jsonl", point.dataset.path)}  # type: ignore
    outs = sorted(e.output_len or 5 for e in entries.values())
    assert sorted(r.sampling.max_tokens for r in reqs) == outs
    prompt_lens, gen_lens = request_lengths(point)  # preflight's view, no tokenizer
    assert sorted(gen_lens.tolist()) == outs
    assert sorted(prompt_lens.tolist()) == sorted(len(r.prompt_ids) for r in reqs)


def test_text_dataset_without_a_tokenizer_is_one_line() -> None:
    point = WorkloadPoint(kind="offline", num_requests=2,
                          dataset=DatasetSection(kind="jsonl",
                                                 path="infbench:samples/prompts_small.jsonl"))
    with pytest.raises(UserError, match=r"^workload.dataset: jsonl prompts are text and need "
                                        r"the model's tokenizer.*allowed without one: kind trace"):
        generate_requests(point, vocab_size=100)


BAD = [
    ("jsonl", '{"prompt": "hi"}\n{"prompt": "x", "max_tokens": 3}\n',
     r"^{f}:2: unknown key 'max_tokens'; allowed: prompt, output_len$"),
    ("jsonl", '{"prompt": "hi"}\n{"prompt": "x",\n', r"^{f}:2: not valid JSON"),
    ("jsonl", '{"prompt": "hi", "output_len": 0}\n', r"^{f}:1: output_len: must be an integer"),
    ("jsonl", '{"output_len": 4}\n', r"^{f}:1: prompt: required"),
    ("sharegpt", '{"conversations": []}', r"^{f}: expected a JSON list"),
    ("sharegpt", '[{"conversations": [{"from": "human"}]}]',
     r"^{f}: entry 0: conversations\[0\]: must be an object with string 'from'"),
    ("sharegpt", '[{"conversations": [{"from": "human", "value": "hi"}]}]',
     r"^{f}: no usable sharegpt entries"),
    ("trace", "TIMESTAMP,ContextTokens,GeneratedTokens,Model\n1,2,3,x\n",
     r"^{f}:1: unknown column 'Model'; allowed: TIMESTAMP, ContextTokens, GeneratedTokens$"),
    ("trace", "TIMESTAMP,ContextTokens\n1,2\n", r"^{f}: column 'GeneratedTokens' is missing"),
    ("trace", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\nyesterday,2,3\n",
     r"^{f}:3: TIMESTAMP: 'yesterday' is not a date-time"),
    ("trace", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,-2,3\n",
     r"^{f}:2: ContextTokens: must be an integer in 1\.\."),
    ("trace", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2\n", r"^{f}:2: expected 3 values"),
]


@pytest.mark.parametrize("kind,text,pattern", BAD, ids=[f"{k}-{i}" for i, (k, _, _) in
                                                         enumerate(BAD)])
def test_bad_files_are_one_line_errors_naming_file_and_key(tmp_path: Path, kind: str, text: str,
                                                           pattern: str) -> None:
    file = tmp_path / f"bad.{kind}"
    file.write_text(text)
    with pytest.raises(UserError, match=pattern.replace("{f}", str(file))) as exc:
        load_dataset(kind, str(file))
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2


def test_missing_file_and_bad_keys_are_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^workload.dataset.path: nope.jsonl: no such file$"):
        load_dataset("jsonl", "nope.jsonl")
    with pytest.raises(UserError, match="no such packaged file; allowed: infbench:samples/"):
        load_dataset("jsonl", "infbench:samples/missing.jsonl")
    doc = {"name": "x", "model": {"preset": "tiny"},
           "workload": {"dataset": {"kind": "csv", "path": "a"}}}
    with pytest.raises(UserError, match=r"^s.yaml: workload.dataset.kind: unknown value 'csv'; "
                                        r"allowed: sharegpt, jsonl, trace$"):
        scenario_from_document(doc, "s.yaml").points()
    doc["workload"] = {"kind": "poisson", "rate": 2.0, "burstiness": -1}
    with pytest.raises(UserError, match=r"^s.yaml: workload.burstiness: must be > 0 \(got -1\)$"):
        scenario_from_document(doc, "s.yaml")
    doc["workload"] = {"dataset": {"kind": "jsonl", "path": "a"}, "shared_prefix_len": 4}
    with pytest.raises(UserError, match=r"workload.shared_prefix_len: the prompts come from "
                                        r"workload.dataset \(a\); remove shared_prefix_len"):
        scenario_from_document(doc, "s.yaml").points()
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,4,2\n1,4,2\n")
    short = WorkloadPoint(kind="trace", num_requests=3,
                          dataset=DatasetSection(kind="trace", path=str(trace)))
    with pytest.raises(UserError, match=r"workload.num_requests: 3 requests from a trace of 2 "
                                        r"rows; allowed: at most 2"):
        generate_requests(short, vocab_size=100)
