"""The result schema: committed results validate, version 1 upgrades, errors name the field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import tiny_scenario

from infbench.core.errors import ResultSchemaError
from infbench.results.schema import SCHEMA_VERSION, RunResult, json_schema, upgrade, validate
from infbench.results.store import build_result, load_result, write_json_atomic

REPO = Path(__file__).resolve().parents[2]
# Every committed result (the run manifests beside them are not results).
BASELINES = sorted(p for p in (REPO / "results" / "baselines").rglob("*.json")
                   if p.name != "manifest.json")
# A version-1 result, as committed before the typed schema: the upgrade path's fixture.
BASELINE = Path(__file__).resolve().parent / "data" / "v1_ci_baseline" / "ci_gate_000.json"


def _baseline() -> dict[str, Any]:
    return json.loads(BASELINE.read_text())


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "x.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_baselines_exist() -> None:
    assert BASELINES, "results/baselines holds no JSON: the gate has nothing to compare with"


@pytest.mark.parametrize("path", BASELINES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_committed_result_loads_and_validates(path: Path) -> None:
    doc = json.loads(path.read_text())
    if doc.get("kind") != "infbench.run":  # a run directory's manifest.json
        pytest.skip(f"{path.name} is a {doc.get('kind')!r}, not a result")
    loaded = load_result(path)
    assert loaded["schema_version"] == SCHEMA_VERSION
    model = validate(loaded)
    # the typed view and the dict agree on the numbers readers use
    assert model.metrics.output_tokens_per_s == loaded["metrics"]["output_tokens_per_s"]
    assert model.metrics.ttft_s is not None
    assert model.metrics.ttft_s.model_extra == {
        k: v for k, v in loaded["metrics"]["ttft_s"].items() if k != "mean"}


def test_version_1_upgrades_in_memory_without_touching_numbers(tmp_path: Path) -> None:
    old = _baseline()
    assert old["schema_version"] == 1 and "engine_disabled" not in old
    new = upgrade(old)
    assert old["schema_version"] == 1  # the input is not modified
    assert new["schema_version"] == 2
    assert new["engine_disabled"] == [] and new["requests"] == [] and new["telemetry"] == {}
    for key in ("metrics", "prediction", "repeats", "spread", "steps"):
        assert new[key] == old[key]
    # the scenario gains only which weights ran (version 1 ran presets with random weights)
    assert "weights" not in old["scenario"]["model"]
    assert new["scenario"]["model"] == {**old["scenario"]["model"], "weights": "random"}
    assert {k: v for k, v in new["scenario"].items() if k != "model"} == {
        k: v for k, v in old["scenario"].items() if k != "model"}
    validate(new)
    assert load_result(_write(tmp_path, old))["schema_version"] == 2


@pytest.mark.parametrize("version", [0, 3, "1", None])
def test_other_versions_are_one_line_errors(tmp_path: Path, version: Any) -> None:
    path = _write(tmp_path, {**_baseline(), "schema_version": version})
    with pytest.raises(ResultSchemaError) as info:
        load_result(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: result schema_version {version}, expected 2")
    assert "\n" not in msg


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is _DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


_DELETE = object()
FIELD_ERRORS = [
    ("metrics.ttft_s.p50", "fast", "metrics.ttft_s.p50: input should be a valid number"),
    ("metrics.ttft_s.median", 0.1, "metrics.ttft_s: unknown statistic 'median'"),
    ("metrics.output_tokens_per_sec", 1.0,
     "metrics.output_tokens_per_sec: unknown field (renamed or misspelled?)"),
    ("metrics.num_steps", True, "metrics.num_steps: input should be a valid integer"),
    ("metrics.decode.mbu", "0.4", "metrics.decode.mbu: input should be a valid number"),
    ("repeats.1.tpot_s.p99", [1], "repeats.1.tpot_s.p99: input should be a valid number"),
    ("steps.3.duration_s", {}, "steps.3.duration_s: input should be a valid number"),
    ("prediction.tpot", 0.1, "prediction.tpot: unknown field"),
    ("spread.output_tokens_per_s.median", 1.0, "spread.output_tokens_per_s.median: unknown"),
    ("hardware.bandwidth", "fast", "hardware.bandwidth: input should be a valid number"),
    ("env.cpu_count", "two", "env.cpu_count: input should be a valid integer"),
    ("seed", _DELETE, "seed: field required"),
    ("unexpected", 1, "unexpected: unknown field"),
]


@pytest.mark.parametrize(("where", "value", "expected"), FIELD_ERRORS,
                         ids=[f[0] for f in FIELD_ERRORS])
def test_a_bad_field_is_an_error_naming_file_and_path(tmp_path: Path, where: str, value: Any,
                                                      expected: str) -> None:
    doc = upgrade(_baseline())
    _set(doc, where, value)
    path = _write(tmp_path, doc)
    with pytest.raises(ResultSchemaError) as info:
        load_result(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: {expected}"), msg
    assert "\n" not in msg


def test_fields_being_added_by_the_engine_are_accepted() -> None:
    doc = upgrade(_baseline())
    doc["requests"] = [{
        "id": "r0", "arrival_s": 0.0, "first_token_s": 0.01, "finish_s": 0.05,
        "itl_s": [0.01, 0.02], "num_prompt_tokens": 64, "num_output_tokens": 3,
        "num_cached_prompt_tokens": 0, "num_preemptions": 0, "finish_reason": "length"}]
    doc["metrics"]["noise"] = {"cv": {"output_tokens_per_s": 0.02, "tpot_s.p50": None},
                               "warnings": ["reference bandwidth is 40% off"]}
    doc["metrics"]["ttft_s"] = {"mean": 0.1, "p50": 0.1, "p95": 0.2, "p99.9": 0.3, "p90": None}
    doc["prediction"]["decode_tokens_per_s"] = 1200.0
    doc["prediction"]["output_tokens_per_s"] = 1000.0
    doc["engine_disabled"] = [{"feature": "cuda_graphs", "reason": "CPU run"}]
    model = validate(doc)
    assert model.requests[0].itl_s == [0.01, 0.02]
    assert model.metrics.noise is not None and model.metrics.noise.cv["tpot_s.p50"] is None
    bad = copy.deepcopy(doc)
    bad["requests"][0]["arrival"] = 0.0
    with pytest.raises(Exception, match="requests.0.arrival"):
        validate(bad)


def test_build_result_validates_before_anything_is_written(tmp_path: Path) -> None:
    doc = _baseline()
    core = {k: doc[k] for k in ("metrics", "prediction", "steps", "env", "seed", "hardware",
                                "repeats", "spread")}
    good = build_result(doc["scenario"], **core)
    assert good["schema_version"] == SCHEMA_VERSION
    target = tmp_path / "r.json"
    write_json_atomic(target, good)
    before = target.read_bytes()
    broken = {**core, "metrics": {**doc["metrics"], "ttft": doc["metrics"]["ttft_s"]}}
    with pytest.raises(ResultSchemaError, match=r"^build_result: metrics\.ttft: unknown field"):
        write_json_atomic(target, build_result(doc["scenario"], **broken))
    assert target.read_bytes() == before


def test_exported_json_schema_describes_the_result_file() -> None:
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert schema["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert "model_config" in schema["properties"]  # the file's key, not the Python name
    required = set(schema["required"])
    assert {"schema_version", "kind", "metrics", "prediction", "steps", "seed"} <= required
    defs = schema["$defs"]
    for name in ("Metrics", "LatencyStats", "Prediction", "Step", "RequestRow", "Spread",
                 "Env", "Hardware", "Noise", "EngineDisabled"):
        assert name in defs, name
    assert defs["Metrics"]["additionalProperties"] is False
    assert defs["Env"].get("additionalProperties", True) is not False  # open on purpose
    stats = defs["LatencyStats"]
    assert stats["propertyNames"]["pattern"] == r"^(mean|p\d+(\.\d+)?)$"
    assert set(defs["RequestRow"]["required"]) >= {"id", "arrival_s", "num_prompt_tokens",
                                                   "num_output_tokens", "finish_reason"}
    # every Metrics field of the baseline is declared by the export
    assert set(_baseline()["metrics"]) <= set(defs["Metrics"]["properties"])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infbench.cli", *args], capture_output=True,
                          text=True, check=False)


def test_schema_command_prints_and_writes_the_result_schema(tmp_path: Path) -> None:
    res = _cli("schema", "--results")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == json_schema()
    out = tmp_path / "sub" / "result.schema.json"
    res = _cli("schema", "--results", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text()) == RunResult.model_json_schema(by_alias=True)
    scenario = _cli("schema")  # the default is still the scenario file's schema
    assert scenario.returncode == 0 and "Scenario" in json.loads(scenario.stdout)["title"]
    bad = _cli("schema", "--results", "--out", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.startswith("error:")


TINY = tiny_scenario("tiny_schema", batch_size="3", warmup=1, repeats=2)


def test_a_fresh_result_validates_against_the_exported_schema(tmp_path: Path) -> None:
    """No jsonschema package in the venv: validate through the model, and check that every
    key the fresh file has is one the exported schema declares (the export's structure)."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TINY)
    res = _cli("run", str(scenario), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "out" / "tiny_schema_000.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    validate(doc)
    schema = json_schema()
    defs = schema["$defs"]
    assert set(doc) <= set(schema["properties"])
    assert set(doc["metrics"]) <= set(defs["Metrics"]["properties"])
    assert set(doc["prediction"]) <= set(defs["Prediction"]["properties"])
    for step in doc["steps"]:
        assert set(step) <= set(defs["Step"]["properties"])
    for row in doc["requests"]:
        assert set(row) <= set(defs["RequestRow"]["properties"])
    assert len(doc["requests"]) == 3
