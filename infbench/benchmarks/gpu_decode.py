"""`make bench-gpu`: batch-1 decode of a llama3-8b-shaped model (random bf16 weights).

Runs the engine with the Triton backend on CUDA and reports the decode step time,
tokens/s and MBU: the bytes a decode step must read (weights + KV, from the same
cost model as `infbench predict`) / step time / the GPU's datasheet bandwidth.
gpt-fast reaches about 68% of the A100's bandwidth in bf16; the target here is 75%.

    python -m infbench.benchmarks.gpu_decode [--batches 1,8] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any


def _hardware_for(name: str) -> str:
    """The table entry of the GPU torch names (never a silent H100: no entry is an error)."""
    from infbench.core.errors import UserError
    from infbench.hardware.spec import entry_for_device_name

    entry = entry_for_device_name(name)
    if entry is None:
        raise UserError(f"GPU {name!r} has no entry in the hardware table; run "
                        "`infbench calibrate` and pass its profile")
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--out", default="results/decode_gpu.json")
    args = parser.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.table import Table

    from infbench.core.config import EngineConfig, QuantConfig
    from infbench.core.errors import UserError
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.request import Request, SamplingParams
    from infbench.hardware.spec import get_hardware
    from infbench.model.loader import load_model
    from infbench.results.store import env_info, write_json_atomic
    from infbench.roofline.costs import SeqWork, step_costs, total

    if not torch.cuda.is_available():
        raise UserError("make bench-gpu needs CUDA; on a CPU run `make bench`")
    hw = get_hardware(_hardware_for(torch.cuda.get_device_name()))
    loaded = load_model({"preset": args.model}, dtype="bfloat16", device="cuda")
    cfg = loaded.config
    rows: list[dict[str, Any]] = []
    for batch in [int(b) for b in args.batches.split(",")]:
        reqs = [Request(f"r{i}", tuple(range(10, 10 + args.prompt)),
                        SamplingParams(max_tokens=args.gen, ignore_eos=True))
                for i in range(batch)]
        engine_cfg = EngineConfig(backend="triton", max_num_seqs=batch,
                                  enable_prefix_caching=False, cuda_graphs=args.cuda_graphs)
        engine = Engine.create(loaded, engine_cfg, "cuda", "bfloat16",
                               sizing=KVSizing.for_requests(reqs, engine_cfg.block_size))
        engine.run(reqs)
        res = engine.run(reqs)
        decode = [s for s in res.steps if s.num_prefill_tokens == 0]
        step_s = statistics.median(s.duration_s for s in decode)
        ctx = args.prompt + args.gen // 2
        step = total(step_costs(cfg, [SeqWork(1, ctx)] * batch, "bfloat16", QuantConfig()))
        rows.append({
            "batch": batch, "decode_step_s": step_s, "decode_tokens_per_s": batch / step_s,
            "step_bytes": step.bytes, "achieved_bytes_per_s": step.bytes / step_s,
            "mbu": step.bytes / step_s / hw.bandwidth,
        })
    table = Table(title=f"{args.model} bf16 decode on {torch.cuda.get_device_name()} "
                        f"({hw.name}, {hw.bandwidth / 1e12:.2f} TB/s)")
    for col in ("batch", "step ms", "tok/s", "GB/s", "MBU"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), f"{r['decode_step_s'] * 1e3:.2f}",
                      f"{r['decode_tokens_per_s']:.1f}", f"{r['achieved_bytes_per_s'] / 1e9:.0f}",
                      f"{100 * r['mbu']:.0f}%")
    Console().print(table)
    write_json_atomic(args.out, {"kind": "infbench.bench.gpu_decode", "env": env_info("cuda"),
                                 "hardware": hw.to_dict(), "args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # one line for user errors, like the CLI
        from infbench.core.errors import UserError

        if isinstance(exc, UserError):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
