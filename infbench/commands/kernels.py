"""`infbench kernels bench`: kernel micro-benchmarks on the roofline (parse, call, print).

The sweep and the timing live in `infbench.measure.kernel_bench`; torch is imported only when
the command runs, so `infbench --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from infbench.commands import _options as opt
from infbench.core.errors import UserError


def register(app: typer.Typer) -> None:
    kernels_app = typer.Typer(
        help="Triton kernels: micro-benchmarks against the hardware peaks.",
        no_args_is_help=True,
    )
    kernels_app.command("bench")(bench)
    app.add_typer(kernels_app, name="kernels")


def bench(
    device: str = typer.Option(
        "auto", callback=opt.non_empty, help="cpu | cuda | auto (cuda when available)."),
    dtype: str = typer.Option(
        "auto", callback=opt.non_empty,
        help="float32 | float16 | bfloat16 | auto (bfloat16 on cuda, float32 on cpu)."
    ),
    quick: bool = typer.Option(False, "--quick", help="A short sweep (about 20 s on a CPU)."),
    out: Path | None = typer.Option(None, "--out", callback=opt.output_file,
                                    help="Write the rows to this JSON file."),
    hardware: str | None = typer.Option(
        None, callback=opt.non_empty,
        help="Hardware spec for the peaks (default: cpu on CPU, on CUDA the entry of the GPU "
             "NVML names)."
    ),
) -> None:
    """Time each kernel over a size sweep; report achieved GB/s, TFLOP/s and % of peak.

    On CUDA the Triton kernels run (timed with triton.testing.do_bench); on a CPU the
    torch references, i.e. the engine's CPU backend, are timed instead.
    """
    from rich.console import Console

    from infbench.hardware.spec import default_hardware, get_hardware
    from infbench.measure import kernel_bench

    if out is not None and out.suffix != ".json":
        raise UserError(f"--out {out}: expected a .json file name")
    resolved = kernel_bench.resolve_device(device)
    dtype_name = kernel_bench.resolve_dtype(dtype, resolved)
    spec = get_hardware(hardware or default_hardware(resolved))  # NVML's GPU, never a guess
    spec.peak(dtype_name)  # fail before timing anything if the spec lacks this dtype
    sizes = kernel_bench.default_sizes(resolved, quick)
    console = Console(stderr=True)
    with console.status("benchmarking kernels") as status:
        rows = kernel_bench.run_kernel_bench(
            resolved, dtype_name, spec, sizes,
            on_row=lambda row: status.update(f"{row.kernel} {row.shape}"),
        )
    _print_table(rows, resolved, dtype_name, spec.name)
    if out is not None:
        document = kernel_bench.bench_document(rows, resolved, dtype_name, spec, quick)
        kernel_bench.write_json(out, document)
        console.print(f"wrote {len(rows)} rows to {out}")


def _print_table(rows: list, device: str, dtype: str, hardware: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kernels on {device} ({dtype}), peaks from {hardware}")
    table.add_column("kernel", no_wrap=True)
    table.add_column("shape")
    table.add_column("backend", no_wrap=True)
    for name in ("time (us)", "GB/s", "TFLOP/s", "% peak BW", "% peak FLOPs"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            row.kernel, row.shape, row.backend, f"{row.time_us:,.1f}", f"{row.gb_per_s:,.1f}",
            f"{row.tflop_per_s:.3f}", f"{row.pct_peak_bandwidth:.1f}",
            f"{row.pct_peak_flops:.1f}",
        )
    Console().print(table)
