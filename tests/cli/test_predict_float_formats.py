"""`infbench predict --quant fp8|mxfp4|nvfp4 --activations ... --fp8-scales ...` and their
refusals: one `error:` line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

from infbench.core.config import ModelConfig, QuantConfig
from infbench.hardware.spec import get_hardware
from infbench.roofline.analysis import predict
from infbench.roofline.shapes import weight_bytes

PREDICT = ["predict", "--model", "llama3-8b", "--batch", "8", "--prompt", "2048", "--gen", "4"]


def predicted(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              *args: str) -> dict:
    code, out, err = run_cli(monkeypatch, capsys, *PREDICT, *args, "--json")
    assert code == 0, err
    return json.loads(out)[0]


def test_the_flags_price_what_the_api_prices(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ModelConfig.from_name("llama3-8b")
    for flags, quant, hardware in (
            (["--quant", "fp8", "--fp8-scales", "block"],
             QuantConfig(weights="fp8", fp8_scales="block"), "h100-sxm"),
            (["--quant", "fp8", "--activations", "fp8"],
             QuantConfig(weights="fp8", activations="fp8"), "h100-sxm"),
            (["--quant", "nvfp4", "--activations", "fp4", "--hardware", "b200"],
             QuantConfig(weights="nvfp4", activations="fp4"), "b200")):
        got = predicted(monkeypatch, capsys, *flags)
        want = predict(cfg, get_hardware(hardware), batch=8, prompt_len=2048, gen_len=4,
                       dtype="bfloat16", quant=quant)
        assert got["weight_bytes"] == weight_bytes(cfg, "bfloat16", quant)
        assert got["ttft_s"] == pytest.approx(want.ttft_s)
        assert got["quant"]["activations"] == quant.activations


def test_w8a8_prefill_is_faster_than_w8a16(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    w8a16 = predicted(monkeypatch, capsys, "--quant", "fp8")
    w8a8 = predicted(monkeypatch, capsys, "--quant", "fp8", "--activations", "fp8")
    assert w8a8["weight_bytes"] == w8a16["weight_bytes"]
    assert w8a8["ttft_s"] < 0.75 * w8a16["ttft_s"]
    same = predicted(monkeypatch, capsys, "--quant", "fp8", "--activations", "fp8",
                     "--set", "workload.gen_len=4")  # the scenario path prices the same
    assert same["ttft_s"] == pytest.approx(w8a8["ttft_s"])


@pytest.mark.parametrize(("flags", "message"), [
    (["--quant", "fp8", "--activations", "fp8", "--hardware", "a100-80g"],
     "error: hardware 'a100-80g' has no 'float8' peak"),
    (["--quant", "mxfp4", "--activations", "fp4", "--hardware", "h100-sxm"],
     "error: hardware 'h100-sxm' has no 'float4' peak"),
    (["--quant", "int4", "--activations", "fp8"],
     "error: quant.activations='fp8' multiplies fp8 weights; got quant.weights='int4'"),
    (["--quant", "int8", "--fp8-scales", "block"],
     "error: quant.fp8_scales='block' is the scale layout of fp8 weights"),
    (["--quant", "fp8", "--fp8-scales", "row"], "unknown value 'row'; allowed: tensor, channel"),
    (["--quant", "fp8", "--activations", "fp16"], "unknown value 'fp16'; allowed: float, int8"),
])
def test_refusals_are_one_line(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str], flags: list[str],
                               message: str) -> None:
    code, out, err = run_cli(monkeypatch, capsys, *PREDICT, *flags)
    assert code == 2 and message in err and "Traceback" not in err, err
    if err.startswith("error:"):
        assert len(err.strip().splitlines()) == 1


def test_a_scenario_file_takes_the_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "w8a8.yaml"
    scenario.write_text("name: w8a8\nhardware: h100-sxm\n"
                        "model: {preset: llama3-8b, quant: {weights: fp8, fp8_scales: block, "
                        "activations: fp8}}\n"
                        "workload: {kind: static, batch_size: 8, prompt_len: 2048, "
                        "gen_len: 4}\n")
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(scenario), "--json")
    assert code == 0, err
    flags = predicted(monkeypatch, capsys, "--quant", "fp8", "--fp8-scales", "block",
                      "--activations", "fp8")
    row = json.loads(out)[0]
    assert row["weight_bytes"] == flags["weight_bytes"]
    assert row["ttft_s"] == pytest.approx(flags["ttft_s"])
    scenario.write_text(scenario.read_text().replace("h100-sxm", "a100-80g"))
    code, out, err = run_cli(monkeypatch, capsys, "predict", str(scenario))
    assert code == 2 and err.startswith(f"error: {scenario}: ") and "'float8' peak" in err
