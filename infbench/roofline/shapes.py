"""Every weight tensor of a model and the memory it needs: parameters, KV cache, state.

`layer_weights` enumerates the tensors of one resolved layer, tagged with the
operator that reads them; parameter counts, weight bytes and the per-step weight
traffic of `step_costs` all come from this one list, so they cannot disagree.

Quantization (`QuantConfig.weights`) applies to the projection matrices inside the
blocks (attention/MLA/SSM projections, MLP and expert matrices).  The embedding,
the LM head, norms, convolution, SSM parameters, biases and the MoE router stay in
the model dtype, as in AWQ/GPTQ checkpoints; the exceptions are `quant.head: int8` and,
under native weights, a GGUF file's quantized token embedding / LM head, which
`QuantConfig.weight_bits` prices in the file's format.  KV bytes use `quant.kv_bytes`;
recurrent state (linear attention, SSM) is held in the model dtype.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from infbench.core.config import DTYPE_BYTES, LayerSpec, ModelConfig, QuantConfig
from infbench.core.errors import ConfigError
from infbench.core.formats import INT4_GROUP_SIZES


@dataclass(frozen=True)
class Weight:
    """One weight tensor: a (in_features x out_features) matrix or a vector (in_features=1)."""

    op: str  # the operator that reads it (an OpCost name)
    in_features: int
    out_features: int
    quantized: bool = True
    count: int = 1  # identical copies (routed experts)
    expert: bool = False  # a routed expert's matrix: read only if the expert is hit

    @property
    def numel(self) -> int:
        return self.in_features * self.out_features * self.count

    def nbytes(self, quant: QuantConfig, dtype_bytes: int) -> float:
        if not self.quantized:
            return float(self.numel * dtype_bytes)
        return self.numel * quant.weight_bits(self.in_features, dtype_bytes, self.op,
                                             self.out_features) / 8.0


@dataclass(frozen=True)
class ParamCount:
    """Parameters: all, those one token multiplies with (MoE: top-k experts; the input
    embedding gather excluded), and the embedding table."""

    total: int
    active: int
    embedding: int
    mtp: int = 0  # DeepSeek-V3's MTP modules as the checkpoint stores them (not in `total`)


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def has_mlp(cfg: ModelConfig) -> bool:
    """Mamba-1 blocks are norm + mixer only; every other arch follows a mixer with an MLP."""
    return cfg.arch != "mamba"


def is_moe_layer(cfg: ModelConfig, spec: LayerSpec) -> bool:
    return cfg.moe is not None and cfg.moe.is_moe(spec.index)


def feature_dim(cfg: ModelConfig) -> int:
    """Linear attention: size f of phi(q), phi(k) per head, as the engine allocates it.

    elu / relu act elementwise (f = head_dim); favor draws `feature_dim` random
    features (default head_dim); taylor is the symmetric 2nd-order expansion
    [1, x, x_i x_j for i <= j]: f = 1 + d + d(d+1)/2 with d = head_dim.
    """
    a, d = cfg.attention, cfg.dim_head
    if a.feature_map == "favor":
        return a.feature_dim or d
    if a.feature_dim is not None and a.feature_dim != d:
        raise ConfigError(
            f"attention.feature_dim={a.feature_dim} applies to feature_map 'favor' only (the "
            f"number of random features); feature_map {a.feature_map!r} is fixed by the head "
            f"dim ({d}); allowed: leave feature_dim unset or use feature_map: favor"
        )
    if a.feature_map == "taylor":
        return 1 + d + d * (d + 1) // 2
    return d


def mamba_dims(cfg: ModelConfig) -> tuple[int, int, int, int]:
    """(d_inner, d_state, d_conv, dt_rank) of a Mamba-1 mixer."""
    a = cfg.attention
    return (
        a.expand * cfg.hidden_size,
        a.d_state,
        a.d_conv,
        a.dt_rank or math.ceil(cfg.hidden_size / 16),
    )


def mla_dims(cfg: ModelConfig) -> tuple[int, int, int, int]:
    """(kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim)."""
    a = cfg.attention
    return a.kv_lora_rank, a.qk_rope_head_dim, a.qk_nope_head_dim, a.v_head_dim


def _mixer_weights(cfg: ModelConfig, spec: LayerSpec) -> list[Weight]:
    d, h, hd, kvh = cfg.hidden_size, cfg.num_heads, cfg.dim_head, cfg.kv_heads
    if spec.mixer in ("attention", "linear"):
        ws = [Weight("qkv_proj", d, h * hd)]
        if spec.owns_kv:  # CLA: a layer that reads another layer's KV has no K/V projection
            ws.append(Weight("qkv_proj", d, 2 * kvh * hd))
        if spec.mixer == "attention":
            ws += _attention_extras(cfg, spec)
        if cfg.attention_bias:  # gpt-oss: o_proj's bias too
            ws.append(Weight("o_proj", 1, d, quantized=False))
        return [*ws, Weight("o_proj", h * hd, d)]
    if spec.mixer == "mla":
        r, rope, nope, v = mla_dims(cfg)
        qlr = cfg.attention.q_lora_rank
        if qlr is None:
            ws = [Weight("qkv_proj", d, h * (nope + rope))]
        else:
            ws = [
                Weight("qkv_proj", d, qlr),
                Weight("norm", 1, qlr, quantized=False),
                Weight("qkv_proj", qlr, h * (nope + rope)),
            ]
        return [
            *ws,
            Weight("qkv_proj", d, r + rope),  # kv_a_proj_with_mqa: latent + shared RoPE key
            Weight("norm", 1, r, quantized=False),
            Weight("qkv_proj", r, h * (nope + v)),  # kv_b_proj (W_UK and W_UV)
            Weight("o_proj", h * v, d),
        ]
    di, n, dc, rank = mamba_dims(cfg)
    return [
        Weight("ssm_in_proj", d, 2 * di),
        Weight("ssm_conv", 1, di * dc + di, quantized=False),  # depthwise kernel + bias
        Weight("ssm_x_proj", di, rank + 2 * n),
        Weight("ssm_x_proj", rank, di),  # dt_proj
        Weight("ssm_x_proj", 1, di, quantized=False),  # dt_proj bias
        Weight("ssm_scan", 1, di * n + di, quantized=False),  # A_log and D
        Weight("ssm_out_proj", di, d),
    ]


def _attention_extras(cfg: ModelConfig, spec: LayerSpec) -> list[Weight]:
    """Qwen2's (and gpt-oss's) q/k/v biases, the q/k norms of Qwen3 / Gemma-3 and gpt-oss's
    attention sinks (vectors, never quantized)."""
    h, hd, kvh = cfg.num_heads, cfg.dim_head, cfg.kv_heads
    ws = []
    if spec.sinks:  # one logit per query head (counted with the projections: a step
        ws.append(Weight("qkv_proj", 1, h, quantized=False))  # always has that operator)
    if cfg.qkv_bias or cfg.attention_bias:
        ws.append(Weight("qkv_proj", 1, h * hd + (2 * kvh * hd if spec.owns_kv else 0),
                         quantized=False))
    if cfg.qk_norm:
        ws += [Weight("norm", 1, hd, quantized=False)] * 2
    return ws


def _mlp_weights(cfg: ModelConfig, spec: LayerSpec) -> list[Weight]:
    d = cfg.hidden_size
    if not is_moe_layer(cfg, spec):
        f = cfg.intermediate_size
        return [Weight("mlp", d, 2 * f), Weight("mlp", f, d)]
    moe = cfg.moe
    assert moe is not None
    mi = moe.moe_intermediate_size
    ws = [Weight("moe_router", d, moe.num_experts, quantized=False)]
    if moe.topk_method == "noaux_tc":  # the router's e_score_correction_bias
        ws.append(Weight("moe_router", 1, moe.num_experts, quantized=False))
    if moe.router_bias:
        ws.append(Weight("moe_router", 1, moe.num_experts, quantized=False))
    if moe.num_shared_experts:
        fs = moe.shared_size
        ws += [Weight("moe_shared", d, 2 * fs), Weight("moe_shared", fs, d)]
        if moe.shared_gate:  # Qwen2-MoE: one sigmoid gate per token on the shared output
            ws.append(Weight("moe_shared", d, 1, quantized=False))
    e = moe.num_experts
    ws += [
        Weight("moe_experts", d, 2 * mi, count=e, expert=True),
        Weight("moe_experts", mi, d, count=e, expert=True),
    ]
    if moe.expert_bias:  # gpt-oss: gate_up and down biases of every expert
        ws += [Weight("moe_experts", 1, 2 * mi, quantized=False, count=e, expert=True),
               Weight("moe_experts", 1, d, quantized=False, count=e, expert=True)]
    return ws


def layer_weights(cfg: ModelConfig, spec: LayerSpec) -> list[Weight]:
    """The weight tensors of one layer (norms, mixer, MLP or MoE)."""
    norms = [Weight("norm", 1, cfg.hidden_size, quantized=False)]
    if not has_mlp(cfg):
        return norms + _mixer_weights(cfg, spec)
    if cfg.is_gemma:  # a norm after each sublayer too: post-attention, pre/post feed-forward
        norms = norms * 2
    return [*norms, *_mixer_weights(cfg, spec), *norms, *_mlp_weights(cfg, spec)]


def model_weights(cfg: ModelConfig, quant: QuantConfig | None = None) -> list[Weight]:
    """Weights outside the layers: embedding, final norm, LM head (absent when tied, unless
    `quant.head` int8 stores a quantized copy of the tied embedding for it; a GGUF file's
    quantized tied embedding under native weights is the head itself, so it has no copy).
    The embedding and the head are priced by `QuantConfig.weight_bits` (the model dtype
    unless quantized)."""
    v, d = cfg.vocab_size, cfg.hidden_size
    q = quant or QuantConfig()
    ws = [Weight("embed", v, d), Weight("norm", 1, d, quantized=False)]
    head_copy = q.head == "int8" and q.native_bits("lm_head", 1) is None
    if not cfg.tie_word_embeddings or head_copy:
        ws.append(Weight("lm_head", d, v))
    return ws


def mtp_layer(cfg: ModelConfig) -> LayerSpec:
    """The decoder layer of an MTP module: indexed after the main layers (DeepSeek-V3's
    `model.layers.61`), shaped like the last of them (so MoE in V3)."""
    return dataclasses.replace(cfg.layers()[-1], index=cfg.num_layers, kv_source=cfg.num_layers)


def mtp_model(cfg: ModelConfig) -> ModelConfig:
    """The MTP module's decoder layer, embedding, norm and head as a one-layer model: what one
    MTP draft step runs besides its eh_proj merge (`mtp_weights`' "mtp_proj")."""
    moe = cfg.moe
    if moe is not None and moe.is_moe(cfg.num_layers):
        moe = dataclasses.replace(moe, first_k_dense=0, moe_step=1, dense_layers=())
    else:
        moe = None
    return dataclasses.replace(cfg, name=f"{cfg.name} mtp", num_layers=1, moe=moe,
                               num_mtp_layers=0)


def mtp_weights(cfg: ModelConfig) -> list[Weight]:
    """One MTP module as the engine holds it: enorm, hnorm, eh_proj (2H -> H), its decoder
    layer and shared_head.norm; the embedding and the head are the main model's."""
    d = cfg.hidden_size
    merge = [Weight("norm", 1, d, quantized=False)] * 2 + [Weight("mtp_proj", 2 * d, d)]
    return [*merge, *layer_weights(cfg, mtp_layer(cfg)), Weight("norm", 1, d, quantized=False)]


def mtp_param_count(cfg: ModelConfig) -> int:
    """Parameters of the MTP modules as the checkpoint stores them: each module also keeps
    its own copy of the embedding and the head (`embed_tokens`, `shared_head.head`), which
    is how DeepSeek-V3's 671B main model becomes 685B on disk."""
    if not cfg.num_mtp_layers:
        return 0
    copies = 2 * cfg.vocab_size * cfg.hidden_size
    return cfg.num_mtp_layers * (sum(w.numel for w in mtp_weights(cfg)) + copies)


def _all_weights(cfg: ModelConfig, quant: QuantConfig | None = None) -> list[Weight]:
    ws = model_weights(cfg, quant)
    for spec in cfg.layers():
        ws += layer_weights(cfg, spec)
    return ws


def param_count(cfg: ModelConfig) -> ParamCount:
    ws = _all_weights(cfg)
    total = sum(w.numel for w in ws)
    inactive = 0
    if cfg.moe is not None:  # the routed experts' tensors (biases included) not in the top k
        moe = cfg.moe
        routed = sum(w.numel for w in ws if w.expert)
        idle = moe.num_experts - moe.num_experts_per_tok
        inactive = routed // moe.num_experts * idle
    embedding = cfg.vocab_size * cfg.hidden_size
    # An untied input embedding is a gather (one row per token), so like DeepSeek's
    # "activated parameters" the active count leaves it out; a tied one is the LM head.
    gathered = 0 if cfg.tie_word_embeddings else embedding
    return ParamCount(total, total - inactive - gathered, embedding, mtp_param_count(cfg))


def weight_bytes(cfg: ModelConfig, dtype: str, quant: QuantConfig | None = None) -> int:
    """Bytes of all weights as stored (quantized projections include their scales)."""
    q, nbytes = quant or QuantConfig(), dtype_bytes(dtype)
    return math.ceil(sum(w.nbytes(q, nbytes) for w in _all_weights(cfg, q)))


def layer_kv_bytes_per_token(cfg: ModelConfig, spec: LayerSpec, kv_bytes: float,
                             scale_bytes: int = 0) -> int:
    """KV bytes one token adds to this layer's cache (0 if the layer holds no KV).

    `scale_bytes`: a quantized cache's scale per stored row (`QuantConfig.kv_scale_bytes`):
    one per KV head for K and one for V, or one per MLA latent row.
    """
    if not spec.has_kv_cache:
        return 0
    if spec.mixer == "mla":
        r, rope, _, _ = mla_dims(cfg)
        return math.ceil((r + rope) * kv_bytes) + scale_bytes
    # A sub-byte cache (quant.kv_bits) packs a head's row and rounds it up to whole bytes.
    return 2 * cfg.kv_heads * (math.ceil(cfg.dim_head * kv_bytes) + scale_bytes)


def kv_bytes_per_token(cfg: ModelConfig, dtype: str, quant: QuantConfig | None = None) -> int:
    """KV-cache bytes per token summed over the layers that hold a cache (scales included)."""
    q = quant or QuantConfig()
    kvb = q.kv_bytes(dtype_bytes(dtype))
    return sum(layer_kv_bytes_per_token(cfg, spec, kvb, q.kv_scale_bytes)
               for spec in cfg.layers())


def kv_cache_bytes(
    cfg: ModelConfig, dtype: str, quant: QuantConfig | None, context_len: int, batch: int
) -> int:
    """KV cache of `batch` sequences of `context_len` tokens (sliding layers keep the window,
    chunked layers the chunk: LayerSpec.kv_held)."""
    q = quant or QuantConfig()
    kvb = q.kv_bytes(dtype_bytes(dtype))
    per_seq = 0
    for spec in cfg.layers():
        held = spec.kv_held(context_len)
        per_seq += layer_kv_bytes_per_token(cfg, spec, kvb, q.kv_scale_bytes) * held
    return per_seq * batch


def layer_state_entries(cfg: ModelConfig, spec: LayerSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Constant recurrent state of one sequence in one layer: (name, shape) entries.

    The engine allocates exactly these tensors per sequence slot, so measured state
    memory equals the predicted one.  Attention and MLA layers have none.
    """
    if spec.mixer == "linear":
        f, hd, h = feature_dim(cfg), cfg.dim_head, cfg.num_heads
        return [("S", (h, f, hd)), ("z", (h, f))]  # sum of phi(k) v^T and of phi(k), per head
    if spec.mixer == "ssm":
        di, n, dc, _ = mamba_dims(cfg)
        return [("conv", (di, dc)), ("ssm", (di, n))]  # last d_conv inputs; SSM state h
    return []


def layer_state_bytes(cfg: ModelConfig, spec: LayerSpec, nbytes: int) -> int:
    """Constant recurrent state of one sequence in one layer (0 for attention layers)."""
    return sum(math.prod(shape) for _, shape in layer_state_entries(cfg, spec)) * nbytes


def state_bytes_per_seq(cfg: ModelConfig, dtype: str) -> int:
    """Constant state per sequence over all linear-attention and SSM layers."""
    nbytes = dtype_bytes(dtype)
    return sum(layer_state_bytes(cfg, spec, nbytes) for spec in cfg.layers())


def largest_int4_group(cfg: ModelConfig) -> tuple[int | None, list[int]]:
    """(the largest int4 group of INT4_GROUP_SIZES that divides the input width of every
    projection int4 quantizes, or None when none does; those widths): the group `eval` and a
    scenario use when the user gave none (SmolLM2's 576 is 4.5 x 128, so 64 there)."""
    widths = sorted({w.in_features for spec in cfg.layers() for w in layer_weights(cfg, spec)
                     if w.quantized and w.in_features > 1})
    for group in sorted(INT4_GROUP_SIZES, reverse=True):
        if all(width % group == 0 for width in widths):
            return group, widths
    return None, widths
