"""A safetensors checkpoint's `quantization_config` as the stored formats the analytic model
prices (`quant.weights: native` with a Hugging Face directory; no torch, no tensors read).

config.json's `quantization_config` (or, for NVIDIA ModelOpt exports without it,
`hf_quant_config.json`) names one stored format for the decoder's linear layers and the
modules it leaves in the model dtype:

    quant_method fp8                 fp8 codes, one fp32 scale per `weight_block_size` tile
                                     (DeepSeek-V3: [128, 128], transformers' default); the
                                     modules of `modules_to_not_convert` in the model dtype
    quant_method compressed-tensors  `config_groups[*].weights`: float 8 bits -> fp8 with
                                     `strategy` tensor | channel | block ([128, 128]);
                                     float 4 bits in groups of 16 -> nvfp4, of 32 -> mxfp4;
                                     the modules of `ignore` (names or `re:` patterns)
    quant_method modelopt            `quant_algo` FP8 -> fp8/tensor, FP8_PER_CHANNEL_PER_TOKEN
                                     -> fp8/channel, FP8_PB_WO -> fp8/block, NVFP4 -> nvfp4;
                                     `exclude_modules` / `ignore`
    quant_method mxfp4               mxfp4 (gpt-oss: the experts), `modules_to_not_convert`

Every other method or weight type is refused in one line.  The token embedding, the LM head,
the norms and the MoE router stay in the model dtype (the checkpoints store them so).  An
operator is in the stored format unless every one of its matrices is excluded (then in the
model dtype); a partial exclusion inside one operator is refused, not guessed.

`native_mix` rows are (operator, stored format, layers): within one operator every layer
holds the same matrix shapes, so a layer count weighs `QuantConfig.native_bits`'s mean
exactly (a GGUF file's rows count weights instead).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from infbench.core.config import ModelConfig
from infbench.core.errors import UserError
from infbench.core.formats import FP8_BLOCK, MX_BLOCK, NV_BLOCK
from infbench.core.gguf_types import FLOAT

METHODS = ("fp8", "compressed-tensors", "modelopt", "mxfp4")
MODELOPT_ALGOS = {"FP8": "fp8/tensor", "FP8_PER_CHANNEL_PER_TOKEN": "fp8/channel",
                  "FP8_PB_WO": "fp8/block", "NVFP4": "nvfp4"}

# Preset -> the quantization_config its released checkpoint ships (as config.json has it), so
# `quant.weights: native` on the preset prices the stored formats without the directory.  A
# preset released in float has no entry; a family adds its released checkpoints' entries.
# DeepSeek-V3 (and R1, V3-0324) and Kimi-K2 ship every decoder linear in fp8 128x128 blocks.
_FP8_BLOCKS: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3",
                               "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
PUBLISHED_QUANTIZATION: dict[str, dict[str, Any]] = {
    "deepseek-v3": _FP8_BLOCKS, "kimi-k2": _FP8_BLOCKS,
}

# roofline operator -> the Hugging Face leaves (under model.layers.N.) whose matrices it reads
_LEAVES = {
    "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "moe_shared": ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj",
                   "mlp.shared_experts.down_proj"),
    "moe_experts": ("mlp.experts.0.gate_proj", "mlp.experts.0.up_proj",
                    "mlp.experts.0.down_proj"),
    "ssm_in_proj": ("mixer.in_proj",),
    "ssm_x_proj": ("mixer.x_proj", "mixer.dt_proj"),
    "ssm_out_proj": ("mixer.out_proj",),
}
_MLA_QKV = ("self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj")


class _Rules:
    """Which stored format a module name has under one quantization_config."""

    def __init__(self, groups: list[tuple[tuple[str, ...], str]], ignore: tuple[str, ...]):
        self.groups = groups  # (targets, format); targets ("Linear",) matches every linear
        self.ignore = ignore

    def format_of(self, name: str) -> str:
        if any(_matches(name, p) for p in self.ignore):
            return FLOAT
        for targets, fmt in self.groups:
            if any(t == "Linear" or _matches(name, t) for t in targets):
                return fmt
        return FLOAT


def _matches(name: str, pattern: str) -> bool:
    """compressed-tensors' `re:` patterns; otherwise transformers' module patterns: a regex
    matching a leading run of the name's dotted parts (`model.layers.*.self_attn`,
    `lm_head`), or the name's last parts (`mlp.gate`)."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if name == pattern or name.endswith("." + pattern):
        return True
    try:
        return re.match(rf"(?:{pattern})(?:\.|$)", name) is not None
    except re.error:
        return False


def read_quantization_config(root: Path, raw: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """(the file it came from, the quantization_config) of a checkpoint directory; a
    UserError when it has none (a float checkpoint)."""
    cfg_file = root / "config.json"
    qc = raw.get("quantization_config")
    if qc is None:
        extra = root / "hf_quant_config.json"
        if extra.is_file():
            try:
                data = json.loads(extra.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise UserError(f"{extra}: cannot read ({exc})") from exc
            qc = {"quant_method": "modelopt", **(data.get("quantization") or {})}
            cfg_file = extra
    if qc is None:
        raise UserError(f"{cfg_file}: model.quant.weights=native: no quantization_config (a "
                        "float checkpoint); allowed here: model.quant.weights none, int8, int4, "
                        "fp8, mxfp4, nvfp4")
    if not isinstance(qc, dict):
        raise UserError(f"{cfg_file}: quantization_config must be a JSON object")
    return cfg_file, qc


def _rules(cfg_file: Path, qc: dict[str, Any]) -> _Rules:
    method = qc.get("quant_method")
    where = f"{cfg_file}: quantization_config"
    if method == "fp8":
        block = qc.get("weight_block_size", [FP8_BLOCK, FP8_BLOCK])
        if block != [FP8_BLOCK, FP8_BLOCK]:
            raise UserError(f"{where}.weight_block_size={block}: fp8 block scales are priced "
                            f"for {FP8_BLOCK}x{FP8_BLOCK} tiles; allowed: [{FP8_BLOCK}, "
                            f"{FP8_BLOCK}]")
        return _Rules([(("Linear",), "fp8/block")], _names(qc, "modules_to_not_convert"))
    if method == "mxfp4":
        return _Rules([(("Linear",), "mxfp4")], _names(qc, "modules_to_not_convert"))
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        if algo not in MODELOPT_ALGOS:
            raise UserError(f"{where}.quant_algo={qc.get('quant_algo')!r} is not priced as "
                            f"stored; allowed: {', '.join(MODELOPT_ALGOS)}")
        ignore = _names(qc, "exclude_modules") + _names(qc, "ignore")
        return _Rules([(("Linear",), MODELOPT_ALGOS[algo])], ignore)
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise UserError(f"{where}.config_groups: expected a mapping of groups")
        parsed = [(tuple(str(t) for t in g.get("targets") or ()),
                   _tensors_format(f"{where}.config_groups.{key}", g.get("weights")))
                  for key, g in groups.items() if isinstance(g, dict)]
        return _Rules(parsed, _names(qc, "ignore"))
    raise UserError(f"{where}.quant_method={method!r} is not priced as stored; allowed: "
                    f"{', '.join(METHODS)}")


def _names(qc: dict[str, Any], key: str) -> tuple[str, ...]:
    value = qc.get(key) or ()
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else (str(value),)


def _tensors_format(where: str, weights: Any) -> str:
    """The stored format of one compressed-tensors weight scheme."""
    if not isinstance(weights, dict):
        raise UserError(f"{where}.weights: expected a mapping")
    kind, bits = weights.get("type"), weights.get("num_bits")
    strategy, group = weights.get("strategy"), weights.get("group_size")
    if kind == "float" and bits == 8:
        if strategy == "block":
            block = weights.get("block_structure")
            if block != [FP8_BLOCK, FP8_BLOCK]:
                raise UserError(f"{where}.weights.block_structure={block}: allowed: "
                                f"[{FP8_BLOCK}, {FP8_BLOCK}]")
        if strategy in ("tensor", "channel", "block"):
            return f"fp8/{strategy}"
    if kind == "float" and bits == 4 and group in (NV_BLOCK, MX_BLOCK):
        return "nvfp4" if group == NV_BLOCK else "mxfp4"
    raise UserError(f"{where}.weights: {kind} {bits}-bit, strategy {strategy!r}, group_size "
                    f"{group!r} is not priced as stored; allowed: float 8-bit (strategy "
                    "tensor, channel or block), float 4-bit in groups of 16 (nvfp4) or 32 "
                    "(mxfp4)")


def _leaves(cfg: ModelConfig, index: int) -> dict[str, tuple[str, ...]]:
    """The operators of decoder layer `index` and the module names each reads."""
    spec = cfg.layers()[index]
    ops: list[str] = []
    if spec.mixer == "ssm":
        ops += ["ssm_in_proj", "ssm_x_proj", "ssm_out_proj"]
    else:
        ops += ["qkv_proj", "o_proj"]
    if cfg.arch != "mamba":
        if cfg.moe is not None and cfg.moe.is_moe(index):
            ops += ["moe_experts", *(["moe_shared"] if cfg.moe.shared_size else [])]
        else:
            ops.append("mlp")
    out = {op: _LEAVES[op] for op in ops}
    if spec.mixer == "mla":
        query = (("self_attn.q_a_proj", "self_attn.q_b_proj")
                 if cfg.attention.q_lora_rank is not None else ("self_attn.q_proj",))
        out["qkv_proj"] = (*query, *_MLA_QKV)
    return {op: tuple(f"model.layers.{index}.{leaf}" for leaf in leaves)
            for op, leaves in out.items()}


def hf_native_mix(root: Path, raw: dict[str, Any],
                  cfg: ModelConfig) -> tuple[tuple[str, str, int], ...]:
    """(roofline operator, stored format, layers) of a checkpoint's quantization_config
    (module docstring): what `QuantConfig.native_bits` prices under native weights."""
    cfg_file, qc = read_quantization_config(root, raw)
    return mix_of(str(cfg_file), qc, cfg)


def preset_native_mix(name: str, cfg: ModelConfig) -> tuple[tuple[str, str, int], ...] | None:
    """The mix of the quantization_config preset `name`'s released checkpoint ships
    (`PUBLISHED_QUANTIZATION`), None for a preset released in float."""
    qc = PUBLISHED_QUANTIZATION.get(name.lower())
    return None if qc is None else mix_of(f"preset {name}", qc, cfg)


def mix_of(origin: str, qc: dict[str, Any], cfg: ModelConfig) -> tuple[tuple[str, str, int], ...]:
    """The native_mix of quantization_config `qc` over the layers of `cfg` (`origin` names
    where it came from in an error)."""
    rules = _rules(Path(origin), qc)
    rows: Counter[tuple[str, str]] = Counter()
    for index in range(cfg.num_layers):
        for op, names in _leaves(cfg, index).items():
            formats = {rules.format_of(name) for name in names}
            if len(formats) > 1:
                raise UserError(f"{origin}: quantization_config stores some matrices of "
                                f"{', '.join(names)} as {'/'.join(sorted(formats))}: an "
                                "exclusion inside one operator is not priced; allowed: every "
                                "matrix of an operator in one format")
            rows[(op, formats.pop())] += 1
    return tuple(sorted((op, fmt, n) for (op, fmt), n in rows.items()))
