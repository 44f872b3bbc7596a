"""The workload, defined once: `WorkloadPoint` names every key of the scenario's `workload:`
section, its type, bounds, default and meaning; `WorkloadSection` (what the YAML is validated
against) is derived from it, with the sweepable keys taking lists (scenario/derive.py).

A point's checks between keys (poisson needs a rate, a trace needs a trace dataset, the
arrivals fit max_duration_s, ...) run once per point, after the sweep is expanded, in
`WorkloadPoint.__post_init__`; every single key was validated by the section before.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from infbench.core.errors import ConfigError
from infbench.scenario.derive import section_from
from infbench.scenario.prefix import PrefixSection
from infbench.scenario.prefix import check as check_prefix
from infbench.scenario.sessions import SessionsSection
from infbench.scenario.values import (
    MAX_SEED,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    Rate,
    Section,
    StrictBool,
)

WorkloadKind = Literal["static", "offline", "poisson", "trace", "sessions"]
DatasetKind = Literal["sharegpt", "jsonl", "trace"]
PromptSource = Literal["random", "text"]
LengthDist = Literal["fixed", "uniform", "normal", "lognormal"]
OverContext = Literal["drop", "refuse"]
WORKLOAD_KINDS: tuple[str, ...] = typing.get_args(WorkloadKind)
DATASET_KINDS: tuple[str, ...] = typing.get_args(DatasetKind)
PROMPT_SOURCES: tuple[str, ...] = typing.get_args(PromptSource)
LENGTH_DISTS: tuple[str, ...] = typing.get_args(LengthDist)
OVER_CONTEXT: tuple[str, ...] = typing.get_args(OverContext)
# Without workload.num_requests: static runs batch_size requests, the other kinds this many.
DEFAULT_NUM_REQUESTS = 64
# workload.max_duration_s: a run's expected arrivals span at most this by default (a rate of
# 1e-9 would wait for decades), and at most MAX_DURATION_S when raised.
DEFAULT_MAX_DURATION_S = 24 * 3600.0
MAX_DURATION_S = 365 * 24 * 3600.0
# Workload keys whose list values sweep, in the order they nest in the product.
SWEEPABLE_WORKLOAD = (
    "batch_size", "prompt_len", "gen_len", "num_requests", "rate", "shared_prefix_len",
    "samples_per_prompt",
)


class DatasetSection(Section):
    """workload.dataset (measure/datasets.py reads it)."""

    kind: DatasetKind
    """sharegpt: a JSON list of {conversations: [{from: human, value}, {from: gpt, value}]};
    jsonl: one {prompt, optional output_len} per line; trace: an Azure LLM inference trace
    CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    path: Annotated[str, Field(min_length=1)]
    """The file (relative to the working directory), or `infbench:samples/NAME` for the
    small sample files shipped with infbench."""
    time_scale: PosFloat = 1.0
    """trace: multiplies the gaps between the trace's timestamps (0.1 replays 10x faster)."""
    over_context: OverContext = "drop"
    """Text entries whose prompt + output exceed the model context: drop (skipped before
    sampling, with a note counting them, as vLLM's ShareGPT sampler skips them) or refuse
    (the first is a one-line error naming its line or entry)."""


@dataclass(frozen=True)
class WorkloadPoint:
    """One workload shape, all scalars: a point of the scenario's `workload:` section."""

    kind: WorkloadKind = "static"
    """static: num_requests (default batch_size) requests, batch_size at a time; offline:
    num_requests at t=0; poisson: arrivals at `rate`; trace: the dataset trace's timestamps;
    sessions: multi-turn conversations (`sessions`), arriving at `rate` sessions per second
    (unset: all at t=0)."""
    batch_size: PosInt = 1
    prompt_len: PosInt = 128
    gen_len: PosInt = 32
    num_requests: PosInt | None = None
    """Requests per run; unset: batch_size for kind static, 64 for the other kinds."""
    rate: Rate | None = None
    """Arrival rate in requests per second (required for kind poisson); inf: all at t=0."""
    shared_prefix_len: NonNegInt = 0
    """The first N tokens of every prompt are identical (a shared system prompt)."""
    samples_per_prompt: PosInt = 1
    seed: Annotated[int, Field(ge=0, le=MAX_SEED, strict=True)] = 0
    prompt_source: PromptSource = "random"
    """random token ids, or windows of the shipped public-domain text (needs a tokenizer)."""
    prompt_len_dist: LengthDist = "fixed"
    gen_len_dist: LengthDist = "fixed"
    len_spread: Annotated[float, Field(ge=0, le=100, strict=True, allow_inf_nan=False)] = 0.5
    """Relative spread of the length distributions (uniform: L*(1-s)..L*(1+s))."""
    chat: StrictBool = False
    """Wrap text prompts in the model's chat template."""
    temperature: NonNegFloat = 0.0
    top_k: NonNegInt = 0
    top_p: Annotated[float, Field(gt=0, le=1, strict=True, allow_inf_nan=False)] = 1.0
    ignore_eos: StrictBool = True
    burstiness: PosFloat = 1.0
    """kind poisson: gamma-distributed gaps of shape `burstiness` and mean 1/rate (1: a
    Poisson process; < 1 burstier, > 1 more regular), as vLLM's --burstiness."""
    max_concurrency: PosInt | None = None
    """Client-side cap on outstanding requests: a request is submitted only when fewer are
    in flight (its TTFT counts from that submission); null: no cap."""
    dataset: DatasetSection | None = None
    """Prompts (and output lengths, and for a trace arrival times) from a file."""
    prefix: PrefixSection | None = None
    """Prefix groups: requests whose prompts share their group's prefix (docs/prefix.md)."""
    max_duration_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S, strict=True,
                                           allow_inf_nan=False)] = DEFAULT_MAX_DURATION_S
    """The longest a run's arrivals may span (poisson: (requests - 1) / rate expected; trace:
    its drawn rows' span times time_scale); longer is refused before the run (24 h unless
    raised, at most 365 days)."""
    sessions: SessionsSection | None = None
    """kind sessions: the conversations (turns, message lengths, think times;
    docs/sessions.md); unset with kind sessions: the section's defaults."""

    def __post_init__(self) -> None:
        if self.kind == "poisson" and self.rate is None:
            raise ConfigError(f"workload.rate: required for kind 'poisson' as requests per "
                              f"second > 0 or inf (got {self.rate})")
        if self.shared_prefix_len > self.prompt_len:
            raise ConfigError(f"workload.shared_prefix_len: must be in 0..workload.prompt_len "
                              f"({self.prompt_len}) (got {self.shared_prefix_len})")
        if self.chat and self.prompt_source != "text":
            raise ConfigError("workload.chat: applies to text prompts; set "
                              "workload.prompt_source: text (got random)")
        self._check_arrivals()
        self._check_duration()
        self._check_dataset()
        self._check_sessions()
        check_prefix(self.prefix, shared_prefix_len=self.shared_prefix_len, chat=self.chat,
                     num_prompts=self.num_prompts, prompt_len=self.prompt_len,
                     dataset_kind=None if self.dataset is None else self.dataset.kind)

    def _check_arrivals(self) -> None:
        """The arrival keys that only make sense together."""
        if self.max_concurrency is not None and self.kind == "static":
            raise ConfigError("workload.max_concurrency: kind static already runs batch_size "
                              "requests at a time; allowed with kind offline, poisson, trace")
        if self.kind == "static" and self.num_prompts < self.batch_size:
            raise ConfigError(f"workload.num_requests: kind static runs batch_size "
                              f"({self.batch_size}) requests at a time; allowed: at least "
                              f"batch_size, or unset (got {self.num_requests})")
        if self.burstiness != 1.0 and self.kind not in ("poisson", "sessions"):
            raise ConfigError(f"workload.burstiness: shapes poisson arrivals; allowed with "
                              f"workload.kind poisson or sessions (got kind {self.kind})")
        if self.kind == "trace" and not self._has_trace:
            raise ConfigError("workload.kind: 'trace' replays a trace's timestamps and needs "
                              "workload.dataset: {kind: trace, path: FILE.csv}")
        if self.kind == "trace" and self.rate is not None:
            raise ConfigError("workload.rate: kind trace takes its arrivals from the trace; "
                              "remove rate (or use kind poisson for the trace's lengths at a "
                              "rate)")

    def _check_duration(self) -> None:
        """Poisson arrivals expected to span more than max_duration_s are refused here, at
        load (a trace's span is known once its file is read: measure/workload.py)."""
        if self.kind not in ("poisson", "sessions") or self.rate is None or \
                not math.isfinite(self.rate):
            return
        expected = (self.num_prompts - 1) / self.rate  # the first arrives at t=0
        what = "sessions" if self.kind == "sessions" else "requests"
        if expected > self.max_duration_s:
            raise ConfigError(
                f"workload.rate: {self.num_prompts} {what} at {self.rate:g}/s arrive over "
                f"about {expected:.3g} s ({_readable_s(expected)}), beyond "
                f"workload.max_duration_s {self.max_duration_s:g} "
                f"({_readable_s(self.max_duration_s)}); allowed: a higher rate, fewer "
                f"{what}, or max_duration_s up to {MAX_DURATION_S:.0f} when a run that long "
                "is meant")

    def _check_dataset(self) -> None:
        """Prompts from a file: the keys that shape generated prompts do not apply."""
        if self.dataset is None:
            return
        # A trace gives lengths only: its prompts are random ids or windows of text.
        text_source = "random" if self._has_trace else self.prompt_source
        for key, value, default in (("shared_prefix_len", self.shared_prefix_len, 0),
                                    ("prompt_source", text_source, "random"),
                                    ("chat", self.chat, False)):
            if value != default:
                raise ConfigError(f"workload.{key}: the prompts come from "
                                  f"workload.dataset ({self.dataset.path}); remove {key}")

    def _check_sessions(self) -> None:
        """kind sessions draws its lengths from workload.sessions: the keys that shape
        single requests do not apply (the section itself was checked when it loaded)."""
        if self.sessions is not None and self.kind != "sessions":
            raise ConfigError(f"workload.sessions: describes multi-turn conversations; allowed "
                              f"with workload.kind sessions (got kind {self.kind})")
        if self.kind != "sessions":
            return
        defaults = WorkloadPoint()
        for key in ("num_requests", "prompt_len", "gen_len", "shared_prefix_len",
                    "samples_per_prompt", "prompt_source", "prompt_len_dist", "gen_len_dist",
                    "chat", "dataset", "prefix"):
            if getattr(self, key) != getattr(defaults, key):
                instead = {"num_requests": "sessions.num_sessions",
                           "prompt_len": "sessions.user_len",
                           "gen_len": "sessions.output_len",
                           "shared_prefix_len": "sessions.system_prompt_len",
                           "dataset": "sessions.dataset"}.get(key)
                raise ConfigError(f"workload.{key}: kind sessions draws its turns from "
                                  "workload.sessions; remove " + key
                                  + (f" (use workload.{instead})" if instead else ""))

    @property
    def _has_trace(self) -> bool:
        """The dataset is a trace (its timestamps, or with kind poisson only its lengths)."""
        return self.dataset is not None and self.dataset.kind == "trace"

    @property
    def is_realtime(self) -> bool:
        """Arrivals replayed on the wall clock (poisson, trace), not all at t=0."""
        return self.kind in ("poisson", "trace")

    @property
    def num_prompts(self) -> int:
        """Requests (distinct prompts) of a run: num_requests, or when unset batch_size for
        kind static and DEFAULT_NUM_REQUESTS for the other kinds."""
        if self.kind == "sessions":  # the conversations (each of several requests)
            return self.session_config.num_sessions
        if self.num_requests is not None:
            return self.num_requests
        return self.batch_size if self.kind == "static" else DEFAULT_NUM_REQUESTS

    @property
    def session_config(self) -> SessionsSection:
        """workload.sessions, or its defaults when kind sessions left it unset."""
        return self.sessions if self.sessions is not None else SessionsSection()

    @property
    def num_sequences(self) -> int:
        return self.num_prompts * self.samples_per_prompt


def _readable_s(seconds: float) -> str:
    for unit, size, above in (("years", 365 * 86400.0, 1.0), ("days", 86400.0, 2.0),
                              ("h", 3600.0, 1.0)):
        if seconds >= size * above:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


if typing.TYPE_CHECKING:  # derived at run time; its attributes are WorkloadPoint's (lists)
    WorkloadSection = Any
else:
    WorkloadSection = section_from(WorkloadPoint, "WorkloadSection", sweep=SWEEPABLE_WORKLOAD,
                                   module=__name__, doc="The scenario's `workload:` section: "
                                   "WorkloadPoint's keys, the sweepable ones also as lists.")
