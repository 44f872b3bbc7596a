"""`infbench kernels bench`: the sweep, the timing rows and the JSON they are written to."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from infbench.commands import kernels as kernels_command
from infbench.core.errors import UserError
from infbench.hardware.spec import get_hardware
from infbench.measure import kernel_bench
from kernels.paged_decode_attention import paged_decode_attention_cost
from kernels.quant_matmul import int4_matmul_cost

TINY = kernel_bench.BenchSizes(
    num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, hidden_size=32,
    intermediate_size=16, group_size=32, decode_batches=(2,), decode_contexts=(10,),
    prefill_lens=(6,), num_tokens=(3,), matmul_shapes=((1, 16, 64), (12, 16, 64)),
    warmup=0, repeats=2,
)
KERNELS = {"paged_decode_attention", "prefill_attention", "rmsnorm+residual", "rope",
           "silu_and_mul", "store_kv", "int8_gemv", "int4_gemv", "int8_gemm", "int4_gemm",
           "mla_decode_attention", "linear_attention_decode"}


def test_rows_carry_costs_and_derived_rates():
    cpu = get_hardware("cpu")
    rows = kernel_bench.run_kernel_bench("cpu", "float32", cpu, TINY)
    assert {r.kernel for r in rows} == KERNELS and len(rows) == len(KERNELS)
    for row in rows:
        assert row.backend == "torch" and row.time_us > 0 and row.bytes > 0
        seconds = row.time_us * 1e-6
        assert row.gb_per_s == pytest.approx(row.bytes / seconds / 1e9)
        assert row.pct_peak_bandwidth == pytest.approx(100 * row.bytes / seconds / cpu.bandwidth)
        assert row.pct_peak_flops == pytest.approx(
            100 * row.flops / seconds / cpu.peak("float32"))
    decode = next(r for r in rows if r.kernel == "paged_decode_attention")
    assert decode.bytes == paged_decode_attention_cost(2, 4, 2, 16, 16, 10, 4).bytes
    gemv = next(r for r in rows if r.kernel == "int4_gemv")
    assert gemv.flops == int4_matmul_cost(1, 16, 64, 32, 4).flops


def test_cli_writes_json_atomically(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_bench, "default_sizes", lambda device, quick: TINY)
    app = typer.Typer()
    kernels_command.register(app)
    out = tmp_path / "sub" / "kernels.json"
    result = CliRunner().invoke(
        app, ["kernels", "bench", "--device", "cpu", "--quick", "--out", str(out),
              "--hardware", "h100-sxm"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == kernel_bench.SCHEMA_VERSION and doc["quick"] is True
    from infbench.core.device import auto_dtype

    assert doc["device"] == "cpu" and doc["dtype"] == auto_dtype("cpu")[0]  # --dtype auto
    assert doc["hardware"] == "h100-sxm" and doc["peak_bandwidth"] == 3.35e12
    assert {row["kernel"] for row in doc["rows"]} == KERNELS
    assert all(row["time_us"] > 0 for row in doc["rows"])
    assert [p.name for p in out.parent.iterdir()] == ["kernels.json"]  # no temp file left
    assert "paged_decode_attention" in result.output


@pytest.mark.parametrize("args", [["--device", "tpu"], ["--dtype", "int3"],
                                  ["--hardware", "no-such-gpu"], ["--out", "x.csv"]],
                         ids=["device", "dtype", "hardware", "out"])
def test_cli_rejects_bad_input(args, monkeypatch):
    monkeypatch.setattr(kernel_bench, "default_sizes", lambda device, quick: TINY)
    app = typer.Typer()
    kernels_command.register(app)
    result = CliRunner().invoke(app, ["kernels", "bench", "--device", "cpu", *args])
    assert isinstance(result.exception, UserError), result.output


def test_importing_the_command_does_not_import_torch():
    code = ("import sys, infbench.commands.kernels, infbench.measure.kernel_bench; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_default_sizes():
    quick, full = kernel_bench.default_sizes("cpu", True), kernel_bench.default_sizes("cpu", False)
    assert max(full.decode_contexts) >= 16384 and max(quick.decode_contexts) <= 4096
    assert 16384 in kernel_bench.default_sizes("cuda", True).decode_contexts
