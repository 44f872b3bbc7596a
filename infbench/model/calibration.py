"""Calibration passes for activation-aware quantization (AWQ, LLM.int8()).

`calibration_ids` picks the tokens: the first `quant.calibration_tokens` tokens of the
calibration split of the offline evaluation text (`model/eval_text.py`, disjoint from the
test split that perplexity scores), or, for a model without a tokenizer (a preset with
random weights, whose accuracy means nothing), seeded uniform random token ids.

`for_each_layer` runs the float model one decoder layer at a time over those tokens (dense
forward, no KV cache, sequences of at most CALIBRATION_WINDOW tokens packed back to back),
records statistics of the input of every nn.Linear inside the layer (`InputStats`) and
hands them to a callback right after that layer's forward: the callback may change or
replace the layer's projections, and the next layer still receives the float layer's output
(AutoAWQ's order), so only one layer's statistics are held at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from infbench.core.errors import ConfigError
from infbench.model.context import DenseContext
from infbench.model.evaluate import token_ids
from infbench.model.tokenizer import Tokenizer
from infbench.model.transformer import Transformer

CALIBRATION_WINDOW = 512  # tokens per calibration sequence (as perplexity's window)


class InputStats:
    """What one projection saw on the calibration tokens (float32, per input feature).

    With `keep_inputs` it also answers output-error questions about those activations X
    (T, K): `error` = ||X (W' - W)^T||_F^2 and the Gram blocks of each input group.  It
    keeps X while T <= K, and X^T X (K, K) beyond, answered through a K x K factor F with
    F^T F = X^T X (from its eigendecomposition, exact): every question then costs
    2 N K min(T, K) flops and memory stays bounded for any T."""

    def __init__(self, in_features: int, device: torch.device | None = None,
                 keep_inputs: bool = False) -> None:
        self.in_features = in_features
        self.num_tokens = 0
        self.abs_sum = torch.zeros(in_features, device=device)  # (K,) sum of |x| over tokens
        self.abs_max = torch.zeros(in_features, device=device)  # (K,) max of |x|
        self.keep_inputs = keep_inputs
        self._rows: list[torch.Tensor] = []  # pieces of X while T <= K
        self._gram: torch.Tensor | None = None  # (K, K) X^T X once T > K
        self._factor: torch.Tensor | None = None  # X itself, or F

    @property
    def abs_mean(self) -> torch.Tensor:
        return self.abs_sum / max(self.num_tokens, 1)

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()  # (T, K)
        self.num_tokens += x.shape[0]
        self.abs_sum += x.abs().sum(0)
        self.abs_max = torch.maximum(self.abs_max, x.abs().amax(0))
        if not self.keep_inputs:
            return
        self._factor = None
        if self._gram is None and self.num_tokens <= self.in_features:
            self._rows.append(x)
            return
        if self._gram is None:  # past K tokens: X^T X is the smaller form
            gram = torch.zeros(self.in_features, self.in_features, device=x.device)  # (K, K)
            for rows in self._rows:
                gram += rows.t() @ rows
            self._gram, self._rows = gram, []
        self._gram += x.t() @ x

    def inputs(self) -> torch.Tensor:
        """X (T, K) while T <= K; beyond, F (K, K) with F^T F = X^T X, which answers every
        question about ||X A^T|| the same way."""
        if not self.keep_inputs or self.num_tokens == 0:
            raise ValueError("InputStats kept no activations (keep_inputs=False or no tokens)")
        if self._factor is None:
            if self._gram is None:
                self._factor = torch.cat(self._rows)  # (T, K)
            else:  # X^T X = U diag(lam) U^T = F^T F with F = diag(sqrt(lam)) U^T
                lam, u = torch.linalg.eigh(self._gram.double())
                self._factor = (lam.clamp(min=0).sqrt()[:, None] * u.t()).float()  # (K, K)
        return self._factor

    def reference(self, w: torch.Tensor) -> torch.Tensor:
        """X w^T (T, N) (or F w^T) for a weight w (N, K) whose errors `error` will be asked
        about many times."""
        return self.inputs() @ w.t()

    def error(self, w_hat: torch.Tensor, w: torch.Tensor, col_scale: torch.Tensor | None = None,
              reference: torch.Tensor | None = None) -> float:
        """||X (w_hat / col_scale - w)^T||_F^2: the output error of replacing w (N, K) by
        w_hat, a weight for the activations X / col_scale (None: X itself).  `reference` is
        `self.reference(w)`, which saves a product when asking many times about one w."""
        x = self.inputs()  # (T, K)
        if col_scale is not None:
            x = x / col_scale[None, :]
        ref = reference if reference is not None else self.reference(w)
        return float((x @ w_hat.t()).sub_(ref).square_().sum())  # (T, N)

    def group_grams(self, group_size: int, col_scale: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """(K / g, g, g): X'_j^T X'_j for each group j of g input columns, X' = X / col_scale."""
        x = self.inputs()  # (T, K)
        if col_scale is not None:
            x = x / col_scale[None, :]
        xg = x.reshape(x.shape[0], self.in_features // group_size, group_size)  # (T, G, g)
        return torch.einsum("tgi,tgj->gij", xg, xg)


LayerCallback = Callable[[int, nn.Module, dict[str, InputStats]], None]


def calibration_ids(tokenizer: Tokenizer | None, num_tokens: int, vocab_size: int,
                    seed: int = 0) -> tuple[list[int], str]:
    """(token ids, what they are) for a calibration pass of `num_tokens` tokens."""
    if num_tokens < 2:
        raise ConfigError(f"quant.calibration_tokens={num_tokens}: calibration needs at "
                          "least 2 tokens")
    if tokenizer is None:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab_size, (num_tokens,), generator=gen).tolist()
        return ids, f"{num_tokens} random tokens (seed {seed}; the model has no tokenizer)"
    return (token_ids(tokenizer, "calibration", num_tokens),
            f"{num_tokens} tokens of the calibration text")


def _layer_linears(layer: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in layer.named_modules() if isinstance(m, nn.Linear)}


@torch.no_grad()
def for_each_layer(model: Transformer, ids: list[int], on_layer: LayerCallback,
                   keep_inputs: bool = False, window: int = CALIBRATION_WINDOW) -> None:
    """Run the float decoder layers of `model` (a `Transformer`) over `ids`, calling
    `on_layer(index, layer, stats)` after each layer's forward with the input statistics
    of every nn.Linear inside it (keyed by its name within the layer)."""
    config = model.config
    window = min(window, config.max_seq_len)
    device = model.device
    bounds = list(range(0, len(ids), window)) + [len(ids)]
    positions = torch.cat([torch.arange(b - a, device=device)
                           for a, b in zip(bounds, bounds[1:], strict=False)])  # (T,)
    ctx = DenseContext(bounds, config)
    x = model.embed(torch.tensor(ids, dtype=torch.long, device=device))  # (T, H)
    for index, layer in enumerate(model.layers):
        linears = _layer_linears(layer)
        stats = {name: InputStats(m.in_features, device, keep_inputs)
                 for name, m in linears.items()}
        hooks = [m.register_forward_pre_hook(
            lambda _m, args, s=stats[name]: s.add(args[0])) for name, m in linears.items()]
        try:
            # (T, H), float weights; Gemma-3's local layers rotate with their own table
            x = layer(x, positions, ctx, model.layer_rope(model.layer_specs[index]))
        finally:
            for hook in hooks:
                hook.remove()
        on_layer(index, layer, stats)
