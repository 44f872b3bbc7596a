"""Engine: joins scheduler, block manager, KV cache and runner into a step loop.

`Engine.step()` is schedule -> execute -> update, timed, and emits a StepRecord;
`Engine.run(requests)` replays a workload (arrival times honoured in real time
for Poisson traffic) and returns per-request and per-step records for
`infbench.measure.metrics`.  Each `run` starts from a cold prefix cache, so warm-up runs
and repeats do not leak cache hits into each other.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from infbench.core.config import EngineConfig, ModelConfig
from infbench.core.errors import ConfigError, DoesNotFitError, UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.engine.admission import ClientAdmission
from infbench.engine.backend import get_ops
from infbench.engine.block_manager import BlockManager, StateSlots
from infbench.engine.cuda_graphs import DecodeGraphs
from infbench.engine.kv_cache import (
    TORCH_DTYPES,
    KVCache,
    StatePool,
    kv_budget_bytes,
    kv_bytes_per_token_for,
    kv_quant_refusal,
    kv_value_dtype,
    plan_num_blocks,
)
from infbench.engine.kv_groups import GroupedBlockManager, kv_group_windows, plan_group_blocks
from infbench.engine.moe_stats import RoutingRecorder
from infbench.engine.records import RequestRecord, StepRecord
from infbench.engine.request import Request
from infbench.engine.runner import ModelRunner
from infbench.engine.scheduler import Scheduler, SchedulerOutput
from infbench.engine.sequence import Sequence as Seq
from infbench.engine.spec.base import Proposer, SpecRequest
from infbench.model.context import LanguageModel
from infbench.model.loader import LoadedModel


@dataclass
class RunOutput:
    requests: list[RequestRecord]
    steps: list[StepRecord]
    wall_s: float
    outputs: dict[str, list[int]]  # request id (with /sample suffix when n > 1) -> tokens


@dataclass(frozen=True)
class KVSizing:
    """What the KV pool must hold: the one input from which the engine plans its blocks.

    Every engine is sized through one of the two constructors: `for_requests` (a known
    workload: benchmarks, `infbench run`) or `for_max_model_len` (the Python API and
    `infbench generate`: any prompts up to a length).  The byte budget itself comes from
    `EngineConfig.kv_cache_memory` unless `num_kv_blocks` fixes the pool.
    """

    min_seq_tokens: int = 1  # one sequence this long must fit, or DoesNotFitError up front
    # The most KV slots the engine can ever occupy at once; caps the pool so a CPU run does
    # not zero gigabytes it never uses.  None: the budget alone decides.
    max_tokens_needed: int | None = None
    num_kv_blocks: int | None = None  # blocks per KV pool, instead of the byte budget

    @classmethod
    def for_requests(cls, requests: Sequence[Request], block_size: int, *,
                     capped: bool = True) -> KVSizing:
        """Room for `requests` all resident at once (uncapped: the budget decides)."""
        if not requests:
            raise UserError("no requests to size the engine for")
        longest = max(len(r.prompt_ids) + r.sampling.max_tokens for r in requests)
        cap = max_tokens_needed(requests, block_size) if capped else None
        return cls(min_seq_tokens=longest, max_tokens_needed=cap)

    @classmethod
    def for_max_model_len(cls, max_model_len: int, engine_cfg: EngineConfig,
                          num_kv_blocks: int | None = None) -> KVSizing:
        """Any prompts up to `max_model_len` tokens (prompt + output), max_num_seqs at once."""
        per_seq = math.ceil(max_model_len / engine_cfg.block_size) * engine_cfg.block_size
        return cls(min_seq_tokens=max_model_len,
                   max_tokens_needed=engine_cfg.max_num_seqs * per_seq,
                   num_kv_blocks=num_kv_blocks)


class Engine:
    @classmethod
    def create(cls, loaded: LoadedModel, engine_cfg: EngineConfig, device: str | torch.device,
               dtype: str, *, sizing: KVSizing, seed: int = 0, kv_quant: str = "none",
               speculative: SpeculativeConfig | None = None,
               source: dict[str, str] | None = None) -> Engine:
        """An engine over a loaded model; EOS comes from its tokenizer (None without one).

        `kv_quant` (`model.quant.kv`): none (the KV cache in `dtype`), int8, or fp8 (CUDA).
        `speculative`: a scenario's speculative section (engine/spec/build.py builds its
        proposer; `source`, the target's model source, lets a quantized self-draft load).
        """
        tok = loaded.tokenizer
        engine = cls(loaded.model, loaded.config, engine_cfg, torch.device(device), dtype,
                     weight_bytes=loaded.weight_bytes, sizing=sizing, seed=seed,
                     eos_token_id=tok.eos_token_id if tok is not None else None,
                     kv_quant=kv_quant)
        if speculative is not None and speculative.enabled:
            engine.enable_speculation(speculative, loaded, source)
        return engine

    def __init__(self, model: LanguageModel, cfg: ModelConfig, engine_cfg: EngineConfig,
                 device: torch.device, dtype: str, *, weight_bytes: int,
                 sizing: KVSizing | None = None, seed: int = 0,
                 eos_token_id: int | None = None, kv_quant: str = "none") -> None:
        sizing = sizing or KVSizing()
        reason = kv_quant_refusal(kv_quant, device, cfg)
        if reason is not None:
            raise ConfigError(f"model.quant.kv={kv_quant!r}: {reason}")
        self.kv_quant = kv_quant
        self.model = model
        self.cfg = cfg
        self.engine_cfg = engine_cfg
        self.device = device
        self.dtype = TORCH_DTYPES[dtype]
        self.eos_token_id = eos_token_id
        self.ops = get_ops(engine_cfg.backend, device)
        if engine_cfg.num_threads is not None:
            torch.set_num_threads(engine_cfg.num_threads)  # CPU intra-op threads
        if device.type == "cpu":
            from infbench.model.linear import use_cpu_linears

            if isinstance(model, torch.nn.Module):
                use_cpu_linears(model, self.ops.name)
        if hasattr(model, "set_ops"):
            model.set_ops(self.ops)
        elem = kv_value_dtype(kv_quant, self.dtype).itemsize  # bytes of one cached value
        # Layers with different windows get one KV pool each (engine/kv_groups.py).
        self.kv_windows = kv_group_windows(cfg)
        num_blocks: int | list[int]
        if sizing.num_kv_blocks is not None:
            num_blocks = fixed_num_blocks(cfg, engine_cfg, sizing, len(self.kv_windows))
            self.kv_budget_bytes = sizing.num_kv_blocks * engine_cfg.block_size * sum(
                kv_bytes_per_token_for(cfg, elem, g, kv_quant)
                for g in range(len(self.kv_windows)))
        elif len(self.kv_windows) > 1:
            self.kv_budget_bytes = kv_budget_bytes(engine_cfg, device)
            num_blocks = plan_group_blocks(
                cfg, engine_cfg,
                [kv_bytes_per_token_for(cfg, elem, g, kv_quant)
                 for g in range(len(self.kv_windows))],
                self.kv_budget_bytes, weight_bytes, sizing.max_tokens_needed,
                sizing.min_seq_tokens)
        else:
            num_blocks, self.kv_budget_bytes = plan_num_blocks(
                cfg, engine_cfg, kv_bytes_per_token_for(cfg, elem, kv_quant=kv_quant),
                weight_bytes, device,
                sizing.max_tokens_needed, sizing.min_seq_tokens)
        self.kv = KVCache(cfg, num_blocks, engine_cfg.block_size, self.dtype, device, kv_quant)
        self._group_slot_bytes = [self.kv.group_bytes_per_token(g)
                                  for g in range(len(self.kv.group_num_blocks))]
        # Constant-state schemes reserve one state slot per running sequence instead of blocks.
        has_state = any(spec.mixer in ("linear", "ssm") for spec in cfg.layers())
        self.states = (StatePool(cfg, engine_cfg.max_num_seqs, self.dtype, device)
                       if has_state else None)
        # One KV group whose layers all share a window: the scheduler frees behind it.
        # Several groups: GroupedBlockManager releases per windowed group itself.
        self.window = self.kv_windows[0] if len(self.kv_windows) == 1 else None
        self.runner = ModelRunner(model, self.kv, self.ops, device, seed, states=self.states)
        # MoE: the tokens each expert received, read once per step (engine/moe_stats.py).
        self.routing = (RoutingRecorder(model, cfg, self.dtype.itemsize)
                        if cfg.moe is not None else None)
        # Features asked for that this model runs without: results record them (no silent
        # downgrades), as {"feature": engine-config key, "reason": why}.
        self.disabled: list[dict[str, str]] = []
        if engine_cfg.enable_prefix_caching:
            reason = None
            if self.states is not None:
                reason = "a prefix-cache hit cannot restore a recurrent (linear/SSM) state"
            elif len(self.kv.group_num_blocks) > 1:
                reason = "models with several KV groups (windowed and full layers) share no cache"
            if reason is not None:
                self.disabled.append({"feature": "enable_prefix_caching", "reason": reason})
        if engine_cfg.cuda_graphs and cfg.moe is not None:
            self.disabled.append({"feature": "cuda_graphs", "reason": "MoE layers sort their "
                                  "tokens by expert with data-dependent sizes (not captured)"})
        elif engine_cfg.cuda_graphs:
            self._enable_cuda_graphs()
        self.seed = seed
        # Speculative decoding (enable_speculation): the proposer, its settings, and
        # whether runs speculate (set_speculation turns it off for a same-run baseline).
        self.proposer: Proposer | None = None
        self.spec: SpeculativeConfig | None = None
        self.speculating = False
        self.reset()

    def enable_speculation(self, spec: SpeculativeConfig, loaded: LoadedModel,
                           source: dict[str, str] | None = None) -> None:
        """Build the proposer of `spec` and speculate from the next run on."""
        from infbench.engine.spec.build import build_proposer

        self.proposer = build_proposer(spec, loaded, self, target_source=source, seed=self.seed)
        self.spec = spec
        self.set_speculation(True)

    def set_speculation(self, on: bool) -> None:
        """Speculate (True) or decode plainly (False) from the next run on."""
        if on and self.proposer is None:
            raise ValueError("enable_speculation first")
        self.speculating = on
        self.runner.feature_sink = (self.proposer.observe if on and self.proposer is not None
                                    and self.proposer.needs_features else None)
        self.reset()

    def _enable_cuda_graphs(self) -> None:
        reason = None
        if self.device.type != "cuda":
            reason = "there is no GPU (CUDA graphs are a GPU feature)"
        elif self.states is not None or any(s.mixer == "mla" for s in self.cfg.layers()):
            reason = "MLA and recurrent-state layers run eagerly for now"
        elif len(self.kv.group_num_blocks) > 1:
            reason = "models with several KV groups (windowed and full layers) run eagerly"
        elif any(s.softcap is not None for s in self.cfg.layers()):
            # model/softcap.py reads context lengths on the host: not capturable
            reason = "soft-capped attention (Gemma-2) runs its torch fallback eagerly"
        if reason is not None:
            self.disabled.append({"feature": "cuda_graphs", "reason": reason})
            warnings.warn(f"engine.cuda_graphs ignored: {reason}", stacklevel=3)
            return
        self.runner.graphs = DecodeGraphs(
            self.model, self.kv, self.ops, self.device, self.engine_cfg.max_num_seqs,
            self.cfg.max_seq_len, self.runner.graph_context)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Fresh bookkeeping (cold prefix cache) over the same model and KV pool."""
        # A prefix-cache hit cannot restore a recurrent state: no prefix caching with states.
        caching = self.engine_cfg.enable_prefix_caching and self.states is None
        self.block_manager: BlockManager | GroupedBlockManager
        if len(self.kv.group_num_blocks) > 1:  # no prefix caching over several groups
            self.block_manager = GroupedBlockManager(
                self.kv.group_num_blocks, self.engine_cfg.block_size, self.kv_windows,
                self.engine_cfg)
        else:
            self.block_manager = BlockManager(
                self.kv.num_blocks, self.engine_cfg.block_size, caching)
        slots = StateSlots(self.states.num_slots) if self.states is not None else None
        speculating = getattr(self, "speculating", False)
        self.scheduler = Scheduler(
            self.engine_cfg, self.block_manager, state_slots=slots, window=self.window,
            eos_token_id=self.eos_token_id,
            num_spec_tokens=self.spec.num_tokens if speculating and self.spec else 0)
        self.runner.reset()  # fresh sampler streams and persistent batch
        proposer = getattr(self, "proposer", None)
        if proposer is not None:
            proposer.reset()
        if self.routing is not None:
            self.routing.reset()
        self._step_index = 0

    def add_request(self, request: Request) -> Seq:
        if len(request.prompt_ids) + request.sampling.max_tokens > self.cfg.max_seq_len:
            raise UserError(
                f"request {request.request_id}: prompt ({len(request.prompt_ids)}) + max_tokens "
                f"({request.sampling.max_tokens}) exceeds the model context "
                f"({self.cfg.max_seq_len} tokens)")
        # Forked samples take ids from the same counter, so ask the scheduler.
        seq = Seq.from_request(request, self.scheduler.next_seq_id())
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str, sample_index: int | None = None) -> list[Seq]:
        """Stop serving a request (one sample with `sample_index`) between steps: its
        sequences leave the scheduler, their KV blocks and state slots are freed, and the
        runner, sampler and proposer forget them.  Returns the sequences removed."""
        removed = self.scheduler.abort(request_id, sample_index)
        for seq in removed:
            self.runner.sampler.release((seq.request_id, seq.sample_index))
            self.runner.release(seq.seq_id)
            if self.proposer is not None:
                self.proposer.release(seq.seq_id)
        return removed

    def step(self, clock: Callable[[], float]) -> tuple[StepRecord, list[Seq]]:
        start = clock()
        out = self.scheduler.schedule()
        draft_time = self._propose(out) if self.speculating else 0.0
        device_time = None
        if self.device.type == "cuda":
            begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            begin.record()
            sampled = self.runner.execute(out) if not out.is_empty else {}
            end.record()
            end.synchronize()
            device_time = begin.elapsed_time(end) / 1e3
        else:
            sampled = self.runner.execute(out) if not out.is_empty else {}
        now = clock()
        finished = self.scheduler.update(out, sampled, now)
        if self.states is not None and self.scheduler.forked:
            self.states.copy_slots([(p.state_slot, c.state_slot)
                                    for p, c in self.scheduler.forked])
        bm = self.block_manager
        # One pass per list over the scheduled sequences (this runs for every sequence
        # every step): the prefill counts come from the prefill lengths, the decode
        # counts are the rest.
        scheduled = out.scheduled
        query_lens = [s.num_new_tokens for s in scheduled]
        prefill_lens = [s.num_new_tokens for s in scheduled if s.is_prefill]
        num_prefill_tokens = sum(prefill_lens)
        record = StepRecord(
            index=self._step_index,
            start_s=start,
            duration_s=now - start,
            num_prefill_tokens=num_prefill_tokens,
            num_decode_tokens=sum(query_lens) - num_prefill_tokens,
            num_prefill_seqs=len(prefill_lens),
            num_decode_seqs=len(scheduled) - len(prefill_lens),
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            kv_slots_used=used_slots(self.scheduler.running, bm),
            kv_bytes_used=self._kv_bytes_used(),
            num_preempted=len(out.preempted),
            context_lens=[s.start_pos + s.num_new_tokens for s in scheduled],
            query_lens=query_lens,
            logits_lens=[s.num_new_tokens if s.spec_tokens else 1 if s.num_samples > 0 else 0
                         for s in scheduled],
            device_time_s=device_time,
            spec_drafts=[d for d, _ in self.runner.verified],
            spec_accepted=[a for _, a in self.runner.verified],
            draft_time_s=draft_time,
        )
        if self.routing is not None:
            record.moe = self.routing.take()
        self._step_index += 1
        for seq in finished:
            self.runner.sampler.release((seq.request_id, seq.sample_index))
            self.runner.release(seq.seq_id)
            if self.proposer is not None:
                self.proposer.release(seq.seq_id)
        for seq in out.preempted:  # recomputed later with new blocks: its rows can go
            self.runner.release(seq.seq_id)
        return record, finished

    def _propose(self, out: SchedulerOutput) -> float:
        """Ask the proposer for the drafts of every decode given room for them; returns the
        seconds it took.  A sequence given fewer drafts (none: a plain decode) computes
        fewer tokens; its unused slots are released after verification."""
        items = [s for s in out.scheduled if s.num_spec > 0]
        if not items:
            return 0.0
        assert self.proposer is not None
        t0 = time.perf_counter()
        requests = [SpecRequest(s.seq.seq_id, s.seq.token_ids, s.num_spec, s.seq.sampling,
                                s.seq.block_table, s.seq.num_preemptions) for s in items]
        proposals = self.proposer.propose(requests)
        for item, proposal in zip(items, proposals, strict=True):
            tokens = proposal.tokens[:item.num_spec]
            item.num_new_tokens = 1 + len(tokens)
            if tokens:
                item.spec_tokens = tokens
                if proposal.probs is not None:
                    item.spec_probs = proposal.probs[:len(tokens)]
        return time.perf_counter() - t0

    def _kv_bytes_used(self) -> int:
        """Bytes of the used blocks: used blocks x block_size x bytes per slot, per group."""
        bm, bs = self.block_manager, self.engine_cfg.block_size
        used = (bm.group_used_blocks() if isinstance(bm, GroupedBlockManager)
                else [bm.num_used_blocks])
        return sum(n * bs * b for n, b in zip(used, self._group_slot_bytes, strict=True))

    # ------------------------------------------------------------------ runs
    def run(self, requests: Sequence[Request], realtime_arrivals: bool = True,
            on_step: Callable[[StepRecord], None] | None = None, *,
            keep_prefix_cache: bool = False, max_concurrency: int | None = None,
            submit_until_s: float | None = None) -> RunOutput:
        """Serve `requests` to completion; arrival_s offsets are replayed in real time.

        Measurements start cold (a fresh block manager); the Python API keeps the prefix
        cache across `generate` calls, as vLLM does, with `keep_prefix_cache`.

        `max_concurrency` N is a client-side cap: a request is submitted only while fewer
        than N requests are outstanding (a request with n samples is one request until its
        last sample finishes).  A request held back is submitted when a slot frees, and its
        arrival (TTFT, E2E) counts from that submission, as vLLM's benchmark client does.

        `submit_until_s` (a time-based run, measure.duration_s): no request is submitted
        once that many seconds have passed; those in flight finish, the rest never run.
        """
        admission = ClientAdmission(requests, realtime_arrivals=realtime_arrivals,
                                    max_concurrency=max_concurrency,
                                    submit_until_s=submit_until_s)
        if not keep_prefix_cache or self.scheduler.has_unfinished:
            self.reset()
        t0 = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - t0

        records: list[RequestRecord] = []
        steps: list[StepRecord] = []
        outputs: dict[str, list[int]] = {}
        while admission.has_pending or self.scheduler.has_unfinished:
            admission.admit(clock(), self.add_request)
            if not self.scheduler.has_unfinished:
                if not admission.has_pending:
                    break  # submissions stopped (measure.duration_s) and everything finished
                time.sleep(max(0.0, admission.next_due_s() - clock()))
                continue
            record, finished = self.step(clock)
            steps.append(record)
            if on_step is not None:
                on_step(record)
            for seq in finished:
                key, arrival_s = admission.finished(seq.request_id, seq.sample_index)
                outputs[key] = list(seq.output_ids)
                records.append(RequestRecord(
                    request_id=key,
                    arrival_s=arrival_s,
                    num_prompt_tokens=seq.num_prompt_tokens,
                    token_times_s=list(seq.token_times_s),
                    num_cached_prompt_tokens=seq.num_cached_tokens,
                    num_preemptions=seq.num_preemptions,
                    finish_reason=seq.finish_reason or "length",
                    output_ids=list(seq.output_ids),
                ))
        return RunOutput(records, steps, clock(), outputs)


def used_slots(running: list[Seq], bm: BlockManager | GroupedBlockManager) -> int:
    """Token slots holding live KV: used blocks minus the empty tail of each last block.

    Blocks cover exactly the computed tokens after an update, so only the last block
    of a sequence can be partly empty; forked samples share it until they diverge,
    hence the dict over block ids.  Several KV groups: the sum over groups.
    """
    if isinstance(bm, GroupedBlockManager):
        return bm.used_slots(running)
    bs = bm.block_size
    # This runs over every sequence every step, so the common case is plain list
    # comprehensions and sums: every table ends in a live block of its own and every
    # hole is within [0, bs].  Otherwise (forked samples sharing a last block, released
    # or empty tables) the holes are keyed by block, as the docstring says.
    tables = [seq.block_table for seq in running]
    if all(tables):
        lasts = [t[-1] for t in tables]
        holes = [len(t) * bs - seq.num_computed_tokens
                 for seq, t in zip(running, tables, strict=True)]
        if (len(set(lasts)) == len(lasts) and min(lasts, default=0) >= 0
                and min(holes, default=0) >= 0 and max(holes, default=0) <= bs):
            return bm.num_used_blocks * bs - sum(holes)
    by_block = {t[-1]: min(max(len(t) * bs - seq.num_computed_tokens, 0), bs)
                for seq, t in zip(running, tables, strict=True) if t and t[-1] >= 0}
    return bm.num_used_blocks * bs - sum(by_block.values())


def fixed_num_blocks(cfg: ModelConfig, engine_cfg: EngineConfig, sizing: KVSizing,
                     num_groups: int) -> int | list[int]:
    """An explicit pool size (`num_kv_blocks`, per KV group) that must hold one sequence."""
    assert sizing.num_kv_blocks is not None
    need = math.ceil(sizing.min_seq_tokens / engine_cfg.block_size)
    if sizing.num_kv_blocks < need:
        raise DoesNotFitError(
            f"model {cfg.name!r}: num_kv_blocks={sizing.num_kv_blocks} holds "
            f"{sizing.num_kv_blocks * engine_cfg.block_size} tokens, but one sequence of "
            f"{sizing.min_seq_tokens} tokens needs {need} blocks of {engine_cfg.block_size}")
    return sizing.num_kv_blocks if num_groups == 1 else [sizing.num_kv_blocks] * num_groups


def max_tokens_needed(requests: Sequence[Request], block_size: int) -> int:
    """KV slots the workload can occupy at once, at most (every request resident)."""
    return sum(
        math.ceil((len(r.prompt_ids) + r.sampling.max_tokens) / block_size) * block_size * r.n
        for r in requests
    )
