"""Predictions carry the measured metrics' names with the same definitions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infbench.core.config import ModelConfig
from infbench.hardware.spec import HardwareSpec
from infbench.measure.prediction import predict_point
from infbench.roofline.analysis import predict
from infbench.scenario.schema import load_scenario

# A round-number machine so the decode step of the tiny model is easy to reason about.
HW = HardwareSpec("round", "test machine", {"float32": 1e12, "bfloat16": 1e12}, 100e9, 64e9)


def _point(tmp_path: Path, workload: dict[str, object], max_num_seqs: int = 2) -> object:
    doc = {"name": "pred", "device": "cpu", "dtype": "float32", "hardware": "cpu",
           "model": {"preset": "tiny"}, "workload": workload,
           "engine": {"max_num_seqs": max_num_seqs}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path).points()[0]


def test_prediction_names_and_definitions_on_a_known_case(tmp_path: Path) -> None:
    # 5 requests, at most 2 at a time: 3 waves of batch 2 back to back.
    point = _point(tmp_path, {"kind": "offline", "num_requests": 5, "prompt_len": 32,
                              "gen_len": 9})
    cfg = ModelConfig.from_name("tiny")
    d = predict_point(point, cfg, HW)
    p = predict(cfg, HW, batch=2, prompt_len=32, gen_len=9, dtype="float32")
    assert d["waves"] == 3 and d["batch"] == 2
    assert d["overlap"] == p.overlap == "full"  # a datasheet entry: the lecture's model
    assert d["ttft_s"] == p.ttft_s and d["e2e_s"] == p.e2e_s
    # TPOT = (E2E - TTFT) / (output tokens - 1), as measured per request
    assert d["tpot_s"] == (d["e2e_s"] - d["ttft_s"]) / 8
    assert d["tpot_s"] == pytest.approx(p.time_per_token_s)
    # decode only: batch / decode step time
    assert d["decode_tokens_per_s"] == pytest.approx(2 / p.decode.time_s)
    assert d["decode_tokens_per_s"] * d["tpot_s"] == pytest.approx(2)
    # end to end: output tokens / predicted wall time of the whole workload (prefill included)
    assert d["output_tokens_per_s"] == pytest.approx(5 * 9 / (3 * p.e2e_s))
    assert d["total_tokens_per_s"] == pytest.approx(5 * (32 + 9) / (3 * p.e2e_s))
    assert d["output_tokens_per_s"] < d["decode_tokens_per_s"]
    assert "tokens_per_s" not in d and "tokens_per_s" not in d["decode"]


def test_one_output_token_has_no_tpot(tmp_path: Path) -> None:
    point = _point(tmp_path, {"kind": "static", "batch_size": 1, "prompt_len": 16,
                              "gen_len": 1})
    d = predict_point(point, ModelConfig.from_name("tiny"), HW)
    assert d["tpot_s"] is None  # as the measured tpot_s: no samples -> None
    assert d["output_tokens_per_s"] == pytest.approx(1 / d["e2e_s"])


def test_predict_json_carries_the_same_names() -> None:
    cfg = ModelConfig.from_name("tiny")
    d = predict(cfg, HW, batch=4, prompt_len=16, gen_len=5, dtype="float32").to_dict()
    assert d["tpot_s"] == (d["e2e_s"] - d["ttft_s"]) / 4
    assert d["output_tokens_per_s"] == pytest.approx(4 * 5 / d["e2e_s"])
    assert d["decode_tokens_per_s"] == pytest.approx(4 / d["decode"]["time_per_token_s"])


def test_poisson_has_no_roofline_but_a_simulation(tmp_path: Path) -> None:
    point = _point(tmp_path, {"kind": "poisson", "num_requests": 4, "rate": 2.0})
    d = predict_point(point, ModelConfig.from_name("tiny"), HW)
    assert set(d) == {"hardware", "note", "metrics"}  # the roofline prices no queueing
    assert d["note"].startswith("roofline not priced: Poisson arrivals")
    assert d["metrics"]["num_requests"] == 4 and d["metrics"]["ttft_s"]["p50"] > 0
