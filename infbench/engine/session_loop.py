"""The closed loop of multi-turn sessions, shared by the engine's run of them
(`measure/engine_sessions.py`, on the wall clock) and the simulation's
(`sim/sessions_sim.py`, on a virtual clock), so both submit the same turns at the same
moments with the same prompts.

A conversation (`Conversation`, planned by `measure/sessions.py`) is one session: its
arrival, a system prompt and its turns.  Sessions are admitted by the client's rule
(`ClientAdmission`, each session one "request" from its first turn to its last):
in arrival order once due, at most `max_concurrency` active, a session held back by a full
cap starting, and counting its first turn's arrival, when a slot frees.  A session's first
turn is due when it starts; turn k+1 is due `think_s` after turn k finished; a turn's
prompt is the system prompt, every earlier user message, every earlier reply (the ids the
caller reports back through `finished`) and the new message; and its arrival (TTFT, E2E)
is the moment it became due.  Without `realtime` (warm-ups) sessions start at once and
think times are skipped.  Torch-free: the analytic half imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from infbench.engine.admission import ClientAdmission
from infbench.engine.request import Request, SamplingParams


@dataclass(frozen=True)
class Turn:
    """One user turn: its new message, max_tokens, the think time before it (0 for the
    first turn) and its sampling seed."""

    index: int  # 0-based turn index within the session
    user_ids: tuple[int, ...]
    max_tokens: int
    think_s: float
    seed: int
    user_text: str | None = None  # from a dataset file: sent as is where prompts are text


@dataclass(frozen=True)
class Conversation:
    """One session: when it starts, the system prompt every turn begins with, its turns."""

    session_id: str
    arrival_s: float
    system_ids: tuple[int, ...]
    turns: tuple[Turn, ...]


def turn_id(session_id: str, index: int) -> str:
    """A turn's request id, `s0003/t2` (`measure.sessions.tag_rows` reads the parts back)."""
    return f"{session_id}/t{index}"


def sizing_requests(conversations: Sequence[Conversation]) -> list[Request]:
    """One request per session at its longest (its last turn, every earlier reply at its
    max_tokens), arriving when the session does: what a KV pool is sized for (a session has
    one turn resident at a time) and what `SessionLoop` admits sessions by."""
    out = []
    for conv in conversations:
        history = len(conv.system_ids) + sum(len(t.user_ids) + t.max_tokens
                                             for t in conv.turns[:-1])
        last = conv.turns[-1]
        out.append(Request(request_id=conv.session_id,
                           prompt_ids=(0,) * (history + len(last.user_ids)),
                           sampling=SamplingParams(max_tokens=last.max_tokens),
                           arrival_s=conv.arrival_s))
    return out


@dataclass
class _Session:
    conversation: Conversation
    history: list[int]
    due_s: float  # when the next turn goes out
    next_turn: int = 0
    in_flight: bool = False


@dataclass
class SessionLoop:
    """Active sessions, their histories and due times, and each submitted turn's arrival."""

    conversations: Sequence[Conversation]
    sampling: Callable[[Turn], SamplingParams]  # a turn's sampling parameters
    realtime: bool = True
    max_concurrency: int | None = None
    arrivals: dict[str, float] = field(default_factory=dict)  # turn id -> its arrival

    def __post_init__(self) -> None:
        self.admission = ClientAdmission(sizing_requests(self.conversations),
                                         realtime_arrivals=self.realtime,
                                         max_concurrency=self.max_concurrency)
        self.by_id = {c.session_id: c for c in self.conversations}
        self.active: dict[str, _Session] = {}

    @property
    def has_unfinished(self) -> bool:
        """Some session has not started or has turns left."""
        return self.admission.has_pending or bool(self.active)

    def _start(self, request: Request) -> None:
        conv = self.by_id[request.request_id]
        self.active[conv.session_id] = _Session(
            conv, list(conv.system_ids), due_s=self.admission.arrivals[request.request_id])

    def submit_due(self, now: float, add: Callable[[Request], object]) -> None:
        """Start the sessions the cap lets in and submit (through `add`) every turn due at
        `now`."""
        self.admission.admit(now, self._start)
        for s in self.active.values():
            if s.in_flight or s.due_s > now:
                continue
            turn = s.conversation.turns[s.next_turn]
            s.history.extend(turn.user_ids)
            rid = turn_id(s.conversation.session_id, turn.index)
            self.arrivals[rid] = s.due_s
            add(Request(rid, tuple(s.history), self.sampling(turn), arrival_s=s.due_s))
            s.in_flight = True

    def next_due_s(self) -> float:
        """When the next turn or session is due, while no turn is in flight (a session
        held back by a full cap waits for a finish, not a time: it does not count)."""
        waits = [s.due_s for s in self.active.values() if not s.in_flight]
        if self.admission.has_pending and not self.admission.is_full:
            waits.append(self.admission.next_due_s())
        return min(waits, default=math.inf)

    def finished(self, request_id: str, output_ids: Sequence[int], now: float) -> float:
        """A turn finished at `now` with reply `output_ids`: its session's next turn is due
        think time later (or the session ends and frees its slot); returns the turn's
        arrival."""
        sid = request_id.rpartition("/t")[0]
        s = self.active[sid]
        s.history.extend(output_ids)  # the reply as it was produced
        s.next_turn += 1
        s.in_flight = False
        if s.next_turn == len(s.conversation.turns):
            del self.active[sid]
            self.admission.finished(sid, 0)
        else:
            think = s.conversation.turns[s.next_turn].think_s if self.realtime else 0.0
            s.due_s = now + think
        return self.arrivals[request_id]
