"""Hardware profiles: one schema for built-in and calibrated specs; bad files are one line, exit 2.

`infbench predict --hardware X` takes a table name, `local` or another profile name
under $INFBENCH_HOME/hardware/, or a path to a profile .json.  Zero, negative, NaN or
list-valued numbers, malformed curves and damaged files (truncated, not JSON, not
UTF-8) must print one `error:` line naming the file and the key, never a traceback.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from cli_helpers import run_cli

from infbench.core.errors import ConfigError, UserError
from infbench.hardware.spec import HARDWARE, HardwareSpec, get_hardware, load_profile

GOOD: dict[str, Any] = {
    "name": "box", "description": "a test box", "kind": "cpu", "source": "hand-written",
    "peak_flops": {"float32": 100e9, "bfloat16": 200e9}, "bandwidth": 20e9,
    "memory_bytes": 24e9,
    "extra": {"matmul_flops_by_tokens": {"float32": [[1, 10e9], [16, 50e9], [256, 90e9]]},
              "step_overhead_s": 1e-4, "layer_overhead_s": 1e-5, "seq_layer_overhead_s": 0.0,
              "device": "cpu", "quick": True, "read_bytes_per_s": 20e9,
              "gemm_flops_per_s": {"float32": {"128": 50e9}}, "gemv_shape": [2048, 4096],
              "torch_threads": 2, "timestamp": "2026-11-30T00:00:00+0000"},
}


def _profile(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return data


_DELETE = object()


def _predict_error(monkeypatch, capsys, hardware: str) -> str:
    code, out, err = run_cli(monkeypatch, capsys, "predict", "--model", "tiny", "--dtype",
                             "float32", "--hardware", hardware)
    assert code == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    return lines[0]


def test_good_profile_predicts_by_path_and_by_name(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "box.json"
    path.write_text(json.dumps(GOOD))
    code, out, err = run_cli(monkeypatch, capsys, "predict", "--model", "tiny", "--dtype",
                             "float32", "--hardware", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)[0]["hardware"] == "box"
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "hardware").mkdir(parents=True)
    (tmp_path / "home" / "hardware" / "mybox.json").write_text(json.dumps(GOOD))
    assert get_hardware("mybox").peak_at("float32", 16) == 50e9


# (key path with __ between levels, value, what the one line must say)
BAD_VALUES = [
    ("bandwidth", 0, "bandwidth: must be a finite number > 0"),
    ("bandwidth", -3.35e12, "bandwidth: must be a finite number > 0"),
    ("bandwidth", float("nan"), "bandwidth: must be a finite number > 0, got nan"),
    ("bandwidth", float("inf"), "bandwidth: must be a finite number > 0, got inf"),
    ("bandwidth", "fast", "bandwidth: must be a finite number > 0"),
    ("bandwidth", True, "bandwidth: must be a finite number > 0"),
    ("memory_bytes", 0, "memory_bytes: must be a finite number > 0"),
    ("peak_flops__float32", 0, "peak_flops.float32: must be a finite number > 0"),
    ("peak_flops__float32", float("nan"), "peak_flops.float32: must be a finite number > 0"),
    ("peak_flops__float32", -1e12, "peak_flops.float32: must be a finite number > 0"),
    ("peak_flops", [1e12], "peak_flops: must be a JSON object (dtype -> FLOP/s)"),
    ("peak_flops", {}, "peak_flops"),
    ("peak_flops__fp32", 1e12, "peak_flops.fp32: unknown dtype 'fp32'; allowed: float32"),
    ("kind", "tpu", "kind: unknown value 'tpu'; allowed: gpu, cpu"),
    ("bandwith", 3e12, "bandwith: unknown key; allowed: name, description, peak_flops"),
    ("bandwidth", _DELETE, "bandwidth: required key is missing"),
    ("extra__step_overhead", 1e-3, "extra.step_overhead: unknown key; allowed:"),
    ("extra__step_overhead_s", -1e-3, "extra.step_overhead_s: must be a finite number >= 0"),
    ("extra__matmul_flops_by_tokens__float32", [[16, 5e9], [1, 1e9]],
     "rows must increase strictly"),
    ("extra__matmul_flops_by_tokens__float32", [[1, 5e9, 3]],
     "extra.matmul_flops_by_tokens.float32[0]: must be a list of [rows, FLOP/s] pairs"),
    ("extra__matmul_flops_by_tokens__float32", [[1, 0]],
     "extra.matmul_flops_by_tokens.float32[0]"),
    ("extra__matmul_flops_by_tokens__float32", "1,2",
     "extra.matmul_flops_by_tokens.float32: must be a list of [rows, FLOP/s] pairs"),
    ("extra__matmul_flops_by_tokens__fp64", [[1, 1e9]],
     "extra.matmul_flops_by_tokens.fp64: unknown dtype 'fp64'"),
]


@pytest.mark.parametrize("key,value,says", BAD_VALUES,
                         ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD_VALUES])
def test_bad_profile_values_are_one_line(key, value, says, tmp_path, monkeypatch,
                                         capsys) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_profile(**{key: value})))
    line = _predict_error(monkeypatch, capsys, str(path))
    assert str(path) in line and says in line, line


@pytest.mark.parametrize("content,says", [
    (b'{"name": "box", "peak_flops": {"float32": 1e11}, "bandw', "truncated JSON"),
    (b"", "not JSON"),
    (b"hello, world", "not JSON"),
    (b'{"name": "b\xff\xfe"}', "not UTF-8"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
    (b"[1, 2, 3]", "expected a JSON object"),
    (b"null", "expected a JSON object"),
], ids=["truncated", "empty", "text", "latin1", "binary", "list", "null"])
def test_damaged_profile_files_are_one_line(content, says, tmp_path, monkeypatch,
                                            capsys) -> None:
    path = tmp_path / "damaged.json"
    path.write_bytes(content)
    line = _predict_error(monkeypatch, capsys, str(path))
    assert str(path) in line and says in line, line


def test_named_profile_in_infbench_home_is_validated(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path))
    (tmp_path / "hardware").mkdir()
    local = tmp_path / "hardware" / "local.json"
    local.write_text(json.dumps(_profile(bandwidth=0)))
    line = _predict_error(monkeypatch, capsys, "local")
    assert str(local) in line and "bandwidth" in line
    local.write_bytes(b'{"name": "local", "peak_fl')
    assert "truncated JSON" in _predict_error(monkeypatch, capsys, "local")
    assert "does not exist" in _predict_error(monkeypatch, capsys, str(tmp_path / "nope.json"))


def test_the_same_rule_in_the_dataclass() -> None:
    for spec in HARDWARE.values():  # the built-in table passes its own rule
        assert spec.bandwidth > 0 and all(math.isfinite(v) for v in spec.peak_flops.values())
    ok = dict(name="x", description="", peak_flops={"float32": 1e12}, bandwidth=1e12,
              memory_bytes=8e9)
    HardwareSpec(**ok)
    for change, says in [
        (dict(bandwidth=0.0), "bandwidth must be a finite number > 0"),
        (dict(bandwidth=-1.0), "bandwidth must be a finite number > 0"),
        (dict(bandwidth=float("nan")), "bandwidth must be a finite number > 0"),
        (dict(memory_bytes=float("inf")), "memory_bytes must be a finite number > 0"),
        (dict(peak_flops={"float32": 0.0}), "peak_flops.float32 must be a finite number > 0"),
        (dict(peak_flops=[1e12]), "peak_flops must be a non-empty mapping"),
        (dict(peak_flops={"fp32": 1e12}), "peak_flops.fp32 is not a known dtype"),
        (dict(kind="tpu"), "kind unknown value 'tpu'"),
        (dict(extra={"step_overhead_s": float("nan")}), "extra.step_overhead_s"),
        (dict(extra={"matmul_flops_by_tokens": {"float32": [[4, 1e9], [2, 2e9]]}}),
         "rows must increase strictly"),
        (dict(extra={"matmul_flops_by_tokens": {"float32": [[1, -1e9]]}}),
         r"\[0\] must be a \[rows, FLOP/s\] pair"),
    ]:
        with pytest.raises(ConfigError, match=says):
            HardwareSpec(**(ok | change))


def test_load_profile_round_trips_what_calibrate_writes(tmp_path) -> None:
    """save_profile writes asdict(spec): load_profile must read it back unchanged."""
    from dataclasses import asdict

    spec = HardwareSpec(**{k: v for k, v in GOOD.items()})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(asdict(spec), indent=2, sort_keys=True))
    loaded = load_profile(path)
    # to_dict() is what a result file records (no interconnect: a run uses one device)
    assert asdict(loaded) == json.loads(path.read_text())
    with pytest.raises(UserError, match="cannot read"):
        load_profile(tmp_path)  # a directory
