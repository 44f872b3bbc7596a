"""Run multi-turn sessions (`workload.kind: sessions`) against an OpenAI-compatible server.

The conversations are planned by measure/sessions.py (seeded); this module plays them.
Each session starts at its arrival (with `workload.max_concurrency`, when fewer sessions
than that are active; it holds its slot until its last turn ends) and sends its turns one
after the other: turn k goes out `think_s` after turn k-1's stream ended, and its prompt is
the history so far plus the new user message.  The history holds the replies as the server
returned them:

- chat: `messages` = the system prompt (when set) as a system message, then user and
  assistant messages in order, the assistant's content the text it streamed (reasoning
  text left out, as chat clients do);
- completions with text prompts: the system prompt, every user message and every reply
  text, concatenated;
- completions with token prompts: the ids, each reply as the token ids the server sent
  (`target.return_token_ids`) or else the tokenizer's encoding of its text.

Every turn is one streamed request through `openai_target._one_request`, timed as every
other client request (its TTFT counts from the moment the turn was sent), and becomes a
`RequestRecord` with the id `<session>/t<turn>`.  A turn that fails ends its session: the
later turns cannot be built without its reply, and are counted as skipped.  (So does a
reply that cannot join a token history: no ids sent and no tokenizer; the next turn is then
the failure, reason `no_token_ids`.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from infbench.client.failures import RequestFailed
from infbench.client.openai_target import (
    ClientPlan,
    Failure,
    TargetRun,
    _error_text,
    _one_request,
    to_record,
)
from infbench.client.stream import Stream
from infbench.core.errors import UserError
from infbench.engine.request import Request
from infbench.engine.session_loop import Conversation, Turn, turn_id
from infbench.measure.sessions import turn_sampling
from infbench.scenario.workload import WorkloadPoint


@dataclass
class SessionsRun(TargetRun):
    """One pass over the conversations: a TargetRun (one record per finished turn) and the
    turns never sent (an earlier turn of their session failed)."""

    num_skipped: int = 0
    conversations: Sequence[Conversation] = ()  # what was planned (metrics.sessions)


def check_plan(plan: ClientPlan) -> None:
    """Token prompts send every reply back as ids: the server's (return_token_ids) or the
    tokenizer's encoding of its text; with neither, the second turn could not be built."""
    if not plan.target.sends_text and plan.tokenizer is None and \
            not plan.target.return_token_ids:
        raise UserError("workload.kind: sessions with target.prompt_format tokens sends each "
                        "reply back as token ids; allowed: set target.tokenizer (encodes the "
                        "reply text) or target.return_token_ids: true (the server's ids)")


class _History:
    """One session's conversation so far, in the form the target's prompts take."""

    def __init__(self, plan: ClientPlan, conversation: Conversation) -> None:
        self.plan = plan
        self.ids: list[int] = list(conversation.system_ids)
        self.messages: list[dict[str, str]] = []
        self.text = ""
        if conversation.system_ids and plan.target.sends_text:
            system = self._decode(conversation.system_ids)
            self.messages.append({"role": "system", "content": system})
            self.text = system

    def _decode(self, ids: Sequence[int]) -> str:
        if self.plan.tokenizer is None:  # the target schema requires one for text prompts
            raise ValueError("text prompts need target.tokenizer")
        return str(self.plan.tokenizer.decode(list(ids), skip_special_tokens=True))

    def ask(self, turn: Turn) -> None:
        self.ids.extend(turn.user_ids)
        if self.plan.target.sends_text:
            user = turn.user_text if turn.user_text is not None else self._decode(turn.user_ids)
            self.messages.append({"role": "user", "content": user})
            self.text += user if not self.text or turn.user_text is None else "\n" + user

    def answer(self, stream: Stream) -> None:
        """The reply as the server returned it joins the history."""
        reply = "".join(c.text for c in stream.chunks if not c.is_reasoning)
        ids = [i for c in stream.chunks if not c.is_reasoning and c.token_ids is not None
               for i in c.token_ids]
        complete = all(c.token_ids is not None for c in stream.chunks if not c.is_reasoning)
        if not (complete and ids) and self.plan.tokenizer is not None:
            ids = list(self.plan.tokenizer.encode(reply, add_special_tokens=False))
        elif not (complete and ids) and not self.plan.target.sends_text:
            raise RequestFailed("no_token_ids", f"the reply ({len(stream.chunks)} chunk(s)) "
                                                "carried no token ids and target.tokenizer is "
                                                "not set to encode its text")
        self.ids.extend(int(i) for i in ids)
        self.messages.append({"role": "assistant", "content": reply})
        self.text += reply

    def body(self, request: Request) -> dict[str, Any]:
        body = self.plan.body(request, 0) if not self.plan.target.sends_text else \
            self.plan.body(_no_prompt(request), 0)
        if self.plan.target.endpoint == "chat":
            body["messages"] = list(self.messages)
        elif self.plan.target.sends_text:
            body["prompt"] = self.text
        return body


def _no_prompt(request: Request) -> Request:
    """The request without ids to detokenize (the body's prompt is set from the history)."""
    return Request(request_id=request.request_id, prompt_ids=(0,), sampling=request.sampling,
                   arrival_s=request.arrival_s)


async def run_sessions(plan: ClientPlan, workload: WorkloadPoint,
                       conversations: Sequence[Conversation], *,
                       session: aiohttp.ClientSession, api_key: str | None = None,
                       eos_token_id: int | None = None) -> SessionsRun:
    """Play every conversation once; session arrivals replayed in real time."""
    t0 = time.perf_counter()
    clock = time.perf_counter
    chat = plan.target.endpoint == "chat"
    headers = plan.headers(api_key)
    deadline = plan.target.request_timeout_s
    run = SessionsRun(records=[], failures=[], wall_s=0.0, start_perf_s=t0,
                      conversations=conversations)
    slots = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
    last = [0.0]

    async def one_turn(history: _History, conv: Conversation, turn: Turn) -> int | None:
        """Send one turn; None when it (and its reply's place in the history) went well,
        else the index of the turn that failed: this one, or the next one when the reply
        cannot join the history (no_token_ids)."""
        rid = turn_id(conv.session_id, turn.index)
        history.ask(turn)
        sent = clock() - t0
        request = Request(request_id=rid, prompt_ids=tuple(history.ids) or (0,),
                          sampling=turn_sampling(workload, turn, eos_token_id), arrival_s=sent)
        stream = Stream(max_tokens=turn.max_tokens, chat=chat)
        try:
            await asyncio.wait_for(_one_request(plan, request, 0, t0, session, headers, stream,
                                                history.body(request)), deadline)
            record = to_record(rid, sent, request, stream, plan.tokenizer)
        except asyncio.TimeoutError:
            run.failures.append(Failure(rid, f"no complete answer within "
                                             f"target.request_timeout_s {deadline:g} s",
                                        "deadline"))
            last[0] = max(last[0], clock() - t0)
            return turn.index
        except RequestFailed as exc:
            run.failures.append(Failure(rid, _error_text(exc), exc.reason))
            last[0] = max(last[0], clock() - t0)
            return turn.index
        run.records.append(record)
        last[0] = max(last[0], stream.end_s)
        if turn.index + 1 < len(conv.turns):  # the next turn's history needs the reply
            try:
                history.answer(stream)
            except RequestFailed as exc:
                run.failures.append(Failure(turn_id(conv.session_id, turn.index + 1),
                                            _error_text(exc), exc.reason))
                return turn.index + 1
        return None

    async def one(conv: Conversation) -> None:
        delay = conv.arrival_s - (clock() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        if slots is not None:
            await slots.acquire()
        history = _History(plan, conv)
        try:
            for turn in conv.turns:
                if turn.think_s > 0:
                    await asyncio.sleep(turn.think_s)
                failed = await one_turn(history, conv, turn)
                if failed is not None:  # the later turns cannot be built
                    run.num_skipped += len(conv.turns) - failed - 1
                    break
        finally:
            if slots is not None:
                slots.release()

    await asyncio.gather(*(one(c) for c in sorted(conversations, key=lambda c: c.arrival_s)))
    run.records.sort(key=lambda r: r.request_id)
    run.failures.sort(key=lambda f: f.request_id)
    run.wall_s = max(last[0], 1e-9)
    return run
