"""GPU telemetry pieces that must behave on a CPU machine, and the ncu CSV parser."""

from __future__ import annotations

import sys

import pytest

from infbench.measure.telemetry import NvmlSampler, ncu_profile, parse_ncu_csv, summarize_samples

NCU_CSV = '''==PROF== Connected to process 1234
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1234","python","h","_paged_decode_attention_kernel","1","7","(128, 1, 1)","(1, 8, 4)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","1,024.50"
"0","1234","python","h","_paged_decode_attention_kernel","1","7","(128, 1, 1)","(1, 8, 4)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Kbyte","2.00"
"1","1234","python","h","gemv","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","512"
"1","1234","python","h","gemv","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","0"
'''


def test_parse_ncu_csv_sums_bytes_over_kernels_with_units():
    got = parse_ncu_csv(NCU_CSV)
    assert got["dram_bytes_read"] == pytest.approx(1024.5e6 + 512)
    assert got["dram_bytes_write"] == pytest.approx(2e3)
    assert got["num_kernels"] == 2


def test_summarize_samples_mean_and_max():
    s = summarize_samples([{"t_s": 0.0, "power_w": 100.0}, {"t_s": 0.1, "power_w": 300.0}])
    assert s["num_samples"] == 2
    assert s["power_w"] == {"mean": 200.0, "max": 300.0}
    assert summarize_samples([], "no NVML") == {"num_samples": 0, "error": "no NVML"}


def test_nvml_sampler_degrades_cleanly_without_a_gpu(monkeypatch):
    # Without a driver pynvml raises at init; with the module missing the import fails.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    summary = NvmlSampler().start().stop()
    assert summary["num_samples"] == 0 and "NVML unavailable" in summary["error"]


def test_ncu_profile_is_skipped_without_ncu(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda _name: None)
    assert ncu_profile({}).get("status", "").startswith("skipped")
