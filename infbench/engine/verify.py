"""Verification of draft tokens: exact match under greedy decoding, the rejection rule
under sampling (Leviathan et al. 2023; Chen et al. 2023).

The target scores the step's input token and the k drafts in one pass: row i of its
distribution p (k + 1 rows) is the target's next-token distribution after draft i (row 0:
after the step's input token).  Draft i is accepted with probability min(1, p_i(d) /
q_i(d)); at the first rejection the token is drawn from the residual max(0, p_i - q_i),
renormalized, and verification stops; when all k are accepted a bonus token is drawn from
p_k.  Every emitted token then follows the target's distribution exactly, whatever q was.
A proposer that picked its tokens deterministically has a one-hot q: accept with
probability p_i(d), residual p_i with d removed.

Both functions return the tokens the step emits: the accepted drafts, then the correction
(or bonus) token, so 1 to k + 1 tokens.
"""

from __future__ import annotations

import torch


def verify_greedy(target_tokens: list[int], drafts: list[int]) -> list[int]:
    """target_tokens: the target's argmax after the input and after each draft (k + 1)."""
    if len(target_tokens) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} target tokens, "
                         f"got {len(target_tokens)}")
    out: list[int] = []
    for draft, target in zip(drafts, target_tokens, strict=False):
        out.append(target)
        if draft != target:
            return out
    out.append(target_tokens[len(drafts)])
    return out


def verify_sampled(p: torch.Tensor, drafts: list[int], q: torch.Tensor | None,
                   generator: torch.Generator) -> list[int]:
    """p: (k + 1, V) target probabilities (after temperature / top-k / top-p); q: (k, V)
    the draft's, or None for deterministic drafts.  Draws from `generator` only."""
    k = len(drafts)
    if p.shape[0] != k + 1 or (q is not None and q.shape[0] != k):
        raise ValueError(f"{k} drafts need p of {k + 1} rows and q of {k} rows, got "
                         f"{tuple(p.shape)} and {None if q is None else tuple(q.shape)}")
    out: list[int] = []
    u = torch.rand(k, generator=generator, dtype=torch.float64).tolist() if k else []
    for i, draft in enumerate(drafts):
        p_d = float(p[i, draft])
        q_d = 1.0 if q is None else float(q[i, draft])
        if q_d > 0 and u[i] * q_d < p_d:  # u < p/q: accept (always when p >= q)
            out.append(draft)
            continue
        if q is None:
            residual = p[i].clone()
            residual[draft] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_min(0.0)
        total = float(residual.sum())
        # Rejection with an empty residual has probability 0 (p = q); rounding aside, p.
        row = residual / total if total > 0 else p[i]
        out.append(int(torch.multinomial(row, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[k], 1, generator=generator)))
    return out
