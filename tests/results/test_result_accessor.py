"""The metric accessor: every name the CLI and the gate use, and errors that list valid names."""

from __future__ import annotations

from pathlib import Path

import pytest

from infbench.core.errors import UserError
from infbench.core.metric_names import GATE_METRICS, LATENCY_METRICS
from infbench.results.accessor import (
    DEFAULT_STATISTIC,
    metric,
    metric_names,
    section_metric,
    with_default_statistic,
)
from infbench.results.store import load_result

# a version-1 result (no per-request rows, no decode/e2e prediction split)
BASELINE = Path(__file__).resolve().parent / "data" / "v1_ci_baseline" / "ci_gate_000.json"


@pytest.fixture(scope="module")
def result() -> dict:
    return load_result(BASELINE)


def _raw(tree: dict, path: str) -> object:
    for part in path.split("."):
        tree = tree[part]
    return tree


@pytest.mark.parametrize("name", GATE_METRICS)
def test_every_gate_metric_name_reads_the_stored_number(result: dict, name: str) -> None:
    head = name.split(".")[0]
    if head in LATENCY_METRICS and name.split(".")[1] not in result["metrics"][head]:
        # a percentile this (older) result did not record: valid name, no value
        assert metric(result, name) is None
        return
    assert metric(result, name) == _raw(result["metrics"], name)
    assert metric(result, f"metrics.{name}") == metric(result, name)


@pytest.mark.parametrize("name", [
    "decode.mbu", "decode.mfu", "prefill.mfu", "decode.time_per_token_s",
    "normalized.output_tokens_per_s_per_gbs", "reference_bytes_per_s", "state_bytes_per_seq"])
def test_nested_measured_names(result: dict, name: str) -> None:
    assert metric(result, name) == pytest.approx(_raw(result["metrics"], name))


@pytest.mark.parametrize("name", ["prediction.ttft_s", "prediction.tpot_s",
                                  "prediction.output_tokens_per_s",
                                  "prediction.decode.time_per_token_s"])
def test_prediction_names(result: dict, name: str) -> None:
    assert metric(result, name) == pytest.approx(_raw(result, name))
    short = name.removeprefix("prediction.")
    assert section_metric(result["prediction"], short, "prediction") == metric(result, name)


def test_a_valid_name_without_a_value_is_none(result: dict) -> None:
    assert metric(result, "mixed.mbu") is None  # no mixed prefill+decode steps in this run
    assert metric(result, "prediction.decode_tokens_per_s") is None  # not in version 1
    assert metric({"metrics": {"ttft_s": {"p50": None}}}, "ttft_s.p50") is None


def test_a_percentile_outside_the_default_set_is_a_valid_name() -> None:
    r = {"metrics": {"ttft_s": {"mean": 1.0, "p99.9": 2.5}}}
    assert metric(r, "ttft_s.p99.9") == 2.5


@pytest.mark.parametrize("name", ["ttft", "output_tokens_per_sec", "decode.nope",
                                  "metrics.bogus", "prediction.ttft_s.p50", "ttft_s.median"])
def test_an_unknown_name_is_a_user_error_listing_the_valid_ones(result: dict, name: str) -> None:
    with pytest.raises(UserError) as info:
        metric(result, name)
    msg = str(info.value)
    assert repr(name.split(".", 1)[1] if name.startswith("metrics.") else name) in msg or \
        repr(name) in msg
    assert "valid" in msg and "\n" not in msg
    if name.startswith("prediction."):
        assert "prediction.output_tokens_per_s" in msg
    else:
        assert "output_tokens_per_s" in msg and "ttft_s.p99" in msg and "decode.mbu" in msg


@pytest.mark.parametrize("name", ["ttft_s", "metrics.itl_s", "e2e_s"])
def test_a_latency_without_a_statistic_is_an_error_not_a_silent_p50(result: dict,
                                                                   name: str) -> None:
    with pytest.raises(UserError, match="latency distribution") as info:
        metric(result, name)
    assert f"{name}.p50" in str(info.value) and f"{name}.p99" in str(info.value)


def test_a_group_is_an_error_listing_its_fields(result: dict) -> None:
    with pytest.raises(UserError, match="is a group") as info:
        metric(result, "decode")
    assert "decode.mbu" in str(info.value) and "decode.mfu" in str(info.value)


def test_the_gate_default_statistic_is_explicit() -> None:
    assert DEFAULT_STATISTIC == "p50"
    assert with_default_statistic("ttft_s") == "ttft_s.p50"
    assert with_default_statistic("metrics.tpot_s") == "metrics.tpot_s.p50"
    assert with_default_statistic("ttft_s.p99") == "ttft_s.p99"
    assert with_default_statistic("output_tokens_per_s") == "output_tokens_per_s"


def test_metric_names_cover_the_gate_names() -> None:
    names = set(metric_names())
    assert {n for n in GATE_METRICS} <= names
    assert "decode.mbu" in names and "normalized.output_tokens_per_s_per_gbs" in names
    assert "prediction.decode_tokens_per_s" in metric_names("prediction")
    assert not any(n.startswith("noise") for n in names)  # not numbers: not metrics
