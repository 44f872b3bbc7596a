"""Logit distillation of a pruned model against the model it was pruned from.

The student (the pruned model) learns the teacher's next-token distribution on
calibration text: the loss is KL(teacher || student) of the softmax of the logits at
every position (temperature 1), averaged over the tokens, minimized with AdamW over
the decoder layers and the final norm.  The embedding and the LM head stay frozen:
pruning does not touch them, and they are the largest matrices of a small model
(SmolLM2: 28M of 135M parameters), whose gradient and AdamW state would be three more
copies.  Each step packs `batch_windows` windows of the token stream into one dense
forward (`DenseContext`); the teacher's logits are computed without a graph.  The
model's plain (no `ops`) forward is differentiable end to end, so no separate training
model is needed; the step runs in the model's dtype (float32 for `infbench prune`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from infbench.core.errors import UserError
from infbench.model.context import DenseContext
from infbench.model.transformer import Transformer

DISTILL_WINDOW = 256  # tokens per sequence of a distillation batch
DISTILL_BATCH = 2  # windows per step
FROZEN = ("embed_tokens.", "lm_head.")  # parameters distillation leaves as they are


@dataclass
class DistillResult:
    """What one distillation run did: the KL on its first batch before and after."""

    steps: int
    kl_before: float
    kl_after: float
    losses: list[float] = field(default_factory=list)  # training loss of every step
    seconds: float = 0.0
    tokens_per_step: int = 0


def batches(ids: Sequence[int], steps: int, window: int = DISTILL_WINDOW,
            batch_windows: int = DISTILL_BATCH) -> list[list[torch.Tensor]]:
    """`steps` batches of `batch_windows` consecutive windows of `window` tokens, read from
    `ids` in order and wrapping around at its end."""
    if len(ids) < window:
        raise UserError(f"distillation needs at least {window} calibration tokens, got {len(ids)}")
    stream = torch.as_tensor(list(ids), dtype=torch.long)
    per_pass = len(ids) // window  # whole windows per pass over the text
    out = []
    for step in range(steps):
        group = []
        for j in range(batch_windows):
            k = (step * batch_windows + j) % per_pass
            group.append(stream[k * window:(k + 1) * window])
        out.append(group)
    return out


def _logits(model: Transformer, windows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Next-token logits (T, V) float32 of windows packed into one dense forward."""
    device = model.device
    ids = torch.cat(list(windows)).to(device)  # (T,)
    positions = torch.cat([torch.arange(w.numel()) for w in windows]).to(device)  # (T,)
    bounds = [0]
    for w in windows:
        bounds.append(bounds[-1] + w.numel())
    hidden = model(ids, positions, DenseContext(bounds, model.config))  # (T, H)
    return model.compute_logits(hidden)  # (T, V)


def kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(teacher || student) on softmax(logits), temperature 1."""
    return F.kl_div(F.log_softmax(student_logits.float(), -1),
                    F.log_softmax(teacher_logits.float(), -1),
                    log_target=True, reduction="batchmean")


def kl_on(student: Transformer, teacher: Transformer, windows: Sequence[torch.Tensor]) -> float:
    with torch.no_grad():
        return float(kl_loss(_logits(student, windows), _logits(teacher, windows)).item())


def distill(student: Transformer, teacher: Transformer, ids: Sequence[int], steps: int,
            lr: float = 1e-4, *, window: int = DISTILL_WINDOW,
            batch_windows: int = DISTILL_BATCH,
            on_step: Callable[[int, float], None] | None = None) -> DistillResult:
    """Train `student` in place for `steps` AdamW steps on KL(teacher || student) over
    batches of `ids`; returns the KL on the first batch before and after.

    The student must run its plain forward (no engine `ops` bound: those kernels have no
    backward); it is left in eval mode without gradients, as `load_model` returns models.
    """
    if getattr(student, "ops", None) is not None or getattr(teacher, "ops", None) is not None:
        raise ValueError("distill runs the models' plain forward; these are bound to an engine")
    if steps < 1:
        raise UserError(f"distillation needs at least 1 step, got {steps}")
    data = batches(ids, steps, window, batch_windows)
    start = time.perf_counter()
    kl_before = kl_on(student, teacher, data[0])
    params = [p for name, p in student.named_parameters() if not name.startswith(FROZEN)]
    for p in params:
        p.requires_grad_(True)
    # Weight decay would pull the pruned weights toward zero: not what recovery wants.
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    losses: list[float] = []
    try:
        for step, group in enumerate(data):
            with torch.no_grad():
                target = _logits(teacher, group)  # (T, V)
            loss = kl_loss(_logits(student, group), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            losses.append(float(loss.item()))
            if on_step is not None:
                on_step(step, losses[-1])
    finally:
        student.requires_grad_(False)
        optimizer.zero_grad(set_to_none=True)
    kl_after = kl_on(student, teacher, data[0])
    return DistillResult(steps, kl_before, kl_after, losses, time.perf_counter() - start,
                         window * batch_windows)
