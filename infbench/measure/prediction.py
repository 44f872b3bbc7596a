"""The analytic prediction for a measured scenario point, under the metric names.

`bench.run_point` stores this next to the measured metrics, so `infbench
report` can print measured, predicted and error % side by side.  Static and
offline workloads are predicted (static as waves of batch_size requests, offline as waves
of `max_num_seqs`, or of workload.max_concurrency when lower); dataset workloads, whose
lengths vary per request, are not; Poisson traffic depends on queueing the roofline
does not model, so it is left unpredicted rather than guessed.

The names mean what the measured metrics mean (docs/results.md#metric-definitions):
`ttft_s`, `tpot_s` = (E2E - TTFT) / (gen_len - 1) and `e2e_s` of one request of the
first wave; `output_tokens_per_s` and `total_tokens_per_s` end to end (tokens / the
predicted wall time of the whole workload, prefill included); `decode_tokens_per_s`
the decode-only rate (batch / decode step time), which has no measured twin.

`profile_flags` carries the flags of a calibrated profile (`HardwareSpec.profile_flags`,
[] when it has none) so that `run` and `report` can say a prediction rests on doubtful
figures; datasheet entries leave it out.
"""

from __future__ import annotations

import math
from typing import Any

from infbench.core.config import ModelConfig
from infbench.hardware.spec import CURVE_KEY, HardwareSpec
from infbench.roofline.analysis import predict, prediction_dict, quantized_rates


def predict_point(point: Any, cfg: ModelConfig, hw: HardwareSpec) -> dict[str, Any]:
    w = point.workload
    if w.kind == "poisson":
        return {"hardware": hw.name, "note": "not predicted: Poisson arrivals (queueing)"}
    if w.kind == "trace" or w.dataset is not None:
        return {"hardware": hw.name, "note": "not predicted: prompt and output lengths from a "
                "dataset (the roofline prices one shape)"}
    n = w.num_prompts * w.samples_per_prompt
    # static runs batch_size at a time (a client cap); offline is capped by the engine only
    at_once = w.batch_size * w.samples_per_prompt if w.kind == "static" else n
    if w.max_concurrency is not None:
        at_once = min(at_once, w.max_concurrency * w.samples_per_prompt)
    batch = min(at_once, point.engine.max_num_seqs)
    waves = math.ceil(n / batch)
    p = predict(cfg, hw, batch=batch, prompt_len=w.prompt_len, gen_len=w.gen_len,
                dtype=point.dtype, quant=point.quant_config())
    d = prediction_dict(p)  # ttft_s, tpot_s, e2e_s, decode_tokens_per_s of one wave
    wall = waves * p.e2e_s  # waves run back to back
    d.update({
        "hardware": hw.name,
        "output_tokens_per_s": n * w.gen_len / wall,
        "total_tokens_per_s": n * (w.prompt_len + w.gen_len) / wall,
        "waves": waves,
        "overlap": p.overlap,
    })
    if hw.extra:  # a calibrated profile (datasheet entries have no calibration details)
        d["profile_flags"] = hw.profile_flags
    notes = []
    quant = point.quant_config()
    if quant.method == "llm_int8":  # its outlier count is known after loading
        notes.append("llm_int8 priced as int8: the outlier columns it keeps in the model dtype "
                     "(chosen on calibration text) are not in the predicted weight bytes; the "
                     "measured weight_bytes count them")
    if (quant.weights != "none" and CURVE_KEY in hw.extra
            and not quantized_rates(cfg, hw, quant, batch)):
        notes.append(f"quantized projections priced at the {point.dtype} matmul curve of "
                     f"profile {hw.name!r}: it has no curve of the kernels these weights run "
                     "(calibrate measures int8 and int4 with float activations on the C++ "
                     "backend), so their smaller weight reads are not credited")
    if notes:
        d["note"] = "; ".join(notes)
    return d
