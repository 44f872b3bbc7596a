"""DeepSeek-V3 (noaux_tc router, q-LoRA MLA, a dense layer) against transformers: logits,
greedy tokens through the engine, `run` and `serve`."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
import torch
from moe_checkpoints import VOCAB, write_hf_moe

from infbench.core.config import MoEConfig
from infbench.engine.llm import LLM
from infbench.engine.request import SamplingParams
from infbench.model.context import DenseContext
from infbench.model.layers import SwiGLUMLP
from infbench.model.loader import load_model
from infbench.model.moe import MoEMLP, route
from infbench.roofline.shapes import weight_bytes

TOL = 1e-4
SEQ_LEN = 23
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
        "rope_theta": 10000.0}


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(ids, torch.arange(ids.numel()), DenseContext([0, ids.numel()]))
        return model.compute_logits(hidden)  # (T, V)


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


@pytest.mark.parametrize("rope", ["default", "yarn"])
def test_logits_match_transformers(tmp_path: Path, rope: str) -> None:
    cfg = {"rope_parameters": YARN} if rope == "yarn" else {}
    hf = write_hf_moe(tmp_path, "deepseek_v3", **cfg)
    loaded = load_model({"path": str(tmp_path)})
    c = loaded.config
    assert c.arch == "deepseek_v3" and c.attention.q_lora_rank == 24 and c.moe is not None
    assert (c.moe.topk_method, c.moe.scoring, c.moe.n_group, c.moe.topk_group) == \
        ("noaux_tc", "sigmoid", 4, 2)
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    torch.testing.assert_close(_logits(loaded.model, ids), ref, atol=TOL, rtol=TOL)
    assert loaded.weight_bytes == weight_bytes(c, "float32")  # the correction biases too
    mlps = [layer.mlp for layer in loaded.model.layers]
    assert type(mlps[0]) is SwiGLUMLP and all(isinstance(m, MoEMLP) for m in mlps[1:])
    # The loaded correction bias is the checkpoint's, and it matters: without it the
    # router chooses other experts and the logits move.
    bias = hf.model.layers[1].mlp.gate.e_score_correction_bias
    torch.testing.assert_close(mlps[1].gate.e_score_correction_bias, bias)
    with torch.no_grad():
        for m in mlps[1:]:
            m.gate.e_score_correction_bias.zero_()
    assert (_logits(loaded.model, ids) - ref).abs().max() > 100 * TOL


def test_noaux_tc_chooses_by_biased_scores_and_weighs_unbiased() -> None:
    # 4 experts in 2 groups, keep 1 group, top 2; the bias moves the choice to group 1.
    moe = MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=4,
                    scoring="sigmoid", topk_method="noaux_tc", n_group=2, topk_group=1,
                    norm_topk_prob=False, routed_scaling_factor=2.0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    weights, ids = route(logits, moe, torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert sorted(ids[0].tolist()) == [2, 3]
    expected = 2.0 * torch.tensor([0.0, -1.0]).sigmoid()
    torch.testing.assert_close(weights[0].sort(descending=True).values, expected)
    weights, ids = route(logits, moe, torch.zeros(4))  # unbiased: group 0
    assert sorted(ids[0].tolist()) == [0, 1]
    renorm = dataclasses.replace(moe, norm_topk_prob=True)
    weights, _ = route(logits, renorm, torch.zeros(4))
    assert float(weights.sum()) == pytest.approx(2.0)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_engine_greedy_equals_transformers_generate(tmp_path: Path, backend: str) -> None:
    hf = write_hf_moe(tmp_path, "deepseek_v3", seed=3)
    prompts = [[3, 17, 42, 5, 9, 61, 2, 8, 30], [7, 7, 1, 90, 44, 12, 13]]
    expected = [_hf_greedy(hf, p, 10) for p in prompts]
    llm = LLM(load_model({"path": str(tmp_path)}), backend=backend, max_model_len=64,
              num_kv_blocks=32, block_size=4, max_num_batched_tokens=8)  # chunked prefill
    outs = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_serve_returns_transformers_greedy_tokens(tmp_path: Path) -> None:
    from serve_helpers import MODEL_NAME, byte_tokenizer, start_server

    from infbench.client.openai_target import ClientPlan, TargetRun, open_session, run_requests
    from infbench.measure.workload import generate_requests
    from infbench.scenario.point import WorkloadPoint
    from infbench.scenario.target import TargetSection

    hf = write_hf_moe(tmp_path, "deepseek_v3", seed=4, vocab_size=256)  # the byte tokenizer's
    loaded = load_model({"path": str(tmp_path)})
    loaded.tokenizer = byte_tokenizer()
    workload = WorkloadPoint(kind="offline", num_requests=3, prompt_len=10, gen_len=6, seed=2)
    requests = generate_requests(workload, 256)
    server = start_server(loaded=loaded)
    try:
        target = TargetSection(kind="openai", base_url=server.url + "/v1", model=MODEL_NAME,
                               return_token_ids=True)

        async def main() -> TargetRun:
            async with open_session(target, 3) as session:
                return await run_requests(ClientPlan(target), requests, session=session)

        remote = asyncio.run(main())
    finally:
        server.stop()
    assert not remote.failures, remote.failures[:1]
    got = {r.request_id: r.output_ids for r in remote.records}
    assert got == {r.request_id: _hf_greedy(hf, list(r.prompt_ids), 6) for r in requests}
