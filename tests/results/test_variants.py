"""One row per scenario variant (results/variants.py), its table in `report`, and the
speed-versus-perplexity figure of `plots`."""

from __future__ import annotations

import json
from typing import Any

from cli_helpers import run_cli

from infbench.plots.measured import accuracy_speed_figure
from infbench.results.variants import variant_of, variant_rows, variant_table


def _result(variant: str | None, batch: int, tokens: float, time_s: float,
            ppl: float | None = None) -> dict[str, Any]:
    swept: dict[str, Any] = {"batch_size": batch}
    if variant is not None:
        swept = {"variant": variant, **swept}
    r: dict[str, Any] = {
        "name": "q", "label": ",".join(f"{k}={v}" for k, v in swept.items()),
        "scenario": {"dtype": "float32", "swept": swept, "workload": {"batch_size": batch}},
        "metrics": {"weight_bytes": 1e6 if variant == "a" else 5e5, "kv_bytes_per_token": 100,
                    "decode": {"num_tokens": tokens, "time_s": time_s}},
    }
    if ppl is not None:
        r["accuracy"] = {"perplexity": ppl, "perplexity_change": ppl / 10 - 1,
                         "greedy_agreement": 0.9}
    return r


def test_rows_group_by_variant_and_batch():
    results = [_result("a", 1, 60, 1.0), _result("a", 16, 320, 1.0),
               _result("b,c=1", 1, 90, 1.0, ppl=11.0), _result("b,c=1", 16, 400, 1.0, ppl=11.0),
               _result(None, 1, 10, 1.0)]
    assert variant_of(results[2]) == "b,c=1" and variant_of(results[4]) is None
    rows = variant_rows(results)
    assert [r["variant"] for r in rows] == ["a", "b,c=1"]
    assert rows[0]["decode_tokens_per_s"] == {1: 60.0, 16: 320.0}
    assert rows[0]["perplexity"] is None
    assert rows[1]["perplexity"] == 11.0
    assert abs(rows[1]["perplexity_change"] - 0.1) < 1e-12
    table = variant_table(rows)
    assert [c.header for c in table.columns][4:6] == ["decode tok/s b=1", "decode tok/s b=16"]
    assert table.row_count == 2


def test_figure_only_with_accuracy(tmp_path):
    assert accuracy_speed_figure([_result("a", 1, 60, 1.0)], tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()
    out = accuracy_speed_figure([_result("a", 1, 60, 1.0, ppl=10.0),
                                 _result("b", 1, 90, 1.0, ppl=12.0),
                                 _result("b", 16, 400, 2.0, ppl=12.0)], tmp_path / "x.png")
    assert out is not None and (tmp_path / "x.png").stat().st_size > 0
    assert {(p["variant"], p["batch_size"]) for p in out["points"]} == {("a", 1), ("b", 1),
                                                                          ("b", 16)}
    assert out["legend"] == ["batch 1", "batch 16"]


def test_report_prints_the_variant_table(tmp_path, monkeypatch, capsys):
    scenario = tmp_path / "v.yaml"
    scenario.write_text("""
name: v
device: cpu
dtype: float32
hardware: cpu
model: {preset: tiny, overrides: {max_seq_len: 64}}
workload: {kind: static, batch_size: [1, 2], prompt_len: 8, gen_len: 4, seed: 0}
engine: {block_size: 4, max_num_batched_tokens: 32}
measure: {warmup: 0, repeats: 1}
variants:
  - {label: plain}
  - {label: int4, model.quant: {weights: int4, group_size: 32}}
""")
    out_dir = tmp_path / "out"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out", str(out_dir))
    assert code == 0, err
    labels = sorted(json.loads(p.read_text())["label"] for p in out_dir.glob("v_*.json"))
    assert labels == ["variant=int4,batch_size=1", "variant=int4,batch_size=2",
                      "variant=plain,batch_size=1", "variant=plain,batch_size=2"]
    code, out, err = run_cli(monkeypatch, capsys, "report", str(out_dir))
    assert code == 0, err
    assert "variants: bytes, speed and accuracy" in out
    assert "int4" in out and "plain" in out
