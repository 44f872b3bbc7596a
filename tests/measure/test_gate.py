"""The regression gate: verdicts, direction of metrics, noise handling, normalization, bad input."""

from __future__ import annotations

import copy
import io

import pytest
from rich.console import Console

from infbench.core.errors import ResultSchemaError, UserError
from infbench.results.gate import (
    compare,
    compare_many,
    gate_from_scenario,
    is_lower_better,
    parse_threshold,
    scenario_difference,
)


def test_identical_results_pass(fake_result):
    res = compare(fake_result(), fake_result())
    assert res.passed and res.exit_code == 0
    row = res.rows[0]
    assert row.change_pct == pytest.approx(0.0)
    assert row.status == "ok"


def test_ten_percent_slower_is_a_regression(fake_result):
    base, new = fake_result(), fake_result(speed=0.9)
    res = compare(base, new, max_regression=0.05)
    assert not res.passed and res.exit_code == 1
    row = res.rows[0]
    assert row.status == "regression"
    # every time scales by 1/0.9, so tokens/s is exactly 10% lower
    assert row.change_pct == pytest.approx(-10.0)
    assert row.new == pytest.approx(base["metrics"]["output_tokens_per_s"] * 0.9)
    # a looser threshold lets the same change through
    assert compare(base, new, max_regression=0.15).passed


def test_faster_run_is_improved_not_regression(fake_result):
    res = compare(fake_result(), fake_result(speed=1.2))
    assert res.passed
    assert res.rows[0].status == "improved"


@pytest.mark.parametrize("metric,lower", [
    ("output_tokens_per_s", False), ("ttft_s.p50", True), ("ttft_s", True),
    ("decode.time_per_token_s", True), ("decode.mbu", False), ("peak_kv_bytes", True),
    ("decode.achieved_bytes_per_s", False), ("e2e_latency", True), ("requests_per_s", False),
])
def test_metric_direction(metric, lower):
    assert is_lower_better(metric) is lower


def test_latency_increase_regresses(fake_result):
    res = compare(fake_result(), fake_result(speed=0.9), metric="ttft_s.p99")
    row = res.rows[0]
    assert row.is_lower_better
    assert row.change_pct == pytest.approx(100 / 9)  # times grow by 1/0.9
    assert row.status == "regression"
    assert compare(fake_result(), fake_result(speed=1.2), metric="ttft_s.p99").passed


@pytest.mark.parametrize("text,frac", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125),
                                       (0.1, 0.1), ("0", 0.0)])
def test_parse_threshold(text, frac):
    assert parse_threshold(text) == pytest.approx(frac)


@pytest.mark.parametrize("text", ["5", "abc", "150%", "-1%"])
def test_parse_threshold_rejects(text):
    with pytest.raises(UserError):
        parse_threshold(text)


def test_bare_latency_gates_its_p50_explicitly(fake_result):
    # the gate's documented default statistic (results.accessor.with_default_statistic)
    r = fake_result()
    row = compare(r, r, metric="ttft_s").rows[0]
    assert row.metric == "ttft_s.p50" and row.new == r["metrics"]["ttft_s"]["p50"]


def test_gate_uses_median_of_repeats_and_reports_spread(fake_result):
    base = fake_result(repeat_speeds=(0.5, 1.0, 1.01))  # one very slow repeat
    new = fake_result(repeat_speeds=(1.0, 1.0, 1.0))
    base["metrics"]["output_tokens_per_s"] = 1.0  # must not be used while repeats exist
    res = compare(base, new)
    row = res.rows[0]
    assert row.source == "median of 3 repeats"
    assert row.baseline == pytest.approx(new["metrics"]["output_tokens_per_s"])
    assert res.passed
    vals = [r["output_tokens_per_s"] for r in base["repeats"]]
    assert row.baseline_spread["min"] == pytest.approx(min(vals))
    assert row.baseline_spread["max"] == pytest.approx(max(vals))
    assert any("vary by" in n for n in res.notes)  # the 0.5x repeat exceeds the 5% threshold


def test_gate_falls_back_to_metrics_without_repeats(fake_result):
    base, new = fake_result(), fake_result(speed=0.9)
    for r in (base, new):
        r["repeats"] = []
    res = compare(base, new)
    assert res.rows[0].source == "metrics"
    assert res.rows[0].baseline_spread == base["spread"]["output_tokens_per_s"]
    assert not res.passed


def test_normalize_mbu_ignores_a_busy_machine(fake_result):
    base = fake_result()
    new = fake_result(speed=0.9)
    # same bytes per token achieved at the same fraction of peak: not a code regression
    for tree in [new["metrics"], *new["repeats"]]:
        tree["decode"]["mbu"] = base["metrics"]["decode"]["mbu"]
    assert not compare(base, new).passed
    res = compare(base, new, normalize="mbu")
    assert res.passed and res.rows[0].metric == "decode.mbu"


def test_normalize_roofline_fraction(fake_result):
    base, new = fake_result(), fake_result(speed=0.9)
    new["prediction"]["output_tokens_per_s"] *= 0.9  # a slower calibrated profile
    res = compare(base, new, normalize="roofline_fraction")
    assert res.passed
    expected = base["metrics"]["output_tokens_per_s"] / base["prediction"]["output_tokens_per_s"]
    assert res.rows[0].baseline == pytest.approx(expected)
    base["prediction"] = {}
    with pytest.raises(ResultSchemaError, match="no prediction"):
        compare(base, new, normalize="roofline_fraction")


def test_normalize_reference(fake_result):
    base = fake_result(reference_gbs=17.0)
    new = fake_result(speed=0.9, reference_gbs=17.0 * 0.9)  # memory 10% slower this run
    assert compare(base, new, normalize="reference").passed
    new = fake_result(speed=0.9, reference_gbs=17.0)  # memory as fast, tokens slower
    assert not compare(base, new, normalize="reference").passed
    for tree in [new["metrics"], *new["repeats"]]:
        del tree["normalized"]
    with pytest.raises(ResultSchemaError, match="reference bandwidth"):
        compare(base, new, normalize="reference")


def test_different_scenario_names_the_key(fake_result):
    base, new = fake_result(batch_size=4), fake_result(batch_size=4)
    new["scenario"]["workload"]["prompt_len"] = 256
    with pytest.raises(UserError, match=r"scenario\.workload\.prompt_len"):
        compare(base, new)


def test_volatile_scenario_keys_are_ignored(fake_result):
    base, new = fake_result(), fake_result()
    new["scenario"]["measure"]["repeats"] = 9
    new["scenario"]["gate"] = {"metric": "output_tokens_per_s"}
    new["scenario"]["source"] = "/elsewhere/smoke.yaml"
    assert scenario_difference(base["scenario"], new["scenario"]) is None
    assert compare(base, new).passed


def test_schema_mismatch_and_missing_metric(fake_result):
    with pytest.raises(ResultSchemaError, match="schema_version"):
        compare(fake_result(), fake_result(schema_version=99))
    with pytest.raises(UserError, match="no_such_metric"):
        compare(fake_result(), fake_result(), metric="no_such_metric")
    with pytest.raises(UserError, match="--normalize"):
        compare(fake_result(), fake_result(), normalize="bogus")


def test_compare_many_matches_points(fake_result):
    base = [fake_result(point_index=i, batch_size=bs) for i, bs in enumerate((1, 4))]
    new = [fake_result(point_index=1, batch_size=4, speed=0.9),
           fake_result(point_index=0, batch_size=1)]
    res = compare_many(base, new)
    assert [r.status for r in res.rows] == ["regression", "ok"]
    assert res.exit_code == 1
    extra = fake_result(point_index=2, batch_size=8)
    with pytest.raises(UserError, match=r"smoke\[0\], smoke\[1\]"):
        compare_many(base, [*new, extra])


def test_gate_from_scenario(fake_result, result_file, tmp_path):
    base_path = result_file("baseline.json")
    out = io.StringIO()
    console = Console(file=out, width=200)
    gate = {"metric": "output_tokens_per_s", "baseline": str(base_path),
            "max_regression": 0.05, "normalize": "none"}
    assert gate_from_scenario(gate, [fake_result()], console) == 0
    assert gate_from_scenario(gate, [fake_result(speed=0.9)], console) == 1
    text = out.getvalue()
    assert "regression" in text and "-10.0%" in text and "PASS" in text
    missing = dict(gate, baseline=str(tmp_path / "nope.json"))
    with pytest.raises(UserError, match=r"nope\.json.*--out"):
        gate_from_scenario(missing, [fake_result()], console)


def test_gate_from_scenario_accepts_attribute_objects(fake_result, result_file):
    class Gate:
        metric = "tpot_s.p50"
        baseline = str(result_file("b.json"))
        max_regression = "5%"
        normalize = "none"

    console = Console(file=io.StringIO())
    slower = copy.deepcopy(fake_result(speed=0.9))
    assert gate_from_scenario(Gate(), [slower], console) == 1


def test_compare_many_rejects_duplicate_points(fake_result):
    base = [fake_result(point_index=0), fake_result(point_index=1, batch_size=8)]
    with pytest.raises(UserError, match="appears twice"):
        compare_many(base, [fake_result(point_index=0), fake_result(point_index=0)])


def test_scenario_keys_added_later_match_their_default() -> None:
    """A result recorded before the speculative draft keys existed equals a scenario holding
    their defaults, and only their defaults."""
    old = {"speculative": {"method": "none", "num_tokens": 4}}
    new = {"speculative": {"method": "none", "num_tokens": 4, "draft_model": None,
                           "draft_layers": None, "draft_quant": "none", "draft_group_size": 64,
                           "heads": None, "ngram_max": 4, "ngram_min": 1}}
    assert scenario_difference(old, new) is None
    new["speculative"]["draft_quant"] = "int4"
    assert scenario_difference(old, new) == "scenario.speculative.draft_quant"
    assert scenario_difference({"speculative": {}}, {"speculative": {"x": 1}}) == \
        "scenario.speculative.x"
