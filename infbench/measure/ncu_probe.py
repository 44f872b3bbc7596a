"""The program `infbench.measure.telemetry.ncu_profile` runs under Nsight Compute.

    python -m infbench.measure.ncu_probe POINT.json ACCOUNTED.json NUM_STEPS

Serves the point's static batch until every sequence decodes, then brackets
NUM_STEPS decode steps with cudaProfilerStart/Stop (ncu runs with
--profile-from-start off, so only those kernels are measured) and writes the
bytes the cost model accounts for the same steps.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch

    from infbench.core.config import EngineConfig
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.request import Request, SamplingParams
    from infbench.hardware.spec import get_hardware
    from infbench.measure.traffic import annotate_steps
    from infbench.model.loader import load_model
    from infbench.scenario.point import ModelPoint

    point = json.loads(Path(argv[0]).read_text())
    out, num_steps = Path(argv[1]), int(argv[2])
    w = point["workload"]
    model = ModelPoint(**point["model"])  # the point's to_dict form
    loaded = load_model(model.source(), dtype=point["dtype"], device="cuda",
                        overrides=model.changes())
    batch, prompt = int(w["batch_size"]), int(w["prompt_len"])
    reqs = [Request(f"r{i}", tuple(range(10, 10 + prompt)),
                    SamplingParams(max_tokens=num_steps + 4, ignore_eos=True))
            for i in range(batch)]
    engine_cfg = EngineConfig(**{k: v for k, v in point["engine"].items()
                                 if k in EngineConfig.__dataclass_fields__})
    engine = Engine.create(loaded, engine_cfg, "cuda", point["dtype"],
                           sizing=KVSizing.for_requests(reqs, engine_cfg.block_size))
    for r in reqs:
        engine.add_request(r)
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    while True:  # prefill (possibly chunked) until a pure decode step comes next
        record, _ = engine.step(clock)
        if record.num_prefill_tokens == 0 or engine.scheduler.num_waiting == 0 and all(
                s.num_computed_tokens >= s.num_prompt_tokens for s in engine.scheduler.running):
            break
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    steps = [engine.step(clock)[0] for _ in range(num_steps)]
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    hw = get_hardware("h100-sxm")
    quant = model.quant_config()
    costs = annotate_steps(steps, loaded.config, point["dtype"], quant, hw)
    out.write_text(json.dumps({"bytes": sum(c["bytes"] for c in costs),
                               "flops": sum(c["flops"] for c in costs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
