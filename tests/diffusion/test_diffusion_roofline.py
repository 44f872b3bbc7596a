"""The analytic price of diffusion decoding, and `infbench predict --diffusion-steps`."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from infbench.core.config import ModelConfig
from infbench.core.errors import ConfigError
from infbench.hardware.spec import get_hardware
from infbench.roofline.costs import param_count
from infbench.roofline.diffusion import (
    DiffusionStepShape,
    diffusion_schedule,
    diffusion_step_costs,
    predict_diffusion,
)

CFG = ModelConfig.from_name("llama2-7b")
H100 = get_hardware("h100-sxm")


def test_attention_is_bidirectional_and_matmuls_see_every_row() -> None:
    shape = DiffusionStepShape(query_len=384, context_len=384, num_logits=256, count=1)
    ops = {op.name: op for op in diffusion_step_costs(CFG, shape, 2, "bfloat16")}
    h, d = CFG.num_heads, CFG.dim_head
    assert ops["attn_score"].flops == pytest.approx(2.0 * 2 * 384 * 384 * h * d * CFG.num_layers)
    # Projections: 2 FLOPs per weight per row, 2 x 384 rows
    dense = param_count(CFG).total - 2 * CFG.vocab_size * CFG.hidden_size  # no embed, no head
    proj = sum(ops[n].flops for n in ("qkv_proj", "o_proj", "mlp"))
    assert proj == pytest.approx(2.0 * 2 * 384 * dense, rel=1e-3)
    assert ops["lm_head"].flops == pytest.approx(2.0 * 2 * 256 * CFG.hidden_size * CFG.vocab_size)


def test_schedule_has_s_steps() -> None:
    assert diffusion_schedule(10, 8, 4, 8, False) == [DiffusionStepShape(18, 18, 8, 4)]
    cached = diffusion_schedule(10, 8, 4, 4, True)
    assert sum(s.count for s in cached) == 4
    assert [(s.query_len, s.count) for s in cached] == [(18, 2), (8, 1), (4, 1)]
    with pytest.raises(ConfigError, match="multiple of the number of blocks"):
        diffusion_schedule(10, 8, 3, 4, False)


def test_compute_bound_where_decode_is_memory_bound_and_one_over_s() -> None:
    preds = [predict_diffusion(CFG, H100, batch=1, prompt_len=128, gen_len=256, steps=s)
             for s in (16, 64, 256)]
    for p in preds:
        assert p.ar_decode_bound == "memory" and p.ar_decode_intensity < 2
        assert {s.bound for s in p.step_prices} == {"compute"} and p.intensity > 100
    # Every step costs the same without a cache: tokens/s x S is constant.
    rates = [p.tokens_per_s * p.steps for p in preds]
    assert rates == pytest.approx([rates[0]] * 3)
    assert preds[0].tokens_per_s > preds[0].ar_tokens_per_s > preds[-1].tokens_per_s


def test_prefix_cache_is_cheaper() -> None:
    kw = dict(batch=4, prompt_len=128, gen_len=256, steps=64, block_length=32)
    plain = predict_diffusion(CFG, H100, prefix_cache=False, **kw)  # type: ignore[arg-type]
    cached = predict_diffusion(CFG, H100, prefix_cache=True, **kw)  # type: ignore[arg-type]
    assert cached.total_time_s < plain.total_time_s
    assert sum(p.shape.count for p in cached.step_prices) == 64


def test_predict_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(monkeypatch, capsys, "predict", "--model", "llama2-7b",
                           "--diffusion-steps", "16,64", "--gen", "256", "--prompt", "128",
                           "--batch", "1,8", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [(r["batch"], r["steps"]) for r in rows] == [(1, 16), (1, 64), (8, 16), (8, 64)]
    assert rows[0]["step_kinds"][0]["bound"] == "compute"
    assert rows[0]["autoregressive"]["decode_bound"] == "memory"


@pytest.mark.parametrize("args", [
    ["--diffusion-steps", "3", "--gen", "8", "--block-length", "4"],
    ["--diffusion-steps", "4", "--gen", "8", "--block-length", "3"],
    ["--diffusion-steps", "4", "--gen", "0"],
    ["--block-length", "4"],
])
def test_predict_cli_bad_input(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, _, err = run_cli(monkeypatch, capsys, "predict", "--model", "tiny", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:")


@pytest.mark.parametrize("prefix", [0, 10])
def test_priced_matmuls_equal_the_engine_forward(prefix: int) -> None:
    """The matmul FLOPs the cost model charges a step equal torch's count of the forward the
    engine runs for it (whole canvas, or the positions after a cached prefix)."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from infbench.model.diffusion import BidirectionalContext, DiffusionLM
    from infbench.model.transformer import Transformer

    cfg = ModelConfig(name="x", vocab_size=64, hidden_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, intermediate_size=96, max_seq_len=64)
    lm = DiffusionLM(Transformer(cfg).eval(), cfg, 63)
    tokens = torch.randint(0, 63, (3, 20), generator=torch.Generator().manual_seed(0))
    lo, hi = 10, 18  # the current block
    with torch.no_grad():
        ctx = BidirectionalContext(3, 20, record_prefix=prefix)
        lm.logits(tokens, ctx)
        ctx = BidirectionalContext(3, 20 - prefix, prefix=ctx.recorded or None)
        with FlopCounterMode(display=False) as counter:
            lm.logits(tokens[:, prefix:], ctx, prefix, (lo - prefix, hi - prefix))
    counted = counter.get_flop_counts()["Global"]
    mm = sum(v for k, v in counted.items() if "mm" in str(k))
    shape = DiffusionStepShape(20 - prefix, 20, hi - lo, 1)
    ops = {op.name: op.flops for op in diffusion_step_costs(cfg, shape, 3, "float32")}
    d, i = cfg.hidden_size, cfg.intermediate_size
    mlp_matmul = 2.0 * 3 * shape.query_len * 3 * d * i * cfg.num_layers  # gate, up, down
    assert mm == pytest.approx(ops["qkv_proj"] + ops["o_proj"] + ops["lm_head"] + mlp_matmul)
    assert ops["mlp"] == pytest.approx(mlp_matmul, rel=0.02)  # + the SiLU-and-mul
