"""The MoE part of a Hugging Face config.json -> MoEConfig (no torch).

Mixtral (MixtralForCausalLM), Qwen2-MoE (Qwen2MoeForCausalLM), Qwen3-MoE
(Qwen3MoeForCausalLM), DeepSeek-V2 (DeepseekV2ForCausalLM) and DeepSeek-V3
(DeepseekV3ForCausalLM: noaux_tc) spell the same router differently; this module reads each
spelling into one `MoEConfig` (which layers are MoE: `first_k_dense`, `moe_step`,
`dense_layers`) and refuses, in one line that lists what is supported, the variants the
engine does not implement (another scoring function or top-k method, DeepSeek's MoE every
n-th layer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infbench.core.config import MOE_SCORING, MOE_TOPK_METHODS, MoEConfig
from infbench.core.errors import ConfigError, UserError

MOE_ARCHITECTURES = {
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
# An MoE family whose attention and norms are those of a dense family of
# checkpoint/families.py (which reads them): Qwen3-MoE's are Qwen3's (q/k norms, head_dim).
MOE_BLOCK_FAMILIES = {"qwen3_moe": "qwen3"}
TOPK_METHODS = ("greedy", "group_limited_greedy")  # DeepSeek-V2's topk_method values
V3_TOPK_METHOD = MOE_TOPK_METHODS[1]  # noaux_tc: the only one transformers' DeepSeek-V3 runs


def _count(cfg_file: Path, raw: dict[str, Any], key: str, default: int | None = None,
           minimum: int = 1) -> int:
    value = raw.get(key, default)
    if value is None:
        raise UserError(f"{cfg_file}: missing key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{cfg_file}: {key}: must be an integer >= {minimum} (got {value!r})")
    return value


def _scoring(cfg_file: Path, raw: dict[str, Any]) -> str:
    scoring = raw.get("scoring_func", "softmax")
    allowed = tuple(s for s in MOE_SCORING if s in ("softmax", "sigmoid"))  # these configs'
    if scoring not in allowed:
        raise UserError(f"{cfg_file}: scoring_func: unsupported MoE scoring function "
                        f"{scoring!r}; supported: {', '.join(allowed)}")
    return str(scoring)


def _make(cfg_file: Path, **fields: Any) -> MoEConfig:
    try:
        return MoEConfig(**fields)
    except ConfigError as exc:
        raise UserError(f"{cfg_file}: {exc}") from None


def moe_from_hf(cfg_file: Path, raw: dict[str, Any], arch: str) -> dict[str, Any]:
    """ModelConfig fields (`moe`, and Qwen2-MoE's `qkv_bias` when set) of an MoE
    checkpoint; {} for a DeepSeek-V2 checkpoint whose layers are all dense."""
    if arch == "mixtral":
        return {"moe": _make(
            cfg_file, num_experts=_count(cfg_file, raw, "num_local_experts"),
            num_experts_per_tok=_count(cfg_file, raw, "num_experts_per_tok"),
            moe_intermediate_size=_count(cfg_file, raw, "intermediate_size"),
            norm_topk_prob=True)}  # Mixtral always renormalizes its top-k weights
    if arch == "qwen2_moe":
        return _qwen2_moe(cfg_file, raw)
    if arch == "qwen3_moe":
        return _qwen3_moe(cfg_file, raw)
    if arch in ("deepseek_v2", "deepseek_v3"):
        return _deepseek(cfg_file, raw, arch)
    return {}


def _sparse_layers(cfg_file: Path, raw: dict[str, Any]) -> dict[str, Any] | None:
    """Qwen-MoE's MoE layers: every `decoder_sparse_step`-th, except `mlp_only_layers`
    (MoEConfig's moe_step, dense_layers); None when no layer is MoE."""
    num_layers = _count(cfg_file, raw, "num_hidden_layers")
    step = _count(cfg_file, raw, "decoder_sparse_step", 1)
    dense = raw.get("mlp_only_layers") or []
    if (not isinstance(dense, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                           or not 0 <= i < num_layers for i in dense)):
        raise UserError(f"{cfg_file}: mlp_only_layers: must be a list of layer indices in "
                        f"0..{num_layers - 1} (got {dense!r})")
    layers = {"moe_step": step, "dense_layers": tuple(sorted(set(dense)))}
    if not any((i + 1) % step == 0 and i not in dense for i in range(num_layers)):
        return None
    return layers


def _qwen2_moe(cfg_file: Path, raw: dict[str, Any]) -> dict[str, Any]:
    layers = _sparse_layers(cfg_file, raw)
    fields: dict[str, Any] = {}
    if raw.get("qkv_bias", True):  # Qwen2's q/k/v projections carry biases
        fields["qkv_bias"] = True
    if layers is None:
        return fields  # every layer dense
    shared = _count(cfg_file, raw, "shared_expert_intermediate_size", 0, minimum=0)
    fields["moe"] = _make(
        cfg_file, num_experts=_count(cfg_file, raw, "num_experts"),
        num_experts_per_tok=_count(cfg_file, raw, "num_experts_per_tok"),
        moe_intermediate_size=_count(cfg_file, raw, "moe_intermediate_size"),
        num_shared_experts=1 if shared else 0,
        shared_intermediate_size=shared or None, shared_gate=bool(shared),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        scoring=_scoring(cfg_file, raw), **layers)
    return fields


def _qwen3_moe(cfg_file: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """Softmax top-k routing, no shared expert; transformers 5 saves `num_experts` as
    `num_local_experts` (its attribute map), the published configs as `num_experts`."""
    layers = _sparse_layers(cfg_file, raw)
    if layers is None:
        return {}
    key = "num_experts" if "num_experts" in raw else "num_local_experts"
    return {"moe": _make(
        cfg_file, num_experts=_count(cfg_file, raw, key),
        num_experts_per_tok=_count(cfg_file, raw, "num_experts_per_tok"),
        moe_intermediate_size=_count(cfg_file, raw, "moe_intermediate_size"),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)), **layers)}


def _deepseek(cfg_file: Path, raw: dict[str, Any], arch: str) -> dict[str, Any]:
    """DeepSeek-V2's or V3's MoE layers; V3 always routes with noaux_tc over sigmoid scores
    (transformers' DeepseekV3TopkRouter), so another topk_method / scoring_func is refused."""
    num_layers = _count(cfg_file, raw, "num_hidden_layers")
    first_dense = _count(cfg_file, raw, "first_k_dense_replace", 0, minimum=0)
    if first_dense >= num_layers or not raw.get("n_routed_experts"):
        return {}  # every layer dense
    if _count(cfg_file, raw, "moe_layer_freq", 1) != 1:
        raise UserError(f"{cfg_file}: moe_layer_freq {raw['moe_layer_freq']!r} is not "
                        "supported; supported: 1 (every layer after first_k_dense_replace)")
    if arch == "deepseek_v3":
        return {"moe": _deepseek_v3(cfg_file, raw, first_dense)}
    method = raw.get("topk_method", "greedy")
    if method not in TOPK_METHODS:
        raise UserError(f"{cfg_file}: topk_method: unsupported MoE routing {method!r}; "
                        f"supported: {', '.join(TOPK_METHODS)}")
    grouped = method == "group_limited_greedy"
    factor = raw.get("routed_scaling_factor", 1.0)
    return {"moe": _make(
        cfg_file, num_experts=_count(cfg_file, raw, "n_routed_experts"),
        num_experts_per_tok=_count(cfg_file, raw, "num_experts_per_tok"),
        moe_intermediate_size=_count(cfg_file, raw, "moe_intermediate_size"),
        num_shared_experts=_count(cfg_file, raw, "n_shared_experts", 0, minimum=0),
        first_k_dense=first_dense, scoring=_scoring(cfg_file, raw),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        n_group=_count(cfg_file, raw, "n_group", 1) if grouped else 1,
        topk_group=_count(cfg_file, raw, "topk_group", 1) if grouped else 1,
        routed_scaling_factor=float(factor) if factor is not None else 1.0)}


def _deepseek_v3(cfg_file: Path, raw: dict[str, Any], first_dense: int) -> MoEConfig:
    for key, only in (("topk_method", V3_TOPK_METHOD), ("scoring_func", "sigmoid")):
        if raw.get(key, only) != only:
            raise UserError(f"{cfg_file}: {key}: unsupported for DeepSeek-V3 {raw[key]!r}; "
                            f"supported: {only}")
    factor = raw.get("routed_scaling_factor", 1.0)
    return _make(
        cfg_file, num_experts=_count(cfg_file, raw, "n_routed_experts"),
        num_experts_per_tok=_count(cfg_file, raw, "num_experts_per_tok"),
        moe_intermediate_size=_count(cfg_file, raw, "moe_intermediate_size"),
        num_shared_experts=_count(cfg_file, raw, "n_shared_experts", 0, minimum=0),
        first_k_dense=first_dense, scoring="sigmoid", topk_method=V3_TOPK_METHOD,
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        n_group=_count(cfg_file, raw, "n_group", 1),
        topk_group=_count(cfg_file, raw, "topk_group", 1),
        routed_scaling_factor=float(factor) if factor is not None else 1.0)
