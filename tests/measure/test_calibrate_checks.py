"""A calibration a noisy machine cannot fool: repeats with their spread, re-measurement,
consistency checks that flag or refuse a profile, and predictions that say so.

No real measurement: `time_op` is replaced by a fake that returns fixed timings (the
buffers are allocated, nothing is timed), and the engine's decode step times by fixed
figures, so every test here takes well under a second of CPU, except the one tiny
engine run of `infbench run`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_helpers import run_cli, tiny_scenario

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.errors import UserError
from infbench.core.parallel import ParallelConfig
from infbench.core.speculative import SpeculativeConfig
from infbench.hardware import checks as checks
from infbench.hardware.spec import HARDWARE, get_hardware, load_profile, profile_path
from infbench.measure import calibrate as cal
from infbench.measure import calibrate_engine as cal_engine
from infbench.measure.prediction import predict_point
from infbench.results.schema import validate

BASE_S = 1e-3  # every fake timing: 1 ms, so each rate is its work per ms


def _names(fn: Any) -> set[str]:
    code = fn.__code__
    return set(code.co_names) | set(code.co_freevars)


class FakeTimer:
    """`time_op` without running `fn`: BASE_S per call, times `slow` for the ops it names.

    slow: {"mv": 10.0} slows the GEMV, {64: 10.0} the engine matmul at 64 rows.
    slow_repeat: the read's calls (x.sum()) whose second repeat runs 3x slower, counted
    from the first: 3 of them make every round of the read figure spread 67%.
    """

    def __init__(self, slow: dict[Any, float] | None = None, slow_repeat: int = 0) -> None:
        self.slow = slow or {}
        self.slow_repeat = slow_repeat
        self.read_calls = 0

    def factor(self, fn: Any) -> float:
        names = _names(fn)
        for key, factor in self.slow.items():
            if isinstance(key, str) and key in names:
                return factor
            if isinstance(key, int) and "linear" in names:
                xs = fn.__defaults__[0]  # the activations by K of one matmul point
                if next(iter(xs.values())).shape[0] == key:
                    return factor
        return 1.0

    def __call__(self, fn: Any, device: str, repeats: int, warmup: int,
                 inner: int = 1) -> list[float]:
        times = [BASE_S * self.factor(fn)] * repeats
        if "sum" in _names(fn) and repeats > 1:
            self.read_calls += 1
            if self.read_calls <= self.slow_repeat:
                times[1] *= 3
        return times


STEP_TIMES = {(2, 1): 1.0e-3, (8, 1): 2.2e-3, (8, 16): 4.6e-3}


def _fake(monkeypatch: pytest.MonkeyPatch, timer: FakeTimer,
          steps: dict[tuple[int, int], float] | None = None) -> None:
    times = steps or STEP_TIMES
    monkeypatch.setattr(cal, "time_op", timer)
    monkeypatch.setattr(cal_engine, "time_op", timer)
    monkeypatch.setattr(cal_engine, "step_time_figures", lambda device, quick: {
        k: checks.Figure((t, t * 1.05, t * 1.02), "min") for k, t in times.items()})
    monkeypatch.setattr(cal, "device_description", lambda device: "test CPU")


def _calibrate(**kwargs: Any) -> Any:
    return cal.calibrate("cpu", quick=True, dtypes=("float32",), **kwargs)


# --- figures ------------------------------------------------------------------------------


def test_figure_is_the_best_repeat_with_its_spread():
    rate = checks.Figure((8.0, 10.0, 5.0), "best")
    assert rate.value == 10.0 and rate.spread == pytest.approx(0.5) and rate.flagged
    time = checks.Figure((2e-3, 1e-3, 1.1e-3), "min")
    assert time.value == 1e-3 and time.spread == pytest.approx(0.5)
    calm = checks.Figure((9.5, 10.0, 9.8), "best")
    assert calm.spread == pytest.approx(0.05) and not calm.flagged
    assert calm.to_dict() == {"repeats": [9.5, 10.0, 9.8], "choice": "best", "value": 10.0,
                              "spread": pytest.approx(0.05), "rounds": 1, "flagged": False}
    with pytest.raises(ValueError, match="choice"):
        checks.Figure((1.0,), "median")


def test_a_noisy_round_is_measured_again_and_the_calm_one_kept():
    rounds = iter([[10.0, 4.0, 9.0], [10.0, 9.6, 9.9], [1.0, 1.0, 1.0]])
    fig = checks.measure_figure(lambda: next(rounds))
    assert fig.rounds == 2 and fig.repeats == (10.0, 9.6, 9.9) and not fig.flagged
    # noisy every time: three rounds (the bound), the calmest kept, and flagged
    noisy = iter([[10.0, 4.0, 9.0], [10.0, 6.0, 9.0], [10.0, 5.0, 9.0], [10.0, 10.0, 10.0]])
    fig = checks.measure_figure(lambda: next(noisy))
    assert fig.rounds == checks.MAX_ROUNDS == 3
    assert fig.repeats == (10.0, 6.0, 9.0) and fig.flagged


# --- calibrate ----------------------------------------------------------------------------


def test_calibration_with_an_injected_slow_repeat_is_flagged(monkeypatch, tmp_path):
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path))
    _fake(monkeypatch, FakeTimer(slow_repeat=3))  # every round of the read has a slow repeat
    spec = _calibrate()
    read = spec.extra["figures"]["read_bytes_per_s"]
    nbytes = cal.PLANS["cpu", True].buffer_bytes
    assert read["rounds"] == 3 and read["flagged"] and read["choice"] == "best"
    assert read["value"] == pytest.approx(nbytes / BASE_S) == spec.extra["read_bytes_per_s"]
    assert read["spread"] == pytest.approx(2 / 3)
    assert read["repeats"] == pytest.approx([nbytes / BASE_S, nbytes / BASE_S / 3,
                                             nbytes / BASE_S])
    assert spec.profile_flags == [
        "spread: read_bytes_per_s repeats spread 67% after 3 rounds (limit 20%), the machine "
        "was busy"]
    # every other figure was calm in its first round
    others = {k: f for k, f in spec.extra["figures"].items() if k != "read_bytes_per_s"}
    assert {f["rounds"] for f in others.values()} == {1}
    assert not any(f["flagged"] for f in others.values())
    assert "decode_step_s.8x16" in others and "matmul.float32.256" in others
    # saved with its flags, loaded back with them
    cal.save_profile(spec, "local")
    loaded = get_hardware("local")
    assert loaded.profile_flags == spec.profile_flags and loaded.spread_known


def test_one_slow_repeat_is_measured_again_and_not_flagged(monkeypatch):
    _fake(monkeypatch, FakeTimer(slow_repeat=1))
    spec = _calibrate()
    assert spec.extra["figures"]["read_bytes_per_s"]["rounds"] == 2
    assert spec.profile_flags == []


def test_calibrate_cli_prints_one_warning_per_flag(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path))
    # the read spread, and the engine matmul at 64 rows at 40% of the rate at 32
    _fake(monkeypatch, FakeTimer(slow={64: 2.5}, slow_repeat=3))
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", "--quick", "--json",
                             "--device", "cpu")
    assert code == 0
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all(ln.startswith("warning: calibrate: profile 'local' flagged: ")
                                   for ln in lines)
    assert "spread: read_bytes_per_s" in lines[0]
    assert "matmul curve: float32 engine matmul by rows at 64 is 80% of" in lines[1]
    data = json.loads(out)
    assert data["flags"] == [ln.split("flagged: ", 1)[1] for ln in lines]
    assert data["spread"]["read_bytes_per_s"] == pytest.approx(2 / 3)
    assert data["spread"]["copy_bytes_per_s"] == 0.0
    saved = json.loads(profile_path("local").read_text())
    assert saved["extra"]["flags"] == data["flags"]


def _previous_profile(tmp_path: Path) -> bytes:
    path = tmp_path / "hardware" / "local.json"
    path.parent.mkdir(parents=True)
    text = json.dumps({"name": "local", "peak_flops": {"float32": 1e11}, "bandwidth": 2e10,
                       "memory_bytes": 1e10, "kind": "cpu"}).encode()
    path.write_bytes(text)
    return text


@pytest.mark.parametrize(("slow", "steps", "message"), [
    # the case: the GEMV streams at a tenth of the read
    ({"mv": 10.0}, None, "gemv: GEMV 3.4 GB/s is 5% of the streaming read 67.1 GB/s "
                         "(below 25%): not credible"),
    # 128 rows at a sixth of the rate of 64
    ({128: 12.0}, None, "matmul curve: float32 engine matmul by rows at 128 is 17% of"),
    # 8 layers faster than 2: a negative per-layer cost
    ({}, {(2, 1): 2e-3, (8, 1): 1.5e-3, (8, 16): 3e-3}, "fixed cost: the per-layer fit is "
                                                        "negative (-0.500 ms"),
], ids=["gemv-below-read", "matmul-dip", "negative-fixed-cost"])
def test_contradicting_figures_are_refused_and_the_previous_profile_kept(
        monkeypatch, capsys, tmp_path, slow, steps, message):
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path))
    before = _previous_profile(tmp_path)
    _fake(monkeypatch, FakeTimer(slow=slow), steps)
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", "--quick", "--device", "cpu")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: calibrate: profile 'local' refused, nothing saved: ")
    assert message in err
    assert (tmp_path / "hardware" / "local.json").read_bytes() == before
    assert [p.name for p in (tmp_path / "hardware").iterdir()] == ["local.json"]


# --- checks on hand-made profiles ---------------------------------------------------------


def _profile(tmp_path: Path, name: str = "box", **extra: Any) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({
        "name": name, "description": "test", "peak_flops": {"float32": 2e11},
        "bandwidth": 3.2e10, "memory_bytes": 2.5e10, "kind": "cpu",
        "extra": {"device": "cpu", "read_bytes_per_s": 3.2e10, **extra}}))
    return path


CURVE = [[1, 1.6e10], [16, 1.2e11], [64, 1.8e11], [256, 1.9e11]]


def test_an_old_profile_loads_unflagged_with_its_spread_unknown(tmp_path):
    hw = load_profile(_profile(tmp_path, gemv_bytes_per_s=2.4e10, matmul_flops_by_tokens={
        "float32": CURVE}, step_overhead_s=2e-4, layer_overhead_s=8e-5, seq_layer_overhead_s=1e-5))
    assert hw.profile_flags == [] and not hw.spread_known and "flags" not in hw.extra
    assert hw.peak_at("float32", 16) == 1.2e11


@pytest.mark.parametrize(("extra", "flag"), [
    ({"matmul_flops_by_tokens": {"float32": [[1, 1.6e10], [16, 1.2e11], [64, 0.9e11]]}},
     "matmul curve: float32 engine matmul by rows at 64 is 75% of the 120.0 GFLOP/s at 16 "
     "(tolerance 15%)"),
    ({"gemm_flops_per_s": {"float32": {"512": 2e11, "1024": 1.6e11}}},
     "matmul curve: float32 GEMM by size at 1024 is 80% of the 200.0 GFLOP/s at 512"),
    ({"step_overhead_s": 0.0, "layer_overhead_s": 8e-5},
     "fixed cost: step_overhead_s is 0 s; an engine step and layer always cost some"),
    ({"layer_overhead_s": 2e-2}, "fixed cost: layer_overhead_s 20.000 ms is above the "
                                 "plausible 5 ms"),
    ({"decode_attention_bytes_per_s": 7e10},
     "attention: the engine's decode attention read 70.0 GB/s, 219% of the streaming read "
     "32.0 GB/s (above 200%): the KV cache was served from a cache"),
], ids=["curve-dip", "gemm-dip", "zero-step-cost", "huge-layer-cost", "cached-attention"])
def test_doubtful_figures_load_flagged(tmp_path, extra, flag):
    hw = load_profile(_profile(tmp_path, **extra))
    assert len(hw.profile_flags) == 1 and hw.profile_flags[0].startswith(flag)


@pytest.mark.parametrize(("extra", "message"), [
    ({"engine_gemv_bytes_per_s": 2.1e9}, "refused hardware profile: gemv: engine GEMV 2.1 GB/s "
                                         "is 7% of the streaming read 32.0 GB/s"),
    ({"matmul_flops_by_tokens": {"float32": [[1, 1.6e10], [16, 1.2e11], [64, 5e10]]}},
     "refused hardware profile: matmul curve: float32 engine matmul by rows at 64 is 42%"),
    ({"figures": {name: {"repeats": [t], "choice": "min", "value": t, "spread": 0.0,
                         "rounds": 1, "flagged": False}
                  for name, t in zip(checks.STEP_FIGURES.values(), (1e-3, 2e-3, 1e-3),
                                     strict=True)}},
     "refused hardware profile: fixed cost: the per-sequence-per-layer fit is negative"),
    ({"step_overhead_s": -1e-3}, "invalid hardware profile: extra.step_overhead_s: must be a "
                                 "finite number >= 0"),
    ({"decode_attention_bytes_per_s": 2e9}, "refused hardware profile: attention: the "
     "engine's decode attention read 2.0 GB/s, 6% of the streaming read 32.0 GB/s (below 10%)"),
    ({"decode_attention_bytes_per_s": -1.0}, "invalid hardware profile: "
     "extra.decode_attention_bytes_per_s: "),
], ids=["gemv", "curve", "negative-fit", "negative-cost", "slow-attention",
        "negative-attention"])
def test_contradicting_profiles_are_refused_on_load(tmp_path, extra, message):
    path = _profile(tmp_path, **extra)
    with pytest.raises(UserError) as exc:
        load_profile(path)
    assert str(exc.value).startswith(f"{path}: {message}") and "\n" not in str(exc.value)


# --- predictions from a flagged profile ---------------------------------------------------


FLAGS = ["spread: read_bytes_per_s repeats spread 67% after 3 rounds (limit 20%), the machine "
         "was busy"]


def _point(hardware: str = "cpu") -> Any:
    workload = SimpleNamespace(kind="static", dataset=None, num_prompts=2, samples_per_prompt=1,
                               batch_size=2, max_concurrency=None, prompt_len=32, gen_len=8)
    return SimpleNamespace(workload=workload, engine=SimpleNamespace(max_num_seqs=8),
                           dtype="float32", hardware=hardware,
                           quant_config=lambda: QuantConfig(),
                           speculative=SpeculativeConfig(), parallel=ParallelConfig())


@pytest.fixture
def roofline_only(monkeypatch):
    """These fake points price the roofline only (tests/sim runs the simulation)."""
    monkeypatch.setattr("infbench.measure.prediction.with_simulation",
                        lambda priced, *args: priced)


def test_a_prediction_carries_the_profile_flags(tmp_path, monkeypatch, roofline_only):
    monkeypatch.setattr("infbench.measure.prediction.predict", lambda *a, **k: SimpleNamespace(
        e2e_s=1.0, overlap="none", disaggregated=None))
    monkeypatch.setattr("infbench.measure.prediction.prediction_dict",
                        lambda p: {"ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": p.e2e_s})
    cfg = ModelConfig.from_name("smollm2-135m")
    flagged = load_profile(_profile(tmp_path, flags=FLAGS))
    assert predict_point(_point(), cfg, flagged)["profile_flags"] == FLAGS
    old = load_profile(_profile(tmp_path, name="old"))
    assert predict_point(_point(), cfg, old)["profile_flags"] == []
    assert "profile_flags" not in predict_point(_point(), cfg, HARDWARE["cpu"])


def test_quantized_weights_on_a_calibrated_curve_are_noted(tmp_path, roofline_only):
    cfg = ModelConfig.from_name("tiny")
    point = _point()
    point.quant_config = lambda: QuantConfig(weights="int8")
    curved = load_profile(_profile(tmp_path, matmul_flops_by_tokens={"float32": CURVE}))
    note = predict_point(point, cfg, curved)["note"]
    assert note.startswith("quantized projections priced at the float32 matmul curve of "
                           "profile 'box'")
    assert "note" not in predict_point(_point(), cfg, curved)  # float weights: no note
    assert "note" not in predict_point(point, cfg, HARDWARE["cpu"])  # a datasheet: no curve


def test_report_flags_predictions_from_a_flagged_profile(monkeypatch, capsys, result_file,
                                                         fake_result):
    plain = result_file("plain.json")
    flagged = fake_result(point_index=1, batch_size=8)
    flagged["prediction"]["profile_flags"] = FLAGS
    flagged["prediction"]["hardware"] = "local"
    path = result_file("flagged.json", flagged)
    code, out, err = run_cli(monkeypatch, capsys, "report", str(plain), str(path), "--json")
    assert code == 0
    assert err == f"note: 1 prediction priced on the flagged profile 'local': {FLAGS[0]}\n"
    rows = json.loads(out)
    assert [r["profile_flags"] for r in rows] == [None, FLAGS[0]]
    # results without the field (version 1, and version 2 written before it) still load
    code, out, err = run_cli(monkeypatch, capsys, "report", str(plain), "--json")
    assert code == 0 and err == "" and "profile_flags" not in json.loads(out)[0]


def test_result_schema_takes_profile_flags_and_old_results_without_them(fake_result):
    from infbench.results.schema import upgrade

    result = upgrade(fake_result())
    assert validate(result).prediction.profile_flags is None
    flagged = copy.deepcopy(result)
    flagged["prediction"]["profile_flags"] = FLAGS
    assert validate(flagged).prediction.profile_flags == FLAGS


def test_run_notes_predictions_on_a_flagged_profile(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path))
    (tmp_path / "hardware").mkdir()
    profile = json.loads(_profile(tmp_path, name="flaky", flags=FLAGS).read_text())
    (tmp_path / "hardware" / "flaky.json").write_text(json.dumps(profile))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(tiny_scenario("flaky_run", batch_size="[1, 2]", prompt_len=6,
                                      gen_len=3).replace("hardware: cpu", "hardware: flaky"))
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                           str(tmp_path / "out"))
    assert code == 0, err
    notes = [ln for ln in err.splitlines() if "flagged profile" in ln]
    # the flag is the profile's: said once for the run's two points, recorded in each result
    assert notes == [f"note: predictions on the flagged profile 'flaky' (each result records "
                     f"it in prediction.profile_flags): {FLAGS[0]}"]
    results = sorted((tmp_path / "out").glob("flaky_run_*.json"))
    assert len(results) == 2
    for result in results:
        assert json.loads(result.read_text())["prediction"]["profile_flags"] == FLAGS
