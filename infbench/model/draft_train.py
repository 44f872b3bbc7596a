"""Training Medusa and EAGLE draft heads by self-distillation, and their checkpoint file.

The data is text the target writes itself, so the heads learn the target's own
continuations (what verification accepts), not the corpus':

1. Prompts: `num_sequences` windows of `prompt_tokens` tokens, evenly spaced over the
   calibration split of the offline evaluation text (`model/eval_text.py`; the test split
   stays unseen).
2. Continuations: `new_tokens` greedy tokens per prompt, EOS ignored, batched with a KV
   cache (`evaluate.greedy_continuations`).
3. Features: one dense forward of each prompt + continuation through the frozen target;
   f_t (float32) is kept for every position, tokens next to them.
4. The last `heldout_sequences` sequences are held out; AdamW trains the heads on the
   others: Medusa on `batch_positions` random positions a step (cross-entropy of head i on
   x_{t+1+i}, averaged over the heads), EAGLE on `batch_sequences` random whole sequences
   a step (smooth-L1 of g_j against f_{j+1} plus 0.1 x cross-entropy of
   compute_logits(g_j) on x_{j+2}).  Only positions whose predicted token is a generated
   one count (the prompt's next tokens are the corpus', not the target's).

Everything is seeded: the same target, seed and thread count give the same heads.

The checkpoint is one safetensors file: the heads' float32 tensors plus string metadata
(`format`, method, shapes, the target's fingerprint, steps, final loss, version), written
atomically.  The fingerprint is the target's architecture plus a hash of its first 64
token embeddings rounded to bfloat16, so float32, bfloat16 and weight-quantized loads of
one checkpoint share it while another model's weights do not.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from infbench.core.errors import DamagedFileError, UserError
from infbench.core.io import write_bytes_atomic
from infbench.core.speculative import HEAD_METHODS
from infbench.core.version import __version__
from infbench.model.context import DenseContext
from infbench.model.draft_heads import EagleHead, MedusaHeads
from infbench.model.eval_text import eval_text
from infbench.model.evaluate import greedy_continuations
from infbench.model.tokenizer import Tokenizer
from infbench.model.transformer import Transformer

METHODS = HEAD_METHODS
DEFAULT_LR = {"medusa": 1e-3, "eagle": 1e-3}
EAGLE_CE_WEIGHT = 0.1  # the EAGLE paper's weight of the token loss next to the feature loss
FORMAT = "infbench-draft-heads"
FORMAT_VERSION = "1"
FINGERPRINT_TOKENS = 64
DraftHeads = MedusaHeads | EagleHead


@dataclass(frozen=True)
class DraftTrainConfig:
    """One training run; the data sizes give 3072 training positions by default."""

    method: str
    steps: int
    num_heads: int = 4  # Medusa's K
    lr: float | None = None  # None: DEFAULT_LR[method]
    seed: int = 0
    num_sequences: int = 56
    heldout_sequences: int = 8
    prompt_tokens: int = 64
    new_tokens: int = 64
    batch_positions: int = 128  # Medusa: positions per step
    batch_sequences: int = 4  # EAGLE: whole sequences per step

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"draft method {self.method!r} is unknown; allowed: "
                            f"{', '.join(METHODS)}")
        for name in ("steps", "num_heads", "prompt_tokens", "new_tokens", "batch_positions",
                     "batch_sequences", "heldout_sequences"):
            if getattr(self, name) < 1:
                raise UserError(f"draft training: {name} must be >= 1 (got {getattr(self, name)})")
        if self.num_sequences <= self.heldout_sequences:
            raise UserError(f"draft training: num_sequences ({self.num_sequences}) must exceed "
                            f"heldout_sequences ({self.heldout_sequences})")
        if self.new_tokens < self.num_heads + 1:
            raise UserError(f"draft training: new_tokens ({self.new_tokens}) must be > "
                            f"num_heads ({self.num_heads})")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"draft training: lr must be a finite number > 0 (got {self.lr})")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.method]


@dataclass
class DistillData:
    """Sequences the target wrote: tokens (S, N) and the target's features (S, N, H)."""

    token_ids: torch.Tensor
    features: torch.Tensor
    prompt_tokens: int
    num_train: int  # sequences [0, num_train) train, the rest are held out


@dataclass
class DraftReport:
    method: str
    steps: int
    lr: float
    seed: int
    initial_loss: float  # held-out loss before the first step
    final_loss: float  # held-out loss after the last step
    head1_accuracy_before: float  # held-out top-1 of the first draft, teacher-forced
    head1_accuracy: float
    head_accuracy: list[float]  # after training, per head (EAGLE: one, the first draft)
    train_positions: int
    heldout_positions: int
    train_losses: list[float] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainedDraft:
    heads: DraftHeads
    report: DraftReport


# ------------------------------------------------------------------ data
def self_distill_data(target: Transformer, tokenizer: Tokenizer, config: DraftTrainConfig,
                      note: Callable[[str], None] = lambda _: None) -> DistillData:
    """Prompts from the calibration text, the target's greedy continuations and features."""
    length = config.prompt_tokens + config.new_tokens
    if length > target.config.max_seq_len:
        raise UserError(f"draft training needs sequences of {length} tokens; model "
                        f"{target.config.name!r} allows {target.config.max_seq_len}")
    ids = tokenizer.encode(eval_text("calibration"), add_special_tokens=False)
    stride = len(ids) // config.num_sequences
    if stride < config.prompt_tokens:
        raise UserError(f"the calibration text has {len(ids)} tokens: too few for "
                        f"{config.num_sequences} prompts of {config.prompt_tokens}")
    prompts = [ids[k * stride:k * stride + config.prompt_tokens]
               for k in range(config.num_sequences)]
    note(f"generating {config.num_sequences} x {config.new_tokens} greedy tokens ...")
    continuations = greedy_continuations(target, prompts, config.new_tokens)
    device = target.device
    tokens = torch.tensor([p + c for p, c in zip(prompts, continuations, strict=True)],
                          dtype=torch.long, device=device)  # (S, N)
    note(f"target features of {tokens.numel()} positions ...")
    features = torch.empty(*tokens.shape, target.config.hidden_size, device=device)  # (S, N, H)
    group = 8  # sequences per dense forward
    with torch.no_grad():  # not inference_mode: features feed autograd graphs later
        for start in range(0, tokens.shape[0], group):
            chunk = tokens[start:start + group]  # (g, N)
            bounds = [i * length for i in range(chunk.shape[0] + 1)]
            positions = torch.arange(length, device=device).repeat(chunk.shape[0])
            hidden = target(chunk.reshape(-1), positions, DenseContext(bounds, target.config))
            features[start:start + group] = hidden.float().view(chunk.shape[0], length, -1)
    return DistillData(tokens, features, config.prompt_tokens,
                       config.num_sequences - config.heldout_sequences)


# ------------------------------------------------------------------ losses
@dataclass
class _Loss:
    loss: torch.Tensor
    correct: list[int]  # per head: top-1 hits of the draft token
    total: list[int]


def _medusa_loss(heads: MedusaHeads, target: Transformer, data: DistillData,
                 seqs: torch.Tensor, ts: torch.Tensor) -> _Loss:
    """Positions (seqs[b], ts[b]) with x_{t+2} generated: head i scores x_{t+1+i} where it
    exists; the loss is the mean over heads of each head's mean cross-entropy."""
    length = data.token_ids.shape[1]
    out = heads(data.features[seqs, ts])  # (K, B, H)
    rows, labels, owner = [], [], []
    for i in range(heads.num_heads):
        pos = ts + 2 + i  # head i+1 predicts x_{t+2+i}
        valid = pos < length
        rows.append(out[i][valid])
        labels.append(data.token_ids[seqs[valid], pos[valid]])
        owner.append(torch.full((int(valid.sum()),), i, device=ts.device))
    logits = target.compute_logits(torch.cat(rows).to(target.dtype))
    label, head = torch.cat(labels), torch.cat(owner)  # (R,), (R,)
    ce = F.cross_entropy(logits, label, reduction="none")  # (R,)
    hits = logits.argmax(-1) == label
    losses, correct, total = [], [], []
    for i in range(heads.num_heads):
        mine = head == i
        if bool(mine.any()):
            losses.append(ce[mine].mean())
        correct.append(int(hits[mine].sum()))
        total.append(int(mine.sum()))
    return _Loss(torch.stack(losses).mean(), correct, total)


def _eagle_loss(head: EagleHead, target: Transformer, data: DistillData,
                seqs: torch.Tensor) -> _Loss:
    """Whole sequences: rows j = 0..N-2 (f_j, x_{j+1}); losses on j >= P-2 (x_{j+2}
    generated): smooth-L1(g_j, f_{j+1}) + 0.1 x CE(logits(g_j), x_{j+2})."""
    num, length = len(seqs), data.token_ids.shape[1]
    rows = length - 1
    features = data.features[seqs, :rows].reshape(num * rows, -1)  # (b*(N-1), H)
    embeds = target.embed_tokens(data.token_ids[seqs, 1:].reshape(-1))  # (b*(N-1), H)
    g = head(features, embeds, [i * rows for i in range(num + 1)]).view(num, rows, -1)
    first = data.prompt_tokens - 2
    g_loss = g[:, first:].float()  # (b, N-1-first, H): j = first..N-2
    feature_loss = F.smooth_l1_loss(g_loss, data.features[seqs, first + 1:])
    g_ce = g[:, first:rows - 1].reshape(-1, g.shape[-1])  # j = first..N-3
    labels = data.token_ids[seqs, first + 2:].reshape(-1)
    logits = target.compute_logits(g_ce.to(target.dtype))
    ce = F.cross_entropy(logits, labels)
    hits = int((logits.argmax(-1) == labels).sum())
    return _Loss(feature_loss + EAGLE_CE_WEIGHT * ce, [hits], [labels.numel()])


def _heldout(heads: DraftHeads, target: Transformer, data: DistillData
             ) -> tuple[float, list[float], int]:
    """(mean loss, per-head top-1 accuracy, positions) over the held-out sequences."""
    num_heads = heads.num_heads if isinstance(heads, MedusaHeads) else 1
    losses: list[float] = []
    correct, total = [0] * num_heads, [0] * num_heads
    device = data.token_ids.device
    with torch.no_grad():
        for s in range(data.num_train, data.token_ids.shape[0]):
            one = torch.tensor([s], device=device)
            if isinstance(heads, MedusaHeads):
                ts = torch.arange(data.prompt_tokens - 2, data.token_ids.shape[1] - 2,
                                  device=device)
                part = _medusa_loss(heads, target, data, one.expand(len(ts)), ts)
            else:
                part = _eagle_loss(heads, target, data, one)
            losses.append(float(part.loss))
            correct = [a + b for a, b in zip(correct, part.correct, strict=True)]
            total = [a + b for a, b in zip(total, part.total, strict=True)]
    accuracy = [c / t if t else 0.0 for c, t in zip(correct, total, strict=True)]
    return sum(losses) / len(losses), accuracy, total[0]


# ------------------------------------------------------------------ training
def new_heads(method: str, target: Transformer, num_heads: int, seed: int) -> DraftHeads:
    """Untrained heads shaped for `target`, float32 on its device (EAGLE: seeded init)."""
    c, device = target.config, target.device
    if method == "medusa":
        return MedusaHeads(c.hidden_size, num_heads, torch.float32, device)
    head = EagleHead(c.hidden_size, c.num_heads, c.kv_heads, c.intermediate_size, c.rope_theta,
                     torch.float32, rms_norm_eps=c.rms_norm_eps, device=device)
    head.init_weights(torch.Generator(device=device).manual_seed(seed))
    return head


def train_draft_heads(target: Transformer, tokenizer: Tokenizer, config: DraftTrainConfig,
                      note: Callable[[str], None] = lambda _: None,
                      on_step: Callable[[int, float], None] | None = None) -> TrainedDraft:
    """Self-distillation data, then `config.steps` AdamW steps; see the module docstring.

    The target runs its plain forward (no engine `ops` bound) and stays frozen.
    """
    if getattr(target, "ops", None) is not None:
        raise ValueError("draft training runs the target's plain forward; this one is bound "
                         "to an engine")
    target.requires_grad_(False)
    begin = time.perf_counter()
    data = self_distill_data(target, tokenizer, config, note)
    seconds = {"data": time.perf_counter() - begin}
    heads = new_heads(config.method, target, config.num_heads, config.seed)
    begin_eval = time.perf_counter()
    initial, accuracy_before, heldout = _heldout(heads, target, data)
    seconds["eval"] = time.perf_counter() - begin_eval
    params = list(heads.parameters())
    lr = config.learning_rate
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_scale(step,
                                                                                  config.steps))
    generator = torch.Generator().manual_seed(config.seed)
    device = data.token_ids.device
    first, last = data.prompt_tokens - 2, data.token_ids.shape[1] - 3  # Medusa's t range
    note(f"training {config.method}: {config.steps} steps, lr {lr:g} ...")
    losses: list[float] = []
    start = time.perf_counter()
    heads.train()
    for step in range(config.steps):
        if isinstance(heads, MedusaHeads):
            seqs = torch.randint(0, data.num_train, (config.batch_positions,),
                                 generator=generator).to(device)
            ts = torch.randint(first, last + 1, (config.batch_positions,),
                               generator=generator).to(device)
            loss = _medusa_loss(heads, target, data, seqs, ts).loss
        else:
            seqs = torch.randperm(data.num_train, generator=generator)[:config.batch_sequences]
            loss = _eagle_loss(heads, target, data, seqs.to(device)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    heads.eval()
    heads.requires_grad_(False)
    seconds["train"] = time.perf_counter() - start
    begin_eval = time.perf_counter()
    final, accuracy, _ = _heldout(heads, target, data)
    seconds["eval"] += time.perf_counter() - begin_eval
    seconds["total"] = time.perf_counter() - begin
    train_positions = data.num_train * (data.token_ids.shape[1] - data.prompt_tokens)
    report = DraftReport(config.method, config.steps, lr, config.seed, initial, final,
                         accuracy_before[0], accuracy[0], accuracy, train_positions, heldout,
                         losses, seconds)
    return TrainedDraft(heads, report)


def _lr_scale(step: int, steps: int) -> float:
    """Linear warmup over the first 5% of the steps, then cosine decay to 10%."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


# ------------------------------------------------------------------ checkpoint
def target_fingerprint(target: Transformer) -> dict[str, Any]:
    """The target's architecture fields and a hash of its first 64 token embeddings in
    bfloat16 (equal for float32, bfloat16 and weight-quantized loads of one checkpoint)."""
    c = target.config
    with torch.no_grad():
        ids = torch.arange(min(FINGERPRINT_TOKENS, c.vocab_size), device=target.device)
        rows = target.embed_tokens(ids).to("cpu", torch.bfloat16).contiguous()
    digest = hashlib.sha256(rows.view(torch.int16).numpy().tobytes()).hexdigest()[:16]
    return {"hidden_size": c.hidden_size, "num_layers": c.num_layers, "num_heads": c.num_heads,
            "num_kv_heads": c.kv_heads, "vocab_size": c.vocab_size, "embedding_hash": digest}


def _shape_metadata(heads: DraftHeads) -> dict[str, str]:
    if isinstance(heads, MedusaHeads):
        return {"method": "medusa", "num_heads": str(heads.num_heads),
                "hidden_size": str(heads.hidden_size)}
    c = heads.config
    return {"method": "eagle", "hidden_size": str(c.hidden_size),
            "num_attention_heads": str(c.num_heads), "num_kv_heads": str(c.kv_heads),
            "intermediate_size": str(c.intermediate_size), "rope_theta": repr(c.rope_theta),
            "rms_norm_eps": repr(c.rms_norm_eps)}


def save_draft_heads(path: str | os.PathLike[str], heads: DraftHeads, target: Transformer,
                     report: DraftReport | None = None) -> Path:
    """Write `heads` (as float32) for `target` to one safetensors file, atomically."""
    from safetensors.torch import save

    fingerprint = target_fingerprint(target)
    metadata = {"format": FORMAT, "format_version": FORMAT_VERSION, **_shape_metadata(heads),
                "vocab_size": str(fingerprint["vocab_size"]),
                "target": json.dumps(fingerprint, sort_keys=True),
                "target_name": target.config.name, "infbench_version": __version__}
    if report is not None:
        metadata.update(steps=str(report.steps), final_loss=repr(report.final_loss),
                        seed=str(report.seed), lr=repr(report.lr),
                        head1_accuracy=repr(report.head1_accuracy))
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous()
               for name, t in heads.state_dict().items()}
    out = Path(path)
    write_bytes_atomic(out, save(tensors, metadata))
    return out


def read_draft_file(path: str | os.PathLike[str]) -> tuple[dict[str, str],
                                                            dict[str, torch.Tensor]]:
    """(metadata, tensors) of a draft-head file; UserError when it is missing, damaged or
    not a draft-head file."""
    from safetensors import safe_open

    file = Path(path)
    if not file.is_file():
        raise UserError(f"{file}: no such draft-head file" if not file.exists() else
                        f"{file}: not a file; expected a draft-head .safetensors file")
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            metadata = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except OSError as exc:
        raise UserError(f"{file}: cannot read ({exc.strerror or exc})") from exc
    except Exception as exc:  # SafetensorError: a bad header, sizes past the end, ...
        raise DamagedFileError(f"{file}: not a readable safetensors file, damaged or "
                               f"truncated? ({type(exc).__name__}: {exc})") from exc
    if metadata.get("format") != FORMAT:
        raise UserError(f"{file}: not an infbench draft-head file (its metadata has no "
                        f"format={FORMAT!r}); write one with `infbench train-draft`")
    return metadata, tensors


def _build(file: Path, meta: dict[str, str]) -> DraftHeads:
    try:
        hidden = int(meta["hidden_size"])
        if meta["method"] == "medusa":
            return MedusaHeads(hidden, int(meta["num_heads"]))
        if meta["method"] == "eagle":
            return EagleHead(hidden, int(meta["num_attention_heads"]),
                             int(meta["num_kv_heads"]), int(meta["intermediate_size"]),
                             float(meta["rope_theta"]),
                             rms_norm_eps=float(meta["rms_norm_eps"]))
    except (KeyError, ValueError) as exc:
        raise DamagedFileError(f"{file}: damaged draft-head metadata ({type(exc).__name__}: "
                               f"{exc})") from exc
    raise DamagedFileError(f"{file}: unknown draft method {meta['method']!r}; allowed: "
                           f"{', '.join(METHODS)}")


def load_draft_heads(path: str | os.PathLike[str], target: Transformer,
                     dtype: torch.dtype | None = None) -> DraftHeads:
    """The heads of a file written by `save_draft_heads`, on the target's device in `dtype`
    (default: the target's), frozen.  UserError (one line naming the file) when the file is
    missing, damaged, not a draft-head file or made for another model."""
    file = Path(path)
    meta, tensors = read_draft_file(file)
    try:
        saved = json.loads(meta.get("target", ""))
    except ValueError:
        saved = None
    if not isinstance(saved, dict):
        raise DamagedFileError(f"{file}: damaged draft-head metadata (no target fingerprint)")
    mine = target_fingerprint(target)
    for key, value in mine.items():
        if saved.get(key) != value:
            what = ("other weights (the token embeddings differ)" if key == "embedding_hash"
                    else f"{key} {saved.get(key)} in the file, {value} in this model")
            raise UserError(f"{file}: draft heads for another model than "
                            f"{target.config.name!r}: {what}")
    heads = _build(file, meta)
    expected = {name: tuple(t.shape) for name, t in heads.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    if expected != found:
        wrong = sorted(set(expected.items()) ^ set(found.items()))[:1]
        raise DamagedFileError(f"{file}: damaged draft-head file: its tensors do not match "
                               f"its metadata (first difference: {wrong[0][0]})")
    heads.load_state_dict(tensors)
    heads.to(device=target.device, dtype=dtype or target.dtype)
    heads.eval()
    heads.requires_grad_(False)
    return heads
