"""Decoding kinds, defined once: autoregressive or masked diffusion, and the S / L / B rule
of a diffusion plan that the scenario, the engine and the analytic model all check."""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass
from typing import Any, Literal

from infbench.core.errors import ConfigError

DecodingKind = Literal["autoregressive", "diffusion"]
Remasking = Literal["low_confidence", "random"]
DECODING_KINDS: tuple[str, ...] = typing.get_args(DecodingKind)
REMASKING: tuple[str, ...] = typing.get_args(Remasking)


def check_diffusion_plan(gen_len: int, steps: int, block_length: int) -> None:
    """L >= 1, B divides L, S a multiple of the L / B blocks, S <= L (every step commits)."""
    for key, value in (("gen_len", gen_len), ("steps", steps), ("block_length", block_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"diffusion {key} must be an integer >= 1, got {value!r}")
    if gen_len % block_length:
        raise ConfigError(f"diffusion block_length {block_length} must divide the generation "
                          f"length {gen_len}")
    blocks = gen_len // block_length
    if steps % blocks:
        raise ConfigError(f"diffusion steps {steps} must be a multiple of the number of blocks "
                          f"{blocks} (gen_len {gen_len} / block_length {block_length})")
    if steps > gen_len:
        raise ConfigError(f"diffusion steps {steps} must be <= the generation length {gen_len} "
                          "(a step commits at least one token)")


@dataclass(frozen=True)
class DiffusionConfig:
    """A point's masked-diffusion plan (decoding.kind diffusion): S steps for the L = gen_len
    tokens, filled B = block_length at a time; None on a point means autoregressive."""

    steps: int
    block_length: int
    remasking: str = "low_confidence"  # one of REMASKING
    prefix_cache: bool = False  # Fast-dLLM's block-wise prefix K/V cache
    mask_token_id: int | None = None  # None: the LLaDA directory's own

    def to_dict(self) -> dict[str, Any]:
        """The stored form inside a result (`kind` first, as the scenario spells it)."""
        return {"kind": "diffusion", **asdict(self)}
