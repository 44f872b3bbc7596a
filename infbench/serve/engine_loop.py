"""One engine, one thread: every HTTP request is served by the same continuous batch.

The engine is not thread-safe, so exactly one thread touches it: `EngineLoop`'s worker,
which loops over (take the commands queued since the last step, add or abort requests,
`Engine.step`, publish the new tokens).  The model's torch work releases the GIL, so the
asyncio event loop keeps serving HTTP while a step runs.

Requests come in through a thread-safe queue (`submit`, `abort`); tokens go back with
one `loop.call_soon_threadsafe` per step, which puts each request's updates into its
own `asyncio.Queue` (`RequestStream`).  A client that goes away calls `close` on its
stream; a request still running is then aborted between two steps and its KV blocks
are freed (`Engine.abort`).

The interface a caller sees (submit -> stream of `SampleUpdate`, abort, close) carries
no engine object, so a router could front several of these, one per engine process,
with the same calls.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field

from infbench.core.errors import UserError
from infbench.engine.engine import Engine
from infbench.engine.request import Request
from infbench.engine.sequence import Sequence
from infbench.serve.metrics import EngineStats


class QueueFull(Exception):
    """The server holds as many requests as `max_queue` allows (HTTP 429)."""


class ShuttingDown(Exception):
    """The server no longer accepts requests (HTTP 503)."""


@dataclass(frozen=True)
class SampleUpdate:
    """New tokens of one sample after one engine step; `finish_reason` once it is done."""

    index: int
    token_ids: list[int]
    finish_reason: str | None  # None while running; stop | length


@dataclass(frozen=True)
class StreamError:
    """The request failed in the engine (`status`: the HTTP status to answer with)."""

    message: str
    status: int
    code: str | None = None


Event = list[SampleUpdate] | StreamError


@dataclass
class RequestStream:
    """The asyncio side of one request: updates arrive in `events`, one list per step."""

    request_id: str
    n: int
    arrival_s: float  # time.perf_counter() at submission
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    num_done: int = 0  # samples finished (by the engine or by a stop string)
    closed: bool = False

    @property
    def is_done(self) -> bool:
        return self.num_done >= self.n


@dataclass
class _Add:
    request: Request


@dataclass
class _Abort:
    request_id: str
    sample_index: int | None


class _Stop:
    """The command that ends the engine thread's loop."""


@dataclass
class _Active:
    """The engine thread's view of a request it serves."""

    n: int
    emitted: dict[int, int] = field(default_factory=dict)  # sample index -> tokens published
    done: set[int] = field(default_factory=set)  # sample indices finished or aborted
    admitted: set[int] = field(default_factory=set)  # samples counted in the prefix stats


_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


class EngineLoop:
    """Runs `engine` in a worker thread; see the module docstring.

    `max_queue`: requests the server holds beyond the engine's `max_num_seqs` (running
    plus queued requests are capped at their sum); None: no cap.
    """

    def __init__(self, engine: Engine, max_queue: int | None = None) -> None:
        self.engine = engine
        self.capacity = None if max_queue is None else engine.engine_cfg.max_num_seqs + max_queue
        self.stats = EngineStats()  # replaced, never mutated, by the worker after each step
        self.error: str | None = None  # set when the worker died
        self._inbox: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # event-loop side: requests held
        self._active: dict[str, _Active] = {}  # worker side
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._accepting = True
        self._num_preemptions = 0
        self._prefix_queries = 0  # prompt tokens of the admitted samples (first admission)
        self._prefix_hits = 0  # of those, found in the prefix cache
        self._num_steps = 0
        self._step_seconds = 0.0  # the steps' own durations (StepRecord.duration_s)
        self.num_aborted = 0  # sequences the worker removed from the engine unfinished

    # ------------------------------------------------------- event-loop side
    @property
    def num_outstanding(self) -> int:
        """Requests submitted and not yet closed."""
        return len(self._streams)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the worker; its updates are delivered on `loop`."""
        if self._thread is not None:
            raise RuntimeError("the engine loop is already running")
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="infbench-engine", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> RequestStream:
        """Hand a request to the engine; raises QueueFull or ShuttingDown."""
        if not self._accepting or self.error is not None:
            raise ShuttingDown(self.error or "the server is shutting down")
        if self.capacity is not None and len(self._streams) >= self.capacity:
            raise QueueFull(f"the server holds {len(self._streams)} requests, its limit "
                            f"(max_num_seqs + --max-queue)")
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id} is in use")
        stream = RequestStream(request.request_id, request.n, time.perf_counter())
        self._streams[request.request_id] = stream
        self._inbox.put(_Add(request))
        return stream

    def finish_sample(self, stream: RequestStream, index: int) -> None:
        """A sample ended on the caller's side (a stop string): the engine drops it."""
        stream.num_done += 1
        self._inbox.put(_Abort(stream.request_id, index))

    def close(self, stream: RequestStream) -> None:
        """The caller is done with `stream`; a request still running is aborted."""
        if stream.closed:
            return
        stream.closed = True
        self._streams.pop(stream.request_id, None)
        if not stream.is_done:
            self._inbox.put(_Abort(stream.request_id, None))

    def stop_accepting(self) -> None:
        """Refuse new requests (ShuttingDown); those held keep running."""
        self._accepting = False

    def fail_all(self, message: str, status: int, code: str | None = None) -> int:
        """End every request held with an error (the engine aborts each as its handler
        closes the stream); returns how many.  Call on the event loop."""
        for stream in self._streams.values():
            stream.events.put_nowait(StreamError(message, status, code))
        return len(self._streams)

    async def stop(self) -> None:
        """Stop accepting, abort what is left and join the worker (without blocking)."""
        self._accepting = False
        if self._thread is None:
            return
        self._inbox.put(_Stop())
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None
        self._deliver({rid: StreamError("the server is shutting down", 503)
                       for rid in self._streams})

    def _deliver(self, updates: dict[str, Event]) -> None:
        for request_id, event in updates.items():
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.events.put_nowait(event)

    # ------------------------------------------------------------ worker side
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                commands = [] if engine.scheduler.has_unfinished else [self._inbox.get()]
                while True:
                    try:
                        commands.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                if not self._handle(commands):
                    return
                if engine.scheduler.has_unfinished:
                    record, finished = engine.step(time.perf_counter)
                    self._num_preemptions += record.num_preempted
                    self._num_steps += 1
                    self._step_seconds += record.duration_s
                    self._publish(finished)
                self._update_stats()
        except Exception as exc:  # a bug in the engine: fail every request, keep the reason
            self.error = f"the engine failed: {type(exc).__name__}: {exc}"
            self._accepting = False
            self._post({rid: StreamError(self.error, 500) for rid in self._active})
            self._active.clear()
            raise

    def _handle(self, commands: list[_Add | _Abort | _Stop]) -> bool:
        """Apply queued commands in order; False once told to stop."""
        errors: dict[str, Event] = {}
        for cmd in commands:
            if isinstance(cmd, _Stop):
                for request_id in list(self._active):
                    self.num_aborted += len(self.engine.abort(request_id))
                self._active.clear()
                self._update_stats()
                return False
            if isinstance(cmd, _Add):
                try:
                    self.engine.add_request(cmd.request)
                except UserError as exc:  # e.g. more KV than the pool holds
                    errors[cmd.request.request_id] = StreamError(str(exc), 400)
                    continue
                self._active[cmd.request.request_id] = _Active(cmd.request.n)
            else:
                active = self._active.get(cmd.request_id)
                if active is None:
                    continue  # finished already
                self.num_aborted += len(self.engine.abort(cmd.request_id, cmd.sample_index))
                if cmd.sample_index is None:
                    del self._active[cmd.request_id]
                else:
                    active.done.add(cmd.sample_index)
                    if len(active.done) >= active.n:
                        del self._active[cmd.request_id]
        if errors:
            self._post(errors)
        return True

    def _publish(self, finished: list[Sequence]) -> None:
        """Post every sample's tokens that are new since the last step."""
        updates: dict[str, list[SampleUpdate]] = {}
        for seq in itertools.chain(self.engine.scheduler.running, finished):
            active = self._active.get(seq.request_id)
            if active is None or seq.sample_index in active.done:
                continue
            if seq.sample_index not in active.admitted:  # its first step: prefix lookup done
                active.admitted.add(seq.sample_index)
                self._prefix_queries += seq.num_prompt_tokens
                self._prefix_hits += seq.num_cached_tokens
            num_sent = active.emitted.get(seq.sample_index, 0)
            done = seq.is_finished
            if len(seq.output_ids) == num_sent and not done:
                continue
            active.emitted[seq.sample_index] = len(seq.output_ids)
            reason = _FINISH.get(seq.finish_reason or "", "length") if done else None
            updates.setdefault(seq.request_id, []).append(
                SampleUpdate(seq.sample_index, seq.output_ids[num_sent:], reason))
            if done:
                active.done.add(seq.sample_index)
                if len(active.done) >= active.n:
                    del self._active[seq.request_id]
        if updates:
            posted: dict[str, Event] = dict(updates)
            self._post(posted)

    def _post(self, updates: dict[str, Event]) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, updates)

    def _update_stats(self) -> None:
        engine = self.engine
        bm = engine.block_manager
        self.stats = EngineStats(
            num_running=engine.scheduler.num_running, num_waiting=engine.scheduler.num_waiting,
            kv_usage=bm.num_used_blocks / bm.num_blocks, num_preemptions=self._num_preemptions,
            prefix_cache_queries=self._prefix_queries, prefix_cache_hits=self._prefix_hits,
            num_steps=self._num_steps, step_seconds=self._step_seconds)
