"""Pre-flight checks stay fast at any batch size and refuse workloads that cannot fit."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from infbench.core.errors import UserError
from infbench.measure import preflight as pf
from infbench.measure.workload import generate_requests, request_lengths
from infbench.scenario.schema import load_scenario


def _points(tmp_path: Path, workload: str) -> list:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nmodel: {{preset: tiny}}\nworkload: {workload}\n")
    return load_scenario(path).points()


@pytest.mark.parametrize("workload", [
    "{batch_size: 5, prompt_len: 9, gen_len: 3}",
    "{batch_size: 7, prompt_len: 20, gen_len: 6, prompt_len_dist: lognormal, len_spread: 0.5, "
    "gen_len_dist: uniform}",
    "{batch_size: 9, prompt_len: 12, gen_len: 5, shared_prefix_len: 10, seed: 3, "
    "prompt_len_dist: uniform, len_spread: 0.9}",
], ids=["fixed", "spread", "shared-prefix"])
def test_request_lengths_equal_the_generated_requests(tmp_path: Path, workload: str) -> None:
    point = _points(tmp_path, workload)[0]
    prompt_lens, gen_lens = request_lengths(point.workload)
    requests = generate_requests(point.workload, vocab_size=256)
    assert [len(r.prompt_ids) for r in requests] == prompt_lens.tolist()
    assert [r.sampling.max_tokens for r in requests] == gen_lens.tolist()
    i = int(np.argmax(prompt_lens + gen_lens))
    assert pf.longest_request((prompt_lens, gen_lens)) == (int(prompt_lens[i]), int(gen_lens[i]))


def test_millions_of_requests_are_refused_in_seconds(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    point = _points(tmp_path, "{batch_size: 10000000, prompt_len: 8, gen_len: 4}")[0]
    monkeypatch.setattr(pf, "free_memory_bytes", lambda _dev: 16 * 10**9)
    start = time.perf_counter()
    with pytest.raises(UserError, match="host memory"):
        pf.check_host_memory(point, request_lengths(point.workload))
    assert time.perf_counter() - start < 10  # building the requests took minutes


def test_a_normal_batch_passes_the_host_memory_check(tmp_path: Path) -> None:
    point = _points(tmp_path, "{batch_size: 64, prompt_len: 128, gen_len: 32}")[0]
    pf.check_host_memory(point, request_lengths(point.workload))


@pytest.mark.parametrize(("layout", "named"), [
    ("{tp: 2}", "tp 2"), ("{pp: 2, replicas: 3}", "pp 2, replicas 3"),
    ("{disaggregated: {prefill: {}, decode: {}}}", "disaggregated prefill and decode pools")])
def test_an_engine_point_with_a_parallel_layout_is_refused(tmp_path: Path, layout: str,
                                                           named: str) -> None:
    """The engine runs one device: measuring a tp 2 scenario on it would sit beside a
    prediction of two devices as if it had run there."""
    path = tmp_path / "p.yaml"
    path.write_text(f"name: p\nmodel: {{preset: tiny}}\nparallel: {layout}\n"
                    "workload: {batch_size: 1, prompt_len: 8, gen_len: 4}\n")
    with pytest.raises(UserError, match=f"point 0 \\(default\\): parallel: {named}: the "
                                        "engine runs on one device"):
        pf.preflight(load_scenario(path).points(), tmp_path / "out")
    path.write_text("name: p\nmodel: {preset: tiny}\nparallel: {tp: 1}\n"
                    "workload: {batch_size: 1, prompt_len: 8, gen_len: 4}\n")
    pf.preflight(load_scenario(path).points(), tmp_path / "out")
