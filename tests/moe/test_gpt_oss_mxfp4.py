"""gpt-oss's released MXFP4 expert format (`mlp.experts.{gate_up,down}_proj_{blocks,scales}`):
a tiny transformers checkpoint whose experts are replaced by MXFP4 blocks computed with
kernels/fp_format's quantizer loads as stored under `quant.weights: native` (and
dequantized otherwise); its logits and greedy tokens equal transformers' float model
holding the dequantized experts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from gpt_oss_checkpoints import VOCAB, write_gpt_oss

from infbench.core.config import QuantConfig
from infbench.core.errors import UserError
from infbench.engine.llm import LLM
from infbench.engine.request import SamplingParams
from infbench.model.context import DenseContext
from infbench.model.float_quant import StackedFloatCodes
from infbench.model.loader import load_model
from infbench.model.moe import moe_layers
from kernels.fp_format import quantize_mxfp4

TOL = 1e-4
PROMPTS = [[3, 17, 42, 5, 9, 61, 2, 8, 30, 11, 70], [7, 7, 1, 90, 44, 12, 13]]
NEW_TOKENS = 8
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                 "model.embed_tokens", "lm_head"]


def _to_blocks(stacked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float expert stack in transformers' (E, in, out) layout -> (blocks (E, out, in/32,
    16), scales (E, out, in/32), the dequantized stack in the same (E, in, out) layout)."""
    blocks, scales, values = [], [], []
    for w in stacked.transpose(1, 2):  # (out, in) per expert
        q = quantize_mxfp4(w)
        blocks.append(q.packed.reshape(w.shape[0], -1, 16))
        scales.append(q.scales)
        values.append(q.dequantize().t())
    return torch.stack(blocks), torch.stack(scales), torch.stack(values)


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, int]:
    """(the MXFP4 checkpoint, transformers' float model holding the dequantized experts,
    the stored bytes of its expert blocks and scales)."""
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    hf = write_gpt_oss(path)
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    stored = 0
    params = dict(hf.named_parameters())
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj",
                                                   "experts.down_proj"))]:
        blocks, scales, values = _to_blocks(tensors.pop(name))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
        stored += blocks.numel() + scales.numel()
        with torch.no_grad():
            params[name].copy_(values)
    save_file(tensors, str(file), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": NOT_CONVERTED}
    (path / "config.json").write_text(json.dumps(config))
    return path, hf, stored


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(ids, torch.arange(ids.numel()), DenseContext.single(ids.numel()))
        return model.compute_logits(hidden)  # (T, V)


@pytest.mark.parametrize("weights", ["native", "none"])
def test_logits_equal_transformers_on_the_dequantized_experts(released: tuple[Path, Any, int],
                                                              weights: str) -> None:
    path, hf, stored = released
    loaded = load_model({"path": str(path)}, quant=QuantConfig(weights=weights))
    layers = moe_layers(loaded.model)
    assert len(layers) == 4
    if weights == "native":  # the blocks as stored: no float expert anywhere
        assert all(isinstance(m.w13, StackedFloatCodes) and m.w13.kind == "mxfp4"
                   and isinstance(m.w2, StackedFloatCodes) for m in layers)
        assert sum(m.w13.stored_bytes + m.w2.stored_bytes for m in layers) == stored
        floats = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
        assert loaded.weight_bytes == floats + stored
        assert "mxfp4 experts x8, run as stored" in loaded.source
    else:
        assert all(isinstance(m.w13, torch.nn.Parameter) for m in layers)
        assert "dequantized to the model dtype" in loaded.source
    ids = torch.randint(0, VOCAB, (19,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    assert (_logits(loaded.model, ids) - ref).abs().max().item() < TOL


def test_generate_equals_transformers_greedy(released: tuple[Path, Any, int]) -> None:
    path, hf = released[:2]
    llm = LLM(load_model({"path": str(path)}, quant=QuantConfig(weights="native")),
              backend="torch", max_model_len=64, num_kv_blocks=32, block_size=4,
              max_num_batched_tokens=8)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    with torch.no_grad():
        expected = [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                min_new_tokens=NEW_TOKENS, pad_token_id=0)[0, len(p):].tolist()
                    for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_blocks_without_scales_are_refused(released: tuple[Path, Any, int],
                                           tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "broken"
    shutil.copytree(released[0], copy)
    tensors = load_file(str(copy / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="down_proj_scales") as info:
        load_model({"path": str(copy)}, quant=QuantConfig(weights="native"))
    assert "\n" not in str(info.value)
