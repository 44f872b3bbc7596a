"""Result files: building, atomic writes, schema checks, CSV rows, environment."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

from infbench.core.errors import ResultSchemaError
from infbench.results.store import (
    SCHEMA_VERSION,
    build_result,
    env_info,
    flatten_for_csv,
    load_result,
    write_csv_atomic,
    write_json_atomic,
)

POINT = {"name": "demo", "index": 2, "label": "batch_size=8", "device": "cpu",
         "dtype": "float32", "hardware": "cpu", "swept": {"batch_size": 8}}
METRICS = {"ttft_s": {"mean": 0.1, "p50": 0.1, "p90": 0.2, "p99": 0.3},
           "tpot_s": {"mean": 0.01, "p50": 0.01, "p90": 0.02, "p99": 0.03},
           "output_tokens_per_s": 123.4, "num_requests": 8, "kv_fragmentation": None}


def make(**extra: object) -> dict:
    return build_result(POINT, metrics=METRICS, prediction={"ttft_s": 0.05, "tpot_s": 0.008,
                                                            "output_tokens_per_s": 150.0},
                        steps=[{"index": 0}], env={"device": "cpu", "git_sha": "abc"}, seed=7,
                        hardware={"name": "cpu"}, repeats=[METRICS], spread={},
                        extra=dict(extra) or None)


def test_build_result_has_the_contract_keys() -> None:
    r = make(model_config={"hidden_size": 64})
    assert r["schema_version"] == SCHEMA_VERSION and r["kind"] == "infbench.run"
    assert (r["name"], r["label"], r["point_index"], r["seed"]) == ("demo", "batch_size=8", 2, 7)
    for key in ("scenario", "env", "hardware", "metrics", "prediction", "repeats", "spread",
                "steps"):
        assert key in r
    assert r["model_config"] == {"hidden_size": 64}
    with pytest.raises(ValueError, match="core result keys"):
        make(metrics={})


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "r.json"
    result = make()
    # numpy values and NaN in schema fields (a copy: METRICS is shared by the other tests)
    result["metrics"] = {**result["metrics"], "output_tokens_per_s": np.float64(2.5),
                         "kv_fragmentation": float("nan")}
    result["steps"] = [{"index": 0, "context_lens": np.arange(3)}]
    write_json_atomic(path, result)
    loaded = load_result(path)
    assert loaded["metrics"]["output_tokens_per_s"] == 2.5
    assert loaded["steps"][0]["context_lens"] == [0, 1, 2]
    assert loaded["metrics"]["kv_fragmentation"] is None  # strict JSON: no NaN
    assert loaded["scenario"] == POINT
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_atomic_write_keeps_the_old_file_when_serialization_fails(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, make())
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["r.json"]  # no temp file left behind


def test_atomic_write_cleans_up_when_the_write_fails(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, {"v": 1})

    def broken_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["r.json"]


def test_load_result_errors(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(ResultSchemaError, match=f"{missing}: no such result file"):
        load_result(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ResultSchemaError, match="not JSON"):
        load_result(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ResultSchemaError, match="not an infbench result"):
        load_result(other)
    old = tmp_path / "old.json"
    write_json_atomic(old, {**make(), "schema_version": 0})
    with pytest.raises(ResultSchemaError) as info:
        load_result(old)
    msg = str(info.value)
    assert msg.startswith(str(old)) and "schema_version 0, expected 2" in msg
    assert "\n" not in msg


def test_flatten_for_csv() -> None:
    row = flatten_for_csv(make())
    assert row["name"] == "demo" and row["label"] == "batch_size=8" and row["batch_size"] == 8
    assert row["output_tokens_per_s"] == 123.4 and row["num_requests"] == 8
    assert row["ttft_s_p50"] == 0.1 and row["ttft_s_p99"] == 0.3 and row["tpot_s_p99"] == 0.03
    assert row["pred_ttft_s"] == 0.05 and row["pred_tpot_s"] == 0.008
    assert row["pred_output_tokens_per_s"] == 150.0
    assert row["kv_fragmentation"] is None and row["git_sha"] == "abc"
    assert not any(isinstance(v, dict) for v in row.values())


def test_csv_atomic_union_of_columns(tmp_path: Path) -> None:
    path = tmp_path / "out" / "rows.csv"
    write_csv_atomic(path, [{"a": 1, "b": None}, {"a": 2, "c": [1, 2]}])
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows == [{"a": "1", "b": "", "c": ""}, {"a": "2", "b": "", "c": "[1, 2]"}]


def test_env_info_describes_the_machine() -> None:
    env = env_info("cpu")
    for key in ("device", "device_name", "python", "platform", "host", "cpu_count", "packages",
                "infbench_version", "git_sha", "git_dirty", "timestamp"):
        assert key in env
    assert env["device"] == "cpu" and env["device_name"]
    assert set(env["packages"]) == {"torch", "triton", "transformers", "numpy"}
    assert env["packages"]["numpy"] == np.__version__
    assert env["timestamp"].endswith("+00:00")
    if env["git_sha"] is not None:
        sha = env["git_sha"].removesuffix("-dirty")
        assert len(sha) == 40 and env["git_sha"].endswith("-dirty") == env["git_dirty"]
    json.dumps(env)
