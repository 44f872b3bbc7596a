"""`make bench`: infbench vs transformers `generate()` on SmolLM2-135M, fp32, CPU.

One process, one run, interleaved rounds: for each batch size the two engines
alternate (warm-up first, then `--rounds` timed rounds each) on the same random
128-token prompts, 64 new tokens, greedy, EOS ignored.  Printed: tokens/s of both,
the ratio, and infbench's batch-1 decode against the memory-bandwidth roofline
(max of the bytes a decode step must read over the streaming read bandwidth of a
1 GB buffer, and its FLOPs over the fp32 GEMM peak, both measured in this same
process).  Ratios are what to compare: the machine is shared.

    python -m infbench.benchmarks.cpu_vs_transformers [--batches 1,16] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def _transformers_model(path: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def _time_hf(model: Any, prompts: list[list[int]], gen: int) -> float:
    import torch

    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=gen,
                             min_new_tokens=gen, pad_token_id=0)
    elapsed = time.perf_counter() - start
    assert out.shape[1] == len(prompts[0]) + gen
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="results/bench_cpu.json")
    args = parser.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.table import Table

    from infbench.core.checkpoint_config import resolve_gguf
    from infbench.core.config import EngineConfig, QuantConfig
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.request import Request, SamplingParams
    from infbench.measure.calibrate import gemm_flops, measure_reference_bandwidth
    from infbench.model.loader import load_model
    from infbench.results.store import env_info, write_json_atomic
    from infbench.roofline.costs import SeqWork, step_costs, total

    console = Console(stderr=True)
    batches = [int(b) for b in args.batches.split(",")]
    path = resolve_gguf("smollm2-135m")
    console.print(f"loading SmolLM2-135M from {path} (infbench and transformers)")
    ours = load_model({"gguf": "smollm2-135m"}, dtype="float32", device="cpu")
    theirs = _transformers_model(path)
    cfg = ours.config
    peak = max(gemm_flops("cpu", torch.float32, (1024, 2048), 3, 1, 5.0).values())
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for batch in batches:
        prompts = [torch.randint(10, cfg.vocab_size, (args.prompt,), generator=gen).tolist()
                   for _ in range(batch)]
        reqs = [Request(f"r{i}", tuple(p), SamplingParams(max_tokens=args.gen, ignore_eos=True))
                for i, p in enumerate(prompts)]
        engine_cfg = EngineConfig(max_num_seqs=max(batch, 1))
        engine = Engine.create(ours, engine_cfg, "cpu", "float32",
                               sizing=KVSizing.for_requests(reqs, engine_cfg.block_size))
        engine.run(reqs)  # warm-up
        _time_hf(theirs, prompts, args.gen)
        ours_s, theirs_s, decode_step_s = [], [], []
        for _ in range(args.rounds):
            res = engine.run(reqs)
            ours_s.append(res.wall_s)
            decode_step_s.append(statistics.median(
                s.duration_s for s in res.steps if s.num_prefill_tokens == 0))
            theirs_s.append(_time_hf(theirs, prompts, args.gen))
        # 1 GB: past any last-level cache, so this is DRAM streaming bandwidth.
        bw = measure_reference_bandwidth("cpu", seconds=1.0, nbytes=1 << 30)
        # Bytes and FLOPs one decode step must move at this batch, mid-generation context;
        # the roofline time is max(bytes / bandwidth, FLOPs / fp32 GEMM peak), both
        # measured in this process.
        ctx = args.prompt + args.gen // 2
        step = total(step_costs(cfg, [SeqWork(1, ctx)] * batch, "float32", QuantConfig()))
        roof_s = max(step.bytes / bw, step.flops / peak)
        decode_s = statistics.median(decode_step_s)
        row = {
            "batch": batch,
            "infbench_tokens_per_s": batch * args.gen / statistics.median(ours_s),
            "transformers_tokens_per_s": batch * args.gen / statistics.median(theirs_s),
            "infbench_decode_tokens_per_s": batch / decode_s,
            "decode_step_bytes": step.bytes,
            "decode_step_flops": step.flops,
            "read_bandwidth_bytes_per_s": bw,
            "gemm_flops_per_s": peak,
            "roofline_decode_tokens_per_s": batch / roof_s,
        }
        row["speedup"] = row["infbench_tokens_per_s"] / row["transformers_tokens_per_s"]
        row["fraction_of_roofline"] = (row["infbench_decode_tokens_per_s"]
                                       / row["roofline_decode_tokens_per_s"])
        rows.append(row)

    table = Table(title=f"SmolLM2-135M fp32 on CPU: {args.prompt}-token prompts, "
                        f"{args.gen} new tokens (median of {args.rounds})")
    for col in ("batch", "infbench tok/s", "transformers tok/s", "speedup",
                "infbench decode tok/s", "roofline decode tok/s", "% of roofline", "read GB/s",
                "GEMM GFLOP/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), f"{r['infbench_tokens_per_s']:.1f}",
                      f"{r['transformers_tokens_per_s']:.1f}", f"{r['speedup']:.2f}x",
                      f"{r['infbench_decode_tokens_per_s']:.1f}",
                      f"{r['roofline_decode_tokens_per_s']:.1f}",
                      f"{100 * r['fraction_of_roofline']:.0f}%",
                      f"{r['read_bandwidth_bytes_per_s'] / 1e9:.1f}",
                      f"{r['gemm_flops_per_s'] / 1e9:.0f}")
    Console().print(table)
    write_json_atomic(args.out, {"kind": "infbench.bench.cpu_vs_transformers",
                                 "env": env_info("cpu"), "args": vars(args), "rows": rows})
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
