"""Calibration: the bandwidth/FLOP formulas on synthetic timings, a real quick run, profiles."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from infbench.core.errors import UserError
from infbench.hardware.checks import ProfileCheck
from infbench.hardware.spec import get_hardware, profile_path
from infbench.measure import calibrate as cal


def test_formulas_on_synthetic_timing(monkeypatch):
    """8.5 GB in 0.4 s is 21 GB/s; copy counts read + write; GEMM is 2 n^3 FLOPs; each figure
    is the best repeat (the shortest time), and these repeats spread too far: flagged after
    three rounds."""
    monkeypatch.setattr(cal, "time_op", lambda fn, device, repeats, warmup, inner=1:
                        [0.4, 0.5, 0.9][:max(repeats, 1)])
    nbytes = 1 << 20
    read = cal.read_bandwidth("cpu", nbytes, 3, 0)
    assert read.value == pytest.approx(nbytes / 0.4)
    assert read.spread == pytest.approx(1 - 0.4 / 0.9) and read.rounds == 3 and read.flagged
    assert cal.copy_bandwidth("cpu", nbytes, 3, 0).value == pytest.approx(2 * nbytes / 0.4)
    gemv = cal.gemv_bandwidth("cpu", (64, 32), torch.float32, 3, 0)
    assert gemv.value == pytest.approx((64 * 32 + 32 + 64) * 4 / 0.4)
    flops = cal.gemm_flops("cpu", torch.float32, (16, 32), 3, 1, max_single_s=10.0)
    assert {n: f.value for n, f in flops.items()} == {
        16: pytest.approx(2 * 16**3 / 0.4), 32: pytest.approx(2 * 32**3 / 0.4)}
    # a single run slower than the budget stops the size ladder there
    assert list(cal.gemm_flops("cpu", torch.float32, (16, 32), 3, 1, max_single_s=0.1)) == [16]


def test_mbu_of_the_calibrated_bandwidth(monkeypatch):
    """A decode step moving 8.5 GB in 1 s on a machine calibrated at 17 GB/s runs at MBU 0.5."""
    monkeypatch.setattr(cal, "time_op", lambda *a, **k: [1e-3])  # 17 MB read in 1 ms
    bw = cal.read_bandwidth("cpu", 17_000_000, 1, 0)
    assert bw.value == pytest.approx(17e9) and bw.rounds == 1 and not bw.flagged
    assert 8.5e9 / 1.0 / bw.value == pytest.approx(0.5)


def test_time_op_cpu_counts_repeats():
    calls = []
    times = cal.time_op(lambda: calls.append(1), "cpu", repeats=4, warmup=2, inner=3)
    assert len(times) == 4 and all(t >= 0 for t in times)
    assert len(calls) == 2 + 4 * 3


def test_quick_calibration_measures_plausible_numbers(monkeypatch):
    # Real measurements, without the consistency checks: on a busy machine they may (rightly)
    # refuse the profile, which tests/measure/test_calibrate_checks.py covers with a fake
    # timer; the engine terms are measured on their own below.
    monkeypatch.setattr(cal, "check_profile", lambda extra: ProfileCheck())
    spec = cal.calibrate("cpu", quick=True, dtypes=("float32",), engine_terms=False)
    assert spec.kind == "cpu" and spec.name == "local"
    assert 1e8 < spec.bandwidth < 1e13
    assert spec.bandwidth == spec.extra["read_bytes_per_s"]
    assert 1e8 < spec.extra["copy_bytes_per_s"] < 1e13
    assert 1e8 < spec.extra["gemv_bytes_per_s"] < 1e13
    assert set(spec.peak_flops) == {"float32"}
    assert 1e8 < spec.peak_flops["float32"] < 1e14
    best = max(spec.extra["gemm_flops_per_s"]["float32"].values())
    assert spec.peak_flops["float32"] == best
    assert spec.memory_bytes > 1e9
    assert spec.extra["quick"] is True and spec.extra["torch_threads"] >= 1
    figures = spec.extra["figures"]
    assert set(figures) == {"read_bytes_per_s", "copy_bytes_per_s", "gemv_bytes_per_s",
                            *(f"gemm.float32.{n}" for n in spec.extra["gemm_flops_per_s"]
                              ["float32"])}
    read = figures["read_bytes_per_s"]
    assert read["value"] == max(read["repeats"]) == spec.bandwidth and read["choice"] == "best"
    assert 1 <= read["rounds"] <= 3 and len(read["repeats"]) == 3
    assert read["flagged"] == (read["spread"] > 0.2)


def test_engine_terms_quick_are_figures(monkeypatch):
    """The engine's matmul curve and decode step times, really measured (quick sizes, one
    round each: re-measurement is tested in test_calibrate_checks.py)."""
    from infbench.hardware import checks as calibration_checks
    from infbench.measure import calibrate_engine
    from infbench.measure.calibrate_engine import engine_extra

    monkeypatch.setattr(calibrate_engine, "measure_figure", functools.partial(
        calibration_checks.measure_figure, max_rounds=1))
    terms, figures = engine_extra("cpu", ("float32",), quick=True)
    curve = terms["matmul_flops_by_tokens"]["float32"]
    assert [m for m, _ in curve] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert [f for _, f in curve] == [figures[f"matmul.float32.{int(m)}"].value for m, _ in curve]
    steps = [figures[f"decode_step_s.{k}"] for k in ("2x1", "8x1", "8x16")]
    assert all(f.choice == "min" and 0 < f.value < 1 and len(f.repeats) == 2 and f.rounds == 1
               for f in steps)
    for key in ("step_overhead_s", "layer_overhead_s", "seq_layer_overhead_s"):
        assert terms[key] >= 0
    attention = figures["decode_attention_bytes_per_s"]
    assert terms["decode_attention_bytes_per_s"] == attention.value > 0
    assert attention.choice == "best" and len(attention.repeats) == 3
    prefill = figures["prefill_attention_flops_per_s"]
    assert terms["prefill_attention_flops_per_s"] == prefill.value > 0
    assert terms["engine_backend"] in ("cpu", "torch")
    if terms["engine_backend"] == "cpu":  # the C++ quantized GEMV, 1-8 rows in quick mode
        for fmt in ("int8", "int4"):
            qcurve = terms["quant_matmul_flops_by_tokens"][fmt]
            assert [m for m, _ in qcurve] == [1, 2, 4, 8]
            assert [f for _, f in qcurve] == [figures[f"quant_matmul.{fmt}.{int(m)}"].value
                                              for m, _ in qcurve]
    assert terms["matmul_stack_bytes"] == terms["attention_stack_bytes"] == 16 << 20


def test_quant_stack_copies_one_quantized_round_into_distinct_memory():
    from infbench.measure import calibrate_engine as ce

    stack = ce.quant_stack("int4", 20 << 20)  # about 6.6 MB a round: 3 rounds
    n = len(ce.MATMUL_KS)
    assert len(stack) == 3 * n and sorted({w.shape[1] for w in stack}) == list(ce.MATMUL_KS)
    first, copy = stack[0], stack[n]
    assert first.group_size == copy.group_size == ce.QUANT_GROUP
    assert torch.equal(first.packed, copy.packed)
    assert first.packed.data_ptr() != copy.packed.data_ptr()
    assert first.scales.data_ptr() != copy.scales.data_ptr()


def test_stacks_are_four_times_the_last_level_cache(tmp_path, monkeypatch):
    from infbench.measure import calibrate_engine as ce

    for name, level, size in (("index0", 1, "48K"), ("index2", 2, "2048K"),
                              ("index3", 3, "266240K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(f"{level}\n")
        (tmp_path / name / "size").write_text(f"{size}\n")
    assert ce.last_level_cache_bytes(str(tmp_path)) == 266240 << 10
    assert ce.last_level_cache_bytes(str(tmp_path / "missing")) is None
    monkeypatch.setattr(ce, "last_level_cache_bytes", lambda: 266240 << 10)
    assert ce.stack_bytes("cpu", quick=False) == 4 * (266240 << 10)
    monkeypatch.setattr(ce, "last_level_cache_bytes", lambda: 32 << 20)
    assert ce.stack_bytes("cpu", quick=False) == 512 << 20  # at least 512 MiB
    monkeypatch.setattr(ce, "last_level_cache_bytes", lambda: 1 << 30)
    assert ce.stack_bytes("cpu", quick=False) == 2 << 30  # at most 2 GiB
    assert ce.stack_bytes("cpu", quick=True) == 16 << 20
    stack = ce.weight_stack("cpu", torch.float32, 200 << 20)  # whole rounds of ~50 MB
    assert sorted({w.shape[1] for w in stack}) == list(ce.MATMUL_KS)
    assert len(stack) == 4 * len(ce.MATMUL_KS)
    assert abs(sum(w.numel() * 4 for w in stack) - (200 << 20)) < 26 << 20


def test_save_profile_then_get_hardware(tmp_path, monkeypatch):
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path))
    # 1 ms per timing: consistent figures, so the save and load do not depend on how busy
    # the machine is (the checks are tested in test_calibrate_checks.py)
    monkeypatch.setattr(cal, "time_op", lambda fn, device, repeats, warmup, inner=1:
                        [1e-3] * repeats)
    spec = cal.calibrate("cpu", quick=True, dtypes=("float32",), name="mybox",
                         engine_terms=False)
    path = cal.save_profile(spec, "mybox")
    assert path == profile_path("mybox") and path.parent == tmp_path / "hardware"
    data = json.loads(path.read_text())
    assert data["extra"]["copy_bytes_per_s"] == spec.extra["copy_bytes_per_s"]
    loaded = get_hardware("mybox")
    assert loaded.bandwidth == spec.bandwidth and loaded.peak_flops == spec.peak_flops
    assert not list(path.parent.glob(".*tmp"))


def test_reference_bandwidth_probe():
    bw = cal.measure_reference_bandwidth("cpu", seconds=0.05, nbytes=8 << 20)
    assert 1e8 < bw < 1e13


def test_bad_inputs():
    with pytest.raises(UserError, match="dtype"):
        cal.calibrate("cpu", quick=True, dtypes=("float64",))
    with pytest.raises(UserError, match="allowed"):
        cal.calibrate("tpu", quick=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_requested_without_cuda():
    with pytest.raises(UserError, match="CUDA is not available"):
        cal.calibrate("cuda", quick=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_quick_calibration_on_cuda():
    spec = cal.calibrate("cuda", quick=True)
    assert spec.kind == "gpu"
    assert spec.bandwidth > 1e11  # any datacenter GPU streams >100 GB/s
    assert spec.peak_flops["bfloat16"] > spec.peak_flops["float32"] / 2
    assert cal.measure_reference_bandwidth("cuda", seconds=0.1) > 1e11
