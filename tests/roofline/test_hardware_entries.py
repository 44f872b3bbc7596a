"""The hardware table's Blackwell / MI355X entries: FP4 peaks where the tensor cores run 4-bit
formats (and none elsewhere), the NVL72 domain of a GB200, the entries' NVML names."""

from __future__ import annotations

import json

import pytest

from infbench.core.errors import UserError
from infbench.hardware.spec import HARDWARE, entry_for_device_name, get_hardware, load_profile
from infbench.roofline.parallel import all_reduce_s

FP4_DENSE = {"b200": 9e15, "b300": 13.5e15, "gb200": 10e15, "mi355x": 10066.3e12}


@pytest.mark.parametrize(("name", "fp4"), FP4_DENSE.items())
def test_fp4_peaks_are_dense_and_above_fp8(name, fp4) -> None:
    hw = get_hardware(name)
    assert hw.peak("float4") == fp4
    # every listed part runs 4-bit at twice its FP8 rate or more (B300: three times)
    assert hw.peak("float4") >= 2 * hw.peak("float8") * (1 - 1e-4)  # MI355X: rounded figures
    assert "dense" in hw.source and "sparsity" in hw.source


def test_parts_without_fp4_tensor_cores_have_no_float4_peak() -> None:
    with_fp4 = {name for name, hw in HARDWARE.items() if "float4" in hw.peak_flops}
    assert with_fp4 == set(FP4_DENSE)
    with pytest.raises(UserError, match="'h100-sxm' has no peak for dtype 'float4'"):
        get_hardware("h100-sxm").peak("float4")


def test_b300_lists_no_int8_peak() -> None:
    # Blackwell Ultra cut the INT8 tensor rate: an int8 GEMM is refused, not priced as FP8
    with pytest.raises(UserError, match="no peak for dtype 'int8'"):
        get_hardware("b300").peak("int8")
    assert get_hardware("b200").peak("int8") == get_hardware("b200").peak("float8")


def test_mi355x_figures() -> None:
    hw = get_hardware("mi355x")
    assert (hw.peak("bfloat16"), hw.peak("float8")) == (2516.6e12, 5033.2e12)
    assert (hw.bandwidth, hw.memory_bytes) == (8e12, 288e9)
    # 256 CUs at 2.4 GHz, 8,192 FP8 FLOPs per CU per clock
    assert hw.peak("float8") == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)
    net = hw.interconnect
    assert net is not None and (net.topology, net.link_domain) == ("mesh", 8)
    assert net.tier(8) == ("infinity-fabric", 7 * 76.8e9, 1e-6)


def test_gb200_nvlink_domain_is_the_whole_rack() -> None:
    net = get_hardware("gb200").interconnect
    assert net is not None and net.link_domain == 72 and net.devices_per_node == 4
    assert net.tier(72) == ("nvlink5", 900e9, 1e-6)  # 72 GPUs: still NVLink
    assert net.tier(2, span=73)[0] == "network"  # past the rack: the NICs
    # an all-reduce over 16 GPUs stays on NVLink on a GB200, leaves the node on HGX B200
    b200, gb200 = get_hardware("b200"), get_hardware("gb200")
    assert all_reduce_s(1e8, 16, gb200) == pytest.approx(2 * 15 / 16 * 1e8 / 900e9 + 30e-6)
    assert all_reduce_s(1e8, 16, b200) == pytest.approx(2 * 15 / 16 * 1e8 / 50e9 + 30 * 5e-6)


@pytest.mark.parametrize(("nvml", "entry"), [
    ("NVIDIA GB200", "gb200"), ("NVIDIA B200", "b200"), ("NVIDIA B300 SXM6 AC", "b300"),
])
def test_blackwell_nvml_names(nvml, entry) -> None:
    assert entry_for_device_name(nvml) == entry


def test_a_profile_may_carry_a_float4_peak(tmp_path) -> None:
    path = tmp_path / "fp4.json"
    path.write_text(json.dumps({
        "name": "fp4", "peak_flops": {"bfloat16": 1e15, "float4": 4e15}, "bandwidth": 4e12,
        "memory_bytes": 1e11, "kind": "gpu"}), encoding="utf-8")
    assert load_profile(path).peak("float4") == 4e15
