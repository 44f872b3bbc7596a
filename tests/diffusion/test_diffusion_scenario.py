"""`decoding: {kind: diffusion}` scenarios end to end: run, the result schema, report, plots,
and bad input as one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

from infbench.plots.measured import measured_roofline_points
from infbench.results.schema import validate

SCENARIO = """
name: dlm
device: cpu
dtype: float32
hardware: cpu
model: {{preset: tiny, weights: random, overrides: {{max_seq_len: 64}}}}
workload: {{kind: static, batch_size: [1, 2], prompt_len: 6, gen_len: 8, seed: 0}}
engine: {{num_threads: 1}}
measure: {{warmup: 0, repeats: 1}}
variants:
  - {{label: ar}}
  - {{label: dlm, decoding: {decoding}}}
"""
GOOD = "{kind: diffusion, steps: 4, block_length: 4, prefix_cache: true, mask_token_id: 255}"


def _write(tmp_path: Path, decoding: str) -> str:
    path = tmp_path / "dlm.yaml"
    path.write_text(SCENARIO.format(decoding=decoding))
    return str(path)


def test_run_report_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(monkeypatch, capsys, "run", _write(tmp_path, GOOD), "--out", str(out))
    assert code == 0, err
    results = [json.loads(p.read_text()) for p in sorted(out.glob("dlm_*.json"))]
    assert len(results) == 4
    ar, dlm = results[:2], results[2:]
    for r in dlm:
        validate(r)
        batch = r["scenario"]["workload"]["batch_size"]
        assert r["scenario"]["decoding"]["steps"] == 4
        assert len(r["steps"]) == 4 and r["metrics"]["num_steps"] == 4
        assert r["metrics"]["num_output_tokens"] == 8 * batch
        assert sum(s["num_decode_tokens"] for s in r["steps"]) == 8 * batch  # L tokens
        # prefix cache, blocks of 4: the block's later steps run the block onwards only
        assert [s["query_lens"][0] for s in r["steps"]] == [14, 8, 14, 4]
        assert r["metrics"]["diffusion"]["intensity"] > 0
        assert r["prediction"]["diffusion"]["intensity"] > 0
        assert r["prediction"]["output_tokens_per_s"] > 0
        assert 255 not in r["diffusion"]["sample_tokens"]
        assert r["diffusion"]["analytic"]["autoregressive"]["tokens_per_s"] > 0
    assert all("decoding" not in r["scenario"] for r in ar)  # autoregressive as before
    # the measured and predicted diffusion stages land on the roofline
    points = measured_roofline_points(dlm)
    stages = {(p.kind, p.stage) for p in points}
    assert {("measured", "diffusion"), ("predicted", "diffusion")} <= stages
    from infbench.hardware.spec import get_hardware

    peak = get_hardware("cpu").peak_at("float32", None)
    for p in points:  # a predicted step sits on the roof: its FLOPs over its own time
        if p.kind == "predicted" and p.stage == "diffusion":
            roof = min(peak, p.intensity * get_hardware("cpu").bandwidth)
            assert p.flops_per_s == pytest.approx(roof, rel=1e-6)
    code, table, err = run_cli(monkeypatch, capsys, "report", str(out))
    assert code == 0, err
    assert "dlm" in table
    code, _, err = run_cli(monkeypatch, capsys, "plots", str(out), "--out", str(tmp_path / "f"))
    assert code == 0, err
    assert any((tmp_path / "f").iterdir())


@pytest.mark.parametrize("decoding,match", [
    ("{kind: diffusion, steps: 3, block_length: 4, mask_token_id: 255}",
     "multiple of the number of blocks"),
    ("{kind: diffusion, steps: 4, block_length: 3, mask_token_id: 255}", "must divide"),
    ("{kind: diffusion, steps: 4}", "has no mask token"),
    ("{kind: diffusion, mask_token_id: 255}", "decoding.steps: required"),
    ("{steps: 4}", "applies to kind: diffusion only"),
    ("{kind: diffusion, steps: 4, remasking: top}", "remasking"),
])
def test_bad_decoding_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str], decoding: str,
                                  match: str) -> None:
    code, _, err = run_cli(monkeypatch, capsys, "run", _write(tmp_path, decoding), "--out",
                           str(tmp_path / "out"))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], err


def _llada_dir(root: Path) -> Path:
    """A tiny LLaDA-format checkpoint (random weights, mask token 250) written here."""
    import torch
    from safetensors.torch import save_file

    from infbench.model.diffusion import LLADA_NAMES, LLADA_TOP

    hidden, inter, layers, vocab = 32, 48, 2, 256
    gen = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.05

    shapes = {"q_proj.weight": (hidden, hidden), "k_proj.weight": (hidden, hidden),
              "v_proj.weight": (hidden, hidden), "attn_out.weight": (hidden, hidden),
              "ff_proj.weight": (inter, hidden), "up_proj.weight": (inter, hidden),
              "ff_out.weight": (hidden, inter), "attn_norm.weight": (hidden,),
              "ff_norm.weight": (hidden,)}
    assert set(shapes) == set(LLADA_NAMES)
    tensors = {f"model.transformer.blocks.{i}.{k}": w(*v) for i in range(layers)
               for k, v in shapes.items()}
    top = {"model.transformer.wte.weight": (vocab, hidden),
           "model.transformer.ln_f.weight": (hidden,),
           "model.transformer.ff_out.weight": (vocab, hidden)}
    assert set(top) == set(LLADA_TOP)
    tensors.update({k: w(*v) for k, v in top.items()})
    root.mkdir()
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({
        "model_type": "llada", "d_model": hidden, "n_heads": 4, "n_kv_heads": 4,
        "n_layers": layers, "mlp_hidden_size": inter, "vocab_size": vocab,
        "embedding_size": vocab, "max_sequence_length": 64, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "weight_tying": False, "mask_token_id": 250}))
    return root


def test_llada_directory_in_a_scenario_and_predict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = _llada_dir(tmp_path / "llada")
    scenario = tmp_path / "llada.yaml"
    scenario.write_text(f"""
name: llada
device: cpu
dtype: float32
hardware: cpu
model: {{path: {ckpt}}}
workload: {{kind: static, batch_size: 2, prompt_len: 5, gen_len: 6, seed: 0}}
measure: {{warmup: 0, repeats: 1}}
decoding: {{kind: diffusion, steps: 3, remasking: random}}
""")
    out = tmp_path / "out"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out", str(out))
    assert code == 0, err
    (result,) = [json.loads(p.read_text()) for p in out.glob("llada_*.json")]
    assert result["diffusion"]["mask_token_id"] == 250  # from config.json
    assert result["model_config"]["hidden_size"] == 32 and result["metrics"]["num_steps"] == 3
    assert 250 not in result["diffusion"]["sample_tokens"]
    code, text, err = run_cli(monkeypatch, capsys, "predict", "--model", str(ckpt),
                              "--diffusion-steps", "2,4", "--gen", "8", "--prompt", "8",
                              "--hardware", "cpu", "--json")
    assert code == 0, err
    assert [r["steps"] for r in json.loads(text)] == [2, 4]
