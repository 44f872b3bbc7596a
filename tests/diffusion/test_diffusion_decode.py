"""Diffusion decoding: the plan's arithmetic, determinism, and a tiny model trained here with
the masked-diffusion objective that decoding must then answer exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infbench.core.config import ModelConfig
from infbench.core.errors import UserError
from infbench.engine.diffusion import DiffusionPlan, diffusion_generate
from infbench.model.diffusion import DiffusionLM
from infbench.model.transformer import Transformer

MASK = 31  # the last vocabulary id


def _lm(seed: int = 0, vocab: int = 32) -> DiffusionLM:
    cfg = ModelConfig(name="dlm-test", vocab_size=vocab, hidden_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, intermediate_size=128, max_seq_len=64)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
    return DiffusionLM(model.eval(), cfg, MASK)


@pytest.mark.parametrize("args,match", [
    ((6, 4, 4), "must divide"), ((8, 3, 4), "multiple of the number of blocks"),
    ((0, 1, 1), "gen_len must be an integer >= 1"), ((4, 8, 4), "<= the generation length"),
])
def test_bad_plans(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(UserError, match=match):
        DiffusionPlan(*args)


def test_commits_spread_over_steps() -> None:
    plan = DiffusionPlan(gen_len=12, steps=6, block_length=6)
    assert plan.num_blocks == 2 and plan.steps_per_block == 3 and plan.commits() == [2, 2, 2]
    assert DiffusionPlan(10, 4, 5).commits() == [3, 2]


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
@pytest.mark.parametrize("prefix_cache", [False, True])
def test_exactly_l_tokens_in_s_steps_and_deterministic(remasking: str, prefix_cache: bool) -> None:
    lm = _lm()
    prompts = torch.randint(0, MASK, (3, 5), generator=torch.Generator().manual_seed(0))
    plan = DiffusionPlan(gen_len=8, steps=4, block_length=4)
    a = diffusion_generate(lm, prompts, plan, remasking=remasking, prefix_cache=prefix_cache,
                           seed=7)
    b = diffusion_generate(lm, prompts, plan, remasking=remasking, prefix_cache=prefix_cache,
                           seed=7)
    assert a.tokens.shape == (3, 8) and bool((a.tokens != MASK).all())
    assert torch.equal(a.tokens, b.tokens)
    assert len(a.steps) == 4 and sum(s.committed for s in a.steps) == 8
    full = 5 + 8
    if prefix_cache:  # the block's first step runs the canvas, the next the block onwards
        assert [s.query_len for s in a.steps] == [full, full - 5, full, full - 9]
        assert all(s.context_len == full for s in a.steps)
    else:
        assert all(s.query_len == full and s.context_len == full for s in a.steps)
    assert all(s.num_logits == 4 for s in a.steps)


def test_random_remasking_depends_on_the_seed() -> None:
    lm = _lm()
    prompts = torch.randint(0, MASK, (4, 5), generator=torch.Generator().manual_seed(0))
    plan = DiffusionPlan(gen_len=8, steps=2, block_length=8)
    outs = {tuple(diffusion_generate(lm, prompts, plan, remasking="random", seed=s)
                  .tokens.flatten().tolist()) for s in range(4)}
    assert len(outs) > 1


def test_low_confidence_commits_the_most_confident_first() -> None:
    """Step one of S = L commits the position whose top probability is the highest."""
    lm = _lm(seed=3)
    prompts = torch.randint(0, MASK, (2, 4), generator=torch.Generator().manual_seed(5))
    plan = DiffusionPlan(gen_len=6, steps=6, block_length=6)
    with torch.no_grad():
        canvas = torch.cat([prompts, torch.full((2, 6), MASK)], dim=1)
        logits = lm.logits(canvas)[:, 4:]
        logits[..., MASK] = float("-inf")
        conf, pred = torch.softmax(logits, -1).max(-1)
    first = conf.argmax(-1)  # (2,)
    out = diffusion_generate(lm, prompts, plan, seed=0)
    for row in range(2):
        assert out.tokens[row, first[row]] == pred[row, first[row]]


# ------------------------------------------------------------- trained in the test
PROMPT, GEN, SYMBOLS = 4, 4, 10  # tokens 0..9; the answer is the prompt reversed


def _batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    prompt = torch.randint(0, SYMBOLS, (n, PROMPT), generator=gen)
    return prompt, prompt.flip(1)


def _train(lm: DiffusionLM, steps: int) -> None:
    """The masked-diffusion objective (LLaDA's SFT form): mask each answer position with
    probability t ~ U(0.05, 1), cross-entropy on the masked positions weighted by 1/t."""
    gen = torch.Generator().manual_seed(0)
    model = lm.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    n = 64
    for _ in range(steps):
        prompt, answer = _batch(n, gen)
        t = 0.05 + 0.95 * torch.rand(n, 1, generator=gen)
        masked = torch.rand(n, GEN, generator=gen) < t  # (n, GEN)
        noisy = torch.where(masked, torch.full_like(answer, MASK), answer)
        logits = lm.logits(torch.cat([prompt, noisy], 1), logit_range=(PROMPT, PROMPT + GEN))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), answer.reshape(-1),
                               reduction="none").view(n, GEN)
        loss = (loss * masked / t).sum() / (n * GEN)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def test_trained_tiny_model_decodes_the_exact_answer() -> None:
    # One thread: tiny matmuls gain nothing from two, and a 2-thread OpenMP region stalls
    # when another process holds the second core of a shared machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lm = _lm(seed=1, vocab=32)
        _train(lm, steps=900)  # about 10 s on one idle core
    finally:
        torch.set_num_threads(threads)
    prompt, answer = _batch(16, torch.Generator().manual_seed(123))
    one_per_step = DiffusionPlan(gen_len=GEN, steps=GEN, block_length=GEN)
    out = diffusion_generate(lm, prompt, one_per_step, seed=0)
    assert [s.committed for s in out.steps] == [1] * GEN
    assert torch.equal(out.tokens, answer)
    # Semi-autoregressive blocks of 2 with the prefix cache solve it too.
    blocks = DiffusionPlan(gen_len=GEN, steps=GEN, block_length=2)
    assert torch.equal(diffusion_generate(lm, prompt, blocks, prefix_cache=True).tokens, answer)
    # An untrained model of the same shape does not: the test can fail.
    assert not torch.equal(diffusion_generate(_lm(seed=1), prompt, one_per_step).tokens, answer)
