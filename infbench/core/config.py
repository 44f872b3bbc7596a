"""Model, attention, quantization and engine configuration (stdlib only).

Frozen dataclasses with `__post_init__` checks and named presets, in the style
of gpt-fast's `transformer_configs` + `ModelArgs.from_name`.  The analytic model
(`infbench.roofline`) and the engine (`infbench.engine`) both read shapes from
here, so predictions and measurements always describe the same network.

`ModelConfig.layers()` resolves the attention settings into one `LayerSpec`
per layer (which mixer, which window, whether the layer owns a KV cache); the
cost model and the engine iterate over that list instead of re-deriving hybrid
patterns, CLA sharing or sliding windows themselves.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from infbench.core.errors import ConfigError
from infbench.core.formats import (
    FLOAT_CODE_WEIGHTS,
    FP4_WEIGHTS,
    FP8_SCALES,
    INT4_GROUP_SIZES,
    WEIGHT_QUANT,
    Fp8Scales,
    WeightQuant,
    float_code_format,
    stored_bits,
)
from infbench.core.gguf_types import FLOAT, TOP_LEVEL

# Allowed values, defined once: each Literal types a field of the configs below and so the
# scenario sections derived from them (scenario/), and its tuple feeds the dataclass checks, the
# CLI validators (commands/_options.py) and help texts.  Weight formats: core/formats.py.  A
# field reads `Annotated[str, TheLiteral]`: Python callers pass plain strings (__post_init__
# refuses others by name) and the derived section validates against the Literal.
Dtype = Literal["float32", "float16", "bfloat16"]
AttentionKind = Literal["mha", "gqa", "mqa", "mla", "cla", "sliding", "linear", "ssm"]
FeatureMap = Literal["elu", "relu", "favor", "taylor"]
QuantMethod = Literal["rtn", "awq", "llm_int8"]
HeadQuant = Literal["model", "int8"]
ActivationQuant = Literal["float", "int8", "fp8", "fp4"]
KvQuant = Literal["none", "int8", "fp8"]
Backend = Literal["auto", "torch", "triton", "cpu"]
Device = Literal["auto", "cpu", "cuda"]
ModelWeights = Literal["auto", "real", "random"]
DTYPES: tuple[str, ...] = get_args(Dtype)
ATTENTION_KINDS: tuple[str, ...] = get_args(AttentionKind)
FEATURE_MAPS: tuple[str, ...] = get_args(FeatureMap)
QUANT_METHODS: tuple[str, ...] = get_args(QuantMethod)
HEAD_QUANT: tuple[str, ...] = get_args(HeadQuant)
ACTIVATION_QUANT: tuple[str, ...] = get_args(ActivationQuant)
NOT_INT8_ACT = ("none", *FLOAT_CODE_WEIGHTS)  # weights whose projections int8 activations skip
KV_QUANT: tuple[str, ...] = get_args(KvQuant)
BACKENDS: tuple[str, ...] = get_args(Backend)
DEVICES: tuple[str, ...] = get_args(Device)
MODEL_WEIGHTS: tuple[str, ...] = get_args(ModelWeights)
"""auto: a preset that names a released model (REAL_WEIGHTS) loads its real weights when they
are installed, else seeded random ones; real: the released or checkpoint weights, an error if
there are none; random: always seeded random weights (shapes only)."""
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
assert tuple(DTYPE_BYTES) == DTYPES
# The mixer of a resolved layer (LayerSpec.mixer), and the one mapping from attention.kind to
# it.  The two vocabularies differ on purpose: attention.kind names a KV scheme (and the
# attention-free mixers linear and ssm), LayerSpec.mixer the layer class and its cache layout.
# Mixer "attention" is softmax attention in every KV scheme that caches K and V per head (mha,
# gqa, mqa, cla, sliding, and the attention layers of a linear/ssm hybrid); mla caches a latent.
# The engine's mixer registry (model/transformer.MIXERS) and the cost model key on these names.
Mixer = Literal["attention", "mla", "linear", "ssm"]
MIXERS: tuple[str, ...] = get_args(Mixer)
SOFTMAX_MIXER: Mixer = "attention"
KIND_MIXER: dict[str, Mixer] = {
    "mha": "attention", "gqa": "attention", "mqa": "attention", "mla": "mla",
    "cla": "attention", "sliding": "attention", "linear": "linear", "ssm": "ssm",
}
assert tuple(KIND_MIXER) == ATTENTION_KINDS
# ModelConfig.arch values whose blocks are Gemma's (docs/architectures.md).
GEMMA_ARCHS = ("gemma2", "gemma3")


# Sane upper limits (inclusive).  The analytic model is O(1) in the batch and the
# lengths, but values past these are typos or overflows, not workloads: refuse them by name.
MAX_BATCH = 2**24  # sequences in one batch (predict --batch, engine.max_num_seqs)
MAX_TOKENS = 2**24  # tokens of one context: prompt, generation, window, max_seq_len
MAX_LAYERS = 2**16  # layers of a model (configs resolve one LayerSpec per layer)
MAX_DIM = 2**24  # hidden / intermediate sizes, heads, vocabulary, ranks, experts


def check_count(owner: str, key: str, value: object, limit: int = MAX_DIM,
                minimum: int = 1) -> None:
    """A whole number in minimum..limit (bools, floats, NaN and inf refused), naming `owner.key`.

    `owner` may be "" for a bare name such as a CLI flag.
    """
    name = f"{owner}.{key}" if owner else key
    op = "> 0" if minimum == 1 else f">= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer {op}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ConfigError(f"{name} must be {op}, got {value}")
    if value > limit:
        power = limit.bit_length() - 1
        shown = f"{limit} (2**{power})" if limit == 1 << power else str(limit)
        raise ConfigError(f"{name} must be <= {shown}, infbench's sanity limit; got {value}")


def check_real(owner: str, key: str, value: object, *, allow_zero: bool = False) -> None:
    """A finite real number > 0 (>= 0 with `allow_zero`): NaN, inf and bools refused."""
    name = f"{owner}.{key}" if owner else key
    op = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a finite number {op}, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be a finite number {op}, got {value}")


def _check_positive(owner: str, limit: int = MAX_DIM, **values: object) -> None:
    """Integer fields: None (unset) or 1..limit."""
    for key, value in values.items():
        if value is not None:
            check_count(owner, key, value, limit)


def _choice(owner: str, key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{owner}.{key}: unknown value {value!r}; allowed: {', '.join(allowed)}")


@dataclass(frozen=True)
class AttentionConfig:
    """How a model mixes tokens; each kind reads only its own parameters.

    kind: mha | gqa | mqa | mla | cla | sliding | linear | ssm
    kv_heads: KV heads for gqa/cla/sliding (None: the model's num_kv_heads).
    window / global_every: sliding window; every `global_every`-th layer is full
        attention (Gemma 3's 5 local : 1 global is global_every=6).
    cla_group: CLA shares one KV among this many adjacent layers.
    MLA (DeepSeek-V2): kv_lora_rank, q_lora_rank (None: full-rank query),
        qk_rope_head_dim (decoupled RoPE key shared by all heads), qk_nope_head_dim,
        v_head_dim.
    linear: feature_map (elu | relu | favor | taylor) and feature_dim.
    ssm (Mamba-1): d_state, d_conv, expand, dt_rank (None: ceil(hidden / 16)).
    attn_every: for linear/ssm, every `attn_every`-th layer is a GQA attention
        layer instead (Jamba's 1 attention : 7 Mamba is attn_every=8).
    """

    kind: Annotated[str, AttentionKind] = "gqa"
    kv_heads: int | None = None
    window: int | None = None
    global_every: int | None = None
    cla_group: int = 2
    kv_lora_rank: int = 512
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    feature_map: Annotated[str, FeatureMap] = "elu"
    feature_dim: int | None = None
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int | None = None
    attn_every: int | None = None

    def __post_init__(self) -> None:
        _choice("attention", "kind", self.kind, ATTENTION_KINDS)
        _choice("attention", "feature_map", self.feature_map, FEATURE_MAPS)
        _check_positive(
            "attention",
            kv_heads=self.kv_heads,
            global_every=self.global_every,
            cla_group=self.cla_group,
            kv_lora_rank=self.kv_lora_rank,
            q_lora_rank=self.q_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            qk_nope_head_dim=self.qk_nope_head_dim,
            v_head_dim=self.v_head_dim,
            feature_dim=self.feature_dim,
            d_state=self.d_state,
            d_conv=self.d_conv,
            expand=self.expand,
            dt_rank=self.dt_rank,
            attn_every=self.attn_every,
        )
        if self.window is not None:
            check_count("attention", "window", self.window, MAX_TOKENS)
        if self.kind == "sliding" and self.window is None:
            raise ConfigError("attention.window is required for kind 'sliding' (a token count > 0)")
        if self.kind == "mla" and self.qk_rope_head_dim % 2:
            raise ConfigError("attention.qk_rope_head_dim must be even (RoPE rotates pairs)")


# Router gate functions the engine implements: softmax or sigmoid over all E logits, then
# top-k; topk_softmax picks the top-k logits first and softmaxes over those k (gpt-oss).
MOE_SCORING = ("softmax", "sigmoid", "topk_softmax")
# Routed experts' gated activation: silu is SiLU(gate) * up; clamped_swiglu is gpt-oss's
# (gate clamped to <= limit, up to [-limit, limit], gate * sigmoid(alpha * gate) * (up + 1)).
MOE_ACTIVATIONS = ("silu", "clamped_swiglu")
# How the router chooses its k experts (docs/moe.md).  greedy: the top k scores (with
# n_group > 1 only among the topk_group groups of the highest single score: DeepSeek-V2's
# group_limited_greedy); noaux_tc (DeepSeek-V3): a per-expert correction bias
# (e_score_correction_bias) is added to the scores for choosing only, groups rank by the sum
# of their two best biased scores, and the weights are the unbiased scores of the chosen.
MOE_TOPK_METHODS = ("greedy", "noaux_tc")


@dataclass(frozen=True)
class MoEConfig:
    """Mixture of experts (DeepSeek style): routed + shared experts, first k layers dense."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_shared_experts: int = 0
    first_k_dense: int = 0
    # Router (docs/moe.md): gate scores, top-k renormalization, DeepSeek's group-limited
    # routing (the top `topk_group` of `n_group` expert groups) and its scaling factor.
    scoring: str = "softmax"  # softmax | sigmoid
    norm_topk_prob: bool = False
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    topk_method: str = "greedy"  # greedy | noaux_tc (MOE_TOPK_METHODS)
    # Shared experts: width (None: moe_intermediate_size x num_shared_experts) and
    # Qwen2-MoE's sigmoid gate (one scalar per token) on their output.
    shared_intermediate_size: int | None = None
    shared_gate: bool = False
    # Which layers are MoE (is_moe): past the first `first_k_dense`, every `moe_step`-th layer
    # ((index + 1) % moe_step == 0: Qwen3-MoE's decoder_sparse_step, Llama-4's
    # interleave_moe_layer_step), except the `dense_layers` listed (Qwen3-MoE's mlp_only_layers).
    # The others run a dense SwiGLU of the model's intermediate_size.
    moe_step: int = 1
    dense_layers: tuple[int, ...] = ()
    # Llama-4: the router weight scales each expert's input (expert(w * x)) rather than its
    # output (w * expert(x)); with a SwiGLU expert the two differ.
    scale_input: bool = False
    # gpt-oss: a bias on the router logits and on every expert's gate_up and down outputs,
    # and the clamped SwiGLU (`activation`, with `swiglu_alpha` and `swiglu_limit`).
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "silu"  # silu | clamped_swiglu
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        _check_positive(
            "moe",
            num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            moe_intermediate_size=self.moe_intermediate_size,
            shared_intermediate_size=self.shared_intermediate_size,
        )
        check_count("moe", "num_shared_experts", self.num_shared_experts, MAX_DIM, minimum=0)
        check_count("moe", "first_k_dense", self.first_k_dense, MAX_LAYERS, minimum=0)
        check_count("moe", "moe_step", self.moe_step, MAX_LAYERS)
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))  # a YAML/JSON list
        for index in self.dense_layers:
            check_count("moe", "dense_layers[]", index, MAX_LAYERS, minimum=0)
        check_count("moe", "n_group", self.n_group, MAX_DIM)
        check_count("moe", "topk_group", self.topk_group, MAX_DIM)
        check_real("moe", "routed_scaling_factor", self.routed_scaling_factor)
        if self.num_experts_per_tok > self.num_experts:
            raise ConfigError(
                f"moe.num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                f"moe.num_experts ({self.num_experts})"
            )
        if self.scoring not in MOE_SCORING:
            raise ConfigError(f"moe.scoring: unsupported scoring function {self.scoring!r}; "
                              f"supported: {', '.join(MOE_SCORING)}")
        if self.topk_method not in MOE_TOPK_METHODS:
            raise ConfigError(f"moe.topk_method: unsupported expert choice {self.topk_method!r}; "
                              f"supported: {', '.join(MOE_TOPK_METHODS)}")
        if self.topk_method == "noaux_tc" and self.num_experts // self.n_group < 2:
            raise ConfigError(f"moe.topk_method=noaux_tc scores a group by its two best experts: "
                              f"moe.num_experts ({self.num_experts}) / moe.n_group "
                              f"({self.n_group}) must be at least 2")
        if self.activation not in MOE_ACTIVATIONS:
            raise ConfigError(f"moe.activation: unsupported expert activation "
                              f"{self.activation!r}; supported: {', '.join(MOE_ACTIVATIONS)}")
        check_real("moe", "swiglu_alpha", self.swiglu_alpha)
        check_real("moe", "swiglu_limit", self.swiglu_limit)
        if self.scoring == "topk_softmax" and (self.n_group > 1 or self.topk_method != "greedy"):
            raise ConfigError("moe.scoring=topk_softmax does not combine with group-limited "
                              f"routing (moe.n_group {self.n_group}, moe.topk_method "
                              f"{self.topk_method}); allowed: n_group 1, topk_method greedy")
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            raise ConfigError(f"moe.n_group ({self.n_group}) must divide moe.num_experts "
                              f"({self.num_experts}) and moe.topk_group ({self.topk_group}) "
                              "must not exceed it")
        if self.topk_group * (self.num_experts // self.n_group) < self.num_experts_per_tok:
            raise ConfigError(f"moe.topk_group ({self.topk_group}) groups hold fewer experts "
                              f"than moe.num_experts_per_tok ({self.num_experts_per_tok})")

    def is_moe(self, index: int) -> bool:
        """Whether decoder layer `index` (0-based) routes through the experts."""
        return (index >= self.first_k_dense and (index + 1) % self.moe_step == 0
                and index not in self.dense_layers)

    @property
    def shared_size(self) -> int:
        """Width of the shared-expert SwiGLU (0 without shared experts)."""
        if not self.num_shared_experts:
            return 0
        if self.shared_intermediate_size is not None:
            return self.shared_intermediate_size
        return self.moe_intermediate_size * self.num_shared_experts

    def expected_distinct_experts(self, num_tokens: int) -> float:
        """Expected number of distinct routed experts touched by `num_tokens` tokens.

        With uniform routing each token picks k of E experts, so one expert is missed
        by one token with probability (1 - k/E); E * (1 - (1 - k/E)^n) are touched.
        """
        e, k = self.num_experts, self.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** max(num_tokens, 0))

    def touch_probability(self, held: int) -> float:
        """Probability that one token's top-k experts include at least one of the `held`
        consecutive experts one destination (a device, a node) of expert parallelism holds.

        Uniform routing picks k distinct experts: a destination is missed with the
        hypergeometric probability C(E - held, k) / C(E, k).  Under group-limited routing
        (`n_group` > 1: the k experts come from `topk_group` of the `n_group` consecutive
        groups of E / n_group) the groups are picked uniformly, then the k experts among
        the kept M = topk_group x E / n_group: a destination covering c whole groups (or
        lying inside one, c = 1) with j of them kept is missed with C(M - j x held / c, k)
        / C(M, k), j hypergeometric over the groups.  A destination that neither covers
        whole groups nor fits in one is priced as ungrouped (more destinations touched)."""
        e, k = self.num_experts, self.num_experts_per_tok
        size = e // self.n_group if self.n_group > 1 and e % self.n_group == 0 else e
        if size == e or not (held % size == 0 or size % held == 0) or \
                self.topk_group >= self.n_group:
            return 1.0 - math.comb(e - held, k) / math.comb(e, k)
        groups, kept = self.n_group, self.topk_group
        cover = max(1, held // size)  # the groups the destination overlaps
        per = held // cover  # of its experts in each
        m = kept * size
        missed = sum(math.comb(cover, j) * math.comb(groups - cover, kept - j)
                     / math.comb(groups, kept) * math.comb(m - j * per, k) / math.comb(m, k)
                     for j in range(min(cover, kept) + 1))
        return 1.0 - missed


@dataclass(frozen=True)
class QuantConfig:
    """Weight quantization and KV-cache dtype (`model.quant`; the scenario's QuantSection is
    derived from these fields and their docstrings); the stored formats are described in
    `kernels/quant_format.py` and named in `core/formats.py`."""

    weights: Annotated[str, WeightQuant] = "none"
    """One of core/formats.WEIGHT_FORMATS (the scenario's text lists them).  native: the
    decoder projections, and the token embedding / LM head when the file stores them in one
    of those types, run without a float copy."""
    group_size: int = 128
    """int4: input columns per group (32, 64 or 128)."""
    fp8_scales: Annotated[str, Fp8Scales] | None = None
    """fp8 weights only: tensor (one fp32 scale per matrix) | channel (one fp32 per output
    row; the default when unset) | block (one fp32 per 128x128 tile, DeepSeek-V3's
    weight_block_size).  Under native weights the checkpoint's quantization_config decides."""
    kv: Annotated[str, KvQuant] = "none"
    """KV cache: none (model dtype) | int8 | fp8: one byte per value plus a float32 scale per
    token per KV head (`kernels/kv_quant.py`; fp8 is e4m3 and needs a CUDA GPU)."""
    method: Annotated[str, QuantMethod] = "rtn"
    """How int8/int4 weights are chosen: rtn (round to nearest) | awq (int4 with
    activation-aware per-input-channel scales) | llm_int8 (int8 with the input columns whose
    activations pass `outlier_threshold` kept in the model dtype)."""
    outlier_threshold: float = 6.0
    """llm_int8: activation magnitude above which an input column stays in the model dtype."""
    calibration_tokens: int = 1024
    """awq / llm_int8: calibration tokens (held-out from the eval text's test split)."""
    head: Annotated[str, HeadQuant] = "model"
    """The LM head: model (the model dtype, as AWQ/GPTQ checkpoints keep it) | int8 (one fp16
    scale per vocabulary row, as llama.cpp stores output.weight; a tied head gets its own int8
    copy, the embedding gather stays in the model dtype).  Under native weights a head the
    file stores quantized keeps the file's format."""
    activations: Annotated[str, ActivationQuant] = "float"
    """What quantized projections multiply: float (exact) | int8 (each 32-column block of an
    activation row rounded to int8 with one scale, llama.cpp's arithmetic; batch-1 decode runs
    integer dot products on CPUs with AVX512-VNNI, `kernels/csrc/linear_q8act.cpp`) | fp8
    (W8A8: fp8 weights, activations rounded to E4M3, matmuls at the hardware's float8 peak)
    | fp4 (W4A4: mxfp4 / nvfp4 weights, activations rounded to E2M1 in the weights' block
    format, matmuls at the hardware's float4 peak)."""
    native_mix: tuple[tuple[str, str, int], ...] = ()
    """Not a scenario key: with native weights, (roofline operator, stored format, weights) of
    the GGUF file's projections, and "embed" / "lm_head" rows for a quantized token embedding
    or head (`core/gguf_types.native_mix`), or (operator, stored format, layers) of a
    safetensors checkpoint's quantization_config (`checkpoint/hf_quant.py`), filled in from
    the file (`checkpoint.metadata.native_quant`).  Empty: priced in the model dtype."""
    kv_bits: int | None = None
    """Not a scenario key (analytic only): a cache of this many bits per value (1..32; below
    16 with the same float32 row scales as int8), e.g. 6 for DeepSeek-V2's deployed cache."""

    def __post_init__(self) -> None:
        _choice("quant", "weights", self.weights, WEIGHT_QUANT)
        _choice("quant", "kv", self.kv, KV_QUANT)
        _choice("quant", "method", self.method, QUANT_METHODS)
        _choice("quant", "head", self.head, HEAD_QUANT)
        _choice("quant", "activations", self.activations, ACTIVATION_QUANT)
        _check_positive("quant", group_size=self.group_size)
        self._check_float_codes()
        if self.kv_bits is not None:
            check_count("quant", "kv_bits", self.kv_bits, 32)
            if self.kv != "none":
                raise ConfigError(f"quant.kv_bits={self.kv_bits} prices a cache of that many bits "
                                  f"per value; it does not combine with quant.kv={self.kv!r}; "
                                  "allowed: one of the two")
        check_count("quant", "calibration_tokens", self.calibration_tokens, MAX_DIM)
        check_real("quant", "outlier_threshold", self.outlier_threshold)
        if self.weights == "int4" and self.group_size not in INT4_GROUP_SIZES:
            raise ConfigError(f"quant.group_size={self.group_size}: int4 groups must be one of "
                              f"{', '.join(map(str, INT4_GROUP_SIZES))}")
        needs = {"awq": "int4", "llm_int8": "int8"}.get(self.method)
        if needs is not None and self.weights != needs:
            raise ConfigError(f"quant.method={self.method!r} needs quant.weights: {needs} "
                              f"(got {self.weights!r})")
        if self.activations == "int8":
            if self.method == "llm_int8":
                raise ConfigError("quant.activations=int8 does not combine with "
                                  "quant.method: llm_int8 (it keeps outlier columns in float); "
                                  "allowed with llm_int8: float")
            if self.weights == "none" and self.head != "int8":
                raise ConfigError("quant.activations=int8 rounds the inputs of quantized "
                                  "projections: it needs quant.weights "
                                  f"{'|'.join(w for w in WEIGHT_QUANT if w not in NOT_INT8_ACT)}"
                                  " or quant.head: int8")
            if self.weights in FLOAT_CODE_WEIGHTS:
                fitting = "fp8" if self.weights == "fp8" else "fp4"
                raise ConfigError(f"quant.activations=int8 is llama.cpp's integer arithmetic; "
                                  f"it does not combine with quant.weights={self.weights!r}; "
                                  f"allowed with {self.weights}: float|{fitting}")
        if self.method != "rtn" and self.weights in ("none", "native"):
            raise ConfigError(f"quant.method={self.method!r} quantizes weights; allowed with "
                              f"quant.weights: none|native: rtn")

    def _check_float_codes(self) -> None:
        """fp8_scales needs fp8 weights; fp8 activations fp8 weights; fp4 activations mxfp4 or
        nvfp4 weights (native: a checkpoint whose quantized projections store those)."""
        if self.fp8_scales is not None:
            _choice("quant", "fp8_scales", self.fp8_scales, FP8_SCALES)
            if self.weights != "fp8":
                raise ConfigError(f"quant.fp8_scales={self.fp8_scales!r} is the scale layout of "
                                  f"fp8 weights, not of quant.weights={self.weights!r}; allowed: "
                                  "quant.weights: fp8, or fp8_scales unset")
        needs = {"fp8": ("fp8",), "fp4": FP4_WEIGHTS}.get(self.activations)
        if needs is None:
            return
        stored = {fmt.split("/")[0] for op, fmt, _ in self.native_mix
                  if fmt != FLOAT and op not in TOP_LEVEL.values()}
        read = not self.native_mix or (stored and stored <= set(needs))  # empty: not read yet
        if self.weights in needs or (self.weights == "native" and read):
            return
        have = (f"native weights stored as {', '.join(sorted(stored))}"
                if self.weights == "native" else f"quant.weights={self.weights!r}")
        raise ConfigError(f"quant.activations={self.activations!r} multiplies "
                          f"{'/'.join(needs)} weights; got {have}; allowed with it: "
                          f"quant.weights {'|'.join(needs)}|native (a checkpoint storing them)")

    @property
    def fp8_scale_kind(self) -> str:
        """The fp8 scale granularity: `fp8_scales`, channel when unset."""
        return self.fp8_scales or "channel"

    def weight_bits(self, in_features: int, dtype_bytes: int, op: str = "",
                    out_features: int | None = None) -> float:
        """Average stored bits per weight element of one (out_features x in_features)
        projection, scales included, exactly as `kernels/quant_format.py` stores them
        (`formats.stored_bits`; out_features only matters to per-tensor and per-block
        scales: a square matrix when not given).  Native weights: the mean over the
        checkpoint's matrices that operator `op` reads (all projections when `op` has none).
        The embedding (`op` "embed") and the LM head ("lm_head") are in the model dtype
        unless the file stores them natively; otherwise the head follows `head`."""
        out = in_features if out_features is None else out_features
        native = self.native_bits(op, dtype_bytes, in_features, out)
        if op in TOP_LEVEL.values():
            if native is not None:
                return native
            if op == "lm_head" and self.head == "int8":
                return 8.0 + 16.0 / in_features
            return 8.0 * dtype_bytes
        if self.weights == "int8":
            return 8.0 + 16.0 / in_features  # one fp16 scale per output row
        if self.weights == "int4":
            return 4.0 + 2 * 16.0 / self.group_size  # fp16 scale + fp16 minimum per group
        if self.weights in FLOAT_CODE_WEIGHTS:
            fmt = float_code_format(self.weights, self.fp8_scale_kind)
            return stored_bits(fmt, in_features, out, dtype_bytes)
        if native is not None:
            return native
        return 8.0 * dtype_bytes

    def native_bits(self, op: str, dtype_bytes: int, in_features: int = 1,
                    out_features: int = 1) -> float | None:
        """Native weights: the mean stored bits of the file's matrices that `op` reads (a
        projection operator the file lacks: all its projections), each format's scales
        counted for an (out_features x in_features) matrix; None when not native, or for an
        embedding / LM head the file stores in float."""
        if self.weights != "native" or not self.native_mix:
            return None
        rows = [r for r in self.native_mix if r[0] == op]
        if not rows and op not in TOP_LEVEL.values():
            rows = [r for r in self.native_mix if r[0] not in TOP_LEVEL.values()]
        if not rows:
            return None
        return sum(n * stored_bits(fmt, in_features, out_features, dtype_bytes)
                   for _, fmt, n in rows) / sum(n for _, _, n in rows)

    def kv_bytes(self, dtype_bytes: int) -> float:
        """Bytes of one cached K/V value: the model dtype's, one (int8 / fp8 e4m3), or
        `kv_bits` / 8 (any width, analytic only: a 6-bit cache is 0.75 bytes a value)."""
        if self.kv_bits is not None:
            return self.kv_bits / 8.0
        return dtype_bytes if self.kv == "none" else 1

    @property
    def kv_scale_bytes(self) -> int:
        """Bytes of the scale stored beside each row of quantized cached values: one float32
        per token per KV head for each of K and V (an MLA latent row: one per token), as
        `kernels/kv_quant.py` stores them (a `kv_bits` cache narrower than 16 bits is priced
        with the same scales); 0 for a cache in the model dtype."""
        if self.kv_bits is not None:
            return 4 if self.kv_bits < 16 else 0
        return 0 if self.kv == "none" else 4


@dataclass(frozen=True)
class LayerSpec:
    """One resolved layer: the cost model and the engine iterate over these."""

    index: int
    mixer: Mixer  # see KIND_MIXER: attention (softmax) | mla | linear | ssm
    window: int | None = None  # attention only: None is full causal attention
    owns_kv: bool = True  # CLA: only the first layer of a group writes KV
    kv_source: int = -1  # CLA: index of the layer whose KV this layer reads
    softcap: float | None = None  # attention only: scores -> cap * tanh(scores / cap) (Gemma-2)
    # attention only: chunked attention (Llama-4), a query at position t sees the keys p <= t
    # of its own chunk (p // chunk == t // chunk); None: no chunking
    chunk: int | None = None
    rope: bool = True  # False: a NoPE layer (Llama-4), q and k are not rotated
    sinks: bool = False  # attention only: a learned logit per head joins the softmax (gpt-oss)

    @property
    def has_kv_cache(self) -> bool:
        return self.mixer in (SOFTMAX_MIXER, "mla") and self.owns_kv

    @property
    def kv_span(self) -> int | None:
        """The most cached tokens one sequence's later queries can still read: the window,
        or the chunk (a chunk's queries never look behind its start); None: all of them."""
        return self.window if self.window is not None else self.chunk

    def kv_held(self, context_len: int) -> int:
        """Tokens of KV one sequence of `context_len` tokens keeps in this layer:
        min(context, window or chunk)."""
        span = self.kv_span
        return context_len if span is None else min(context_len, span)


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a decoder-only language model (Llama family and its variants)."""

    name: str = "custom"
    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int | None = None  # None: num_heads (MHA)
    head_dim: int | None = None  # None: hidden_size // num_heads
    intermediate_size: int = 11008
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # HF rope_scaling dict as items
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    moe: MoEConfig | None = None
    arch: str = "llama"  # llama | mistral | deepseek_v2 | deepseek_v3 | mamba | ... (a loader's)
    # Architecture features (docs/architectures.md); the defaults are Llama's.
    qkv_bias: bool = False  # Qwen2: biases on the q/k/v projections
    qk_norm: bool = False  # Qwen3, Gemma-3: per-head RMSNorm of q and k before RoPE
    rotary_dim: int | None = None  # partial RoPE (Phi-3 partial_rotary_factor); None: head dim
    attn_logit_softcap: float | None = None  # Gemma-2: scores -> cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # Gemma-2: the same on the LM head's logits
    query_pre_attn_scalar: float | None = None  # Gemma: softmax scale scalar**-0.5, not D**-0.5
    rope_local_theta: float | None = None  # Gemma-3: RoPE base of the sliding-window layers
    # Llama-4 (docs/architectures.md#llama-4): chunked attention on the RoPE layers, NoPE
    # layers (full causal attention, no RoPE) with query temperature tuning, and a
    # weightless RMS norm of q and k after RoPE on the RoPE layers.
    attention_chunk: int | None = None  # RoPE layers attend within chunks of this many tokens
    nope_layers: tuple[int, ...] = ()  # 0-based layers without RoPE (no chunking either)
    qk_l2_norm: bool = False  # q, k -> x / rms(x) (no weight) after RoPE, RoPE layers only
    # NoPE layers' queries scaled by 1 + attn_temperature_scale * log(1 + floor((t + 1) /
    # attn_temperature_floor)) at position t; None: not tuned
    attn_temperature_floor: int | None = None
    attn_temperature_scale: float = 0.1
    # DeepSeek-V3's multi-token-prediction modules (num_nextn_predict_layers), stored after the
    # main layers: each an embedding/hidden merge (enorm, hnorm, eh_proj 2H -> H), one decoder
    # layer and a norm before the shared head.  Not part of the main forward: counted
    # separately (roofline.shapes.mtp_param_count) and run only as `speculative.method: mtp`.
    num_mtp_layers: int = 0
    # gpt-oss: biases on the q, k, v and o projections (qkv_bias is Qwen2's q/k/v only), and
    # attention sinks: one learned logit per query head in every softmax denominator.
    attention_bias: bool = False
    attention_sinks: bool = False

    def __post_init__(self) -> None:
        _check_positive(
            "model",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
        )
        check_count("model", "num_layers", self.num_layers, MAX_LAYERS)
        check_count("model", "max_seq_len", self.max_seq_len, MAX_TOKENS)
        check_count("model", "num_mtp_layers", self.num_mtp_layers, MAX_LAYERS, minimum=0)
        check_real("model", "rope_theta", self.rope_theta)
        check_real("model", "rms_norm_eps", self.rms_norm_eps)
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ConfigError(
                f"model.hidden_size ({self.hidden_size}) is not divisible by "
                f"model.num_heads ({self.num_heads}); set model.head_dim"
            )
        kv = self.kv_heads
        if self.num_heads % kv:
            raise ConfigError(
                f"attention.kv_heads ({kv}) must divide model.num_heads ({self.num_heads}); "
                f"allowed: {', '.join(str(d) for d in _divisors(self.num_heads))}"
            )
        a = self.attention
        if a.kind == "cla" and self.num_layers % a.cla_group:
            raise ConfigError(
                f"attention.cla_group ({a.cla_group}) must divide model.num_layers "
                f"({self.num_layers})"
            )
        if a.kind == "mla":
            if a.kv_lora_rank > self.hidden_size:
                raise ConfigError(
                    f"attention.kv_lora_rank ({a.kv_lora_rank}) exceeds model.hidden_size "
                    f"({self.hidden_size})"
                )
            if a.q_lora_rank is not None and a.q_lora_rank > self.hidden_size * 4:
                raise ConfigError(f"attention.q_lora_rank ({a.q_lora_rank}) is implausibly large")
        if a.kind == "sliding" and a.window is not None and a.window > self.max_seq_len:
            raise ConfigError(
                f"attention.window ({a.window}) is larger than the model context "
                f"model.max_seq_len ({self.max_seq_len}); allowed: 1..{self.max_seq_len}"
            )
        if self.moe is not None and self.moe.first_k_dense > self.num_layers:
            raise ConfigError("moe.first_k_dense exceeds model.num_layers")
        self._check_features()

    def _check_features(self) -> None:
        """The architecture feature fields (qkv_bias ... rope_local_theta)."""
        if self.rotary_dim is not None:
            check_count("model", "rotary_dim", self.rotary_dim, self.dim_head)
            if self.rotary_dim % 2:
                raise ConfigError(f"model.rotary_dim must be even (RoPE rotates pairs), "
                                  f"got {self.rotary_dim}")
        for key in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar",
                    "rope_local_theta"):
            value = getattr(self, key)
            if value is not None:
                check_real("model", key, value)
        self._check_llama4()
        self._check_gpt_oss()

    def _check_gpt_oss(self) -> None:
        """Attention sinks need softmax attention and no soft-capping (gpt-oss)."""
        if self.attention_sinks and KIND_MIXER[self.attention.kind] != SOFTMAX_MIXER:
            raise ConfigError(f"model.attention_sinks: attention.kind {self.attention.kind!r} "
                              "has no softmax over cached keys; allowed with sinks: "
                              "mha, gqa, mqa, cla, sliding")
        if self.attention_sinks and self.attn_logit_softcap is not None:
            raise ConfigError("model.attention_sinks does not combine with "
                              "model.attn_logit_softcap (no attention path has both); allowed: "
                              "one of the two")

    def _check_llama4(self) -> None:
        """Chunked attention, NoPE layers and temperature tuning (Llama-4)."""
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))  # a YAML/JSON list
        for index in self.nope_layers:
            check_count("model", "nope_layers[]", index, MAX_LAYERS, minimum=0)
            if index >= self.num_layers:
                raise ConfigError(f"model.nope_layers[]: layer {index} is past the last layer; "
                                  f"allowed: 0..{self.num_layers - 1}")
        if len(set(self.nope_layers)) != len(self.nope_layers):
            raise ConfigError(f"model.nope_layers lists a layer twice: {list(self.nope_layers)}")
        if self.attention_chunk is not None:
            check_count("model", "attention_chunk", self.attention_chunk, MAX_TOKENS)
        if self.attn_temperature_floor is not None:
            check_count("model", "attn_temperature_floor", self.attn_temperature_floor,
                        MAX_TOKENS)
        check_real("model", "attn_temperature_scale", self.attn_temperature_scale,
                   allow_zero=True)
        kind = self.attention.kind
        uses = [key for key, on in (("attention_chunk", self.attention_chunk is not None),
                                    ("nope_layers", bool(self.nope_layers)),
                                    ("qk_l2_norm", self.qk_l2_norm)) if on]
        if uses and kind not in ("mha", "gqa", "mqa"):
            raise ConfigError(f"model.{uses[0]} needs plain softmax attention, not "
                              f"attention.kind {kind!r}; allowed kinds: mha, gqa, mqa")
        if self.attention_chunk is not None and self.attn_logit_softcap is not None:
            raise ConfigError("model.attention_chunk does not combine with "
                              "model.attn_logit_softcap (no soft-capped chunked attention path); "
                              "allowed: one of them")
        if self.qk_l2_norm and self.qk_norm:
            raise ConfigError("model.qk_l2_norm and model.qk_norm are two q/k norms; "
                              "allowed: one of them")

    @property
    def is_gemma(self) -> bool:
        """Gemma-2/3 blocks: (1 + w) RMSNorms around both sublayers, GeGLU, scaled embeddings."""
        return self.arch in GEMMA_ARCHS

    @property
    def rot_dim(self) -> int:
        """Dimensions of each head that RoPE rotates."""
        return self.rotary_dim if self.rotary_dim is not None else self.dim_head

    # ----------------------------------------------------------------- shapes
    @property
    def kv_heads(self) -> int:
        """KV heads after applying the attention kind (mqa: 1, mha: num_heads)."""
        a = self.attention
        if a.kind == "mha":
            return self.num_heads
        if a.kind == "mqa":
            return 1
        if a.kv_heads is not None:
            return a.kv_heads
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    def layers(self) -> tuple[LayerSpec, ...]:
        """Resolve the attention settings into one LayerSpec per layer."""
        a, n = self.attention, self.num_layers
        specs: list[LayerSpec] = []
        mixer = KIND_MIXER[a.kind]
        for i in range(n):
            if a.kind in ("linear", "ssm"):
                # Jamba puts the attention layer in the middle of each block of attn_every.
                is_attn = a.attn_every is not None and i % a.attn_every == a.attn_every // 2
                specs.append(LayerSpec(i, SOFTMAX_MIXER if is_attn else mixer, kv_source=i))
            elif a.kind == "cla":
                owner = i - i % a.cla_group
                specs.append(LayerSpec(i, mixer, owns_kv=owner == i, kv_source=owner))
            elif a.kind == "sliding":
                is_global = a.global_every is not None and (i + 1) % a.global_every == 0
                specs.append(LayerSpec(i, mixer, None if is_global else a.window, True, i))
            else:  # mha, gqa, mqa, mla: one mixer on every layer
                specs.append(LayerSpec(i, mixer, kv_source=i))
        if self.attn_logit_softcap is not None:
            cap = self.attn_logit_softcap
            specs = [dataclasses.replace(s, softcap=cap) if s.mixer == SOFTMAX_MIXER else s
                     for s in specs]
        if self.nope_layers or self.attention_chunk is not None:
            nope = set(self.nope_layers)  # NoPE layers: no RoPE, full causal attention
            specs = [dataclasses.replace(s, rope=s.index not in nope,
                                         chunk=None if s.index in nope else self.attention_chunk)
                     for s in specs]
        if self.attention_sinks:
            specs = [dataclasses.replace(s, sinks=True) if s.mixer == SOFTMAX_MIXER else s
                     for s in specs]
        return tuple(specs)

    def with_overrides(self, **overrides: Any) -> ModelConfig:
        """Return a copy with fields replaced; `attention`/`moe` accept dicts of fields."""
        return _replace(self, overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of dataclasses.asdict (as stored in result files)."""
        d = dict(data)
        d["attention"] = AttentionConfig(**d.get("attention", {}))
        if d.get("moe"):
            d["moe"] = MoEConfig(**{**d["moe"],
                                    "dense_layers": tuple(d["moe"].get("dense_layers", ()))})
        if d.get("rope_scaling"):
            d["rope_scaling"] = tuple(tuple(item) for item in d["rope_scaling"])
        if d.get("nope_layers"):
            d["nope_layers"] = tuple(d["nope_layers"])
        return cls(**d)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ModelConfig:
        key = name.lower()
        if key not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; allowed: {', '.join(PRESETS)}")
        return PRESETS[key].with_overrides(**overrides) if overrides else PRESETS[key]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _replace(cfg: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    # Fields whose default is None may be set to None (num_kv_heads, head_dim, moe, ...).
    optional = {f.name for f in dataclasses.fields(ModelConfig) if f.default is None}
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in names:
            raise ConfigError(f"unknown model field {key!r}; allowed: {', '.join(sorted(names))}")
        if key in ("attention", "moe") and value is not None and not isinstance(
                value, dict | AttentionConfig | MoEConfig):
            # A scalar here used to pass dataclasses.replace and crash later with AttributeError.
            raise ConfigError(f"model.{key}: must be a mapping of {key} fields, e.g. "
                              f"{key}.{'kind' if key == 'attention' else 'num_experts'}=... "
                              f"(got {value!r})")
        if value is None and key not in optional:
            raise ConfigError(f"model.{key}: must not be null")
        if key == "attention" and isinstance(value, dict):
            value = make_attention(value, base=cfg.attention)
        elif key == "moe" and isinstance(value, dict):
            value = _make(MoEConfig, "moe", {**_asdict(cfg.moe), **value})
        elif key == "rope_scaling" and isinstance(value, dict):
            value = tuple(sorted(value.items()))
        changes[key] = value
    try:
        return dataclasses.replace(cfg, **changes)
    except TypeError as exc:  # wrong type for a field
        raise ConfigError(f"model overrides: {exc}") from None


def _asdict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj) if obj is not None else {}


def _make(cls: type, owner: str, values: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"unknown {owner} key {unknown[0]!r}; allowed: {', '.join(sorted(names))}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{owner}: {exc}") from None


def make_attention(values: dict[str, Any], base: AttentionConfig | None = None) -> AttentionConfig:
    """Build an AttentionConfig from a dict, starting from `base` when the kind is unchanged."""
    start = _asdict(base) if base is not None and values.get("kind", base.kind) == base.kind else {}
    return _make(AttentionConfig, "attention", {**start, **values})  # type: ignore[no-any-return]


@dataclass(frozen=True)
class PruneConfig:
    """Structured pruning applied at load time (`model.prune`; `infbench prune` also
    distills): drop `layers` whole decoder layers, remove `mlp_fraction` of every MLP's
    intermediate channels."""

    layers: int = 0
    """Whole decoder layers to drop, the least important first (importance measured on
    calibration text)."""
    mlp_fraction: float = 0.0
    """Fraction of every MLP's intermediate width to remove, the channels with the smallest
    activation magnitude on calibration text first."""
    calibration_tokens: int = 1024
    """Calibration tokens (from the eval text's calibration split)."""

    def __post_init__(self) -> None:
        check_count("prune", "layers", self.layers, MAX_LAYERS, minimum=0)
        check_real("prune", "mlp_fraction", self.mlp_fraction, allow_zero=True)
        if self.mlp_fraction >= 1:
            raise ConfigError(f"prune.mlp_fraction must be in [0, 1), got {self.mlp_fraction}")
        check_count("prune", "calibration_tokens", self.calibration_tokens, MAX_DIM)

    @property
    def active(self) -> bool:
        return self.layers > 0 or self.mlp_fraction > 0

    def mlp_width(self, intermediate_size: int) -> int:
        """MLP channels kept: round((1 - mlp_fraction) * intermediate_size), at least 1."""
        return max(1, round((1 - self.mlp_fraction) * intermediate_size))

    def pruned_shape(self, cfg: ModelConfig) -> ModelConfig:
        """The shape `cfg` has after this pruning: what the engine runs and predict prices.

        Dropping layers keeps the per-layer pattern only when every layer is alike (one
        mixer, one window, each layer owning its KV); others are refused by name.
        """
        if self.layers >= cfg.num_layers:
            raise ConfigError(f"prune.layers ({self.layers}) must be less than model.num_layers "
                              f"({cfg.num_layers}); allowed: 0..{cfg.num_layers - 1}")
        if self.layers:
            kinds = {(s.mixer, s.window, s.chunk, s.rope, s.owns_kv) for s in cfg.layers()}
            if len(kinds) > 1 or cfg.attention.kind in ("linear", "cla"):
                raise ConfigError(
                    f"prune.layers: model {cfg.name!r} (attention.kind {cfg.attention.kind}) "
                    "has layers of different kinds or layers sharing state; dropping layers "
                    "needs layers that are all alike (mha, gqa, mqa, mla, ssm, or sliding "
                    "without global_every); allowed here: prune.layers: 0")
        if self.mlp_fraction and (cfg.arch == "mamba" or cfg.moe is not None):
            raise ConfigError(f"prune.mlp_fraction: model {cfg.name!r} has no dense SwiGLU MLP "
                              "to narrow (Mamba blocks or MoE experts); allowed: 0")
        return cfg.with_overrides(num_layers=cfg.num_layers - self.layers,
                                  intermediate_size=self.mlp_width(cfg.intermediate_size))


def make_quant(values: dict[str, Any]) -> QuantConfig:
    return _make(QuantConfig, "quant", values)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the built-in engine (the names follow vLLM's engine arguments)."""

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    backend: Annotated[str, Backend] = "auto"
    kv_cache_memory: float = 0.9
    """KV budget: bytes if > 1, else a fraction of the memory left after the weights."""
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    cuda_graphs: bool = False
    num_threads: int | None = None
    """CPU: torch intra-op threads (unset: torch's default)."""

    def __post_init__(self) -> None:
        _choice("engine", "backend", self.backend, BACKENDS)
        _check_positive("engine", MAX_TOKENS, block_size=self.block_size,
                        max_num_batched_tokens=self.max_num_batched_tokens)
        _check_positive("engine", MAX_BATCH, max_num_seqs=self.max_num_seqs)
        _check_positive("engine", MAX_LAYERS, num_threads=self.num_threads)
        check_real("engine", "kv_cache_memory", self.kv_cache_memory)


# ---------------------------------------------------------------------- presets
# Shapes from each model's published config.json (Hugging Face hub), cited per entry.
_GQA = AttentionConfig(kind="gqa")
PRESETS: dict[str, ModelConfig] = {
    # meta-llama/Llama-2-7b-hf
    "llama2-7b": ModelConfig(
        name="llama2-7b", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=32, intermediate_size=11008, max_seq_len=4096,
        attention=AttentionConfig("mha"),
    ),
    # meta-llama/Llama-2-13b-hf
    "llama2-13b": ModelConfig(
        name="llama2-13b", vocab_size=32000, hidden_size=5120, num_layers=40, num_heads=40,
        num_kv_heads=40, intermediate_size=13824, max_seq_len=4096,
        attention=AttentionConfig("mha"),
    ),
    # meta-llama/Llama-2-70b-hf (GQA, 8 KV heads)
    "llama2-70b": ModelConfig(
        name="llama2-70b", vocab_size=32000, hidden_size=8192, num_layers=80, num_heads=64,
        num_kv_heads=8, intermediate_size=28672, max_seq_len=4096, attention=_GQA,
    ),
    # meta-llama/Meta-Llama-3-8B
    "llama3-8b": ModelConfig(
        name="llama3-8b", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=8, intermediate_size=14336, max_seq_len=8192, rope_theta=500000.0,
        attention=_GQA,
    ),
    # meta-llama/Meta-Llama-3-70B
    "llama3-70b": ModelConfig(
        name="llama3-70b", vocab_size=128256, hidden_size=8192, num_layers=80, num_heads=64,
        num_kv_heads=8, intermediate_size=28672, max_seq_len=8192, rope_theta=500000.0,
        attention=_GQA,
    ),
    # mistralai/Mistral-7B-v0.1 (sliding_window 4096)
    "mistral-7b": ModelConfig(
        name="mistral-7b", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=8, intermediate_size=14336, max_seq_len=32768, arch="mistral",
        attention=AttentionConfig(kind="sliding", window=4096),
    ),
    # deepseek-ai/DeepSeek-V2 (236B total, 21B active)
    "deepseek-v2": ModelConfig(
        name="deepseek-v2", vocab_size=102400, hidden_size=5120, num_layers=60, num_heads=128,
        num_kv_heads=128, intermediate_size=12288, max_seq_len=163840, rms_norm_eps=1e-6,
        arch="deepseek_v2",
        attention=AttentionConfig(
            kind="mla", kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
            qk_nope_head_dim=128, v_head_dim=128,
        ),
        moe=MoEConfig(num_experts=160, num_experts_per_tok=6, moe_intermediate_size=1536,
                      num_shared_experts=2, first_k_dense=1),
    ),
    # deepseek-ai/DeepSeek-V2-Lite (15.7B total, 2.4B active)
    "deepseek-v2-lite": ModelConfig(
        name="deepseek-v2-lite", vocab_size=102400, hidden_size=2048, num_layers=27, num_heads=16,
        num_kv_heads=16, intermediate_size=10944, max_seq_len=163840, rms_norm_eps=1e-6,
        arch="deepseek_v2",
        attention=AttentionConfig(
            kind="mla", kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
            qk_nope_head_dim=128, v_head_dim=128,
        ),
        moe=MoEConfig(num_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408,
                      num_shared_experts=2, first_k_dense=1),
    ),
    # deepseek-ai/DeepSeek-V3 (also DeepSeek-V3-0324, R1, R1-0528: the same config.json shapes):
    # 671B main model + one 14B MTP module (685B stored), 37B active; YaRN x40 from 4k.
    "deepseek-v3": ModelConfig(
        name="deepseek-v3", vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128,
        num_kv_heads=128, intermediate_size=18432, max_seq_len=163840, rms_norm_eps=1e-6,
        arch="deepseek_v3", num_mtp_layers=1,
        rope_scaling=(("beta_fast", 32), ("beta_slow", 1), ("factor", 40.0), ("mscale", 1.0),
                      ("mscale_all_dim", 1.0), ("original_max_position_embeddings", 4096),
                      ("rope_type", "yarn")),
        attention=AttentionConfig(
            kind="mla", kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
            qk_nope_head_dim=128, v_head_dim=128,
        ),
        moe=MoEConfig(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
                      num_shared_experts=1, first_k_dense=3, scoring="sigmoid",
                      topk_method="noaux_tc", norm_topk_prob=True, n_group=8, topk_group=4,
                      routed_scaling_factor=2.5),
    ),
    # moonshotai/Kimi-K2-Instruct (DeepseekV3ForCausalLM; card 1T / 32B active, 1.026T here):
    # 64 heads, 384 experts in one group, one dense layer, no MTP module; YaRN x32 from 4k.
    "kimi-k2": ModelConfig(
        name="kimi-k2", vocab_size=163840, hidden_size=7168, num_layers=61, num_heads=64,
        num_kv_heads=64, intermediate_size=18432, max_seq_len=131072, rms_norm_eps=1e-6,
        rope_theta=50000.0, arch="deepseek_v3",
        rope_scaling=(("beta_fast", 1.0), ("beta_slow", 1.0), ("factor", 32.0), ("mscale", 1.0),
                      ("mscale_all_dim", 1.0), ("original_max_position_embeddings", 4096),
                      ("rope_type", "yarn")),
        attention=AttentionConfig(
            kind="mla", kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
            qk_nope_head_dim=128, v_head_dim=128,
        ),
        moe=MoEConfig(num_experts=384, num_experts_per_tok=8, moe_intermediate_size=2048,
                      num_shared_experts=1, first_k_dense=1, scoring="sigmoid",
                      topk_method="noaux_tc", norm_topk_prob=True, n_group=1, topk_group=1,
                      routed_scaling_factor=2.827),
    ),
    # HuggingFaceTB/SmolLM2-135M(-Instruct)
    "smollm2-135m": ModelConfig(
        name="smollm2-135m", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
        num_kv_heads=3, intermediate_size=1536, max_seq_len=8192, rope_theta=100000.0,
        tie_word_embeddings=True, attention=_GQA,
    ),
    # Tiny presets for tests and quick CPU runs.
    "tiny": ModelConfig(
        name="tiny", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        intermediate_size=128, max_seq_len=1024, attention=_GQA,
    ),
    "tiny-mla": ModelConfig(
        name="tiny-mla", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
        num_kv_heads=4, intermediate_size=128, max_seq_len=1024, arch="deepseek_v2",
        attention=AttentionConfig(kind="mla", kv_lora_rank=32, q_lora_rank=None,
                                  qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
    ),
    "tiny-moe": ModelConfig(
        name="tiny-moe", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
        num_kv_heads=2, intermediate_size=128, max_seq_len=1024, attention=_GQA,
        moe=MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      num_shared_experts=1, first_k_dense=0),
    ),
    # A llama-shaped model small enough for a 2-core CPU (about 200M parameters).
    "llama-small": ModelConfig(
        name="llama-small", vocab_size=32000, hidden_size=1024, num_layers=12, num_heads=16,
        num_kv_heads=4, intermediate_size=2816, max_seq_len=4096, attention=_GQA,
    ),
}

# Qwen2.5, Qwen3, Gemma-2, Gemma-3 and Phi-3 (docs/architectures.md), shapes and features
# from each model's published config.json on the Hugging Face hub.
def _qwen2(name: str, vocab: int, hidden: int, layers: int, heads: int, kv: int, inter: int,
           tied: bool) -> ModelConfig:
    return ModelConfig(name=name, vocab_size=vocab, hidden_size=hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=kv, intermediate_size=inter,
                       max_seq_len=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=tied, attention=_GQA, arch="qwen2", qkv_bias=True)


def _qwen3(name: str, hidden: int, layers: int, heads: int, inter: int,
           tied: bool) -> ModelConfig:
    return ModelConfig(name=name, vocab_size=151936, hidden_size=hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=8, head_dim=128, intermediate_size=inter,
                       max_seq_len=40960, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=tied, attention=_GQA, arch="qwen3", qk_norm=True)


def _gemma(name: str, arch: str, vocab: int, hidden: int, layers: int, heads: int, kv: int,
           inter: int, context: int, window: int, **features: Any) -> ModelConfig:
    every = 2 if arch == "gemma2" else 6  # Gemma-2: local/global alternate; Gemma-3: 5:1
    return ModelConfig(name=name, vocab_size=vocab, hidden_size=hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=kv, head_dim=256, intermediate_size=inter,
                       max_seq_len=context, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       attention=AttentionConfig(kind="sliding", window=window,
                                                 global_every=every, kv_heads=kv),
                       arch=arch, query_pre_attn_scalar=256.0, **features)


_GEMMA2 = dict(attn_logit_softcap=50.0, final_logit_softcap=30.0)
_GEMMA3 = dict(qk_norm=True, rope_theta=1e6, rope_local_theta=10000.0)
FAMILY_PRESETS: dict[str, ModelConfig] = {
    # Qwen/Qwen2.5-{0.5B,1.5B,7B}
    "qwen2.5-0.5b": _qwen2("qwen2.5-0.5b", 151936, 896, 24, 14, 2, 4864, tied=True),
    "qwen2.5-1.5b": _qwen2("qwen2.5-1.5b", 151936, 1536, 28, 12, 2, 8960, tied=True),
    "qwen2.5-7b": _qwen2("qwen2.5-7b", 152064, 3584, 28, 28, 4, 18944, tied=False),
    # Qwen/Qwen3-{0.6B,8B}
    "qwen3-0.6b": _qwen3("qwen3-0.6b", 1024, 28, 16, 3072, tied=True),
    "qwen3-8b": _qwen3("qwen3-8b", 4096, 36, 32, 12288, tied=False),
    # google/gemma-2-{2b,9b}
    "gemma-2-2b": _gemma("gemma-2-2b", "gemma2", 256000, 2304, 26, 8, 4, 9216, 8192, 4096,
                         **_GEMMA2),
    "gemma-2-9b": _gemma("gemma-2-9b", "gemma2", 256000, 3584, 42, 16, 8, 14336, 8192, 4096,
                         **_GEMMA2),
    # google/gemma-3-1b-pt; google/gemma-3-4b-pt's text model (linear RoPE x8 on global layers)
    "gemma-3-1b": _gemma("gemma-3-1b", "gemma3", 262144, 1152, 26, 4, 1, 6912, 32768, 512,
                         **_GEMMA3),
    "gemma-3-4b": _gemma("gemma-3-4b", "gemma3", 262208, 2560, 34, 8, 4, 10240, 131072, 1024,
                         rope_scaling=(("factor", 8.0), ("rope_type", "linear")), **_GEMMA3),
    # microsoft/Phi-3-mini-4k-instruct (sliding_window 2047 on every layer)
    "phi-3-mini": ModelConfig(
        name="phi-3-mini", vocab_size=32064, hidden_size=3072, num_layers=32, num_heads=32,
        num_kv_heads=32, intermediate_size=8192, max_seq_len=4096, rms_norm_eps=1e-5,
        attention=AttentionConfig(kind="sliding", window=2047), arch="phi3",
    ),
}


# The dense and MoE models deployed today (docs/models.md), from each model's published
# config.json on the Hugging Face hub.
def _llama31(name: str, hidden: int, layers: int, heads: int, inter: int) -> ModelConfig:
    return ModelConfig(name=name, vocab_size=128256, hidden_size=hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=8, intermediate_size=inter,
                       max_seq_len=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                       rope_scaling=_LLAMA31_ROPE, attention=_GQA)


def _mixtral(name: str, hidden: int, layers: int, heads: int, inter: int,
             context: int) -> ModelConfig:
    return ModelConfig(name=name, vocab_size=32000, hidden_size=hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=8, intermediate_size=inter,
                       max_seq_len=context, rope_theta=1e6, rms_norm_eps=1e-5,
                       attention=_GQA, arch="mixtral",
                       moe=MoEConfig(num_experts=8, num_experts_per_tok=2,
                                     moe_intermediate_size=inter, norm_topk_prob=True))


def _qwen3_moe(name: str, hidden: int, layers: int, heads: int, inter: int,
               moe_inter: int) -> ModelConfig:
    return ModelConfig(name=name, vocab_size=151936, hidden_size=hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=4, head_dim=128, intermediate_size=inter,
                       max_seq_len=40960, rope_theta=1e6, rms_norm_eps=1e-6, attention=_GQA,
                       arch="qwen3_moe", qk_norm=True,
                       moe=MoEConfig(num_experts=128, num_experts_per_tok=8,
                                     moe_intermediate_size=moe_inter, norm_topk_prob=True))


# Llama 3.1's rope_scaling: frequencies below 8192-token wavelengths scaled by 8.
_LLAMA31_ROPE = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                 ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))
FAMILY_PRESETS.update({
    # meta-llama/Llama-3.1-{8B,70B,405B}
    "llama-3.1-8b": _llama31("llama-3.1-8b", 4096, 32, 32, 14336),
    "llama-3.1-70b": _llama31("llama-3.1-70b", 8192, 80, 64, 28672),
    "llama-3.1-405b": _llama31("llama-3.1-405b", 16384, 126, 128, 53248),
    # mistralai/Mixtral-8x7B-v0.1, mistralai/Mixtral-8x22B-v0.1 (every layer MoE, top 2 of 8)
    "mixtral-8x7b": _mixtral("mixtral-8x7b", 4096, 32, 32, 14336, 32768),
    "mixtral-8x22b": _mixtral("mixtral-8x22b", 6144, 56, 48, 16384, 65536),
    # Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B (every layer MoE, top 8 of 128)
    "qwen3-30b-a3b": _qwen3_moe("qwen3-30b-a3b", 2048, 48, 32, 6144, 768),
    "qwen3-235b-a22b": _qwen3_moe("qwen3-235b-a22b", 4096, 94, 64, 12288, 1536),
})
PRESETS.update(FAMILY_PRESETS)


def _llama4(name: str, experts: int, moe_step: int, context: int, qk_norm: bool,
            rope_scaling: tuple[tuple[str, Any], ...] | None) -> ModelConfig:
    """Llama-4's text decoder: 48 layers, a NoPE layer every 4th, chunks of 8192 tokens on
    the others, top-1 sigmoid routing whose score scales the expert input, one shared
    expert of the routed experts' width (checkpoint/llama4.py reads the same keys)."""
    return ModelConfig(
        name=name, vocab_size=202048, hidden_size=5120, num_layers=48, num_heads=40,
        num_kv_heads=8, intermediate_size=16384, max_seq_len=context,
        rope_theta=500000.0, rope_scaling=rope_scaling, attention=_GQA, arch="llama4",
        moe=MoEConfig(num_experts=experts, num_experts_per_tok=1, moe_intermediate_size=8192,
                      num_shared_experts=1, scoring="sigmoid", moe_step=moe_step,
                      scale_input=True),
        attention_chunk=8192, nope_layers=tuple(range(3, 48, 4)), qk_l2_norm=qk_norm,
        attn_temperature_floor=8192, attn_temperature_scale=0.1)


# meta-llama/Llama-4-Scout-17B-16E(-Instruct) and Llama-4-Maverick-17B-128E(-Instruct):
# their config.json text_config (Scout: every layer MoE, qk L2 norm, llama3 RoPE x16 from
# 8192; Maverick: MoE every 2nd layer, dense layers of 16384, no qk norm, no RoPE scaling)
LLAMA4_PRESETS: dict[str, ModelConfig] = {
    "llama-4-scout": _llama4(
        "llama-4-scout", 16, 1, 10485760, True,
        (("factor", 16.0), ("high_freq_factor", 1.0), ("low_freq_factor", 1.0),
         ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))),
    "llama-4-maverick": _llama4("llama-4-maverick", 128, 2, 1048576, False, None),
}
PRESETS.update(LLAMA4_PRESETS)
# gpt-oss (docs/architectures.md), from openai/gpt-oss-{20b,120b}'s config.json: the two
# differ only in depth and expert count.  The checkpoints store the experts in MXFP4.
_GPT_OSS_ROPE = (("beta_fast", 32.0), ("beta_slow", 1.0), ("factor", 32.0),
                 ("original_max_position_embeddings", 4096), ("rope_type", "yarn"),
                 ("truncate", False))


def _gpt_oss(name: str, layers: int, experts: int) -> ModelConfig:
    return ModelConfig(
        name=name, vocab_size=201088, hidden_size=2880, num_layers=layers, num_heads=64,
        num_kv_heads=8, head_dim=64, intermediate_size=2880, max_seq_len=131072,
        rope_theta=150000.0, rope_scaling=_GPT_OSS_ROPE, rms_norm_eps=1e-5,
        attention=AttentionConfig(kind="sliding", window=128, global_every=2, kv_heads=8),
        moe=MoEConfig(num_experts=experts, num_experts_per_tok=4, moe_intermediate_size=2880,
                      scoring="topk_softmax", router_bias=True, expert_bias=True,
                      activation="clamped_swiglu", swiglu_alpha=1.702, swiglu_limit=7.0),
        arch="gpt_oss", attention_bias=True, attention_sinks=True)


GPT_OSS_PRESETS: dict[str, ModelConfig] = {
    "gpt-oss-20b": _gpt_oss("gpt-oss-20b", 24, 32),  # 20.9B total, 3.6B active
    "gpt-oss-120b": _gpt_oss("gpt-oss-120b", 36, 128),  # 116.8B total, 5.1B active
}
PRESETS.update(GPT_OSS_PRESETS)

# Presets that name a released model -> the weights file `model.loader` reads for it (a name
# `checkpoint.metadata.resolve_gguf` knows).  Other presets always get seeded random weights.
REAL_WEIGHTS: dict[str, str] = {"smollm2-135m": "smollm2-135m"}
