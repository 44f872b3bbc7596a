"""Pipeline parallelism on the virtual clock: `pp` virtual engines over `pp` stages.

A pipeline of `pp` stages keeps `pp` batches in flight, one per stage, or all but one
stage idles.  vLLM does this with one scheduler per *virtual engine* (its V0 engine keeps
`pipeline_parallel_size` schedulers, each with 1/pp of the KV blocks, and gives a new
request to the scheduler with the fewest unfinished sequences; V1 keeps `pp` batches in its
batch queue).  The simulation does the same with the engine's own modules:

- `pp` `Sim`s (sim/engine_sim.py), each the engine's `Scheduler` and `BlockManager` with
  1/pp of the replica's KV blocks (or room for every request, when that is less); a
  request goes, when it is submitted, to the virtual engine with the fewest unfinished
  sequences (ties: the lowest index);
- a virtual engine schedules its next step once its last step's tokens are out, when the
  first stage is free; the step then passes stage 0, 1, ..., pp-1, each stage taking the
  seconds the cost model gives for exactly that batch on its layers
  (`roofline.analysis.pipeline_pass`: its share of the layers, the embedding on the first
  stage and the head on the last, its tensor-parallel collectives, the per-step overhead),
  waiting for a stage another virtual engine's step still holds, with one activation hop
  between stages and one back from the last (the sampled tokens return to the scheduler);
- the step's record spans its start to its tokens' return, so per-token times, TTFT and
  the rest come out of the same records and metrics code as one engine's.

Not modelled: speculative decoding (refused, as `predict` refuses it with pp > 1), and a
step's stages overlapping their own hops (a hop waits for its stage to finish).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from infbench.core.errors import ConfigError
from infbench.engine.admission import ClientAdmission
from infbench.engine.records import RequestRecord, StepRecord
from infbench.engine.request import Request
from infbench.engine.sequence import Sequence as Seq
from infbench.roofline.analysis import pipeline_pass
from infbench.roofline.costs import SeqWork
from infbench.sim.engine_sim import Sim, SimConfig, SimOutput, finished_record
from infbench.sim.step_cost import StepBatch, StepPricer


def stage_seconds(pricer: StepPricer, batch: StepBatch) -> tuple[list[float], float]:
    """Each stage's seconds for `batch` and one hop, times the model's step ratio if set."""
    works = [SeqWork(q, c, n) for q, c, n in batch.prefill]
    works += [SeqWork(1, c, 1) for c in batch.decode_contexts]
    works += [SeqWork(q, c, n) for q, c, n in batch.verify]
    stage = "prefill" if batch.prefill else "decode"
    times, hop = pipeline_pass(pricer.cfg, pricer.hw, pricer.dtype, pricer.quant,
                               pricer.parallel, list(Counter(works).items()), stage,
                               pricer.overlap)
    if pricer.scale is not None:
        ratio = pricer.scale(batch.num_tokens)
        times = [t * ratio for t in times]
    return times, hop


def simulate_pipeline(requests: Sequence[Request], pricer: StepPricer, config: SimConfig, *,
                      realtime_arrivals: bool = True, max_concurrency: int | None = None,
                      submit_until_s: float | None = None) -> SimOutput:
    """Serve `requests` on one pipeline-parallel replica (`pricer.parallel.pp` stages) as
    `simulate` serves them on one engine (its arguments mean the same; module docstring).
    `config`'s KV pool is one virtual engine's: 1/pp of the replica's (measure/simulation
    `sim_config` sizes it so)."""
    pp = pricer.parallel.pp
    if pp < 2:
        raise ConfigError(f"simulate_pipeline needs pp >= 2, got {pp}")
    if config.speculative is not None:
        raise ConfigError("speculative decoding is not modelled with pipeline parallelism "
                          "(pp > 1); drop the speculative settings or use pp 1")
    stops = [t for r in requests for t in r.sampling.stop_token_ids]
    sims = [Sim(pricer, config, stops) for _ in range(pp)]
    admission = ClientAdmission(requests, realtime_arrivals=realtime_arrivals,
                                max_concurrency=max_concurrency, submit_until_s=submit_until_s)
    ready = [0.0] * pp  # when each virtual engine may schedule (its last tokens are out)
    free = [0.0] * pp  # when each stage is free
    records: list[RequestRecord] = []
    steps: list[StepRecord] = []
    now = 0.0

    def add_to_least_loaded(request: Request) -> None:
        v = min(range(pp), key=lambda i: (sims[i].scheduler.num_running
                                          + sims[i].scheduler.num_waiting, i))
        ready[v] = max(ready[v], now)  # it cannot schedule a request before it arrives
        sims[v].add(request)

    def end_of(batch: StepBatch, start: float) -> float:
        times, hop = stage_seconds(pricer, batch)
        t = start
        for s, seconds in enumerate(times):
            begin = max(t, free[s])
            free[s] = begin + seconds
            t = free[s] + hop  # to the next stage; from the last, back to the scheduler
        return t

    done: list[tuple[float, list[Seq]]] = []  # (when their tokens are out, finished seqs)

    def retire(until: float) -> None:
        for item in sorted((d for d in done if d[0] <= until), key=lambda d: d[0]):
            for seq in item[1]:
                records.append(finished_record(seq, *admission.finished(seq.request_id,
                                                                        seq.sample_index)))
        done[:] = [d for d in done if d[0] > until]

    while True:
        retire(now)
        admission.admit(now, add_to_least_loaded)
        busy = [v for v in range(pp) if sims[v].scheduler.has_unfinished]
        start = {v: max(ready[v], free[0], now) for v in busy}
        v = min(busy, key=lambda i: (start[i], i)) if busy else -1
        nxt = [d[0] for d in done]  # a finish frees a client slot
        if admission.has_pending and not admission.is_full:
            nxt.append(admission.next_due_s())
        event = min(nxt, default=float("inf"))
        if v < 0 or event < start[v]:  # a finish or an arrival comes first
            if event == float("inf"):
                break  # nothing runs, nothing is in flight, nothing more can be submitted
            now = max(now, event)
            continue
        now = start[v]
        record, finished = sims[v].step(now, end_of)
        steps.append(replace(record, index=len(steps)))
        ready[v] = now + record.duration_s
        done.append((ready[v], finished))
    return SimOutput(records, steps, max([now, *ready]))
