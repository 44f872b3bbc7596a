"""The host-loop benchmark's instrument, and incremental host state against a recomputation.

No timing is asserted: the benchmark's numbers depend on the machine.  What is checked is
that its NullModel and StepSplit produce every part of the split for real engine steps,
and that the incremental bookkeeping (token ids extended in place, block tables copied
into arrays entry by entry, slot mappings and tables built with numpy) equals what a
from-scratch computation gives, step after step of a randomized run with preemption,
prefix-cache hits and forks.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from infbench.benchmarks import host_loop
from infbench.core.config import EngineConfig, ModelConfig
from infbench.engine.engine import Engine, KVSizing
from infbench.engine.request import Request, SamplingParams
from infbench.engine.runner import StepInputs
from infbench.engine.scheduler import SchedulerOutput
from infbench.engine.sequence import BlockTable


def test_null_model_returns_zeros_of_the_right_shapes() -> None:
    model = host_loop.NullModel(hidden_size=16, vocab_size=32)
    hidden = model(torch.zeros(5, dtype=torch.long), torch.arange(5), None)  # type: ignore[arg-type]
    logits = model.compute_logits(hidden[:2])
    assert hidden.shape == (5, 16) and logits.shape == (2, 32)
    assert not hidden.any() and not logits.any() and logits.dtype == torch.float32


def test_measure_reports_every_part_of_real_decode_steps() -> None:
    row = host_loop.measure(batch=3, prompt_len=40, num_steps=4, num_warmup=1)
    assert row["batch"] == 3 and row["num_steps"] == 4
    med = row["median_s"]
    assert set(med) == set(host_loop.PARTS)
    assert all(v >= 0 for v in med.values())
    # The parts are disjoint pieces of Engine.step: schedule and prepare did real work.
    assert med["schedule"] > 0 and med["prepare"] > 0 and med["total"] >= med["prepare"]


def test_step_split_parts_add_up_to_the_step() -> None:
    engine, model = host_loop.build_engine(batch=2, prompt_len=20, gen_len=4)
    split = host_loop.StepSplit()
    split.install(engine, model)
    while engine.scheduler.has_unfinished:
        split.step(engine)
    assert len(split.steps) >= 4
    for step in split.steps:
        parts = sum(step[p] for p in host_loop.PARTS if p != "total")
        assert parts == pytest.approx(step["total"], rel=1e-9, abs=1e-12)
        assert step["execute"] <= step["total"]


def test_main_prints_cpu_flags_and_writes_json(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "host.json"
    threads = torch.get_num_threads()  # main runs torch on one thread; the suite does not
    try:
        code = host_loop.main(["--batches", "1,2", "--prompt", "24", "--steps", "2",
                               "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    data = json.loads(out.read_text())
    assert [r["batch"] for r in data["rows"]] == [1, 2]
    assert set(data["cpu"]["flags"]) <= set(host_loop.RELEVANT_FLAGS)
    assert "host loop per decode step" in capsys.readouterr().out


def test_block_table_array_follows_every_kind_of_edit() -> None:
    rng = random.Random(0)
    table = BlockTable([3, 1])
    for _ in range(500):
        op = rng.randrange(6)
        if op == 0 or len(table) < 2:
            table.append(rng.randrange(100))
        elif op == 1:
            table[rng.randrange(-len(table), len(table))] = rng.randrange(-1, 100)
        elif op == 2:
            table.pop()
        elif op == 3:
            table.insert(rng.randrange(len(table)), rng.randrange(100))
        elif op == 4:
            table[1:2] = [rng.randrange(100), rng.randrange(100)]
        else:
            del table[0]
        if rng.random() < 0.5:
            assert table.as_array().tolist() == list(table)
    assert table.as_array().tolist() == list(table)


# ------------------------------------------------------- incremental vs from scratch
class _RandomLogits(host_loop.NullModel):
    """NullModel with seeded random logits, so greedy decoding produces varied tokens."""

    def __init__(self, hidden_size: int, vocab_size: int, seed: int) -> None:
        super().__init__(hidden_size, vocab_size)
        self.gen = torch.Generator().manual_seed(seed)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.rand(hidden.shape[0], self.vocab_size, generator=self.gen)


def _reference_inputs(out: SchedulerOutput, block_size: int) -> dict[str, torch.Tensor]:
    """The step's tensors recomputed from scratch with per-token Python loops."""
    order = sorted(out.scheduled, key=lambda s: s.is_prefill)
    ids, pos, slots = [], [], []
    dec, pre = [], []
    for s in order:
        seq, start, n = s.seq, s.start_pos, s.num_new_tokens
        tokens = list(seq.prompt_ids) + list(seq.output_ids)
        table = list(seq.block_table)
        for p in range(start, start + n):
            ids.append(tokens[p])
            pos.append(p)
            slots.append(table[p // block_size] * block_size + p % block_size)
        (pre if s.is_prefill else dec).append((table, start + n))

    def tables(rows: list[tuple[list[int], int]]) -> torch.Tensor:
        if not rows:
            return torch.zeros(0, dtype=torch.int32)
        width = max(len(t) for t, _ in rows) or 1
        return torch.tensor([[max(b, 0) for b in t] + [0] * (width - len(t)) for t, _ in rows],
                            dtype=torch.int32)

    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "positions": torch.tensor(pos, dtype=torch.long),
        "slot_mapping": torch.tensor(slots, dtype=torch.long),
        "decode_tables": tables(dec),
        "prefill_tables": tables(pre),
        "decode_context_lens": torch.tensor([c for _, c in dec], dtype=torch.int32),
        "prefill_context_lens": torch.tensor([c for _, c in pre], dtype=torch.int32),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_state_equals_recomputation(seed: int) -> None:
    rng = random.Random(seed)
    cfg = ModelConfig.from_name("tiny", num_layers=1, num_heads=1, num_kv_heads=1,
                                hidden_size=16, max_seq_len=256)
    model = _RandomLogits(cfg.hidden_size, cfg.vocab_size, seed)
    bs = 4
    # A pool too small for everything at once: preemption; shared prompt heads: prefix hits.
    engine_cfg = EngineConfig(block_size=bs, max_num_seqs=8, max_num_batched_tokens=24,
                              backend="torch", enable_prefix_caching=True)
    heads = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randrange(4, 17))]
             for _ in range(3)]
    reqs = []
    for i in range(14):
        tail = [rng.randrange(cfg.vocab_size) for _ in range(rng.randrange(1, 20))]
        reqs.append(Request(f"r{i}", tuple(rng.choice(heads) + tail),
                            SamplingParams(max_tokens=rng.randrange(8, 32), ignore_eos=True),
                            n=rng.choice([1, 1, 1, 2])))
    engine = Engine(model, cfg, engine_cfg, torch.device("cpu"), "float32", weight_bytes=0,
                    sizing=KVSizing(min_seq_tokens=64, num_kv_blocks=24))
    for req in reqs:
        engine.add_request(req)

    checked = {"steps": 0, "preempted": 0, "cached": 0, "shared": 0}
    prepare = engine.runner.prepare

    def checked_prepare(out: SchedulerOutput) -> StepInputs:
        inputs = prepare(out)
        for name, want in _reference_inputs(out, bs).items():
            got = getattr(inputs, name)
            assert got.dtype == want.dtype and torch.equal(got, want), name
        checked["steps"] += 1
        checked["preempted"] += len(out.preempted)
        return inputs

    engine.runner.prepare = checked_prepare  # type: ignore[method-assign]
    sched = engine.scheduler
    while sched.has_unfinished:
        record, _ = engine.step(lambda: 0.0)
        # kv_slots_used against a count of the distinct slots holding computed tokens.
        slots = {engine.block_manager.slot(s, p) for s in sched.running
                 for p in range(s.num_computed_tokens)}
        assert record.kv_slots_used == len(slots)
        checked["shared"] += len(slots) < sum(s.num_computed_tokens for s in sched.running)
        for seq in [*sched.running, *sched.waiting]:
            assert seq.token_ids == list(seq.prompt_ids) + list(seq.output_ids)
            table = seq.block_table
            assert isinstance(table, BlockTable)
            assert np.array_equal(table.as_array(), np.asarray(list(table), dtype=np.int64))
            checked["cached"] += seq.num_cached_tokens > 0
    assert checked["steps"] > 10
    # Finished and preempted sequences handed their persistent block-table rows back.
    rows = engine.runner.table_rows[0]
    assert all(rows.row_of(i) is None for i in range(sched.next_seq_id()))
    assert checked["preempted"] > 0, "the run should exercise preemption"
    assert checked["cached"] > 0, "the run should exercise prefix-cache hits"
    assert checked["shared"] > 0, "the run should share blocks (prefix hits, forks)"
