"""The first run on a machine infbench has not seen (`hardware: auto`, infbench/measure/machine.py).

The probe is faked everywhere (no test depends on this machine's figures): it returns a
profile whose bandwidth the test chooses, and a second resolution must not probe again.
The end-to-end case runs a real tiny scenario with no `hardware:` on a fresh profile
store, and its result must never show an MBU above 100% without the reason beside it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hardware_helpers import probe_document

from infbench.hardware import spec as hardware
from infbench.hardware.machine import Machine, this_machine
from infbench.hardware.spec import HARDWARE, HardwareSpec, get_hardware, probe_path
from infbench.measure import machine as machine_mod
from infbench.measure.metrics import mbu_reasons, noise


@pytest.fixture
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A profile store that has never seen this machine."""
    monkeypatch.setenv("INFBENCH_HOME", str(tmp_path))
    monkeypatch.setattr(machine_mod, "_RESOLVED", {})
    return tmp_path


def fake_probe(bandwidth: float, flags: list[str] | None = None) -> Any:
    calls: list[int] = []

    def probe(machine: Machine | None = None) -> HardwareSpec:
        calls.append(1)
        doc = probe_document(dataclasses.replace(HARDWARE["cpu"], bandwidth=bandwidth))
        doc["extra"]["read_bytes_per_s"] = bandwidth
        doc["extra"]["flags"] = flags or []
        return HardwareSpec(**{k: v for k, v in doc.items() if k != "interconnect"})

    probe.calls = calls  # type: ignore[attr-defined]
    return probe


def test_the_first_run_probes_once_and_caches_per_machine(fresh_home: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    probe = fake_probe(82.3e9)
    monkeypatch.setattr(machine_mod, "probe_machine", probe)
    hw = machine_mod.resolve_hardware("auto", "cpu")
    assert hw.bandwidth == 82.3e9 and hw.name == "auto" and len(probe.calls) == 1
    assert machine_mod.resolve_hardware("auto", "cpu") is hw  # one per process
    err = capsys.readouterr().err
    assert err.count("note: hardware auto:") == 1
    assert "probed its read bandwidth" in err and "82.3 GB/s" in err
    assert "`infbench calibrate` measures the full profile" in err
    cached = probe_path(this_machine())
    assert cached.parent == fresh_home / "hardware" and cached.is_file()
    # a later run (a new process) reads the cache and does not probe
    monkeypatch.setattr(machine_mod, "_RESOLVED", {})
    monkeypatch.setattr(machine_mod, "probe_machine", fake_probe(1.0))
    again = machine_mod.resolve_hardware("auto", "cpu")
    assert again.bandwidth == 82.3e9
    assert "use its read-bandwidth probe, 82.3 GB/s" in capsys.readouterr().err
    # and the analytic commands see the same machine
    assert get_hardware("auto").bandwidth == 82.3e9


def test_a_busy_probe_is_used_once_and_not_cached(fresh_home: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    flag = "spread: read_bytes_per_s repeats spread 60% after 3 rounds (limit 20%)"
    monkeypatch.setattr(machine_mod, "probe_machine", fake_probe(20e9, [flag]))
    assert machine_mod.resolve_hardware("auto", "cpu").bandwidth == 20e9
    assert "not cached, the machine was busy (spread:" in capsys.readouterr().err
    assert not probe_path(this_machine()).exists()


def _profile(home: Path, name: str, bandwidth: float, machine: str, quick: bool = False) -> Path:
    doc = probe_document(dataclasses.replace(HARDWARE["cpu"], bandwidth=bandwidth))
    doc["name"] = name
    doc["extra"] = {"device": "cpu", "quick": quick, "machine": machine,
                    "timestamp": "2026-12-01T10:00:00+0000"}
    path = home / "hardware" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_this_machines_calibrated_profile_comes_first(fresh_home: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    monkeypatch.setattr(machine_mod, "probe_machine", fake_probe(1.0))
    key = this_machine().key
    _profile(fresh_home, "elsewhere", 11e9, "0123456789abcdef")  # another machine's
    _profile(fresh_home, "quick", 12e9, key, quick=True)  # --quick: buffers in cache
    probe = probe_path(this_machine())
    probe.write_text(json.dumps(probe_document(dataclasses.replace(HARDWARE["cpu"],
                                                                   bandwidth=13e9))))
    assert get_hardware("auto").bandwidth == 13e9  # only the probe is this machine's, full
    _profile(fresh_home, "local", 14e9, key)
    hw = machine_mod.resolve_hardware("auto", "cpu")
    assert (hw.name, hw.bandwidth) == ("local", 14e9)
    assert "this machine's calibrated profile 'local'" in capsys.readouterr().err


def test_before_any_measurement_the_analytic_default_says_whose_it_is(fresh_home: Path) -> None:
    hw = get_hardware("auto")
    assert hw.bandwidth == HARDWARE["cpu"].bandwidth
    assert "not this machine" in hw.description and "infbench calibrate" in hw.description


def test_a_damaged_probe_cache_is_probed_again(fresh_home: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = probe_path(this_machine())
    path.parent.mkdir(parents=True)
    path.write_text('{"name": "auto", "bandwidth": ')  # killed mid-write by an old version
    monkeypatch.setattr(machine_mod, "probe_machine", fake_probe(40e9))
    assert machine_mod.resolve_hardware("auto", "cpu").bandwidth == 40e9
    assert json.loads(path.read_text())["bandwidth"] == 40e9


def test_the_machine_key_follows_cpu_flags_cores_and_memory(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    meminfo = tmp_path / "meminfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: avx2 fma\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: avx2 fma\n")
    meminfo.write_text("MemTotal:       24641776 kB\n")
    one = hardware.this_machine(cpuinfo, meminfo)
    assert (one.cpu_model, one.flags, one.memory_gib) == ("AMD EPYC 9R14", ("avx2", "fma"), 24)
    assert hardware.this_machine(cpuinfo, meminfo).key == one.key  # stable
    cpuinfo.write_text("model name\t: AMD EPYC 9R14\nflags\t\t: avx2 fma avx512f\n")
    assert hardware.this_machine(cpuinfo, meminfo).key != one.key
    assert dataclasses.replace(one, num_cpus=one.num_cpus + 2).key != one.key
    assert dataclasses.replace(one, memory_gib=48).key != one.key


def _run(mbu: float) -> dict[str, Any]:
    return {"decode": {"mbu": mbu}, "prefill": {"mbu": 0.1}}


def test_mbu_above_100_percent_always_has_its_reason() -> None:
    # the first run: another machine's 32 GB/s profile, 82.3 GB/s streamed here
    foreign = noise([_run(1.59)], reference_bytes_per_s=82.3e9, hardware_bandwidth=32e9,
                    hardware_name="cpu")["warnings"]
    reason = [w for w in foreign if w.startswith("decode MBU 159% is above 100%")]
    assert len(reason) == 1 and "not this machine's bandwidth" in reason[0]
    assert "it is 62%" in reason[0]  # 1.59 x 32 / 82.3 against the same-run reference
    # this machine's profile, and the steps still streamed faster than its peak
    own = mbu_reasons([_run(1.12), _run(1.10)], 80e9, "auto", 81e9)
    assert len(own) == 1 and own[0].startswith("decode MBU 111% is above 100%: the decode")
    assert "last-level cache" in own[0]
    assert mbu_reasons([_run(0.97)], 80e9, "auto", 81e9) == []


def test_the_run_table_marks_an_mbu_above_100_percent() -> None:
    from rich.console import Console

    from infbench.results.report import OVER_CAPTION, run_table

    def result(label: str, mbu: float) -> dict[str, Any]:
        return {"label": label, "metrics": {"decode": {"mbu": mbu}, "num_requests": 1}}

    console = Console(width=200, record=True)
    console.print(run_table([result("a", 0.6), result("b", 1.59)]))
    text = console.export_text()
    assert "159.0 *" in text and "60.0 *" not in text and OVER_CAPTION[:40] in text
    console.print(run_table([result("a", 0.6)]))
    assert OVER_CAPTION[:40] not in console.export_text()


SCENARIO = """
name: first_run
device: cpu
dtype: float32
model: {preset: tiny, overrides: {max_seq_len: 64}}
workload: {kind: static, batch_size: [1, 2], prompt_len: 8, gen_len: 6, seed: 0}
engine: {block_size: 4, max_num_batched_tokens: 32}
measure: {warmup: 0, repeats: 1}
"""


@pytest.mark.parametrize("bandwidth", [1e6, 1e13], ids=["peak-below-the-steps", "ample-peak"])
def test_a_first_run_never_shows_mbu_above_100_percent_without_a_reason(
        fresh_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], bandwidth: float) -> None:
    from cli_helpers import run_args

    probe = fake_probe(bandwidth)
    monkeypatch.setattr(machine_mod, "probe_machine", probe)
    scenario = tmp_path / "first.yaml"
    scenario.write_text(SCENARIO)
    code, stdout, stderr = run_args(["run", str(scenario), "--out", str(tmp_path / "out")],
                                    capsys)
    assert code == 0, stderr
    assert len(probe.calls) == 1 and stderr.count("note: hardware auto:") == 1
    results = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("*.json"))
               if p.name != "manifest.json"]
    assert len(results) == 2
    for result in results:
        assert result["hardware"]["name"] == "auto"
        m = result["metrics"]
        for stage in ("prefill", "decode", "mixed"):
            mbu = (m.get(stage) or {}).get("mbu")
            if mbu is not None and mbu > 1:
                assert any(w.startswith(f"{stage} MBU") for w in m["noise"]["warnings"])
                assert f"{stage} MBU" in stderr
    if bandwidth == 1e6:  # 1 MB/s: every decode step is "faster than the peak"
        assert any(r["metrics"]["decode"]["mbu"] > 1 for r in results)
        assert "decode MBU above 100%" in stdout  # the table's caption beside the mark
