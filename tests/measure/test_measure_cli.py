"""`infbench compare / report / plots / calibrate` through the real entry point (exit codes)."""

from __future__ import annotations

import json
import subprocess
import sys

from cli_helpers import run_cli

from infbench.hardware.spec import get_hardware


def test_compare_identical_passes(monkeypatch, capsys, result_file):
    base, new = result_file("base.json"), result_file("new.json")
    code, out, _ = run_cli(monkeypatch, capsys, "compare", str(base), str(new))
    assert code == 0
    assert "PASS" in out


def test_compare_ten_percent_slower_fails(monkeypatch, capsys, result_file):
    base, new = result_file("base.json"), result_file("new.json", speed=0.9)
    code, out, _ = run_cli(monkeypatch, capsys, "compare", str(base), str(new))
    assert code == 1
    assert "regression" in out and "-10.0%" in out
    for loose in ("15%", "0.15"):
        code, _, _ = run_cli(monkeypatch, capsys, "compare", str(base), str(new),
                             "--max-regression", loose)
        assert code == 0


def test_compare_directories_and_metric(monkeypatch, capsys, result_file, tmp_path):
    for i, bs in enumerate((1, 4)):
        result_file(f"base/smoke_{i:03d}.json", point_index=i, batch_size=bs)
        result_file(f"new/smoke_{i:03d}.json", point_index=i, batch_size=bs, speed=0.9)
    code, out, _ = run_cli(monkeypatch, capsys, "compare", str(tmp_path / "base"),
                           str(tmp_path / "new"), "--metric", "ttft_s.p50")
    assert code == 1 and out.count("regression") >= 2


def test_compare_schema_mismatch_exits_2(monkeypatch, capsys, result_file):
    base, new = result_file("base.json"), result_file("new.json", schema_version=99)
    code, _, err = run_cli(monkeypatch, capsys, "compare", str(base), str(new))
    assert code == 2
    assert "schema_version" in err and err.startswith("error:")


def test_compare_different_scenario_exits_2(monkeypatch, capsys, result_file, fake_result):
    other = fake_result()
    other["scenario"]["model"]["preset"] = "llama-3-8b"
    base, new = result_file("base.json"), result_file("new.json", other)
    code, _, err = run_cli(monkeypatch, capsys, "compare", str(base), str(new))
    assert code == 2
    assert "scenario.model.preset" in err


def test_compare_bad_options_exit_2(monkeypatch, capsys, result_file, tmp_path):
    base = result_file("base.json")
    for args in (["--normalize", "bogus"], ["--max-regression", "5"]):
        code, _, _ = run_cli(monkeypatch, capsys, "compare", str(base), str(base), *args)
        assert code == 2
    code, _, err = run_cli(monkeypatch, capsys, "compare", str(base), str(tmp_path / "x.json"))
    assert code == 2 and "x.json" in err


def test_report_writes_markdown_and_csv(monkeypatch, capsys, result_file, tmp_path):
    a = result_file("a.json", batch_size=1)
    b = result_file("b.json", batch_size=8, point_index=1)
    md, csv = tmp_path / "out" / "r.md", tmp_path / "out" / "r.csv"
    code, out, _ = run_cli(monkeypatch, capsys, "report", str(a), str(b), "--markdown", str(md),
                           "--csv", str(csv))
    assert code == 0
    assert "measured / predicted" in out and "TPOT p50" in " ".join(out.split())
    assert "decode" in out and "step" in out
    lines = md.read_text().splitlines()
    assert lines[0].startswith("| label |") and len(lines) == 4
    assert csv.read_text().count("\n") == 3


def test_plots_writes_three_pngs(monkeypatch, capsys, result_file, tmp_path):
    a = result_file("a.json", batch_size=1)
    b = result_file("b.json", batch_size=8, point_index=1)
    out_dir = tmp_path / "figs"
    code, out, _ = run_cli(monkeypatch, capsys, "plots", str(a), str(b), "--out", str(out_dir))
    assert code == 0
    for name in ("latency_throughput", "distributions", "roofline_measured"):
        png = out_dir / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG"
        assert str(png) in out


def test_calibrate_quick_json_writes_profile(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path))
    # 1 ms per timing and fixed engine terms: on a busy machine measured figures may (rightly)
    # be refused; tests/measure/test_calibrate_checks.py covers that, test_calibrate.py
    # measures them
    monkeypatch.setattr("infbench.measure.calibrate.time_op",
                        lambda fn, device, repeats, warmup, inner=1: [1e-3] * repeats)
    monkeypatch.setattr("infbench.measure.calibrate_engine.engine_extra",
                        lambda device, dtypes, quick: (
                            {"matmul_flops_by_tokens": {"float32": [[1, 1e9], [16, 1e10]]},
                             "step_overhead_s": 2e-4, "layer_overhead_s": 5e-5,
                             "seq_layer_overhead_s": 1e-5}, {}))
    code, out, _ = run_cli(monkeypatch, capsys, "calibrate", "--quick", "--json",
                           "--device", "cpu")
    assert code == 0
    data = json.loads(out)
    assert data["bandwidth_bytes_per_s"] > 1e8
    assert data["copy_bandwidth_bytes_per_s"] > 1e8
    assert data["flops_per_s"]["float32"] > 1e8
    assert data["profile_path"] == str(tmp_path / "hardware" / "local.json")
    hw = get_hardware("local")
    assert hw.bandwidth == data["bandwidth_bytes_per_s"]
    assert hw.peak("float32") == data["flops_per_s"]["float32"]
    assert hw.spread_known and data["flags"] == hw.profile_flags
    assert set(data["spread"]) == {"read_bytes_per_s", "copy_bytes_per_s", "gemv_bytes_per_s"}


def test_json_commands_do_not_import_torch():
    code = ("import sys, infbench.results.gate, infbench.results.report, "
            "infbench.commands.measure; sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
