"""DeepSeek-V3's MTP module as a speculative proposer (`speculative.method: mtp`): loaded from
the checkpoint's `model.layers.{N}.*`, drafts equal to a full recompute of the module,
speculative greedy output equal to the target's greedy output, and the refusals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from moe_checkpoints import VOCAB, write_hf_deepseek_v3_mtp, write_hf_moe

from infbench.core.errors import UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.engine.llm import LLM
from infbench.engine.request import SamplingParams
from infbench.engine.spec.base import SpecRequest
from infbench.engine.spec.heads import MTPProposer
from infbench.model.context import DenseContext
from infbench.model.loader import load_model, load_mtp_head
from infbench.model.mtp import MTPHead


def _features(model, ids: list[int]) -> torch.Tensor:
    """The target's final-normed hidden states of every position (full recompute)."""
    with torch.inference_mode():  # as the engine runs (the MoE counters are inference tensors)
        return model(torch.tensor(ids), torch.arange(len(ids)), DenseContext([0, len(ids)]))


def _reference_drafts(head: MTPHead, model, ids: list[int], k: int) -> list[int]:
    """Drafts from a full recompute of the module: rows (f_j, x_{j+1}) for j < L-1, then
    (g, draft) rows, all attended densely."""
    f = _features(model, ids[:-1])  # (L-1, H): f_0..f_{L-2}
    hidden, tokens, drafts = list(f), list(ids[1:]), []
    layer = head.layer
    for _ in range(k):
        with torch.inference_mode():
            emb = model.embed_tokens(torch.tensor(tokens))
            rows = layer.eh_proj(torch.cat([layer.enorm(emb), layer.hnorm(torch.stack(hidden))],
                                           dim=-1))
            n = rows.shape[0]
            g = layer(rows, torch.arange(n), DenseContext([0, n], model.config),
                      model.rope_cache)  # (n, H)
            drafts.append(int(head.logits(model, g[-1:]).argmax(-1)))
        hidden.append(g[-1])
        tokens.append(drafts[-1])
    return drafts


def test_mtp_weights_load_and_drafts_equal_a_full_recompute(tmp_path: Path) -> None:
    write_hf_deepseek_v3_mtp(tmp_path)
    loaded = load_model({"path": str(tmp_path)})  # the main model skips model.layers.3.*
    assert loaded.config.num_mtp_layers == 1
    head = load_mtp_head(loaded)
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / "mtp.safetensors"))
    torch.testing.assert_close(head.layer.eh_proj.weight, stored["model.layers.3.eh_proj.weight"])
    torch.testing.assert_close(head.layer.mlp.gate.e_score_correction_bias,
                               stored["model.layers.3.mlp.gate.e_score_correction_bias"])
    proposer = MTPProposer(loaded.model, head)
    seqs = {1: [3, 17, 42, 5, 9, 61, 2, 8], 2: [7, 7, 1, 90, 44]}
    for step in range(3):  # the sequences grow; the proposer catches up on new features
        requests = []
        for seq_id, ids in seqs.items():
            f = _features(loaded.model, ids[:-1])
            proposer.observe(seq_id, 0, 0, f)  # re-sent from 0: entries must stay valid
            requests.append(SpecRequest(seq_id, list(ids), 3, SamplingParams(), [], 0))
        got = [p.tokens for p in proposer.propose(requests)]
        want = [_reference_drafts(head, loaded.model, ids, 3) for ids in seqs.values()]
        assert got == want, step
        for ids in seqs.values():
            ids.append((ids[-1] * 7 + step) % VOCAB)


@pytest.mark.parametrize(("num_tokens", "backend"), [(1, "torch"), (3, "torch"), (3, "cpu")])
def test_mtp_speculation_is_lossless(tmp_path: Path, num_tokens: int, backend: str) -> None:
    hf = write_hf_deepseek_v3_mtp(tmp_path, seed=2)
    prompts = [[3, 17, 42, 5, 9, 61, 2, 8, 30], [7, 7, 1, 90, 44, 12, 13]]
    with torch.no_grad():
        expected = [[int(t) for t in hf.generate(torch.tensor([p]), max_new_tokens=12,
                                                 min_new_tokens=12, do_sample=False,
                                                 pad_token_id=0)[0, len(p):]]
                    for p in prompts]
    llm = LLM(load_model({"path": str(tmp_path)}), backend=backend, max_model_len=64,
              num_kv_blocks=32, block_size=4, speculative=SpeculativeConfig("mtp", num_tokens))
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == expected
    drafts = [d for s in llm.last_steps for d in s.spec_drafts]
    accepted = [a for s in llm.last_steps for a in s.spec_accepted]
    assert drafts and max(drafts) == num_tokens and len(accepted) == len(drafts)
    assert all(0 <= a <= d for a, d in zip(accepted, drafts, strict=True))


def test_mtp_without_its_weights_is_refused(tmp_path: Path) -> None:
    write_hf_moe(tmp_path / "none", "deepseek_v3", num_nextn_predict_layers=1)  # no layer 3
    for path, message in [(tmp_path / "none", "has no MTP weights (model.layers.3.eh_proj"),
                          (None, "has no MTP module")]:
        if path is None:
            write_hf_moe(tmp_path / "zero", "deepseek_v3")  # num_nextn_predict_layers 0
            path = tmp_path / "zero"
        with pytest.raises(UserError, match=re.escape(message)) as err:
            LLM(load_model({"path": str(path)}), backend="torch", max_model_len=32,
                num_kv_blocks=8, block_size=4, speculative=SpeculativeConfig("mtp", 1))
        assert "\n" not in str(err.value)


def test_generate_speculates_with_mtp_and_refuses_without_it(monkeypatch, capsys,
                                                            tmp_path: Path) -> None:
    from cli_helpers import run_cli

    prompt = [3, 17, 42, 5, 9, 61, 2, 8]
    hf = write_hf_deepseek_v3_mtp(tmp_path / "mtp", seed=5)
    capsys.readouterr()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8,
                          do_sample=False, pad_token_id=0)
    expected = [int(t) for t in out[0, len(prompt):]]
    flags = ["--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", "8", "--output-ids",
             "--device", "cpu", "--dtype", "float32", "--backend", "torch", "--speculative", "mtp",
             "--num-speculative-tokens", "2"]
    code, out_text, err = run_cli(monkeypatch, capsys, "generate", "--model",
                                  str(tmp_path / "mtp"), *flags)
    assert code == 0, err
    assert [int(t) for t in out_text.strip().split(",")] == expected
    write_hf_moe(tmp_path / "plain", "deepseek_v3", num_nextn_predict_layers=1)
    capsys.readouterr()  # transformers' save progress bar
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", str(tmp_path / "plain"),
                           *flags)
    errors = [line for line in err.strip().splitlines() if not line.startswith("note:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("error:"), err
    assert "has no MTP weights" in errors[0]
