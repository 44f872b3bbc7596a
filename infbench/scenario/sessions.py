"""The `workload.sessions:` section: multi-turn conversations (`workload.kind: sessions`).

A run of kind sessions serves `num_sessions` conversations.  Each session opens with an
optional system prompt (the same `system_prompt_len` tokens in every session, as a shared
system prompt is in a deployed chat service), then runs its turns one after the other: turn
k's prompt is the whole history so far (the system prompt, every earlier user message and
every earlier reply as the server returned it) plus a new user message.  Between the end of
one turn's reply and the next turn's request the user "thinks" for a drawn time.  Sessions
arrive as requests do in the other kinds: all at t=0 (no `workload.rate`, or inf), or as a
Poisson / gamma process of `workload.rate` sessions per second (`workload.burstiness`);
`workload.max_concurrency` caps the sessions active at once.

Every count and time is a `Distribution`: a bare number is fixed, a mapping names the
distribution (`{dist: exponential, mean: 2.0}`).  With `dataset`, the conversations come
from a file instead (measure/sessions.py reads it): its user messages, in its order, and
its reference replies' lengths as the outputs.

This module is pure pydantic: the section is validated once when the scenario loads, and
the drawing happens in measure/sessions.py (seeded by `workload.seed`).
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from infbench.scenario.values import NonNegInt, PosInt, Section

DistKind = Literal["fixed", "uniform", "normal", "lognormal", "exponential"]
SessionsDatasetKind = Literal["sharegpt", "jsonl"]
DIST_KINDS: tuple[str, ...] = typing.get_args(DistKind)
SESSIONS_DATASET_KINDS: tuple[str, ...] = typing.get_args(SessionsDatasetKind)
MAX_TURNS = 1024  # turns of one session: the history of more outgrows any context
MAX_THINK_S = 24 * 3600.0


class Distribution(Section):
    """A drawn quantity: `dist` around `mean` with relative `spread` (uniform: mean*(1-s) ..
    mean*(1+s); normal: sigma s*mean; lognormal: sigma s in log space, mean `mean`;
    exponential: mean `mean`, spread unused).  A bare number means `{dist: fixed, mean: N}`.
    Counts are rounded and at least 1; times are clipped at 0."""

    dist: DistKind = "fixed"
    mean: Annotated[float, Field(ge=0, le=2**24, strict=True, allow_inf_nan=False)]
    spread: Annotated[float, Field(ge=0, le=100, strict=True, allow_inf_nan=False)] = 0.5

    @model_validator(mode="before")
    @classmethod
    def _bare_number(cls, data: Any) -> Any:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"dist": "fixed", "mean": float(data)}
        return data

    def describe(self) -> str:
        """`64` (fixed) or `lognormal(mean=64, spread=0.5)`."""
        if self.dist == "fixed":
            return f"{self.mean:g}"
        spread = "" if self.dist == "exponential" else f", spread={self.spread:g}"
        return f"{self.dist}(mean={self.mean:g}{spread})"


class SessionsDataset(Section):
    """workload.sessions.dataset: conversations from a file (measure/sessions.py)."""

    kind: SessionsDatasetKind
    """sharegpt: a JSON list of {conversations: [{from: human, value}, {from: gpt, value},
    ...]}, every human turn a user message, the gpt reply after it giving the output length;
    jsonl: one {session_id, turn, prompt, optional output_len} per line, grouped by
    session_id and ordered by turn."""
    path: Annotated[str, Field(min_length=1)]
    """The file, or `infbench:samples/NAME` for a shipped sample."""


def _dist(mean: float) -> Any:
    return Field(default_factory=lambda: Distribution(mean=mean))


class SessionsSection(Section):
    """workload.sessions: N conversations of T turns (kind sessions)."""

    num_sessions: PosInt = 8
    """Conversations per run (drawn from the dataset with a seeded permutation, cycled when
    more are asked for than it holds)."""
    turns: Distribution = _dist(3)
    """Turns per session (rounded, 1..1024)."""
    user_len: Distribution = _dist(64)
    """Tokens of each new user message (random ids, as workload prompts)."""
    output_len: Distribution = _dist(32)
    """max_tokens of each turn (with a dataset: the reference reply's token count, this when
    the file gives none)."""
    think_time_s: Distribution = _dist(0)
    """Seconds between the end of a reply and the next turn's request (at most 24 h)."""
    system_prompt_len: NonNegInt = 0
    """Tokens of a system prompt opening every session (the same ids in all of them)."""
    dataset: SessionsDataset | None = None
    """Conversations from a file instead of drawn lengths."""

    @model_validator(mode="after")
    def _check(self) -> SessionsSection:
        if not 1 <= self.turns.mean <= MAX_TURNS:
            raise ValueError(f"turns: mean must be in 1..{MAX_TURNS} (got {self.turns.mean:g})")
        for key in ("user_len", "output_len"):
            if getattr(self, key).mean < 1:
                raise ValueError(f"{key}: mean must be >= 1 token (got "
                                 f"{getattr(self, key).mean:g})")
        if self.think_time_s.mean > MAX_THINK_S:
            raise ValueError(f"think_time_s: mean must be at most {MAX_THINK_S:g} s (got "
                             f"{self.think_time_s.mean:g})")
        if self.dataset is not None:
            for key in ("turns", "user_len"):
                if key in self.model_fields_set:
                    raise ValueError(f"{key}: the turns come from dataset "
                                     f"({self.dataset.path}); remove {key}")
        return self
