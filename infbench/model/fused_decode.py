"""The `cpu` backend's fused decode layers: one C++ call per layer for decode steps.

`build_decode_layers(model)` makes a `kernels.cpu_decode_layer` DecodeLayer for every layer
it can (softmax attention — MHA/GQA/MQA, sliding window, CLA, q/k/v biases — with RMSNorms
and a SwiGLU MLP whose projections are plain or int8/int4 `QuantLinear`s) and None for the
others (MLA, linear attention, SSM, LLM.int8() or AWQ projections, q/k norms, partial RoPE,
soft-capped scores, Gemma blocks ...), which keep the per-op path.  `Transformer.forward`
uses a layer's DecodeLayer when every token of the step is a single-token decode, there are
at most 32 of them and the context offers an unquantized paged cache
(`decode_layer_args`); the per-op path (`DecoderLayer.forward_fused`) is the
reference and gives the same values.

Built when the engine binds the `cpu` ops; the DecodeLayers hold the weight tensors, so a
model whose projections are replaced afterwards must bind its ops again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from infbench.model.layers import RMSNorm, SwiGLUMLP
from infbench.model.quant import QuantLinear
from kernels.cpu_decode_layer import ProjSpec, make_decode_layer


def projection_spec(module: nn.Module, dtype: torch.dtype) -> ProjSpec | None:
    """The DecodeLayer description of one projection, or None when it cannot be fused."""
    if isinstance(module, nn.Linear):
        if module.weight.dtype != dtype or module.weight.device.type != "cpu":
            return None
        return ("dense", module.weight.detach(), module.bias)
    if type(module) is QuantLinear and module.input_scales is None:
        return ("quant", module.qweight, module.scales, module.mins, module.group_size,
                module.bias, module.act_int8)
    return None


def build_decode_layers(model: Any, attention: type[nn.Module]) -> list[Any | None]:
    """One DecodeLayer or None per layer of `model` (a Transformer whose softmax-attention
    mixer class is `attention`)."""
    dtype = model.dtype
    plans: list[Any | None] = []
    layer: Any
    for layer in model.layers:
        attn: Any = layer.self_attn
        mlp: Any = layer.mlp
        plan = None
        kinds_ok = type(attn) is attention and type(mlp) is SwiGLUMLP  # no narrowing of Any
        # The C++ layer has no q/k norms (Qwen3) and no score soft-capping (Gemma-2): such
        # layers keep the per-op path, which computes them (model/softcap.py).
        # Nor attention sinks or an o_proj bias (gpt-oss).
        kinds_ok = kinds_ok and attn.q_norm is None and attn.layer.softcap is None
        # Nor Llama-4's chunk mask, NoPE layers, weightless q/k norms or query temperature.
        kinds_ok = kinds_ok and attn.layer.chunk is None and attn.layer.rope and (
            attn.l2_eps is None and attn.temperature is None)
        # Nor attention sinks or an o_proj bias (gpt-oss).
        kinds_ok = kinds_ok and not attn.layer.sinks and attn.o_proj.bias is None
        if (dtype in (torch.float32, torch.bfloat16) and kinds_ok
                and isinstance(layer.input_layernorm, RMSNorm)
                and isinstance(layer.post_attention_layernorm, RMSNorm)
                and layer.input_layernorm.eps == layer.post_attention_layernorm.eps
                and model.rope_cache.shape[-1] == attn.head_dim):
            specs = [projection_spec(m, dtype) for m in (attn.qkv_proj, attn.o_proj,
                                                        mlp.gate_up_proj, mlp.down_proj)]
            if all(s is not None for s in specs):
                qkv, o, gate_up, down = specs
                assert qkv is not None and o is not None and gate_up is not None
                assert down is not None
                plan = make_decode_layer(
                    layer.input_layernorm.weight.detach(),
                    layer.post_attention_layernorm.weight.detach(),
                    layer.input_layernorm.eps, qkv, o, gate_up, down,
                    num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads,
                    head_dim=attn.head_dim, scale=attn.scale, window=attn.layer.window,
                    rope_cache=model.rope_cache, owns_kv=attn.layer.owns_kv, dtype=dtype)
        plans.append(plan)
    return plans
