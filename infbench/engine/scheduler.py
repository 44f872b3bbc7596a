"""Continuous-batching scheduler (vLLM v1 style): one token budget, no prefill/decode split.

Every step each sequence is given the next `num_new_tokens` tokens whose KV is not
in the cache yet, min(num_tokens - num_computed_tokens, remaining budget).  A fresh
prompt, a chunk of a long prompt, a one-token decode and the recompute of a
preempted sequence are the same operation; when a chunk reaches the end of the
sequence's tokens the runner samples the next token.

Order is FCFS: running sequences first (so decodes are never starved by new
prompts), then waiting ones until the budget, `max_num_seqs`, the KV blocks or the
state slots run out.  When a running sequence cannot grow, the most recently
admitted sequences are preempted by recompute (their blocks are freed and they go
back to the front of the queue; prefix caching may give their KV back).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infbench.core.config import EngineConfig
from infbench.core.errors import UserError
from infbench.engine.block_manager import BlockManager, StateSlots, cdiv
from infbench.engine.kv_groups import GroupedBlockManager
from infbench.engine.sequence import SeqStatus, Sequence


@dataclass(slots=True)
class ScheduledSeq:
    """Tokens [start_pos, start_pos + num_new_tokens) of `seq` are computed this step."""

    seq: Sequence
    start_pos: int
    num_new_tokens: int
    # 0: the chunk does not reach the end; 1: sample one token; seq.n: the prompt
    # completes and the sequence forks into n samples.
    num_samples: int
    is_prefill: bool  # False only for a decode of a generated token (plain or speculative)
    # Speculative decoding: slots allotted for up to `num_spec` drafts after the decoded
    # token; the engine fills `spec_tokens` (at most num_spec) before the step runs and
    # sets num_new_tokens to 1 + len(spec_tokens).
    num_spec: int = 0
    spec_tokens: list[int] | None = None
    spec_probs: Any = None  # (len(spec_tokens), V) draft q, or None: drafted deterministically


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst), before forward
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled if s.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled if not s.is_prefill)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager | GroupedBlockManager,
        state_slots: StateSlots | None = None,
        window: int | None = None,
        eos_token_id: int | None = None,
        num_spec_tokens: int = 0,
    ):
        if state_slots is not None and block_manager.enable_prefix_caching:
            # A cached block restores KV, not a recurrent state: a hit would skip tokens
            # that the state never saw.
            raise ValueError(
                "prefix caching cannot restore per-sequence states: build the BlockManager "
                "with enable_prefix_caching=False when state_slots are used"
            )
        self.config = config
        self.block_manager = block_manager
        self.state_slots = state_slots
        self.window = window
        self.eos_token_id = eos_token_id
        # Speculative decoding: each decode gets room for up to this many drafts (k).
        self.num_spec_tokens = num_spec_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.forked: list[tuple[Sequence, Sequence]] = []  # (parent, child) of the last update
        self._next_seq_id = 0
        self._live_ids: set[int] = set()  # ids of waiting and running sequences

    # ------------------------------------------------------------------ queue
    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def next_seq_id(self) -> int:
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        return seq_id

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (FCFS); reject requests that could never be served."""
        if seq.seq_id in self._live_ids:
            # Fork children take ids from next_seq_id(): new sequences must too.
            raise ValueError(f"seq id {seq.seq_id} is in use; take ids from next_seq_id()")
        self._check_servable(seq)
        self._next_seq_id = max(self._next_seq_id, seq.seq_id + 1)
        self._live_ids.add(seq.seq_id)
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def _check_servable(self, seq: Sequence) -> None:
        cfg, bm = self.config, self.block_manager
        rid, num_prompt = seq.request_id, seq.num_prompt_tokens
        if not cfg.enable_chunked_prefill and num_prompt > cfg.max_num_batched_tokens:
            raise UserError(
                f"request {rid}: prompt of {num_prompt} tokens exceeds "
                f"engine.max_num_batched_tokens ({cfg.max_num_batched_tokens}) with "
                "engine.enable_chunked_prefill off; raise the limit or enable chunked prefill"
            )
        max_tokens = seq.sampling.max_tokens
        num_needed = cdiv(num_prompt + max_tokens, bm.block_size)
        if num_needed > bm.max_seq_blocks:
            raise UserError(
                f"request {rid}: prompt ({num_prompt}) + max_tokens ({max_tokens}) needs "
                f"{num_needed} KV blocks of {bm.block_size} tokens, but the KV budget "
                f"(engine.kv_cache_memory) holds {bm.max_seq_blocks}; shorten the request or "
                "raise engine.kv_cache_memory"
            )
        if seq.n > cfg.max_num_seqs:
            raise UserError(
                f"request {rid}: n={seq.n} samples exceed engine.max_num_seqs ({cfg.max_num_seqs})"
            )
        if self.state_slots is not None and seq.n > self.state_slots.num_slots:
            raise UserError(
                f"request {rid}: n={seq.n} samples need {seq.n} recurrent states, but the KV "
                f"budget (engine.kv_cache_memory) holds {self.state_slots.num_slots}"
            )

    # --------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        # Like vLLM v1: admitting new work in a step that had to preempt would thrash.
        if not out.preempted:
            budget = self._schedule_waiting(out, budget)
        # Every scheduled token was taken from the budget.
        out.num_batched_tokens = self.config.max_num_batched_tokens - budget
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        # Runs once per running sequence per step: the host loop's hot path (about 1 us
        # per sequence is all a step at batch 256 may spend in total), so methods are
        # bound to locals, the block manager is asked once (try_append_slots), and a
        # plain decode builds its ScheduledSeq without _chunk_size and _scheduled.
        running, scheduled = self.running, out.scheduled
        try_append = self.block_manager.try_append_slots
        running_status = SeqStatus.RUNNING
        spec = self.num_spec_tokens
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            start = seq.num_computed_tokens
            num_remaining = len(seq.prompt_ids) + len(seq.output_ids) - start
            # One token left after generated ones: a decode of the last sampled token.
            is_decode = num_remaining == 1 and len(seq.output_ids) > 0
            num_new = 1 if num_remaining == 1 else self._chunk_size(num_remaining, budget)
            num_spec = 0
            if spec and is_decode:
                # Drafts beyond max_tokens could never be emitted; the budget caps them too.
                num_spec = max(0, min(spec, seq.sampling.max_tokens - len(seq.output_ids) - 1,
                                      budget - 1))
                num_new += num_spec
            if num_new == 0:
                i += 1
                continue
            copies = try_append(seq, num_new)
            while copies is None:
                victim = running.pop()  # latest admitted first; possibly seq itself
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
                copies = try_append(seq, num_new)
            if seq.status is not running_status:
                break  # seq was the last running sequence
            if copies:
                out.block_copies.extend(copies)
            scheduled.append(ScheduledSeq(seq, start, num_new, 1, False, num_spec) if is_decode
                             else self._scheduled(seq, num_new))
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting sequences in FCFS order; returns the budget left."""
        bm, slots = self.block_manager, self.state_slots
        # Samples a running prompt will fork into hold their sequence and state slots.
        num_reserved = sum(s.n - 1 for s in self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if len(self.running) + num_reserved + seq.n > self.config.max_num_seqs:
                break
            if slots is not None and slots.num_free - num_reserved < seq.n:
                break
            num_hit = bm.num_prefix_hit_tokens(seq)
            num_new = self._chunk_size(seq.num_tokens - num_hit, budget)
            if num_new == 0 or not bm.can_allocate(seq, num_new):
                break  # FCFS: no skipping ahead of a sequence that does not fit
            bm.allocate(seq, num_new)
            num_new = min(num_new, seq.num_tokens - seq.num_computed_tokens)
            self.waiting.popleft()
            if slots is not None:
                seq.state_slot = slots.allocate()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            num_reserved += seq.n - 1
            out.scheduled.append(self._scheduled(seq, num_new))
            budget -= num_new
        return budget

    def _chunk_size(self, num_remaining: int, budget: int) -> int:
        """Tokens to compute now, 0 when they must wait for a step with more budget.

        With chunked prefill off a prompt is never split; only the recompute of a
        preempted sequence longer than max_num_batched_tokens is, or it would never run.
        """
        cfg = self.config
        num_new = min(num_remaining, budget)
        if (
            num_new < num_remaining
            and not cfg.enable_chunked_prefill
            and num_remaining <= cfg.max_num_batched_tokens
        ):
            return 0
        return num_new

    def _scheduled(self, seq: Sequence, num_new: int) -> ScheduledSeq:
        start, num_prompt = seq.num_computed_tokens, len(seq.prompt_ids)
        completes = start + num_new == num_prompt + len(seq.output_ids)
        if not completes:
            num_samples = 0
        elif seq.n > 1 and not seq.output_ids:
            num_samples = seq.n
        else:
            num_samples = 1
        is_decode = completes and num_new == 1 and start >= num_prompt
        return ScheduledSeq(seq, start, num_new, num_samples, not is_decode)

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def abort(self, request_id: str, sample_index: int | None = None) -> list[Sequence]:
        """Drop a request's sequences (one sample of it with `sample_index`) from the
        waiting queue and the running batch, freeing their blocks and state slots.

        Prefix-cache entries of the freed blocks stay findable (the blocks become
        evictable, as for a finished sequence).  Returns the sequences removed, marked
        finished with reason "abort"; none when the request is unknown or done.
        """
        def matches(seq: Sequence) -> bool:
            return seq.request_id == request_id and (
                sample_index is None or seq.sample_index == sample_index)

        removed = [s for s in self.waiting if matches(s)]
        if removed:
            self.waiting = deque(s for s in self.waiting if not matches(s))
        running = [s for s in self.running if matches(s)]
        if running:
            self.running = [s for s in self.running if not matches(s)]
            removed += running
        for seq in removed:
            self._release(seq)
            seq.status = SeqStatus.FINISHED
            seq.finish_reason = "abort"
            self._live_ids.discard(seq.seq_id)
        return removed

    def _release(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        if self.state_slots is not None and seq.state_slot >= 0:
            self.state_slots.free(seq.state_slot)
        seq.state_slot = -1

    # ----------------------------------------------------------------- update
    def update(
        self, out: SchedulerOutput, sampled: dict[int, list[int]], now_s: float
    ) -> list[Sequence]:
        """Advance the scheduled sequences, fork, append sampled tokens; return finished ones."""
        self.forked = []
        finished: list[Sequence] = []
        bm, window, eos = self.block_manager, self.window, self.eos_token_id
        bs = bm.block_size
        # BlockManager.commit hashes blocks that filled up since its last call: without
        # prefix caching it does nothing, with it only when a block boundary was reached,
        # so this loop (once per sequence per step) calls it only then.  The grouped
        # manager's commit releases blocks behind windows, which move with every token.
        commit: Callable[[Sequence], None] | None = bm.commit
        commit_on_fill = isinstance(bm, BlockManager)
        if commit_on_fill and not bm.enable_prefix_caching:
            commit = None
        for item in out.scheduled:
            seq = item.seq
            if item.spec_tokens:
                self._update_speculative(item, sampled[seq.seq_id], now_s, finished)
                continue
            end = seq.num_computed_tokens + item.num_new_tokens
            if commit is not None and (not commit_on_fill
                                       or end // bs > seq.num_computed_tokens // bs):
                seq.num_computed_tokens = end
                commit(seq)
            else:
                seq.num_computed_tokens = end
            if window is not None:
                bm.release_outside_window(seq, window)
            tokens = sampled.get(seq.seq_id, ())
            if len(tokens) != item.num_samples:
                raise ValueError(
                    f"seq {seq.seq_id}: expected {item.num_samples} sampled tokens, "
                    f"got {len(tokens)}"
                )
            if not tokens:
                continue
            if len(tokens) == 1:
                # One token (every decode): _stop_reason's tests inline, the reason
                # itself asked for only when one of them fires.
                token = tokens[0]
                seq.output_ids.append(token)
                seq.token_times_s.append(now_s)
                sp = seq.sampling
                if (len(seq.output_ids) >= sp.max_tokens or token in sp.stop_token_ids
                        or (token == eos and not sp.ignore_eos)):
                    self._finish(seq, self._stop_reason(seq, token), finished)
                continue
            # Only a prompt that completes with n > 1 forks (_fork is O(running)).
            group = [seq, *self._fork(seq, len(tokens) - 1)]
            for member, token in zip(group, tokens, strict=True):
                member.output_ids.append(token)
                member.token_times_s.append(now_s)
                reason = self._stop_reason(member, token)
                if reason is not None:
                    self._finish(member, reason, finished)
        return finished

    def _update_speculative(self, item: ScheduledSeq, tokens: list[int], now_s: float,
                            finished: list[Sequence]) -> None:
        """A verified step: `tokens` are the accepted drafts and the target's token after
        them.  The KV of the input token and the accepted drafts is kept; the slots of
        rejected drafts are rolled back (blocks past the kept tokens are freed)."""
        seq = item.seq
        assert item.spec_tokens is not None
        if not 1 <= len(tokens) <= len(item.spec_tokens) + 1:
            raise ValueError(f"seq {seq.seq_id}: {len(tokens)} tokens from verifying "
                             f"{len(item.spec_tokens)} drafts")
        bm = self.block_manager
        # engine/spec/build.py refuses speculation over several KV groups.
        assert isinstance(bm, BlockManager), "speculation needs one KV group"
        seq.num_computed_tokens = item.start_pos + len(tokens)  # input + accepted drafts
        bm.commit(seq)
        if self.window is not None:
            bm.release_outside_window(seq, self.window)
        for token in tokens:
            seq.output_ids.append(token)
            seq.token_times_s.append(now_s)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._finish(seq, reason, finished)
                return
        bm.truncate(seq, seq.num_computed_tokens)

    def _finish(self, seq: Sequence, reason: str | None, finished: list[Sequence]) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self._release(seq)
        self.running.remove(seq)
        self._live_ids.discard(seq.seq_id)
        finished.append(seq)

    def _fork(self, parent: Sequence, num_children: int) -> list[Sequence]:
        """Children 1..num_children share the parent's blocks; they run right after it."""
        children: list[Sequence] = []
        pos = self.running.index(parent) + 1
        for k in range(1, num_children + 1):
            child = Sequence(
                seq_id=self.next_seq_id(),
                request_id=parent.request_id,
                prompt_ids=list(parent.prompt_ids),
                sampling=parent.sampling,
                arrival_s=parent.arrival_s,
                sample_index=k,
                output_ids=list(parent.output_ids),
                status=SeqStatus.RUNNING,
                num_computed_tokens=parent.num_computed_tokens,
                num_cached_tokens=parent.num_cached_tokens,
                token_times_s=list(parent.token_times_s),
            )
            self.block_manager.fork(parent, child)
            if self.state_slots is not None:
                child.state_slot = self.state_slots.allocate()  # the runner copies the state
            self.running.insert(pos + k - 1, child)
            self._live_ids.add(child.seq_id)
            self.forked.append((parent, child))
            children.append(child)
        parent.n = 1
        return children

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        sampling = seq.sampling
        if not sampling.ignore_eos and self.eos_token_id is not None and token == self.eos_token_id:
            return "eos"
        if token in sampling.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= sampling.max_tokens:
            return "length"
        return None
