"""Masked-diffusion decoding: L masked positions refined in S steps, block by block.

The loop (LLaDA's low-confidence remasking sampler, greedy):

1. The canvas is the prompt followed by L mask tokens, for every sequence of the batch
   (all share P and L).
2. The L positions are split into L / B blocks of B, filled left to right
   (semi-autoregressive); each block gets S / (L / B) steps.
3. A step runs the bidirectional model, takes each masked position's argmax token and
   its confidence (its softmax probability, or a seeded uniform draw under `random`
   remasking), and commits the most confident still-masked positions of the current
   block; the rest stay masked ("remasked") for the next step.  A block's B tokens are
   spread over its steps as evenly as possible (the first B mod steps commit one more),
   so exactly L tokens are committed in exactly S steps.

Prefix cache (Fast-dLLM's block-wise cache, an approximation): the first step of a block
runs the whole canvas and keeps every layer's K/V of the positions before the block (the
prompt and the finished blocks); the block's other steps run only the positions from the
block on (the block and the still-masked later blocks) against those cached K/V.  In the
exact computation the prefix's K/V would change whenever a token after it is committed
(attention is bidirectional); the cache ignores that within a block and refreshes at the
next block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from infbench.core.decoding import REMASKING, check_diffusion_plan
from infbench.core.errors import UserError
from infbench.model.diffusion import BidirectionalContext, DiffusionLM


@dataclass(frozen=True)
class DiffusionPlan:
    """The validated shape of a decode: L tokens, S steps, blocks of B."""

    gen_len: int
    steps: int
    block_length: int

    def __post_init__(self) -> None:
        check_plan(self.gen_len, self.steps, self.block_length)

    @property
    def num_blocks(self) -> int:
        return self.gen_len // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks

    def commits(self) -> list[int]:
        """Tokens committed by each step of a block (sums to block_length)."""
        spb, b = self.steps_per_block, self.block_length
        return [b // spb + (1 if i < b % spb else 0) for i in range(spb)]


def check_plan(gen_len: int, steps: int, block_length: int) -> None:
    """L >= 1, B divides L, S a multiple of L / B, and no step that commits nothing."""
    check_diffusion_plan(gen_len, steps, block_length)  # a ConfigError: one line, exit 2


@dataclass(frozen=True)
class DiffusionStep:
    """One model call: its shape (per sequence) and its wall time."""

    block: int
    query_len: int  # positions run through the model, per sequence
    context_len: int  # positions attended to (cached prefix + query), per sequence
    num_logits: int  # positions whose logits were computed, per sequence
    committed: int  # tokens committed per sequence
    time_s: float


@dataclass
class DiffusionOutput:
    tokens: torch.Tensor  # (batch, L) the generated tokens
    steps: list[DiffusionStep] = field(default_factory=list)
    wall_s: float = 0.0  # the whole decode, set-up included

    @property
    def total_s(self) -> float:
        return sum(s.time_s for s in self.steps)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def diffusion_generate(lm: DiffusionLM, prompts: torch.Tensor, plan: DiffusionPlan, *,
                       remasking: str = "low_confidence", prefix_cache: bool = False,
                       seed: int = 0) -> DiffusionOutput:
    """prompts (batch, P) -> the L committed tokens per sequence, with per-step records.

    Deterministic for a fixed seed (greedy tokens; `random` remasking draws from a
    generator seeded with `seed`).
    """
    if remasking not in REMASKING:
        raise UserError(f"decoding.remasking: unknown value {remasking!r}; allowed: "
                        f"{', '.join(REMASKING)}")
    if prompts.dim() != 2 or prompts.shape[1] < 1:
        raise UserError(f"prompts must be (batch, P) with P >= 1, got {tuple(prompts.shape)}")
    batch, prompt_len = prompts.shape
    total = prompt_len + plan.gen_len
    if total > lm.config.max_seq_len:
        raise UserError(f"prompt {prompt_len} + gen {plan.gen_len} tokens exceed the model's "
                        f"max_seq_len {lm.config.max_seq_len}")
    device = lm.model.device
    _sync(device)
    t_start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)
    canvas = torch.full((batch, total), lm.mask_token_id, dtype=torch.long, device=device)
    canvas[:, :prompt_len] = prompts.to(device)
    out = DiffusionOutput(tokens=canvas[:, prompt_len:])
    commits = plan.commits()
    for block in range(plan.num_blocks):
        lo = prompt_len + block * plan.block_length
        hi = lo + plan.block_length
        prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, count in enumerate(commits):
            _sync(device)
            t0 = time.perf_counter()
            if not prefix_cache or i == 0:
                # The whole canvas; with the cache, keep the K/V before the block.
                ctx = BidirectionalContext(batch, total, record_prefix=lo if prefix_cache else 0)
                logits = lm.logits(canvas, ctx, 0, (lo, hi))  # (batch, B, V)
                query, start = total, 0
                prefix = ctx.recorded
            else:
                ctx = BidirectionalContext(batch, total - lo, prefix=prefix)
                logits = lm.logits(canvas[:, lo:], ctx, lo, (0, hi - lo))  # (batch, B, V)
                query, start = total - lo, lo
            _commit(canvas[:, lo:hi], logits, count, lm.mask_token_id, remasking, gen)
            _sync(device)
            out.steps.append(DiffusionStep(block, query, query + start, hi - lo, count,
                                           time.perf_counter() - t0))
    out.wall_s = time.perf_counter() - t_start
    if bool((out.tokens == lm.mask_token_id).any()):  # the plan guarantees it; a bug if not
        raise RuntimeError("diffusion decoding left masked positions")
    return out


def _commit(block: torch.Tensor, logits: torch.Tensor, count: int, mask_id: int,
            remasking: str, gen: torch.Generator) -> None:
    """Commit `count` masked positions per row of `block` (batch, B) in place."""
    logits[..., mask_id] = float("-inf")  # never predict the mask itself
    pred = logits.argmax(dim=-1)  # (batch, B)
    if remasking == "low_confidence":
        conf = torch.softmax(logits, dim=-1).gather(-1, pred[..., None]).squeeze(-1)
    else:
        conf = torch.rand(pred.shape, generator=gen, device=pred.device)  # (batch, B)
    masked = block == mask_id  # (batch, B)
    conf = torch.where(masked, conf, torch.full_like(conf, -1.0))  # committed: never chosen
    # count <= masked positions left in every row (the plan's arithmetic), so topk picks
    # only masked positions; ties go to the lower index (stable sort).
    chosen = torch.sort(conf, dim=-1, descending=True, stable=True).indices[:, :count]
    rows = torch.arange(block.shape[0], device=block.device)[:, None]
    block[rows, chosen] = pred[rows, chosen]
