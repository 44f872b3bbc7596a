"""A whole decoder layer of a decode step in one C++ call (kernels/csrc/decode_layer.cpp).

The `cpu` backend's per-layer fixed cost is mostly Python: module dispatch, argument
checks and tensor wrappers around ~10 small kernel calls.  `make_decode_layer` builds,
once per layer, an object holding the layer's weights and shapes; its `run(x, residual,
positions, k_cache, v_cache, slot_mapping, tables, context_lens)` calls the same kernels
as the per-op path (so the outputs are identical) and returns (out, residual) as the
model's `DecoderLayer.forward_fused` does, which is its reference.

A projection is described by a tuple: ("dense", weight (N, K), bias | None) or
("quant", codes, scales, mins | None, group_size, bias | None) in kernels/quant_format.py's
layout.
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.cpu_ops import module

MAX_ROWS = 32  # decodes per call: the GEMV kernels' range
ProjSpec = tuple[Any, ...]


def make_decode_layer(in_norm: torch.Tensor, post_norm: torch.Tensor, eps: float,
                      qkv: ProjSpec, o: ProjSpec, gate_up: ProjSpec, down: ProjSpec, *,
                      num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                      window: int | None, rope_cache: torch.Tensor, owns_kv: bool,
                      dtype: torch.dtype) -> Any:
    """The C++ DecodeLayer of one softmax-attention + SwiGLU layer (see the module doc)."""
    return module().DecodeLayer(in_norm, post_norm, eps, qkv, o, gate_up, down, num_heads,
                                num_kv_heads, head_dim, scale, window or 0, rope_cache,
                                owns_kv, dtype)
