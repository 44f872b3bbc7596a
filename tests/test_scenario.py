"""Scenario loading: validation messages, --set overrides, sweep expansion, shipped files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infbench.core.config import EngineConfig, ModelConfig
from infbench.core.errors import UserError
from infbench.scenario.point import ScenarioPoint, WorkloadPoint
from infbench.scenario.schema import Scenario, load_scenario, scenario_json_schema

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "x.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path, sets: tuple[str, ...] = ()) -> str:
    with pytest.raises(UserError) as info:
        load_scenario(path, sets)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------ minimal file and defaults
def test_minimal_file_is_valid(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, "name: x\nmodel: {preset: tiny}\n"))
    (point,) = sc.points()
    assert isinstance(point, ScenarioPoint)
    assert point.label == "default" and point.swept == {} and point.index == 0
    assert point.workload == WorkloadPoint()
    assert point.engine == EngineConfig()
    assert point.gate is None
    assert point.model_source() == {"preset": "tiny"}
    assert point.model_config() == ModelConfig.from_name("tiny")
    json.dumps(point.to_dict())  # JSON-able


def test_hardware_and_dtype_defaults_follow_the_device(tmp_path: Path, monkeypatch) -> None:
    from infbench.core import device

    for flags, dtype in ((frozenset({"avx2", "fma"}), "float32"),
                         (frozenset({"avx512f", "avx512_bf16"}), "bfloat16"),
                         (frozenset({"amx_tile", "amx_bf16"}), "bfloat16")):
        monkeypatch.setattr(device, "cpu_flags", lambda flags=flags: flags)
        cpu = load_scenario(write(tmp_path, "name: x\ndevice: cpu\nmodel: {preset: tiny}\n"))
        point = cpu.points()[0]
        assert (point.hardware, point.dtype) == ("auto", dtype)  # this machine
        assert point.dtype_reason.startswith(f"dtype auto -> {dtype} (CPU has ")
        assert ("native bf16" in point.dtype_reason) == (dtype == "bfloat16")
    # CUDA with no hardware: the entry of the GPU NVML names, never a silent H100
    from infbench.hardware import spec as hardware

    monkeypatch.setattr(hardware, "nvml_device_name", lambda index=0: "NVIDIA H200")
    gpu = load_scenario(write(tmp_path, "name: x\ndevice: cuda\nmodel: {preset: tiny}\n"))
    assert (gpu.points()[0].hardware, gpu.points()[0].dtype) == ("h200", "bfloat16")
    assert gpu.hardware is None  # the raw value is kept; the point resolves it
    for name, says in ((None, "no GPU could be identified"),
                       ("Tesla T4", "GPU 'Tesla T4' has no entry in the hardware table; run "
                                    "`infbench calibrate`")):
        monkeypatch.setattr(hardware, "nvml_device_name", lambda index=0, name=name: name)
        with pytest.raises(UserError, match=says):
            gpu.points()
    explicit = load_scenario(write(
        tmp_path, "name: x\ndevice: cpu\nhardware: l40s\ndtype: float16\nmodel: {preset: tiny}\n"))
    assert (explicit.points()[0].hardware, explicit.points()[0].dtype) == ("l40s", "float16")
    assert explicit.points()[0].dtype_reason == ""  # nothing was chosen for the user


def test_model_overrides_attention_and_quant(tmp_path: Path) -> None:
    path = write(tmp_path, """
name: x
model:
  preset: llama3-8b
  overrides: {num_layers: 2}
  attention: {kind: gqa, kv_heads: 4}
  quant: {weights: int4, group_size: 64, kv: fp8}
""")
    point = load_scenario(path).points()[0]
    cfg = point.model_config()
    assert cfg.num_layers == 2 and cfg.kv_heads == 4 and cfg.hidden_size == 4096
    quant = point.quant_config()
    assert (quant.weights, quant.group_size, quant.kv) == ("int4", 64, "fp8")
    assert point.model is not None
    assert point.model.changes()["attention"] == {"kind": "gqa", "kv_heads": 4}


# ------------------------------------------------------------------ error messages
def test_unknown_key_names_file_key_and_allowed(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny}\nworkload: {batchsize: 8}\n")
    msg = error_of(path)
    assert msg.startswith(f"{path}: workload.batchsize: unknown key")
    assert "did you mean batch_size?" in msg
    assert "allowed: batch_size, burstiness, chat, dataset, gen_len" in msg


def test_negative_batch_size(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny}\nworkload: {batch_size: -1}\n")
    assert error_of(path) == f"{path}: workload.batch_size: must be > 0 (got -1)"


def test_bad_value_inside_a_list_names_its_index(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny}\nworkload: {batch_size: [1, 0]}\n")
    assert error_of(path) == f"{path}: workload.batch_size[1]: must be > 0 (got 0)"


def test_unknown_literal_lists_allowed_values(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny}\nworkload: {kind: burst}\n")
    assert error_of(path) == (
        f"{path}: workload.kind: unknown value 'burst'; allowed: static, offline, poisson, trace, "
        "sessions")
    path = write(tmp_path, "name: x\nmodel: {preset: tiny, attention: {kind: flash}}\n")
    assert "model.attention.kind: unknown value 'flash'; allowed: mha, gqa" in error_of(path)


def test_unknown_preset_and_hardware(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, "name: x\nmodel: {preset: llama9}\n"))
    assert "model.preset: unknown value 'llama9'; allowed: llama2-7b" in msg
    msg = error_of(write(tmp_path, "name: x\nhardware: tpu9\nmodel: {preset: tiny}\n"))
    assert "hardware: unknown value 'tpu9'; allowed: h100-sxm" in msg


def test_model_needs_exactly_one_source(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, "name: x\nmodel: {preset: tiny, gguf: a.gguf}\n"))
    assert msg.endswith("model: give exactly one of preset, path, gguf (got preset, gguf)")
    msg = error_of(write(tmp_path, "name: x\nmodel: {overrides: {num_layers: 2}}\n"))
    assert msg.endswith("model: give exactly one of preset, path, gguf (got none)")


def test_missing_name_and_wrong_types(tmp_path: Path) -> None:
    assert error_of(write(tmp_path, "model: {preset: tiny}\n")).endswith(
        "name: required key is missing")
    msg = error_of(write(tmp_path, "name: x\nmodel: {preset: tiny}\nworkload: {gen_len: lots}\n"))
    assert msg.endswith("workload.gen_len: must be an integer (got 'lots')")
    msg = error_of(write(tmp_path, "name: x\nmodel: {preset: tiny}\nworkload: 5\n"))
    assert msg.endswith("workload: must be a mapping of keys (got 5)")


def test_config_error_becomes_user_error_with_file(tmp_path: Path) -> None:
    # 3 KV heads do not divide tiny's 4 query heads: caught by config.py at load time.
    path = write(tmp_path, "name: x\nmodel: {preset: tiny, attention: {kv_heads: 3}}\n")
    msg = error_of(path)
    assert msg.startswith(f"{path}: ") and "attention.kv_heads (3) must divide" in msg


def test_cross_field_workload_checks(tmp_path: Path) -> None:
    base = "name: x\nmodel: {preset: tiny}\nworkload: "
    msg = error_of(write(tmp_path, base + "{kind: poisson}\n"))
    assert "workload.rate: required for kind 'poisson'" in msg
    msg = error_of(write(tmp_path, base + "{chat: true}\n"))
    assert "workload.chat: applies to text prompts" in msg
    msg = error_of(write(tmp_path, base + "{prompt_len: [8, 32], shared_prefix_len: 16}\n"))
    assert "workload.shared_prefix_len" in msg and "(at prompt_len=8)" in msg


def test_gate_fraction_and_percent(tmp_path: Path) -> None:
    base = "name: x\nmodel: {preset: tiny}\ngate: "
    sc = load_scenario(write(tmp_path, base + "{max_regression: '5%', baseline: b.json}\n"))
    gate = sc.points()[0].gate
    assert gate is not None and gate.max_regression == pytest.approx(0.05)
    assert gate.baseline == "b.json" and gate.metric == "output_tokens_per_s"
    assert "gate.max_regression: must be in [0, 1)" in error_of(
        write(tmp_path, base + "{max_regression: 500%}\n"))
    # the same parser as `compare --max-regression`: 1.0 (100%) passes any regression
    assert "gate.max_regression: must be in [0, 1)" in error_of(
        write(tmp_path, base + "{max_regression: 1.0}\n"))
    for bad in ("true", ".nan", "'abc%'"):
        assert "gate.max_regression" in error_of(
            write(tmp_path, base + f"{{max_regression: {bad}}}\n"))
    msg = error_of(write(tmp_path, base + "{metric: speed}\n"))
    assert "gate.metric: unknown value 'speed'; allowed: output_tokens_per_s" in msg
    for metric in ("ttft_s.p99", "ttft_s.p95", "e2e_s.p99.9", "ttft_s", "decode.mbu"):
        ok = load_scenario(write(tmp_path, base + f"{{metric: {metric}, normalize: mbu}}\n"))
        assert ok.points()[0].gate.metric == metric  # type: ignore[union-attr]
    for bad in ("ttft_s.p0", "ttft_s.p101", "ttft_s.pnan", "ttft_s.max"):
        assert f"gate.metric: unknown value '{bad}'" in error_of(
            write(tmp_path, base + f"{{metric: {bad}}}\n"))


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny\nworkload: {}\n")
    msg = error_of(path)
    assert msg.startswith(f"{path}:") and "invalid YAML" in msg
    line = int(msg[len(str(path)) + 1:].split(":")[0])
    assert 2 <= line <= 4


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny}\nname: y\n")
    assert error_of(path) == f"{path}:3: invalid YAML: duplicate key 'name'"


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert error_of(missing) == f"{missing}: no such scenario file"
    assert "top level" in error_of(write(tmp_path, "- a\n- b\n"))
    assert "empty file" in error_of(write(tmp_path, ""))


# ------------------------------------------------------------------ --set
def test_set_overrides_before_validation(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny}\nworkload: {batch_size: 2}\n")
    sc = load_scenario(path, ["workload.batch_size=8", "engine.block_size=32",
                              "model.overrides.num_layers=1", "workload.gen_len=[4, 8]"])
    points = sc.points()
    assert [p.workload.batch_size for p in points] == [8, 8]
    assert [p.workload.gen_len for p in points] == [4, 8]
    assert points[0].engine.block_size == 32 and points[0].model_config().num_layers == 1
    msg = error_of(path, ("workload.batch_size=-3",))
    assert msg == f"{path}: workload.batch_size: must be > 0 (got -3)"
    assert "expected KEY=VALUE" in error_of(path, ("workload.batch_size",))
    assert "unknown key" in error_of(path, ("workload.bogus=1",))


def test_set_can_add_a_sweep(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny}\n")
    sc = load_scenario(path, ["sweep.engine.block_size=[8, 16]"])
    assert [p.engine.block_size for p in sc.points()] == [8, 16]


# ------------------------------------------------------------------ sweeps
def test_workload_lists_make_a_cartesian_product(tmp_path: Path) -> None:
    path = write(tmp_path, """
name: sw
model: {preset: tiny}
workload: {batch_size: [1, 8, 64], prompt_len: [128, 512], gen_len: 16}
""")
    points = load_scenario(path).points()
    assert len(points) == 6
    assert [p.index for p in points] == list(range(6))
    assert points[0].label == "batch_size=1,prompt_len=128"
    assert points[1].label == "batch_size=1,prompt_len=512"
    assert points[5].swept == {"batch_size": 64, "prompt_len": 512}
    assert {(p.workload.batch_size, p.workload.prompt_len) for p in points} == {
        (b, p) for b in (1, 8, 64) for p in (128, 512)}
    assert all(p.workload.gen_len == 16 for p in points)


def test_single_element_list_still_counts_as_swept(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {preset: tiny}\n"
                           "workload: {rate: [2.5], kind: poisson}\n")
    (point,) = load_scenario(path).points()
    assert point.label == "rate=2.5" and point.workload.rate == 2.5


def test_sweep_block_multiplies_with_workload_lists(tmp_path: Path) -> None:
    path = write(tmp_path, """
name: sw
model: {preset: tiny}
workload: {batch_size: [1, 4]}
sweep:
  model.attention.kind: [mha, gqa, mqa]
  engine.block_size: [8, 16]
""")
    points = load_scenario(path).points()
    assert len(points) == 3 * 2 * 2
    first = points[0]
    assert first.swept == {"model.attention.kind": "mha", "engine.block_size": 8,
                           "batch_size": 1}
    assert first.label == "model.attention.kind=mha,engine.block_size=8,batch_size=1"
    kv = {p.swept["model.attention.kind"]: p.model_config().kv_heads for p in points}
    assert kv == {"mha": 4, "gqa": 2, "mqa": 1}
    assert sorted({p.engine.block_size for p in points}) == [8, 16]
    assert len({p.label for p in points}) == len(points)


def test_bad_sweep_value_is_reported_as_a_sweep_key(tmp_path: Path) -> None:
    base = "name: x\nmodel: {preset: tiny}\nsweep: "
    path = write(tmp_path, base + "{model.attention.kind: [gqa, x]}\n")
    msg = error_of(path)
    assert msg == (f"{path}: sweep.model.attention.kind: unknown value 'x'; "
                   "allowed: mha, gqa, mqa, mla, cla, sliding, linear, ssm")
    msg = error_of(write(tmp_path, base + "{modle.x: [1]}\n"))
    assert "sweep: modle.x: unknown key" in msg
    msg = error_of(write(tmp_path, base + "{engine.block_size: []}\n"))
    assert "needs at least one value" in msg


def test_scenario_validates_without_a_file() -> None:
    sc = Scenario.model_validate({"name": "x", "model": {"preset": "tiny"},
                                  "workload": {"gen_len": [1, 2]}})
    assert [p.workload.gen_len for p in sc.points()] == [1, 2]


# ------------------------------------------------------------------ shipped scenarios
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenarios_load_and_expand(path: Path) -> None:
    sc = load_scenario(path)
    points = sc.points()
    assert points and sc.name == path.stem
    assert len({p.label for p in points}) == len(points)
    for point in points:
        json.dumps(point.to_dict())
        if point.model is not None and point.model.preset is not None:
            point.model_config()


def test_shipped_scenarios_cover_the_brief() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"quickstart", "lecture_llama2_13b", "gqa_sweep", "poisson_tiny", "ci_gate"} <= names
    quick = load_scenario(REPO / "scenarios" / "quickstart.yaml").points()
    assert [p.workload.batch_size for p in quick] == [1, 4, 16]
    assert quick[0].model_source() == {"gguf": "smollm2-135m"}
    gate = load_scenario(REPO / "scenarios" / "ci_gate.yaml").points()[0].gate
    assert gate is not None and gate.baseline == "results/baselines/ci"
    # the committed baseline covers every point of the gate scenario
    baselines = sorted((REPO / gate.baseline).glob("ci_gate_*.json"))
    assert len(baselines) == len(load_scenario(REPO / "scenarios" / "ci_gate.yaml").points())


def test_json_schema() -> None:
    schema = scenario_json_schema()
    assert "workload" in schema["properties"] and "name" in schema["required"]
    json.dumps(schema)


def test_modules_do_not_import_torch() -> None:
    code = ("import sys, infbench.scenario.schema, infbench.measure.workload, "
            "infbench.measure.metrics, infbench.results.store; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ one --set parser, model.weights
def test_apply_sets_is_the_parser_of_every_command(tmp_path: Path) -> None:
    from infbench.scenario.schema import apply_sets, scenario_from_document

    doc: dict = {"name": "flags", "model": {"preset": "tiny"}}
    apply_sets(doc, ["model.overrides.num_layers=3", "model.attention.kind=mqa",
                     "workload.batch_size=[1, 8]", "engine.block_size=32"], "command line")
    points = scenario_from_document(doc, "command line").points()
    assert [p.workload.batch_size for p in points] == [1, 8]
    cfg = points[0].model_config()
    assert (cfg.num_layers, cfg.attention.kind, points[0].engine.block_size) == (3, "mqa", 32)
    base = write(tmp_path, "name: f\nmodel: {preset: tiny}\n")
    from_file = load_scenario(base, ["model.overrides.num_layers=3", "model.attention.kind=mqa"])
    assert from_file.points()[0].model_config() == cfg


@pytest.mark.parametrize("item, hint", [
    ("num_layers=2", "did you mean model.overrides.num_layers?"),
    ("attention.kind=mla", "did you mean model.attention.kind?"),
    ("quant.kv=fp8", "did you mean model.quant.kv?"),
])
def test_set_of_a_bare_model_field_names_the_scenario_key(tmp_path: Path, item: str,
                                                          hint: str) -> None:
    path = write(tmp_path, "name: f\nmodel: {preset: tiny}\n")
    assert hint in error_of(path, (item,))


def test_set_of_a_group_to_a_scalar_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: f\nmodel: {preset: tiny}\n")
    assert "model.attention: must be a mapping" in error_of(path, ("model.attention=3",))
    assert "model.overrides.moe: must be a mapping" in error_of(path, ("model.overrides.moe=3",))
    assert "model.name: must not be null" in error_of(path, ("model.overrides.name=null",))


def test_model_weights_is_resolved_in_every_point(tmp_path: Path) -> None:
    """Points say which weights run (real | random), never `auto`: the gate compares it."""
    path = write(tmp_path, "name: f\nmodel: {preset: tiny}\n")
    assert load_scenario(path).points()[0].model.weights == "random"
    random = load_scenario(path, ["model.weights=random"]).points()[0]
    assert random.model.weights == "random" and random.to_dict()["model"]["weights"] == "random"
    assert "model.weights: unknown value 'fake'; allowed: auto, real, random" in error_of(
        path, ("model.weights=fake",))
