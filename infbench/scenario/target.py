"""The scenario's `target:` section: run the workload against a server instead of the engine.

    target:
      kind: openai                      # the one kind so far: an OpenAI-compatible server
      base_url: http://127.0.0.1:8000/v1
      model: Qwen/Qwen2.5-0.5B-Instruct # the name the server serves
      api_key_env: OPENAI_API_KEY       # optional: the variable holding the bearer token
      endpoint: completions             # completions | chat
      tokenizer: smollm2-135m           # optional: a preset name, an HF dir or a .gguf
      prompt_format: tokens             # tokens (ids to /v1/completions) | text
      return_token_ids: false           # ask for token ids (vLLM, infbench serve extension)
      timeout_s: 600                    # a connection, or the gap between two reads
      request_timeout_s: 21600          # one request, sent to [DONE] (vLLM's bench: 6 h)
      workers: 1                        # client processes on this host (client/workers.py)
      metrics: true                     # scrape the server's /metrics (or a path, a URL)
      metrics_interval_s: 1.0           # seconds between two scrapes
      request_overhead_s: 0.0           # priced in the prediction: what serving adds

Validated once, here, with the scenario (pydantic, extra keys refused), so a bad target is
one line naming the file and the key before anything runs: a tokenizer that cannot be
loaded (a missing path, a preset without one) too.  Whether the server answers is checked by
`infbench run` (measure/preflight.probe_target) before it claims the output directory.  The client
that uses it lives in `infbench/client/`; this module is torch-free.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from infbench.checkpoint.metadata import model_source, resolve_gguf
from infbench.core.config import REAL_WEIGHTS
from infbench.core.errors import UserError

TargetKind = Literal["openai"]
TargetEndpoint = Literal["completions", "chat"]
PromptFormat = Literal["tokens", "text"]
TARGET_KINDS: tuple[str, ...] = typing.get_args(TargetKind)
MAX_TIMEOUT_S = 24 * 3600.0
MAX_WORKERS = 256
DEFAULT_REQUEST_TIMEOUT_S = 6 * 3600.0  # vLLM's benchmark client: ClientTimeout(total=6 h)
DEFAULT_METRICS_INTERVAL_S = 1.0
MAX_METRICS_INTERVAL_S = 3600.0
MAX_REQUEST_OVERHEAD_S = 60.0


def tokenizer_source(name: str) -> tuple[str, Path]:
    """Where `target.tokenizer` loads from: ("hf", a directory holding tokenizer.json) or
    ("gguf", an existing file), checked without reading it; ValueError says why not.

    A preset must name a released model (REAL_WEIGHTS) whose GGUF is installed."""
    allowed = (f"allowed: {', '.join(REAL_WEIGHTS)}, an HF directory with tokenizer.json, "
               "or a .gguf file")
    try:
        kind, value = next(iter(model_source(name, "target.tokenizer").items()))
    except UserError:
        raise ValueError(f"{name!r} is no tokenizer preset and no existing directory or file; "
                         f"{allowed}") from None
    try:
        if kind == "preset":
            if value.lower() not in REAL_WEIGHTS:
                raise ValueError(f"preset {value!r} has no tokenizer; {allowed}")
            return "gguf", resolve_gguf(REAL_WEIGHTS[value.lower()])
        if kind == "path":
            if not (Path(value) / "tokenizer.json").is_file():
                raise ValueError(f"{value}: no tokenizer.json (only fast tokenizers are "
                                 "supported)")
            return "hf", Path(value)
        return "gguf", resolve_gguf(value)
    except UserError as exc:  # resolve_gguf: a one-line reason
        raise ValueError(str(exc)) from None


def redact_url(url: str) -> str:
    """`url` as an error may show it: user and password replaced, query and fragment cut."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
    except ValueError:  # e.g. an unbalanced [ in the host
        return "<not a URL>"
    if "@" in parts.netloc:
        host = "***@" + host
    return parts._replace(netloc=host, query="", fragment="").geturl()


class TargetSection(BaseModel):
    """An OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's server, `infbench serve`);
    frozen: the point holds it as validated (`ScenarioPoint.target`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    kind: TargetKind
    """openai: an OpenAI-compatible HTTP server, streamed over SSE."""
    base_url: str
    """The API root including its version, e.g. http://127.0.0.1:8000/v1."""
    model: Annotated[str, Field(min_length=1)]
    """The model name the server serves (the `model` field of every request)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (sent as a bearer token)."""
    endpoint: TargetEndpoint = "completions"
    """completions: /v1/completions; chat: /v1/chat/completions (prompts sent as text)."""
    prompt_format: PromptFormat = "tokens"
    """tokens: the workload's token ids as the prompt (completions only); text: detokenized."""
    tokenizer: str | None = Field(default=None, validate_default=True)
    """Where to load a tokenizer from: a preset name (smollm2-135m), an HF directory or a
    .gguf file.  Counts tokens when the server sends no usage, splits multi-token chunks, and
    turns prompts into text; only the tokenizer is loaded, never weights."""
    return_token_ids: Annotated[bool, Field(strict=True)] = False
    """Ask for the generated token ids next to the text (`return_token_ids`, an extension of
    vLLM and `infbench serve`): exact per-chunk counts and the result's output ids."""
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, strict=True,
                                      allow_inf_nan=False)] = 600.0
    """Seconds a connection or a read between two chunks may take before the request fails."""
    request_timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, strict=True,
                                              allow_inf_nan=False)] = DEFAULT_REQUEST_TIMEOUT_S
    """Seconds one request may take from sending to `data: [DONE]`, however often bytes
    (keep-alive comments included) arrive; then it fails with reason `deadline`."""
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS, strict=True)] = 1
    """Client processes on this host, each pinned to a core (modulo the cores) and fed its
    share of the one seeded arrival schedule (client/workers.py); 1: one event loop here."""
    metrics: Annotated[bool, Field(strict=True)] | str = True
    """Scrape the server's Prometheus metrics while the repeats run (client/server_metrics):
    true: /metrics at the server's root (base_url without its /v1); false: no scraping; a
    path such as /sglang/metrics (on the server's root) or an http(s):// URL."""
    metrics_interval_s: Annotated[float, Field(gt=0, le=MAX_METRICS_INTERVAL_S, strict=True,
                                               allow_inf_nan=False)] = \
        DEFAULT_METRICS_INTERVAL_S
    """Seconds between two scrapes of `metrics` (the first at the first repeat's start, the
    last after the last repeat's end)."""
    request_overhead_s: Annotated[float, Field(ge=0, le=MAX_REQUEST_OVERHEAD_S, strict=True,
                                               allow_inf_nan=False)] = 0.0
    """Seconds the server and this client add to every request beyond the engine's steps
    (HTTP, parsing, hand-offs, streaming), added to each request's predicted token times
    in `prediction.metrics` (TTFT and E2E; TPOT and ITL unchanged).  0: the engine's times
    alone; `python -m infbench.benchmarks.sim_fidelity --through serve` measures it for
    `infbench serve` (docs/predictions-under-load.md)."""

    @model_validator(mode="before")
    @classmethod
    def _chat_defaults_to_text(cls, data: Any) -> Any:
        """endpoint chat sends messages, which are text: prompt_format left unset means text
        (set to tokens with chat it is refused below, when the scenario loads)."""
        if isinstance(data, dict) and data.get("endpoint") == "chat" and (
                "prompt_format" not in data):
            return {**data, "prompt_format": "text"}
        return data

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError for a port out of range
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http:// or https:// URL such as "
                             f"http://127.0.0.1:8000/v1 (got {redact_url(value)!r})")
        if parts.username is not None or parts.password is not None:
            # Refused rather than stored: the point (and so the manifest and every result)
            # records base_url, and a key belongs in the environment.
            raise ValueError(f"must not carry credentials (got {redact_url(value)!r}); put "
                             "the key in an environment variable and name it in api_key_env")
        if parts.query or parts.fragment:
            raise ValueError(f"is the API root; a query or fragment is not part of it (got "
                             f"{redact_url(value)!r})")
        return value.rstrip("/")

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics_where(cls, value: Any) -> Any:
        allowed = ("allowed: true, false, a path such as /metrics, or an http:// or https:// "
                   "URL")
        if isinstance(value, bool):
            return value
        if not isinstance(value, str):
            raise ValueError(f"got {value!r}; {allowed}")
        if value.startswith("/"):
            if value.startswith("//") or any(c in value for c in "?# "):
                raise ValueError(f"a path on the server's root has no host, query, fragment "
                                 f"or space (got {value!r}); {allowed}")
            return value
        try:
            parts = urlsplit(value)
            _ = parts.port
        except ValueError:
            raise ValueError(f"not a URL (got {redact_url(value)!r}); {allowed}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"got {redact_url(value)!r}; {allowed}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"must not carry credentials (got {redact_url(value)!r})")
        if parts.fragment:
            raise ValueError(f"a URL without a fragment (got {redact_url(value)!r})")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_is_set(cls, value: str | None) -> str | None:
        if value is not None and not os.environ.get(value):
            raise ValueError(f"environment variable {value} is not set (or empty); export it "
                             "or remove api_key_env for a server without a key")
        return value

    @field_validator("prompt_format")
    @classmethod
    def _chat_takes_text(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("endpoint") == "chat" and value == "tokens":
            raise ValueError("endpoint chat takes text messages; allowed with chat: text")
        return value

    @field_validator("tokenizer")
    @classmethod
    def _needed_for_text(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must name a tokenizer source (got an empty string)")
        if value is None and info.data.get("endpoint") == "chat":
            raise ValueError("endpoint chat sends prompts as text; name a tokenizer to "
                             "detokenize the workload's prompts (e.g. smollm2-135m)")
        if value is None and info.data.get("prompt_format") == "text":
            raise ValueError("prompt_format text needs a tokenizer to detokenize the "
                             "workload's prompts (e.g. smollm2-135m)")
        if value is not None:
            tokenizer_source(value)  # loadable: refused here, not at the first point
        return value

    @property
    def sends_text(self) -> bool:
        """Prompts go out as text (chat, or prompt_format text), not as token ids."""
        return self.endpoint == "chat" or self.prompt_format == "text"

    @property
    def metrics_url(self) -> str | None:
        """Where the server's Prometheus metrics are scraped, or None (metrics: false)."""
        if self.metrics is False:
            return None
        if isinstance(self.metrics, str) and not self.metrics.startswith("/"):
            return self.metrics  # a URL of its own (validated above)
        parts = urlsplit(self.base_url)
        root = parts.path[:-3] if parts.path.endswith("/v1") else parts.path
        path = "/metrics" if self.metrics is True else self.metrics
        return f"{parts.scheme}://{parts.netloc}{root.rstrip('/')}{path}"

    @property
    def url(self) -> str:
        """The streaming endpoint's URL."""
        path = "/chat/completions" if self.endpoint == "chat" else "/completions"
        return self.base_url + path
