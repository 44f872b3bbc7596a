"""Tiny Llama checkpoints whose projections are stored in fp8 (DeepSeek-V3's block scales,
compressed-tensors' per-tensor / per-channel scales) or nvfp4 (ModelOpt), written here
from a transformers checkpoint, with a float twin that holds the dequantized weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from model_checkpoints import write_hf_llama
from safetensors.torch import load_file, save_file

from kernels.fp_format import quantize_fp8, quantize_mxfp4, quantize_nvfp4

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STYLES = {
    "deepseek-block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                       "weight_block_size": [32, 32]},
    "ct-tensor": {"quant_method": "compressed-tensors", "format": "float-quantized",
                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                      "num_bits": 8, "type": "float", "strategy": "tensor"}}},
                  "ignore": ["lm_head"]},
    "ct-channel": {"quant_method": "compressed-tensors", "format": "float-quantized",
                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                       "num_bits": 8, "type": "float", "strategy": "channel"}}},
                   "ignore": ["lm_head"]},
    "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
    "mxfp4": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                  "num_bits": 4, "type": "float", "group_size": 32}}},
              "ignore": ["lm_head"]},
}


def _stored(style: str, w: torch.Tensor, block: int = 32
            ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The tensors one projection is stored as (suffix -> tensor) and its float values."""
    if style == "mxfp4":  # the scales as torch's E8M0 dtype (F8_E8M0 in the file)
        q = quantize_mxfp4(w)
        return {"weight": q.packed, "weight_scale": q.scales.view(torch.float8_e8m0fnu)}, \
            q.dequantize()
    if style == "nvfp4":
        q = quantize_nvfp4(w)
        return {"weight": q.packed, "weight_scale": q.scales,
                "weight_scale_2": q.global_scale.clone()}, q.dequantize()
    if style == "deepseek-block":
        from kernels.fp_format import Fp8Weight, round_e4m3

        # block x block tiles (the config's weight_block_size), each scaled by its max / 448
        n, k = w.shape
        gn, gk = -(-n // block), -(-k // block)
        amax = torch.zeros(gn, gk)
        for i in range(gn):
            for j in range(gk):
                amax[i, j] = w[i * block:(i + 1) * block, j * block:(j + 1) * block].abs().max()
        scales = amax / 448
        full = scales.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
        q = Fp8Weight(round_e4m3(w / full), scales, block, block)
        return {"weight": q.codes, "weight_scale_inv": q.scales}, q.dequantize()
    q = quantize_fp8(w, "tensor" if style == "ct-tensor" else "channel")
    scale = q.scales.reshape(()) if style == "ct-tensor" else q.scales  # () or (N, 1)
    return {"weight": q.codes, "weight_scale": scale}, q.dequantize()


def write_fp_checkpoint(tmp: Path, style: str, input_scales: bool = False, block: int = 32,
                        **cfg: Any) -> tuple[Path, Path]:
    """(quantized checkpoint dir, float twin dir holding the dequantized weights); `block`:
    the fp8 tile of the deepseek-block style."""
    float_dir, quant_dir, twin_dir = tmp / "float", tmp / style, tmp / f"{style}-twin"
    write_hf_llama(float_dir, **cfg)
    tensors = load_file(str(float_dir / "model.safetensors"))
    quant: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        prefix = name.removesuffix(".weight")
        if prefix.rpartition(".")[2] not in PROJECTIONS:
            quant[name] = twin[name] = tensor
            continue
        stored, values = _stored(style, tensor.float(), block)
        for suffix, t in stored.items():
            quant[f"{prefix}.{suffix}"] = t.contiguous()
        if input_scales:
            quant[f"{prefix}.input_scale"] = torch.tensor(0.01)
        twin[name] = values
    for out, payload, qc in ((quant_dir, quant, STYLES[style]), (twin_dir, twin, None)):
        out.mkdir()
        config = json.loads((float_dir / "config.json").read_text())
        if qc is not None:
            config["quantization_config"] = dict(qc)
            if "weight_block_size" in qc:
                config["quantization_config"]["weight_block_size"] = [block, block]
        (out / "config.json").write_text(json.dumps(config))
        save_file(payload, str(out / "model.safetensors"))
    return quant_dir, twin_dir
