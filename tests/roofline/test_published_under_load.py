"""Published serving runs at a stated load: the simulation of the same load bounds them.

Every row of infbench/data/published/under_load.yaml is priced by the simulated engine
(`measure.published_load`) at the datasheet peaks: each measured latency must not be
shorter than the predicted one and each measured throughput must not exceed the predicted
one, or the row names the gap found, and the gap must still be there.  The scenario a row
is priced as is what `infbench predict SCENARIO` prices; the derated prices (the engine's
`--efficiency` fit) are slower than the raw ones; docs/fidelity.md holds the table
`python -m infbench.benchmarks.published_under_load` prints.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_cli

from infbench.benchmarks.published_under_load import END, START, prices, render
from infbench.core.errors import ConfigError
from infbench.measure.published_load import (
    TIME_METRICS,
    load_rows,
    price_under_load,
    scenario_document,
)

ROWS = load_rows()
REPO = Path(__file__).resolve().parents[2]


def test_the_file_covers_what_the_issue_asks() -> None:
    assert len(ROWS) >= 6
    assert any(r.rate is not None for r in ROWS), "rows at a stated request rate"
    assert any(r.concurrency is not None for r in ROWS), "rows at a stated concurrency"
    assert any(r.offline for r in ROWS), "MLPerf Offline rows: every request at t=0"
    assert any(r.id.startswith("mlperf") and r.rate is not None for r in ROWS), "MLPerf Server"
    fp8 = {r.id for r in ROWS if "fp8" in (r.weights, r.activations, r.kv)}
    assert len(fp8) >= 2, fp8
    assert {r.engine for r in ROWS} >= {"vllm", "sglang", "tensorrt-llm"}
    measured = {m for r in ROWS for m, _ in r.measured}
    assert {"ttft_ms", "tpot_ms", "itl_ms", "output_tokens_per_s"} <= measured


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_every_source_can_be_found(row) -> None:
    # a repository, a path and a 40-hex commit, or a URL; and the table or section
    assert re.search(r"github \S+/\S+ \S+ @ [0-9a-f]{40}|https://\S+", row.source), row.source
    assert re.search(r"table|section|Table", row.source), row.source


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_the_simulation_bounds_every_measured_metric(row) -> None:
    raw, _ = prices(row)
    gaps = dict(row.gap)
    for metric, value in row.measured:
        verdict = (f"{row.id} {metric}: measured {value:.4g}, predicted "
                   f"{raw.value(metric):.4g} ({raw.ratio(metric):.2f}x faster)")
        if metric in gaps:  # investigated: it must still miss, or the gap note goes
            assert not raw.is_bound(metric), f"gap closed: drop gap.{metric} from {verdict}"
        else:
            assert raw.is_bound(metric), f"not a bound: {verdict}"


@pytest.mark.parametrize("row", [r for r in ROWS if r.engine != "sglang"], ids=lambda r: r.id)
def test_the_derated_price_is_slower(row) -> None:
    raw, derated = prices(row)
    assert derated is not None and derated.efficiency is not None
    for metric, _ in row.measured:
        if metric in TIME_METRICS:
            assert derated.value(metric) > raw.value(metric), metric
        else:
            assert derated.value(metric) < raw.value(metric), metric


def test_predict_prices_the_row_as_the_scenario(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # one rate row and one concurrency row: `infbench predict SCENARIO --json` on the
    # scenario the row is priced as prints the same simulated metrics
    picked = [next(r for r in ROWS if r.rate is not None and r.tp > 1),
              next(r for r in ROWS if r.concurrency == 5)]
    for row in picked:
        path = tmp_path / f"{row.id}.yaml"
        path.write_text(yaml.safe_dump(scenario_document(row)))
        code, out, err = run_cli(monkeypatch, capsys, "predict", str(path), "--json")
        assert code == 0, err
        metrics = json.loads(out)[0]["metrics"]
        raw, _ = prices(row)
        assert metrics["ttft_s"]["p50"] * 1e3 == pytest.approx(raw.value("ttft_ms"))
        assert metrics["num_requests"] == row.requests


def test_fewer_priced_replicas_price_the_same_run() -> None:
    # an MLPerf Offline row (fixed lengths, so every replica's share is alike) on one of
    # its identical replicas and on two: the throughput scaled by R / P is the same
    row = next(r for r in ROWS if r.offline and r.replicas >= 2)
    small = replace(row, priced_requests=64, priced_replicas=1, max_batch=32, len_spread=0.0)
    two = replace(small, priced_requests=128, priced_replicas=2)
    one_price = price_under_load(small).value("output_tokens_per_s")
    two_price = price_under_load(two).value("output_tokens_per_s")
    assert scenario_document(two)["parallel"]["replicas"] == 2
    assert two_price == pytest.approx(one_price, rel=1e-9)


GOOD = ("id: x, engine: vllm, model: llama-3.1-8b, gpu: h100-sxm, gpus: 1, prompt_len: 8, "
        "gen_len: 4, statistic: median, source: s, num_requests: 4, ")
BAD_ROWS = [
    ("- {id: x, engine: vllm\n  colour: : red", "not valid YAML"),
    ("- {id: x, engine: vllm}", "missing key 'model'"),
    ("- {" + GOOD + "load: {rate: 1}, measured: {ttft_ms: 1}, colour: red}",
     "unknown key 'colour'"),
    ("- {" + GOOD.replace("vllm", "nope") + "load: {rate: 1}, measured: {ttft_ms: 1}}",
     "engine: 'nope'"),
    ("- {" + GOOD + "load: {rate: 1, concurrency: 2}, measured: {ttft_ms: 1}}",
     "load: one of rate, concurrency, offline, not two"),
    ("- {" + GOOD + "load: {qps: 1}, measured: {ttft_ms: 1}}", "unknown key 'qps'"),
    ("- {" + GOOD + "load: {offline: false}, measured: {ttft_ms: 1}}",
     "load/offline: False; allowed: true"),
    ("- {" + GOOD + "load: {offline: true}, measured: {ttft_ms: 1}, len_dist: zipf}",
     "len_dist: 'zipf'; allowed: uniform, lognormal"),
    ("- {" + GOOD + "load: {rate: 1}, measured: {ttft_ms: 1}, priced_replicas: 2}",
     "priced_replicas: 2; allowed: 1..1"),
    ("- {" + GOOD + "load: {rate: 1}, measured: {ttft_ms: 1}, max_batch: 0}",
     "max_batch: 0; allowed: a whole number >= 1"),
    ("- {" + GOOD + "load: {concurrency: 0}, measured: {ttft_ms: 1}}",
     "load/concurrency: 0; allowed: a whole number >= 1"),
    ("- {" + GOOD + "load: {rate: 1}, measured: {ttft: 1}}", "measured: unknown key 'ttft'"),
    ("- {" + GOOD + "load: {rate: 1}, measured: {ttft_ms: -3}}",
     "measured/ttft_ms: -3; allowed: a number > 0"),
    ("- {" + GOOD + "load: {rate: 1}, measured: {ttft_ms: 1}, gap: {itl_ms: why}}",
     "gap/itl_ms: not a measured metric"),
    ("- {" + GOOD.replace("num_requests: 4, ", "") + "load: {rate: 1}, "
     "measured: {ttft_ms: 1}}", "num_requests or priced_requests is required"),
    ("- {" + GOOD.replace("gpus: 1", "gpus: 3") + "load: {rate: 1}, measured: {ttft_ms: 1}, "
     "parallel: {tp: 2}}", "gpus: 3 is not a multiple of parallel.tp = 2"),
    ("- {" + GOOD + "load: {rate: 1}, measured: {ttft_ms: 1}}\n- {" + GOOD +
     "load: {rate: 1}, measured: {ttft_ms: 1}}", "duplicate id 'x'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_ROWS, ids=[m for _, m in BAD_ROWS])
def test_a_bad_row_is_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rows.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_rows(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_docs_fidelity_holds_what_the_command_prints() -> None:
    page = (REPO / "docs" / "fidelity.md").read_text(encoding="utf-8")
    assert START in page and END in page
    held = page[page.index(START):page.index(END) + len(END)] + "\n"
    assert held == render(), ("docs/fidelity.md is stale: regenerate its under-load table "
                              "with `python -m infbench.benchmarks.published_under_load`")
