"""Llama-4 text models in the engine: logits and greedy tokens equal transformers'.

Each case saves a tiny random Llama4ForCausalLM (save_pretrained) with chunked RoPE layers
(chunk 8, prompts of 19 tokens cross two chunk boundaries), NoPE layers with query
temperature tuning (floor 4, so the scale moves within the prompt), MoE layers whose
router scales the expert input and dense layers, loads it with infbench and compares fp32
logits (DenseContext) and the engine's greedy tokens (paged KV, chunked prefill of 8 tokens,
block size 4) on the torch and cpu backends.  The chunk mask of the paged kernels (the
Triton ones through the interpreter) is checked against the references.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import dense_logits

from infbench.engine.llm import LLM
from infbench.engine.request import SamplingParams
from infbench.model.loader import load_model

VOCAB, SEQ_LEN, TOL = 96, 19, 1e-4
_BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=24, intermediate_size_mlp=40,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    num_local_experts=4, num_experts_per_tok=1, attention_chunk_size=8,
    no_rope_layer_interval=2, moe_layers=[1, 2], max_position_embeddings=128,
    floor_scale=4, attn_scale=0.5, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    pad_token_id=0)
# layer 0: chunked + dense, 1: NoPE + MoE, 2: chunked + MoE, 3: NoPE + dense
CASES: dict[str, dict[str, Any]] = {
    "scout-like": {},
    "top2-no-qk-norm": dict(num_experts_per_tok=2, use_qk_norm=False),
    "llama3-rope": dict(rope_parameters=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16, rope_theta=500000.0)),
}


def write_hf(tmp: Path, case: str, seed: int = 0) -> Any:
    """Save a tiny random Llama-4 text model of `case`; return it (eval, fp32)."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    cfg = Llama4TextConfig(**{**_BASE, **CASES[case]})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Llama4ForCausalLM(cfg).eval()
    with torch.no_grad():  # random norms and a sharp router: a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("router.weight") or "experts" in name:
                p.normal_(0.0, 0.3)
    model.save_pretrained(tmp)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path: Path, case: str) -> None:
    hf = write_hf(tmp_path, case)
    model = load_model({"path": str(tmp_path)}).model
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    ours = dense_logits(model, ids)
    assert ours.shape == (SEQ_LEN, VOCAB)
    assert (ours - ref).abs().max().item() < TOL


def test_each_llama4_feature_changes_the_logits(tmp_path: Path) -> None:
    """Turning a feature off moves the logits: the parity above exercises every one."""
    write_hf(tmp_path, "scout-like")
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    base = dense_logits(load_model({"path": str(tmp_path)}).model, ids)
    for change in (dict(attention_chunk=None), dict(qk_l2_norm=False),
                   dict(attn_temperature_floor=None), dict(nope_layers=()),
                   dict(moe={"scale_input": False})):
        other = dense_logits(load_model({"path": str(tmp_path)}, overrides=change).model, ids)
        assert (other - base).abs().max().item() > 1e-3, change


def _hf_greedy(hf: Any, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                          min_new_tokens=new_tokens, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


PROMPTS = [[3, 17, 42, 5, 9, 61, 2, 8, 30, 11, 4], [7, 7, 1, 90, 44, 12, 13]]


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_engine_greedy_equals_transformers_generate(tmp_path: Path, backend: str) -> None:
    hf = write_hf(tmp_path, "scout-like", seed=3)
    expected = [_hf_greedy(hf, p, 12) for p in PROMPTS]  # past two chunk boundaries
    llm = LLM(load_model({"path": str(tmp_path)}), backend=backend, max_model_len=64,
              num_kv_blocks=48, block_size=4, max_num_batched_tokens=8)  # chunked prefill
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == expected
    if backend == "cpu":  # the fused C++ decode layer has no chunk / NoPE / temperature
        assert all(plan is None for plan in llm.engine.model.decode_layers)


def test_chunked_layers_free_blocks_behind_the_chunk(tmp_path: Path) -> None:
    """Two KV groups (full NoPE layers, chunked layers of span 8): the chunked group holds
    at most chunk + one step of tokens of a sequence, the full group the whole context."""
    from infbench.engine.kv_groups import kv_group_windows

    write_hf(tmp_path, "scout-like")
    loaded = load_model({"path": str(tmp_path)})
    assert kv_group_windows(loaded.config) == [None, 8]
    llm = LLM(loaded, backend="torch", max_model_len=64, num_kv_blocks=48, block_size=4,
              max_num_batched_tokens=8)
    engine = llm.engine
    held: list[tuple[int, int]] = []
    original = engine.block_manager.release_outside_window

    def spy(seq: Any, window: int | None = None) -> int:
        freed = original(seq, window)
        tables = engine.block_manager.tables(seq)  # group 0: full, 1: chunked
        held.append(tuple(sum(1 for b in t if b >= 0) for t in tables))  # type: ignore[arg-type]
        return freed

    engine.block_manager.release_outside_window = spy  # type: ignore[method-assign]
    llm.generate([list(range(3, 33))], SamplingParams(max_tokens=10, ignore_eos=True))
    full, chunked = zip(*held, strict=True)
    assert max(full) == 10  # 40 tokens in blocks of 4
    assert max(chunked) <= (8 + 8) // 4 + 1 and chunked[-1] < full[-1]


_KERNEL_CHECK = r"""
import torch
from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref
from kernels.prefill_attention import prefill_attention, prefill_attention_ref
torch.manual_seed(0)
blocks, bs, hkv, hq, d = 24, 4, 2, 4, 16
k_cache, v_cache = torch.randn(blocks, bs, hkv, d), torch.randn(blocks, bs, hkv, d)
tables = torch.randperm(blocks).to(torch.int32).view(2, 12)
for chunk in (3, 8):
    lens = torch.tensor([29, 17], dtype=torch.int32)
    for q_tokens in (1, 3):
        q = torch.randn(2, q_tokens, hq, d)
        got = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.3, chunk=chunk,
                                     num_splits=2)
        ref = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.3, chunk=chunk)
        assert (got - ref).abs().max() < 1e-5, (chunk, q_tokens)
    cu = torch.tensor([0, 11, 16], dtype=torch.int32)
    q = torch.randn(16, hq, d)
    got = prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.3, chunk=chunk)
    ref = prefill_attention_ref(q, k_cache, v_cache, cu, lens, tables, 0.3, chunk=chunk)
    assert (got - ref).abs().max() < 1e-5, chunk
print("ok")
"""


def test_triton_kernels_mask_the_chunk_like_the_references() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _KERNEL_CHECK], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_chunk_reference_masks_each_query_to_its_own_chunk() -> None:
    from kernels._paged_attention import attention_ref

    torch.manual_seed(0)
    k, v = torch.randn(1, 1, 10, 4), torch.randn(1, 1, 10, 4)
    q = torch.randn(1, 1, 1, 4)
    for t in range(10):  # chunk 4: the query at t sees keys 4 * (t // 4) .. t
        lo = t - t % 4
        got = attention_ref(q, k, v, torch.tensor([[t]]), 0.5, None, chunk=4)
        want = attention_ref(q, k[:, :, lo:t + 1], v[:, :, lo:t + 1],
                             torch.tensor([[t - lo]]), 0.5, None)
        assert torch.allclose(got, want, atol=1e-6), t


def test_generate_command_emits_transformers_tokens(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli_helpers import run_args

    hf = write_hf(tmp_path, "scout-like", seed=3)
    prompt = PROMPTS[0]
    code, out, err = run_args(["generate", "--model", str(tmp_path), "--prompt-ids",
                               ",".join(map(str, prompt)), "--max-tokens", "10",
                               "--output-ids", "--device", "cpu", "--dtype", "float32",
                               "--backend", "torch"], capsys)
    assert code == 0, err
    assert [int(t) for t in out.strip().split(",")] == _hf_greedy(hf, prompt, 10)


def test_serve_completes_token_prompts_as_transformers(tmp_path: Path) -> None:
    import json
    import urllib.request

    from serve_helpers import start_server

    hf = write_hf(tmp_path, "scout-like", seed=3)
    server = start_server(loaded=load_model({"path": str(tmp_path)}))
    try:
        for prompt in PROMPTS:
            body = json.dumps({"model": "tiny-test", "prompt": prompt, "max_tokens": 8,
                               "temperature": 0, "return_token_ids": True,
                               "ignore_eos": True}).encode()
            req = urllib.request.Request(server.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                choice = json.loads(resp.read())["choices"][0]
            assert choice["token_ids"] == _hf_greedy(hf, prompt, 8)
    finally:
        server.stop()


def test_run_measures_and_prices_a_llama4_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cli_helpers import run_args

    write_hf(tmp_path / "ckpt", "scout-like")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"""
name: llama4_run
device: cpu
dtype: float32
hardware: cpu
model: {{path: {tmp_path / 'ckpt'}}}
workload: {{kind: static, batch_size: [2], prompt_len: 12, gen_len: 6, seed: 0}}
engine: {{block_size: 4, max_num_batched_tokens: 8, backend: torch}}
measure: {{warmup: 0, repeats: 1}}
""")
    code, _, err = run_args(["run", str(scenario), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    doc = json.loads(next((tmp_path / "out").glob("llama4_run_*.json")).read_text())
    m = doc["metrics"]
    assert m["num_requests"] == 2 and m["num_output_tokens"] == 12
    # K and V of 2 KV heads x 8 dims in 4 layers, float32: allocated as the analytic count
    assert m["kv_bytes_per_token"] == 4 * 2 * 2 * 8 * 4


def test_multimodal_checkpoint_runs_its_text_model(tmp_path: Path) -> None:
    """A Llama4ForConditionalGeneration file: the language_model.* tensors load (the vision
    tower is skipped) and give the text model's logits."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=32, image_size=28, patch_size=14, vision_output_dim=32,
                  projector_input_dim=32, projector_output_dim=32)
    cfg = Llama4Config(text_config={**_BASE, "num_hidden_layers": 2, "moe_layers": [1]},
                       vision_config=vision, image_token_index=90, boi_token_index=91,
                       eoi_token_index=92)
    torch.manual_seed(0)
    hf = Llama4ForConditionalGeneration(cfg).eval()
    hf.save_pretrained(tmp_path)
    ids = torch.randint(0, 80, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.language_model(ids[None]).logits[0].float()
    assert (dense_logits(load_model({"path": str(tmp_path)}).model, ids) - ref).abs().max() < TOL


_TRITON_ENGINE = r"""
import sys
from infbench.engine.llm import LLM
from infbench.engine.request import SamplingParams
from infbench.model.loader import load_model
llm = LLM(load_model({"path": sys.argv[1]}), backend="triton", max_model_len=64,
          num_kv_blocks=48, block_size=4, max_num_batched_tokens=8)
outs = llm.generate([[3, 17, 42, 5, 9, 61, 2, 8, 30, 11, 4], [7, 7, 1, 90, 44, 12, 13]],
                    SamplingParams(max_tokens=12, ignore_eos=True))
print(";".join(",".join(map(str, o.outputs[0].token_ids)) for o in outs))
"""


def test_triton_backend_engine_emits_transformers_tokens(tmp_path: Path) -> None:
    """The triton backend (interpreted): chunked paged kernels and the fused MoE kernel
    over input-scaled (token, expert) rows give transformers' greedy tokens."""
    hf = write_hf(tmp_path, "top2-no-qk-norm", seed=3)
    expected = [_hf_greedy(hf, p, 12) for p in PROMPTS]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _TRITON_ENGINE, str(tmp_path)],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = [[int(t) for t in row.split(",")] for row in proc.stdout.strip().split(";")]
    assert got == expected
