"""Mixture-of-experts MLP: router, grouped routed experts, shared experts, routing counts.

The router follows the checkpoints it loads (docs/moe.md): softmax or sigmoid scores in
float32 (gpt-oss: a biased router, top-k of the logits, then a softmax over those k),
DeepSeek-V2's group-limited top-k (keep the `topk_group` of `n_group` expert groups
with the highest best score, zero the rest), top-k, optional renormalization of the k
weights, then `routed_scaling_factor`; DeepSeek-V3's noaux_tc chooses by the scores plus a
per-expert correction bias (groups ranked by their two best) and weighs by the unbiased
ones.  Routed experts run grouped by expert (`kernels.fused_moe`: the Triton kernel on the
`triton` backend, the torch reference elsewhere); shared experts are one always-on
SwiGLU, scaled per token by a sigmoid gate in Qwen2-MoE.

`quant.weights` fp8 / mxfp4 / nvfp4 stores the routed experts as codes and scales
(`quantize_experts`: w13 and w2 become `StackedFloatCodes`, each expert's matrix with its
own scales, no float copy kept); the router and Qwen2-MoE's shared-expert gate stay in
float (`float_children`), the shared experts are quantized as dense projections.  Stored
experts run the grouped reference on every backend (the triton one included), which
decodes only the expert being computed, a slice of rows at a time.

Every forward adds the tokens each routed expert received to `expert_counts`; the engine
reads and clears them once per step (`take_routing_counts`) for the routing statistics.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from infbench.core.config import MOE_SCORING, ModelConfig, MoEConfig, QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.float_quant import StackedFloatCodes, stacked_float_codes
from infbench.model.layers import SwiGLUMLP
from infbench.model.ops import Ops
from kernels.fused_moe import ExpertAct, fused_moe, fused_moe_ref


def route(logits: torch.Tensor, moe: MoEConfig, bias: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits (T, E) -> (weights (T, k) float32, expert ids (T, k) int64).

    `bias`: noaux_tc's per-expert correction bias (E,), added to the scores only to choose.
    """
    logits = logits.float()
    if moe.scoring == "topk_softmax":  # gpt-oss: the k best logits, softmaxed among themselves
        top, ids = logits.topk(moe.num_experts_per_tok, dim=-1)  # (T, k) each
        return top.softmax(dim=-1) * moe.routed_scaling_factor, ids
    if moe.scoring == "softmax":
        scores = logits.softmax(dim=-1)
    elif moe.scoring == "sigmoid":
        scores = logits.sigmoid()
    else:
        raise ConfigError(f"moe.scoring: unsupported scoring function {moe.scoring!r}; "
                          f"supported: {', '.join(MOE_SCORING)}")
    if moe.topk_method == "noaux_tc":
        assert bias is not None, "noaux_tc routes with the router's e_score_correction_bias"
        return _route_noaux_tc(scores, scores + bias.float(), moe)
    if moe.n_group > 1:
        num_tokens = scores.shape[0]
        grouped = scores.view(num_tokens, moe.n_group, -1)  # (T, G, E / G)
        best = grouped.max(dim=-1).values  # (T, G): a group's best expert score
        keep = best.topk(moe.topk_group, dim=-1).indices  # (T, topk_group)
        mask = torch.zeros_like(best).scatter_(1, keep, 1.0).bool()  # (T, G)
        scores = grouped.masked_fill(~mask[..., None], 0.0).view(num_tokens, -1)  # (T, E)
    weights, ids = scores.topk(moe.num_experts_per_tok, dim=-1)  # (T, k) each
    if moe.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * moe.routed_scaling_factor, ids


def _route_noaux_tc(scores: torch.Tensor, choice: torch.Tensor, moe: MoEConfig
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3: choose by the biased scores `choice` (T, E), weigh by the unbiased ones.

    Groups rank by the sum of their two best biased scores; experts outside the
    `topk_group` kept groups cannot be chosen (-inf: biased scores may be negative)."""
    num_tokens = scores.shape[0]
    if moe.n_group > 1:
        grouped = choice.view(num_tokens, moe.n_group, -1)  # (T, G, E / G)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (T, G)
        keep = group_scores.topk(moe.topk_group, dim=-1).indices  # (T, topk_group)
        mask = torch.zeros_like(group_scores).scatter_(1, keep, 1.0).bool()  # (T, G)
        choice = grouped.masked_fill(~mask[..., None], float("-inf")).view(num_tokens, -1)
    ids = choice.topk(moe.num_experts_per_tok, dim=-1).indices  # (T, k)
    weights = scores.gather(1, ids)  # (T, k): the unbiased scores of the chosen experts
    if moe.norm_topk_prob:  # DeepSeek's guard against an all-zero row
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling_factor, ids


class MoEMLP(nn.Module):
    """Router + routed experts (stacked: w13 (E, 2I, H) gate rows then up, w2 (E, H, I);
    gpt-oss's biases b13 (E, 2I) and b2 (E, H)) + shared experts.  Parameter names follow
    the checkpoints: `gate` is the router, `shared_experts` the shared SwiGLU,
    `shared_expert_gate` Qwen2-MoE's scalar gate.  With stored experts w13 / w2 are
    `StackedFloatCodes` (`quantize_experts`)."""

    float_children = ("gate", "shared_expert_gate")  # routing stays float under quant
    w13: nn.Parameter | StackedFloatCodes
    w2: nn.Parameter | StackedFloatCodes

    def __init__(self, config: ModelConfig, quant: QuantConfig | None,
                 dtype: torch.dtype | None, device: Any) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        self.moe = moe
        h, e, i = config.hidden_size, moe.num_experts, moe.moe_intermediate_size
        kw: dict[str, Any] = dict(dtype=dtype, device=device)
        self.gate = nn.Linear(h, e, bias=moe.router_bias, **kw)  # router: never quantized
        if moe.topk_method == "noaux_tc":  # the checkpoint's mlp.gate.e_score_correction_bias
            self.gate.e_score_correction_bias = nn.Parameter(torch.zeros(e, **kw),
                                                             requires_grad=False)
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h, **kw))  # (E, 2I, H)
        self.w2 = nn.Parameter(torch.empty(e, h, i, **kw))  # (E, H, I)
        self.dtype = dtype
        self.b13: nn.Parameter | None = None
        self.b2: nn.Parameter | None = None
        if moe.expert_bias:
            self.b13 = nn.Parameter(torch.empty(e, 2 * i, **kw))  # (E, 2I) gate then up
            self.b2 = nn.Parameter(torch.empty(e, h, **kw))  # (E, H)
        self.shared_experts: SwiGLUMLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if moe.shared_size:
            self.shared_experts = SwiGLUMLP(h, moe.shared_size, quant, **kw)
            if moe.shared_gate:
                self.shared_expert_gate = nn.Linear(h, 1, bias=False, **kw)
        self.use_kernel = False
        self.expert_counts: torch.Tensor | None = None  # (E,) int64 tokens since last take

    def set_ops(self, ops: Ops) -> None:
        """The triton backend runs the fused kernel (through the interpreter on a CPU, for
        tests); torch and cpu the grouped reference."""
        self.use_kernel = ops.name == "triton"
        if self.shared_experts is not None:
            self.shared_experts.set_ops(ops)

    @property
    def stored_experts(self) -> bool:
        """Whether the routed experts are stored as fp8 / mxfp4 / nvfp4 codes."""
        return isinstance(self.w13, StackedFloatCodes)

    def quantize_experts(self, weights: str, fp8_scales: str) -> None:
        """Round-to-nearest `quant.weights` fp8 / mxfp4 / nvfp4 of the routed experts, one
        matrix per expert (gate and up rows together, as `predict` prices them); the float
        stacks are dropped.  ValueError when an fp4 block does not divide H or I."""
        assert isinstance(self.w13, nn.Parameter) and isinstance(self.w2, nn.Parameter)
        w13 = stacked_float_codes(self.w13.data, weights, fp8_scales)
        w2 = stacked_float_codes(self.w2.data, weights, fp8_scales)
        del self.w13, self.w2
        self.w13, self.w2 = w13, w2

    def set_stored_experts(self, w13: StackedFloatCodes, w2: StackedFloatCodes) -> None:
        """Experts a checkpoint stores as codes (gpt-oss's MXFP4), in place of the stacks."""
        assert w13.shape == tuple(self.w13.shape) and w2.shape == tuple(self.w2.shape)
        del self.w13, self.w2
        self.w13, self.w2 = w13, w2

    def routed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing of x (T, H): weights (T, k) float32, ids (T, k) int64."""
        bias = getattr(self.gate, "e_score_correction_bias", None)  # noaux_tc only
        return route(self.gate(x), self.moe, bias)

    def _experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 act: ExpertAct) -> torch.Tensor:
        """The routed experts' weighted sum (T, H): the fused kernel on the triton backend
        (also interpreted), the grouped reference otherwise and for stored experts."""
        w13, w2 = self.w13, self.w2
        if self.use_kernel and isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor):
            return fused_moe(x, w13, w2, weights, ids, act)
        return fused_moe_ref(x, w13, w2, weights, ids, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.routed(x)
        if self.expert_counts is None or self.expert_counts.device != x.device:
            self.expert_counts = torch.zeros(self.moe.num_experts, dtype=torch.int64,
                                             device=x.device)
        flat = ids.reshape(-1)  # (T*k,)
        self.expert_counts.index_add_(0, flat, torch.ones_like(flat))  # in place: graph-safe
        m = self.moe
        act = ExpertAct(m.activation, m.swiglu_alpha, m.swiglu_limit, self.b13, self.b2)
        if m.scale_input:  # Llama-4: each (token, expert) pair runs expert(w * x)
            num_tokens, k = ids.shape
            scaled = (x[:, None, :] * weights.to(x.dtype)[..., None]).reshape(num_tokens * k, -1)
            ones = torch.ones(num_tokens * k, 1, dtype=x.dtype, device=x.device)
            pairs = self._experts(scaled, ones, ids.reshape(-1, 1), act)  # (T*k, H)
            out = pairs.view(num_tokens, k, -1).sum(dim=1)  # (T, H)
        else:
            out = self._experts(x.contiguous(), weights.to(x.dtype), ids, act)  # (T, H)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)  # (T, H)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared  # (T, 1) * (T, H)
            out = out + shared
        return out


def moe_layers(model: nn.Module) -> list[MoEMLP]:
    """The model's MoE MLPs in layer order."""
    return [m for m in model.modules() if isinstance(m, MoEMLP)]


def take_routing_counts(model: nn.Module,
                        layers: list[MoEMLP] | None = None) -> list[list[int]] | None:
    """Tokens per routed expert of each MoE layer since the last call (then cleared);
    None for a model without MoE layers.  `layers`: `moe_layers(model)`, when the caller
    keeps it (the engine reads this every step: one module walk saved, and the counts of
    all layers come back in one device-to-host copy)."""
    layers = moe_layers(model) if layers is None else layers
    if not layers:
        return None
    kept = [m.expert_counts for m in layers if m.expert_counts is not None]
    values = iter(torch.stack(kept).tolist() if kept else [])
    rows = [next(values) if m.expert_counts is not None else [0] * m.moe.num_experts
            for m in layers]
    with torch.inference_mode():  # the engine's forwards made them inference tensors
        for counts in kept:
            counts.zero_()
    return rows


# ------------------------------------------------------------ checkpoint names
# Per-expert checkpoint tensors land in views of the stacked parameters, named as if each
# expert were a fused SwiGLU: "mlp.experts.<e>.gate_up_proj.weight" (gate shard 0, up 1)
# and "mlp.experts.<e>.down_proj.weight".
_EXPERT_LEAVES = {
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
    "w1": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1), "w2": ("down_proj", 0),  # Mixtral
}


def expert_views(model: nn.Module) -> tuple[dict[str, Any], dict[str, list[int]], set[str]]:
    """(views by name, their shard row counts, the stacked parameter names they replace).

    The views are plain tensors that a loader writes like parameters (hence Any)."""
    views: dict[str, Any] = {}
    shards: dict[str, list[int]] = {}
    stacked: set[str] = set()
    for prefix, module in model.named_modules():
        if not isinstance(module, MoEMLP):
            continue
        stacked |= {f"{prefix}.w13", f"{prefix}.w2"}
        if not (isinstance(module.w13, torch.Tensor) and isinstance(module.w2, torch.Tensor)):
            continue  # stored experts: the checkpoint's codes fill them (gpt-oss's MXFP4)
        inter = module.w2.shape[2]
        for e in range(module.w13.shape[0]):
            views[f"{prefix}.experts.{e}.gate_up_proj.weight"] = module.w13[e]
            shards[f"{prefix}.experts.{e}.gate_up_proj.weight"] = [inter, inter]
            views[f"{prefix}.experts.{e}.down_proj.weight"] = module.w2[e]
    return views, shards, stacked


# gpt-oss stores each layer's experts stacked, as transformers' GptOssExperts holds them:
# gate_up_proj (E, H, 2I) with gate and up in alternating columns, down_proj (E, I, H),
# their biases (E, 2I) (alternating too) and (E, H); its router is `mlp.router`.
_GPT_OSS_LEAVES = {
    "mlp.experts.gate_up_proj": "mlp.w13", "mlp.experts.gate_up_proj_bias": "mlp.b13",
    "mlp.experts.down_proj": "mlp.w2", "mlp.experts.down_proj_bias": "mlp.b2",
    "mlp.router.weight": "mlp.gate.weight", "mlp.router.bias": "mlp.gate.bias",
}


def gpt_oss_expert_layout(leaf: str, tensor: torch.Tensor) -> torch.Tensor:
    """A gpt-oss checkpoint tensor (leaf under `model.layers.<i>.`) in MoEMLP's layout:
    gate_up (E, H, 2I) interleaved -> w13 (E, 2I, H) gate rows then up rows, down
    (E, I, H) -> w2 (E, H, I), the gate_up bias de-interleaved the same way."""
    if leaf == "mlp.experts.gate_up_proj":
        rows = tensor.transpose(1, 2)  # (E, 2I, H): row 2j the gate, 2j + 1 the up of column j
        return torch.cat([rows[:, 0::2], rows[:, 1::2]], dim=1)
    if leaf == "mlp.experts.gate_up_proj_bias":
        return torch.cat([tensor[:, 0::2], tensor[:, 1::2]], dim=1)  # (E, 2I)
    if leaf == "mlp.experts.down_proj":
        return tensor.transpose(1, 2)  # (E, H, I)
    return tensor


def hf_moe_leaf(leaf: str) -> tuple[str, int] | None:
    """A checkpoint leaf under `model.layers.<i>.` -> (our leaf, shard), or None when it is
    not an MoE tensor.  Mixtral's `block_sparse_moe.*`, Qwen2-MoE's `shared_expert.*` and
    DeepSeek's `shared_experts.*` all map to one layout; gpt-oss's stacked experts fill the
    stacked parameters whole (after `gpt_oss_expert_layout`)."""
    if leaf in _GPT_OSS_LEAVES:
        return _GPT_OSS_LEAVES[leaf], 0
    parts = leaf.split(".")
    if parts[0] == "block_sparse_moe":
        parts[0] = "mlp"
    if len(parts) < 3 or parts[0] != "mlp" or parts[-1] != "weight":
        return None
    if parts[1] == "experts" and len(parts) == 5 and parts[3] in _EXPERT_LEAVES:
        name, shard = _EXPERT_LEAVES[parts[3]]
        return f"mlp.experts.{parts[2]}.{name}.weight", shard
    if parts[1] in ("shared_expert", "shared_experts") and len(parts) == 4:
        fused = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
                 "down_proj": ("down_proj", 0)}.get(parts[2])
        if fused is not None:
            return f"mlp.shared_experts.{fused[0]}.weight", fused[1]
    if leaf == "block_sparse_moe.gate.weight":
        return "mlp.gate.weight", 0
    return None


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def moe_target(hf_name: str) -> tuple[str, int] | None:
    """A checkpoint tensor name -> (our parameter or view name, shard) for MoE tensors."""
    match = _LAYER.fullmatch(hf_name)
    found = hf_moe_leaf(match.group(2)) if match else None
    if match is None or found is None:
        return None
    return f"layers.{match.group(1)}.{found[0]}", found[1]


def routed_expert_bytes(model: nn.Module) -> int:
    """Bytes of one routed expert's weights (gate, up and down, and gpt-oss's biases), as
    stored."""
    layers = moe_layers(model)
    if not layers:
        return 0
    m = layers[0]
    biases = m.b13[0].numel() + m.b2[0].numel() if m.b13 is not None and m.b2 is not None else 0
    if isinstance(m.w13, StackedFloatCodes) and isinstance(m.w2, StackedFloatCodes):
        bias_bytes = biases * m.b13.element_size() if m.b13 is not None else 0
        return m.w13.expert_bytes() + m.w2.expert_bytes() + bias_bytes
    assert isinstance(m.w13, torch.Tensor) and isinstance(m.w2, torch.Tensor)
    return (m.w13[0].numel() + m.w2[0].numel() + biases) * m.w13.element_size()

