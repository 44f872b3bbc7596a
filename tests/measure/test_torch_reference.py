"""The plain-torch reference of the `torch_reference` gate: same function as the model,
the run's work in waves, refused layouts, the bracketed per-repeat figure."""

from __future__ import annotations

import pytest
import torch

from infbench.core.config import ModelConfig
from infbench.engine.request import Request, SamplingParams
from infbench.measure.torch_reference import (
    ReferencePlan,
    ReferenceRun,
    SameRunReference,
    TorchReference,
    Wave,
    unsupported_reason,
)
from infbench.model.context import DenseContext
from infbench.model.transformer import Transformer


def _config(**over: object) -> ModelConfig:
    base = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=96,
                vocab_size=211, max_seq_len=64)
    return ModelConfig.from_name("tiny").with_overrides(**{**base, **over})


def _model(cfg: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # random, not the constructor's ones/zeros
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    return model.eval()


def _greedy_recompute(model: Transformer, prompt: list[int], gen_len: int) -> list[int]:
    """The model's greedy tokens, recomputing the whole sequence each step (no cache)."""
    ids = list(prompt)
    for _ in range(gen_len):
        with torch.no_grad():
            hidden = model(torch.tensor(ids), torch.arange(len(ids)), DenseContext.single(len(ids)))
            ids.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
    return ids[len(prompt):]


@pytest.mark.parametrize("attention", [{"kind": "mha"}, {"kind": "gqa", "kv_heads": 2},
                                       {"kind": "mqa"}], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("tied", [False, True], ids=["lm_head", "tied"])
def test_reference_computes_the_models_function(attention: dict[str, object], tied: bool) -> None:
    cfg = _config(attention=attention, tie_word_embeddings=tied)
    model = _model(cfg)
    ref = TorchReference(cfg, torch.float32, "cpu")
    ref.load_state_dict(model.state_dict())
    prompts = torch.randint(0, cfg.vocab_size, (3, 7), generator=torch.Generator().manual_seed(1))
    # prefill logits of every row against the model's own forward
    cache = [torch.zeros(2, 3, cfg.kv_heads, 12, cfg.dim_head) for _ in range(cfg.num_layers)]
    with torch.no_grad():
        logits = ref.forward(prompts, 0, cache)  # (3, V)
        for b in range(3):
            hidden = model(prompts[b], torch.arange(7), DenseContext.single(7))
            torch.testing.assert_close(logits[b], model.compute_logits(hidden[-1:])[0],
                                       rtol=1e-4, atol=1e-5)
    # decode through the dense cache gives the tokens of a full recompute
    out = ref.generate(prompts, 5)
    for b in range(3):
        assert out[b].tolist() == _greedy_recompute(model, prompts[b].tolist(), 5)


def test_random_weights_have_the_models_shapes_and_bytes() -> None:
    cfg = _config(attention={"kind": "gqa", "kv_heads": 2})
    model = _model(cfg)
    ref = TorchReference(cfg, torch.float32, "cpu", seed=3)
    state = model.state_dict()
    assert {k: tuple(v.shape) for k, v in ref.weights.items()} == {
        k: tuple(state[k].shape) for k in ref.weights}
    assert ref.weight_bytes == sum(v.numel() * 4 for v in model.parameters())
    again = TorchReference(cfg, torch.float32, "cpu", seed=3)
    assert all(torch.equal(ref.weights[k], again.weights[k]) for k in ref.weights)


def test_load_state_dict_refuses_another_shape() -> None:
    ref = TorchReference(_config(), torch.float32, "cpu")
    state = _model(_config(intermediate_size=128)).state_dict()
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.gate_up_proj\.weight: shape"):
        ref.load_state_dict(state)


@pytest.mark.parametrize("over,reason", [
    ({"attention": {"kind": "mla", "kv_lora_rank": 32, "q_lora_rank": None,
                    "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16},
      "arch": "deepseek_v2"}, "arch 'deepseek_v2'"),
    ({"attention": {"kind": "cla", "cla_group": 2}}, "attention.kind 'cla'"),
    ({"attention": {"kind": "sliding", "window": 8}}, "attention.kind 'sliding'"),
])
def test_unsupported_layouts_are_refused(over: dict[str, object], reason: str) -> None:
    cfg = _config(**over)
    assert unsupported_reason(cfg) == reason
    with pytest.raises(ValueError, match="does not run"):
        TorchReference(cfg, torch.float32, "cpu")
    moe = ModelConfig.from_name("tiny-moe")
    assert unsupported_reason(moe) == "mixture-of-experts MLPs"


def _request(i: int, prompt_len: int, gen_len: int, n: int = 1) -> Request:
    return Request(f"r{i}", tuple(range(1, prompt_len + 1)),
                   SamplingParams(max_tokens=gen_len, ignore_eos=True), n=n)


def test_plan_waves_follow_the_engine_batch() -> None:
    reqs = [_request(0, 10, 4), _request(1, 12, 3), _request(2, 5, 6, n=2)]
    plan = ReferencePlan.for_requests(reqs, max_num_seqs=3)
    # rows: (10, 4), (12, 3), (5, 6), (5, 6): a wave of 3 padded to 12 / 6, then one row
    assert plan.waves == (Wave(3, 12, 6), Wave(1, 5, 6))
    assert plan.num_output_tokens == 3 * 6 + 6
    assert plan.max_len == 18
    fixed = ReferencePlan.for_requests([_request(i, 64, 32) for i in range(8)], 256)
    assert fixed.waves == (Wave(8, 64, 32),) and fixed.num_output_tokens == 8 * 32
    with pytest.raises(ValueError, match="at least one request"):
        ReferencePlan.for_requests([], 4)


def test_run_times_the_plan() -> None:
    cfg = _config()
    ref = TorchReference(cfg, torch.float32, "cpu")
    plan = ReferencePlan((Wave(2, 6, 4), Wave(1, 3, 2)))
    run = ref.run(plan)
    assert run.num_output_tokens == 10 and run.wall_s > 0
    assert run.output_tokens_per_s == pytest.approx(10 / run.wall_s)


def test_bracket_is_the_mean_time_of_the_passes_around_a_repeat() -> None:
    row = SameRunReference.bracket(ReferenceRun(0.2, 100), ReferenceRun(0.3, 100))
    assert row["wall_s"] == pytest.approx(0.25)
    assert row["output_tokens_per_s"] == pytest.approx(400.0)
    assert row["num_output_tokens"] == 100
    assert row["num_threads"] == torch.get_num_threads()
