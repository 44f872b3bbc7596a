"""Measured-vs-predicted tables: error % math, the post-run table, Markdown and CSV output."""

from __future__ import annotations

import io
import math

import pandas as pd
import pytest
from rich.console import Console

from infbench.results.report import error_pct, report_frame, run_table, to_markdown, write_csv


@pytest.mark.parametrize("pred,meas,err", [(12.0, 10.0, 20.0), (8.0, 10.0, -20.0),
                                           (10.0, 10.0, 0.0), (None, 10.0, None),
                                           (5.0, 0.0, None), (5.0, None, None)])
def test_error_pct(pred, meas, err):
    got = error_pct(pred, meas)
    assert got == (pytest.approx(err) if err is not None else None)


def test_report_frame_values(fake_result):
    results = [fake_result(batch_size=1), fake_result(batch_size=8, point_index=1)]
    df = report_frame(results)
    assert list(df["batch_size"]) == [1, 8]
    for (_, row), r in zip(df.iterrows(), results, strict=True):
        m, p = r["metrics"], r["prediction"]
        step_m = m["decode"]["time_per_token_s"] * 1e3
        step_p = p["decode"]["time_per_token_s"] * 1e3
        assert row["decode_step_ms_measured"] == pytest.approx(step_m)
        assert row["decode_step_ms_predicted"] == pytest.approx(step_p)
        assert row["decode_step_error_pct"] == pytest.approx((step_p - step_m) / step_m * 100)
        # TPOT is the per-request metric (p50), not the decode step time
        assert row["tpot_ms_measured"] == pytest.approx(m["tpot_s"]["p50"] * 1e3)
        assert row["ttft_ms_measured"] == pytest.approx(m["ttft_s"]["p50"] * 1e3)
        tps_m, tps_p = m["output_tokens_per_s"], p["output_tokens_per_s"]
        assert row["output_tok_s_error_pct"] == pytest.approx((tps_p - tps_m) / tps_m * 100)
        assert row["decode_mbu_pct"] == pytest.approx(m["decode"]["mbu"] * 100)
    # the analytic decode is bandwidth-only, so it is faster than the fake engine: error < 0
    assert (df["decode_step_error_pct"] < 0).all()


def test_report_frame_without_prediction(fake_result):
    r = fake_result()
    r["prediction"] = {}
    df = report_frame([r])
    assert math.isnan(df.loc[0, "tpot_ms_predicted"])
    assert math.isnan(df.loc[0, "tpot_error_pct"])
    assert df.loc[0, "output_tok_s_measured"] == pytest.approx(
        r["metrics"]["output_tokens_per_s"])


def test_to_markdown_format():
    df = pd.DataFrame({"label": ["a|b", "c"], "tok_s": [1234.567, float("nan")],
                       "err_pct": [-12.3456, 0.01234]})
    lines = to_markdown(df).splitlines()
    assert lines[0] == "| label | tok_s | err_pct |"
    assert lines[1] == "| --- | ---: | ---: |"
    assert lines[2] == "| a\\|b | 1235 | -12.35 |"
    assert lines[3] == "| c |  | 0.01234 |"


def test_write_csv_roundtrip(fake_result, tmp_path):
    df = report_frame([fake_result()])
    path = tmp_path / "sub" / "report.csv"
    write_csv(df, path)
    back = pd.read_csv(path)
    assert list(back.columns) == list(df.columns)
    assert back.loc[0, "tpot_error_pct"] == pytest.approx(df.loc[0, "tpot_error_pct"])
    assert not list(path.parent.glob(".*tmp"))  # no temp file left behind


def test_run_table_cells(fake_result):
    r = fake_result(batch_size=4)
    table = run_table([r, fake_result(batch_size=8, point_index=1)])
    assert table.row_count == 2
    out = io.StringIO()
    Console(file=out, width=250).print(table)
    text = out.getvalue()
    m = r["metrics"]
    assert f"{m['output_tokens_per_s']:,.1f}" in text
    assert f"{m['ttft_s']['p50'] * 1e3:,.1f}" in text
    assert f"{m['decode']['mbu'] * 100:,.1f}" in text
    assert f"{r['prediction']['output_tokens_per_s']:,.1f}" in text
    assert "workload.batch_size=8" in text


def test_report_table_cells(fake_result):
    from infbench.results.report import report_table

    r = fake_result(batch_size=4)
    out = io.StringIO()
    Console(file=out, width=200).print(report_table(report_frame([r])))
    text = out.getvalue()
    tm = r["metrics"]["decode"]["time_per_token_s"] * 1e3
    tp = r["prediction"]["decode"]["time_per_token_s"] * 1e3
    assert f"{tm:.1f} / {tp:.1f} {(tp - tm) / tm * 100:+.0f}%" in text
    assert "batch_size=4" in text and "workload." not in text
