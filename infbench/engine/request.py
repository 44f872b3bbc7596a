"""Requests as users submit them: prompt token ids, sampling parameters, arrival time."""

from __future__ import annotations

from dataclasses import dataclass, field

from infbench.core.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, as in vLLM: temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None  # per-request generator seed (None: derived from the run seed)
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # benchmarks generate exactly max_tokens
    n: int = 1  # samples of the prompt (vLLM's place for it; Request.n takes it from here)

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ConfigError(f"sampling.n must be > 0, got {self.n}")
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"sampling.top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens <= 0:
            raise ConfigError(f"sampling.max_tokens must be > 0, got {self.max_tokens}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Request:
    """A prompt to serve; `n` > 1 asks for n samples that share the prompt's KV blocks."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    arrival_s: float = 0.0
    n: int = 1

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ConfigError(f"request {self.request_id}: empty prompt")
        if self.n <= 0:
            raise ConfigError(f"request {self.request_id}: n must be > 0, got {self.n}")
        if self.sampling.n != 1:  # n given in the sampling params: the request follows
            if self.n not in (1, self.sampling.n):
                raise ConfigError(f"request {self.request_id}: n={self.n} but sampling.n="
                                  f"{self.sampling.n}; give one")
            object.__setattr__(self, "n", self.sampling.n)
