"""Seeded multi-turn sessions (`workload.kind: sessions`): what every conversation will say.

`plan_sessions` turns one workload point into `Conversation`s (engine/session_loop.py, which
plays them as a closed loop for the engine and the simulation): for each session its arrival,
the shared system prompt and its turns, each a new user message (token ids, and the text
when it came from a file), the turn's `max_tokens`, the think time before it and a sampling
seed.  The replies are not known here: they are the server's, and the executor
(client/sessions.py, or engine/session_loop.py for the engine and the simulation) appends
each reply to the history before the next turn goes out.  So the plan is backend-neutral:
a server, the engine and the simulated engine play the same conversations.

Every random choice comes from its own `numpy.random.default_rng` stream spawned from
`workload.seed` (turns, user lengths, output lengths, think times, arrivals, prompt ids,
sampling seeds, dataset picks), so changing the think time does not reshuffle the messages.

Conversation files (`workload.sessions.dataset`), read through `dataset_reader`'s bounded
parsers (a damaged file is one line naming the file, the entry or line, and the key):

- sharegpt: a JSON list of `{"conversations": [{"from": "human", "value"}, {"from": "gpt",
  "value"}, ...]}`; every human turn is a user message, the gpt turn right after it its
  reference reply (whose token count is the turn's output length); other roles (system,
  ...) are skipped, and an entry without a non-empty human turn is skipped.
- jsonl: one `{"session_id": ..., "turn": N, "prompt": "...", "output_len": N}` per line
  (`output_len` optional: `sessions.output_len` is drawn when absent); lines of one
  session_id form one conversation, ordered by `turn`, which must not repeat.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infbench.core.errors import DamagedFileError, UserError
from infbench.engine.request import SamplingParams
from infbench.engine.session_loop import Conversation, Turn
from infbench.measure import datasets
from infbench.measure.dataset_reader import (
    JSONLimitError,
    json_problem,
    loads,
    numbered_lines,
    shown,
)
from infbench.measure.metrics import from_request_rows, latency_stats
from infbench.measure.workload import _random_ids, arrival_times
from infbench.scenario.sessions import MAX_TURNS, Distribution, SessionsSection
from infbench.scenario.workload import WorkloadPoint

_NUM_STREAMS = 8  # turns, user lens, output lens, think, arrivals, prompt ids, seeds, picks
SESSION_JSONL_KEYS = ("session_id", "turn", "prompt", "output_len")
_MAX_TOKENS = 2**24
_DATASET_KEY = "workload.sessions.dataset"


@dataclass(frozen=True)
class FileTurn:
    """A user message from a file, its output length or reference reply when given."""

    prompt: str
    output_len: int | None = None
    reference: str | None = None


@dataclass(frozen=True)
class FileConversation:
    turns: tuple[FileTurn, ...]
    where: str  # "entry 3" (sharegpt) or "session 'a'" (jsonl)


def draw(rng: np.random.Generator, dist: Distribution, n: int) -> np.ndarray:
    """`n` values of `dist` (floats, >= 0); counts round them (`draw_counts`)."""
    mean, spread = dist.mean, dist.spread
    if dist.dist == "fixed" or mean == 0:
        values = np.full(n, float(mean))
    elif dist.dist == "uniform":
        values = rng.uniform(mean * (1 - spread), mean * (1 + spread), size=n)
    elif dist.dist == "normal":
        values = rng.normal(mean, spread * mean, size=n)
    elif dist.dist == "lognormal":
        values = rng.lognormal(math.log(mean) - spread**2 / 2, spread, size=n)
    else:  # exponential
        values = rng.exponential(mean, size=n)
    return np.maximum(values, 0.0)


def draw_counts(rng: np.random.Generator, dist: Distribution, n: int,
                upper: int = _MAX_TOKENS) -> np.ndarray:
    return np.clip(np.rint(draw(rng, dist, n)).astype(np.int64), 1, upper)


def _streams(point: WorkloadPoint) -> list[np.random.Generator]:
    return [np.random.default_rng(s)
            for s in np.random.SeedSequence(point.seed).spawn(_NUM_STREAMS)]


def plan_sessions(point: WorkloadPoint, vocab_size: int, tokenizer: Any = None,
                  eos_token_id: int | None = None) -> list[Conversation]:
    """The conversations of one kind-sessions point, identical for the same point and seed."""
    cfg = point.session_config
    turn_rng, user_rng, out_rng, think_rng, arrival_rng, prompt_rng, seed_rng, pick_rng = \
        _streams(point)
    n = cfg.num_sessions
    arrivals = arrival_times(arrival_rng, "poisson" if point.rate is not None else "offline",
                             point.rate, n, point.burstiness)
    system = _random_ids(prompt_rng, cfg.system_prompt_len, vocab_size, eos_token_id)
    if cfg.dataset is not None:
        texts = _file_turns(cfg, pick_rng, n)
        counts = [len(t) for t in texts]
    else:
        counts = [int(c) for c in draw_counts(turn_rng, cfg.turns, n, MAX_TURNS)]
    total = sum(counts)
    outs = draw_counts(out_rng, cfg.output_len, total)
    thinks = draw(think_rng, cfg.think_time_s, total)
    seeds = seed_rng.integers(0, 2**31 - 1, size=total)
    if cfg.dataset is None:
        users = [_random_ids(prompt_rng, int(k), vocab_size, eos_token_id)
                 for k in draw_counts(user_rng, cfg.user_len, total)]
    conversations = []
    flat = 0
    for s, count in enumerate(counts):
        turns = []
        for k in range(count):
            text = None
            max_tokens = int(outs[flat])
            if cfg.dataset is not None:
                entry = texts[s][k]
                text = entry.prompt
                ids = _encode(tokenizer, text, vocab_size, cfg)
                if entry.output_len is not None:
                    max_tokens = entry.output_len
                elif entry.reference is not None:
                    max_tokens = max(len(_encode(tokenizer, entry.reference, None, cfg)), 1)
            else:
                ids = users[flat]
            turns.append(Turn(index=k, user_ids=tuple(ids), max_tokens=max_tokens,
                              think_s=0.0 if k == 0 else float(thinks[flat]),
                              seed=int(seeds[flat]), user_text=text))
            flat += 1
        conversations.append(Conversation(session_id=f"s{s:04d}", arrival_s=float(arrivals[s]),
                                          system_ids=tuple(system), turns=tuple(turns)))
    return conversations


def session_lengths(point: WorkloadPoint) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) of every turn, as long as they can get (each reply
    taken at its max_tokens; file text as whitespace words), without a tokenizer: what the
    pre-flight checks read before a run."""
    cfg = point.session_config
    turn_rng, user_rng, out_rng, *_rest, pick_rng = _streams(point)
    n = cfg.num_sessions
    if cfg.dataset is not None:
        texts = _file_turns(cfg, pick_rng, n)
        counts = [len(t) for t in texts]
        users = [datasets.word_count(t.prompt) for conv in texts for t in conv]
    else:
        counts = [int(c) for c in draw_counts(turn_rng, cfg.turns, n, MAX_TURNS)]
        users = [int(k) for k in draw_counts(user_rng, cfg.user_len, sum(counts))]
    outs = [int(k) for k in draw_counts(out_rng, cfg.output_len, sum(counts))]
    prompts: list[int] = []
    flat = 0
    for count in counts:
        history = cfg.system_prompt_len
        for _ in range(count):
            prompts.append(history + users[flat])
            history += users[flat] + outs[flat]
            flat += 1
    return np.asarray(prompts, dtype=np.int64), np.asarray(outs, dtype=np.int64)


def _encode(tokenizer: Any, text: str, vocab_size: int | None, cfg: SessionsSection) -> list[int]:
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        assert cfg.dataset is not None
        raise UserError(f"{_DATASET_KEY}: {cfg.dataset.kind} conversations are text and need "
                        f"a tokenizer (target.tokenizer) to count their tokens "
                        f"({cfg.dataset.path})")
    raw = tokenizer.encode(text, add_special_tokens=False)
    ids = [int(t) for t in getattr(raw, "ids", raw)]
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        raise UserError(f"{_DATASET_KEY}: the tokenizer produces id {max(ids)}, outside the "
                        f"vocabulary (0..{vocab_size - 1})")
    return ids or [0]  # an empty message still sends a token


# ------------------------------------------------------------------ conversation files
def _file_turns(cfg: SessionsSection, rng: np.random.Generator,
                n: int) -> list[tuple[FileTurn, ...]]:
    """The turns of the n sessions drawn from the file (a seeded permutation, cycled)."""
    assert cfg.dataset is not None
    conversations = load_conversations(cfg.dataset.kind, cfg.dataset.path)
    picks = datasets.sample_indices(len(conversations), n, rng, contiguous=False)
    return [conversations[int(i)].turns[:MAX_TURNS] for i in picks]


def load_conversations(kind: str, path: str) -> list[FileConversation]:
    """The conversations of one file (cached per file, size and modification time)."""
    return datasets.read_entries(kind, path, _DATASET_KEY,
                                 {"sharegpt": _read_sharegpt, "jsonl": _read_jsonl},
                                 "conversations",
                                 {"sharegpt": " (each needs a non-empty human turn)"})


def _read_sharegpt(text: str, where: str) -> list[FileConversation]:
    try:
        data = loads(text)
    except (JSONLimitError, json.JSONDecodeError) as exc:
        line = exc.lineno if isinstance(exc, json.JSONDecodeError) else exc.line
        raise DamagedFileError(f"{where}{f':{line}' if line else ''}: {json_problem(exc)}; "
                               "a sharegpt file is a JSON list of conversations") from None
    if not isinstance(data, list):
        raise DamagedFileError(f"{where}: expected a JSON list of {{\"conversations\": [...]}} "
                               f"entries (got {type(data).__name__})")
    found = []
    for i, item in enumerate(data):
        at = f"{where}: entry {i}"
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise DamagedFileError(f"{at}: expected an object with a 'conversations' list")
        for j, turn in enumerate(turns):
            if (not isinstance(turn, dict) or not isinstance(turn.get("from"), str)
                    or not isinstance(turn.get("value"), str)):
                raise DamagedFileError(f"{at}: conversations[{j}]: must be an object with "
                                       "string 'from' (human, gpt, ...) and 'value'")
        messages = []
        for j, turn in enumerate(turns):
            if turn["from"] != "human" or not turn["value"].strip():
                continue
            after = turns[j + 1] if j + 1 < len(turns) else None
            reply = after["value"] if after is not None and after["from"] == "gpt" and \
                after["value"].strip() else None
            messages.append(FileTurn(prompt=turn["value"], reference=reply))
        if messages:
            found.append(FileConversation(tuple(messages), f"entry {i}"))
    return found


def _read_jsonl(text: str, where: str) -> list[FileConversation]:
    sessions: dict[str, dict[int, FileTurn]] = {}
    for number, line in numbered_lines(text, where):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        try:
            item = loads(line)
        except (JSONLimitError, json.JSONDecodeError) as exc:
            raise DamagedFileError(f"{at}: {json_problem(exc)}; each line is "
                                   "{\"session_id\": ..., \"turn\": N, \"prompt\": \"...\"}") \
                from None
        if not isinstance(item, dict):
            raise DamagedFileError(f"{at}: expected an object {{\"session_id\": ...}} (got "
                                   f"{type(item).__name__})")
        unknown = [k for k in item if k not in SESSION_JSONL_KEYS]
        if unknown:
            raise DamagedFileError(f"{at}: unknown key {shown(unknown[0])}; allowed: "
                                   f"{', '.join(SESSION_JSONL_KEYS)}")
        sid, turn, prompt, out = (item.get(k) for k in SESSION_JSONL_KEYS)
        if isinstance(sid, bool) or not isinstance(sid, (str, int)) or sid == "":
            raise DamagedFileError(f"{at}: session_id: required, a non-empty string or an "
                                   f"integer (got {shown(sid)})")
        if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn < _MAX_TOKENS:
            raise DamagedFileError(f"{at}: turn: required, an integer >= 0 (got {shown(turn)})")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DamagedFileError(f"{at}: prompt: required, a non-empty string")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int)
                                or not 0 < out <= _MAX_TOKENS):
            raise DamagedFileError(f"{at}: output_len: must be an integer in 1..{_MAX_TOKENS} "
                                   f"(got {shown(out)})")
        turns = sessions.setdefault(str(sid), {})
        if turn in turns:
            raise DamagedFileError(f"{at}: turn: session {shown(sid)} already has turn {turn}; "
                                   "allowed: each turn once per session")
        turns[turn] = FileTurn(prompt=prompt, output_len=out)
    return [FileConversation(tuple(turns[k] for k in sorted(turns)), f"session {shown(sid)}")
            for sid, turns in sessions.items()]


# ------------------------------------------------------------------ metrics
def by_turn_metrics(rows: Sequence[Mapping[str, Any]],
                    percentiles: Sequence[float]) -> list[dict[str, Any]]:
    """`metrics.by_turn`: per turn index (rows tagged with `turn`), the requests, their mean
    prompt and output tokens, and TTFT, TPOT and E2E statistics: how latency grows with the
    history (and how a prefix cache, if the server has one, holds it down)."""
    turns = sorted({int(r["turn"]) for r in rows if r.get("turn") is not None})
    out = []
    for k in turns:
        group = [r for r in rows if r.get("turn") == k]
        stats = from_request_rows(group, percentiles)
        out.append({"turn": k, "num_requests": len(group),
                    "mean_prompt_tokens": float(np.mean([r["num_prompt_tokens"]
                                                         for r in group])),
                    "mean_output_tokens": float(np.mean([r["num_output_tokens"]
                                                         for r in group])),
                    "ttft_s": stats["ttft_s"], "tpot_s": stats["tpot_s"],
                    "e2e_s": stats["e2e_s"]})
    return out


def turn_sampling(workload: WorkloadPoint, turn: Turn, eos: int | None) -> SamplingParams:
    """A turn's sampling parameters, the same wherever its conversation is played (the
    engine, a server, the simulation): the workload's sampling, the turn's max_tokens and
    seed, EOS as a stop token unless `ignore_eos`."""
    stop = (eos,) if eos is not None and not workload.ignore_eos else ()
    return SamplingParams(temperature=workload.temperature, top_k=workload.top_k,
                          top_p=workload.top_p, max_tokens=turn.max_tokens, seed=turn.seed,
                          stop_token_ids=stop, ignore_eos=workload.ignore_eos)


def tag_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request rows (measure.metrics.request_rows) of session turns with their session_id
    and turn, read back from their ids (engine.session_loop.turn_id)."""
    for row in rows:
        sid, sep, k = str(row["id"]).rpartition("/t")
        if sep and k.isdigit():
            row["session_id"], row["turn"] = sid, int(k)
    return rows


def sessions_metrics(rows: Sequence[Mapping[str, Any]], conversations: Sequence[Conversation],
                     wall_s: float, percentiles: Sequence[float],
                     num_failed: int = 0) -> dict[str, Any]:
    """`metrics.by_turn` and `metrics.sessions` of one pass (rows: tag_rows's).

    A completed session answered every turn; its duration runs from its first turn's
    arrival to its last token, think times included.  Skipped turns are those never sent
    because an earlier turn of their session failed (`num_failed`: the failed turns)."""
    by_session: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("session_id") is not None:
            by_session.setdefault(str(row["session_id"]), []).append(row)
    planned = sum(len(c.turns) for c in conversations)
    done = sum(len(v) for v in by_session.values())
    durations = []
    for conv in conversations:
        answered = by_session.get(conv.session_id, [])
        if len(answered) == len(conv.turns):
            first = min(answered, key=lambda r: r["turn"])
            durations.append(max(r["finish_s"] or r["arrival_s"] for r in answered)
                             - first["arrival_s"])
    return {"by_turn": by_turn_metrics(rows, percentiles), "sessions": {
        "num_sessions": len(conversations), "num_completed": len(durations),
        "num_turns": planned, "num_turns_done": done,
        "num_turns_skipped": max(planned - done - num_failed, 0),
        "mean_turns": planned / len(conversations) if conversations else None,
        "duration_s": latency_stats(durations, percentiles),
        "sessions_per_s": len(durations) / wall_s if wall_s > 0 else None}}
