"""Quantized GGUF writers for the model tests: tiny llama.cpp-style files with Q4_0 ... Q6_K.

gguf-py quantizes Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/BF16 itself; for the K-quants (which it only
dequantizes) the blocks are built here from the layouts of ggml's `ggml-common.h`
(round to nearest, two-level scales), and `test_gguf_kquants` checks each packer against
gguf-py's dequantization.  Q2_K / Q3_K blocks are random bytes with a chosen fp16 `d`
(every bit pattern of their codes and 4/6-bit scales is a valid block).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from model_checkpoints import llama_cpp_permute
from torch.utils._python_dispatch import TorchDispatchMode

QK_K = 256
LEAVES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    """(nb,) float -> (nb, 2) uint8 (little-endian fp16)."""
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(-1, 2)


# ------------------------------------------------------------------------ packers
def pack_q4_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(nb, 8) 6-bit sc and m -> (nb, 12) bytes: the inverse of gguf-py's get_scale_min."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    lo = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    mid = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    hi = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo, mid, hi], axis=1).astype(np.uint8)


def pack_q4_k(codes: np.ndarray, sc: np.ndarray, m: np.ndarray, d: np.ndarray,
              dmin: np.ndarray) -> np.ndarray:
    """codes (nb, 256) in 0..15 -> (nb, 144): d, dmin, scales, 4 chunks of 32 bytes whose
    low nibbles are values 64j..64j+31 and high nibbles 64j+32..64j+63."""
    c = codes.astype(np.uint8).reshape(-1, 4, 2, 32)
    qs = (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), pack_q4_k_scales(sc, m), qs], 1)


def pack_q5_k(codes: np.ndarray, sc: np.ndarray, m: np.ndarray, d: np.ndarray,
              dmin: np.ndarray) -> np.ndarray:
    """codes (nb, 256) in 0..31 -> (nb, 176): d, dmin, scales, qh (bit i of byte b: the
    fifth bit of value 32i + b), then Q4_K's nibbles of the low four bits."""
    c = codes.astype(np.uint8)
    high = ((c >> 4) & 1).reshape(-1, 8, 32)
    qh = np.zeros((c.shape[0], 32), np.uint8)
    for i in range(8):
        qh |= high[:, i] << i
    low = (c & 0x0F).reshape(-1, 4, 2, 32)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), pack_q4_k_scales(sc, m), qh, qs],
                          1)


def pack_q6_k(codes: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """codes (nb, 256) in 0..63 (value + 32), sc (nb, 16) int8 -> (nb, 210): ql, qh, sc, d.

    Per half h of 128 values: ql byte b holds values 128h+b (low nibble) and 128h+64+b
    (high nibble); qh byte c holds the top two bits of 128h+32s+c at bit 2s."""
    c = codes.astype(np.uint8).reshape(-1, 2, 128)
    ql = ((c[:, :, :64] & 0x0F) | ((c[:, :, 64:] & 0x0F) << 4)).reshape(-1, 128)
    top = (c >> 4).reshape(-1, 2, 4, 32)
    qh = np.zeros((c.shape[0], 2, 32), np.uint8)
    for s in range(4):
        qh |= top[:, :, s] << (2 * s)
    return np.concatenate([ql, qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8),
                           _f16_bytes(d)], 1)


# ------------------------------------------------------------------------ quantizers
def _rows_to_blocks(w: np.ndarray, size: int) -> np.ndarray:
    n, k = w.shape
    assert k % size == 0, f"{k} columns are not whole blocks of {size}"
    return w.astype(np.float32).reshape(n * k // size, size)


def _two_level(values: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Per super-block: fp16 d = max / top and integer multipliers round(values / d)."""
    d = (values.max(axis=1) / top).astype(np.float16)
    safe = np.where(d == 0, 1, d.astype(np.float32))[:, None]
    return d, np.clip(np.round(values / safe), 0, top)


def quantize_q45_k(w: np.ndarray, bits: int) -> np.ndarray:
    """Q4_K (bits 4) or Q5_K (bits 5) by round to nearest: (N, K) -> (N, K / 256 * 144|176)."""
    n = w.shape[0]
    levels = (1 << bits) - 1
    x = _rows_to_blocks(w, QK_K).reshape(-1, 8, 32)
    lo = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - lo) / levels
    d, sc = _two_level(scale, 63)
    dmin, m = _two_level(-lo, 63)
    step = (d.astype(np.float32)[:, None] * sc)[..., None]
    offset = (dmin.astype(np.float32)[:, None] * m)[..., None]
    codes = np.clip(np.round((x + offset) / np.where(step == 0, 1, step)), 0, levels)
    pack = pack_q4_k if bits == 4 else pack_q5_k
    blocks = pack(codes.reshape(-1, QK_K), sc, m, d, dmin)
    return blocks.reshape(n, -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """Q6_K by round to nearest: (N, K) -> (N, K / 256 * 210)."""
    n = w.shape[0]
    x = _rows_to_blocks(w, QK_K).reshape(-1, 16, 16)
    scale = np.abs(x).max(axis=2) / 31.0
    d, sc = _two_level(scale, 127)
    step = (d.astype(np.float32)[:, None] * sc)[..., None]
    codes = np.clip(np.round(x / np.where(step == 0, 1, step)), -32, 31) + 32
    return pack_q6_k(codes.reshape(-1, QK_K), sc.astype(np.int8), d).reshape(n, -1)


def random_k_blocks(w: np.ndarray, type_name: str, seed: int = 0) -> np.ndarray:
    """Q2_K / Q3_K blocks of random bytes for an (N, K) tensor, d set from w's scale."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    n, k = w.shape
    blocks = np.random.default_rng(seed).integers(0, 256, (n * k // QK_K, size), np.uint8)
    d = np.full(blocks.shape[0], float(np.abs(w).max()) / 64, np.float32)
    if type_name == "Q2_K":  # ... scales[16], qs[64], d, dmin
        blocks[:, -4:] = np.concatenate([_f16_bytes(d), _f16_bytes(d)], 1)
    else:  # Q3_K: hmask[32], qs[64], scales[12], d
        blocks[:, -2:] = _f16_bytes(d)
    return blocks.reshape(n, -1)


def quantize(w: np.ndarray, type_name: str) -> np.ndarray:
    """An (N, K) float matrix in GGUF type `type_name`, as the file stores it."""
    import gguf

    if type_name == "Q4_K":
        return quantize_q45_k(w, 4)
    if type_name == "Q5_K":
        return quantize_q45_k(w, 5)
    if type_name == "Q6_K":
        return quantize_q6_k(w)
    if type_name in ("Q2_K", "Q3_K"):
        return random_k_blocks(w, type_name)
    return gguf.quants.quantize(w.astype(np.float32), gguf.GGMLQuantizationType[type_name])


# ------------------------------------------------------------------------ files
class FloatAllocations(TorchDispatchMode):
    """Records (shape, dtype) of every real (non-meta) float tensor torch creates: a load
    under `weights: native` must make no float copy of a matrix it keeps quantized."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[tuple[int, ...], torch.dtype]] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type != "meta":
                self.seen.add((tuple(t.shape), t.dtype))
        return out


def spy_dequantize(monkeypatch: Any) -> list[tuple[int, ...]]:
    """The shapes of every tensor gguf-py dequantizes from now on (gguf.quants.dequantize
    patched for the test): a native load must not dequantize what it keeps stored."""
    import gguf.quants

    shapes: list[tuple[int, ...]] = []
    real = gguf.quants.dequantize

    def spy(data: Any, qtype: Any) -> Any:
        out = real(data, qtype)
        shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(gguf.quants, "dequantize", spy)
    return shapes


# ------------------------------------------------------------------------ files
def write_quantized_gguf(model: Any, path: Path, types: dict[str, str] | str,
                         embedding: str = "F32", head: str = "F32") -> dict[str, np.ndarray]:
    """Write a HF Llama as a llama.cpp-style GGUF whose projections are quantized.

    types: one GGUF type for every projection, or HF leaf (q_proj, ..., down_proj) -> type
    (leaves not named stay F32); embedding: token_embd's type; head: output's type (an
    untied model only: a tied one has no output tensor).  Returns the file's data of every
    tensor (by GGUF name)."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    written: dict[str, np.ndarray] = {}
    for name, t in model.state_dict().items():
        arr = t.detach().float().numpy()
        kind = "F32"
        if name == "model.embed_tokens.weight":
            out, kind = "token_embd.weight", embedding
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            if c.tie_word_embeddings:
                continue
            out, kind = "output.weight", head
        else:
            parts = name.split(".")  # model.layers.N.(self_attn|mlp).X.weight
            leaf = parts[-2]
            out = f"blk.{parts[2]}.{LEAVES[leaf]}.weight"
            if arr.ndim == 2:
                kind = types if isinstance(types, str) else types.get(leaf, "F32")
            if leaf == "q_proj":
                arr = llama_cpp_permute(arr, c.num_attention_heads)
            elif leaf == "k_proj":
                arr = llama_cpp_permute(arr, c.num_key_value_heads)
        if kind == "F32":
            data = arr
            w.add_tensor(out, data)
        elif kind in ("F16",):
            data = arr.astype(np.float16)
            w.add_tensor(out, data)
        else:
            data = quantize(arr, kind)
            w.add_tensor(out, data, raw_dtype=gguf.GGMLQuantizationType[kind])
        written[out] = data
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written
