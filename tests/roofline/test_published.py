"""Published GPU measurements: the roofline is a bound on each, and a useful one.

Every row of infbench/data/published/measurements.yaml that infbench can price is priced
as published; the predicted time per token must not exceed the measured one and the
predicted throughput must not fall below it (a bound), and the measurement must be within
2x (time per token) or 3x (throughput) of the prediction (useful).  A row infbench cannot
price yet names what it needs, and that list must be exactly what is missing now: when a
feature lands, the test fails until the row is enabled.  A priced row that misses the bar
names the gap found, and must still miss it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infbench.core.config import PRESETS
from infbench.core.errors import ConfigError
from infbench.measure.published import (
    load_rows,
    missing_features,
    price_row,
    priceable,
)

ROWS = load_rows()
PRICED = priceable(ROWS)
REPO = Path(__file__).resolve().parents[2]


def test_the_file_covers_what_the_issue_asks() -> None:
    assert len(ROWS) >= 20
    assert any(r.batch == 1 for r in ROWS), "batch-1 decode rows"
    assert any(r.batch is None for r in ROWS), "max-load throughput rows"
    moe = {r.model for r in ROWS if r.model.startswith(("mixtral", "qwen3-", "llama-4",
                                                        "deepseek", "gpt-oss"))}
    assert len(moe) >= 3, moe
    low = {(r.model, r.gpu, r.weights) for r in ROWS if r.weights in ("fp8", "nvfp4", "mxfp4")}
    assert len(low) >= 3, low
    assert {r.engine for r in ROWS} >= {"gpt-fast", "vllm", "sglang", "tensorrt-llm"}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_every_source_can_be_found(row) -> None:
    # a repository, a path, a 40-hex commit, and the table or section the number is in
    assert re.search(r"github \S+/\S+ \S+ @ [0-9a-f]{40}", row.source), row.source
    assert re.search(r"table|section|Table", row.source), row.source


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_needs_name_exactly_what_is_missing_now(row) -> None:
    missing = missing_features(row)
    assert set(row.needs) == set(missing), (
        f"{row.id}: needs {list(row.needs)} but infbench lacks {list(missing)} now: "
        "update the row's needs (a landed feature enables the row)")


@pytest.mark.parametrize("row", PRICED, ids=lambda r: r.id)
def test_the_roofline_bounds_the_measurement_usefully(row) -> None:
    rp = price_row(row)
    kind = "time per token" if row.is_time else "throughput"
    verdict = (f"{row.id}: measured {rp.measured:.4g}, predicted {rp.predicted:.4g} "
               f"({kind}; the roofline {rp.ratio:.2f}x faster; bar {row.bar:g}x)")
    if row.gap:  # investigated: it must still miss the bar, or the gap note goes
        assert not (rp.is_bound and rp.is_useful), f"gap closed: drop `gap` from {verdict}"
        return
    assert rp.is_bound, f"not a bound: {verdict}"
    assert rp.is_useful, f"not a useful bound: {verdict}"


def test_a_row_with_needs_is_refused_in_one_line() -> None:
    pending = [r for r in ROWS if r.needs]
    if not pending:
        pytest.skip("every row is priced")
    with pytest.raises(ConfigError, match=r"not priced yet: needs "):
        price_row(pending[0])


def test_max_load_is_priced_at_the_mean_context() -> None:
    # continuous batching's steady state: each request holds prompt + gen/2 on average
    from infbench.hardware.spec import get_hardware
    from infbench.roofline.analysis import max_batch

    row = next(r for r in PRICED if r.batch is None)
    rp = price_row(row)
    p = rp.price.prediction
    mean = row.prompt_len + (row.gen_len + 1) // 2
    assert rp.batch == max_batch(PRESETS[row.model], get_hardware(row.gpu), row.dtype,
                                 p.quant, mean, p.parallel)
    assert rp.batch > p.max_batch  # more than a wave that ends at prompt + gen fits


BAD_ROWS = [
    ("- {id: x, engine: vllm\n  colour: : red", "not valid YAML"),
    ("- {id: x, engine: vllm}", "missing key 'model'"),
    ("- {id: x, engine: nope, model: m, gpu: h200, gpus: 1, prompt_len: 1, gen_len: 2, "
     "batch: 1, metric: itl_ms, scope: total, value: 1, source: s}", "engine: 'nope'"),
    ("- {id: x, engine: vllm, model: m, gpu: h200, gpus: 1, prompt_len: 1, gen_len: 2, "
     "batch: 0, metric: itl_ms, scope: total, value: 1, source: s}", "batch: 0"),
    ("- {id: x, engine: vllm, model: m, gpu: h200, gpus: 1, prompt_len: 1, gen_len: 2, "
     "batch: 1, metric: tps, scope: total, value: 1, source: s}", "metric: 'tps'"),
    ("- {id: x, engine: vllm, model: m, gpu: h200, gpus: 1, prompt_len: 1, gen_len: 2, "
     "batch: 1, metric: itl_ms, scope: total, value: -1, source: s}", "value: -1"),
    ("- {id: x, engine: vllm, model: m, gpu: h200, gpus: 1, prompt_len: 1, gen_len: 2, "
     "batch: 1, metric: itl_ms, scope: total, value: 1, source: s, parallel: {dp: 2}}",
     "unknown key 'dp'"),
    ("- {id: x, engine: sglang, model: m, gpu: h200, gpus: 8, prompt_len: 1, gen_len: 2, "
     "batch: 1, metric: itl_ms, scope: total, value: 1, source: s, "
     "parallel: {tp: 8, attention_dp: 8, dense_dp: 2}}",
     "parallel/dense_dp: 2; allowed: true, false"),
    ("- {id: x, engine: vllm, model: m, gpu: h200, gpus: 1, prompt_len: 1, gen_len: 2, "
     "batch: 1, metric: itl_ms, scope: total, value: 1, source: s, colour: red}",
     "unknown key 'colour'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_ROWS, ids=[m for _, m in BAD_ROWS])
def test_a_bad_row_is_one_line_naming_the_key(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "rows.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_rows(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_docs_fidelity_holds_what_the_command_prints() -> None:
    from infbench.benchmarks.published import END, START, render

    page = (REPO / "docs" / "fidelity.md").read_text(encoding="utf-8")
    assert START in page and END in page
    held = page[page.index(START):page.index(END) + len(END)] + "\n"
    assert held == render(), ("docs/fidelity.md is stale: regenerate its tables with "
                              "`python -m infbench.benchmarks.published`")
