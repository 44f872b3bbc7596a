"""`infbench predict | kv | roofline | models | hardware` on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infbench.cli import main
from infbench.core.config import ModelConfig
from infbench.hardware.spec import get_hardware
from infbench.plots.analytic import RooflinePoint, kv_figure, roofline_figure
from infbench.roofline.tables import kv_rows

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """Run infbench.cli.main in-process; return (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["infbench", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_json(args: list[str], monkeypatch, capsys):
    code, out, err = run_cli([*args, "--json"], monkeypatch, capsys)
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------ predict
def test_predict_json_reproduces_the_lecture(monkeypatch, capsys) -> None:
    # The lecture's S = 1024 tokens of KV: prompt 896 + 128 generated (was --prompt 1023
    # --gen 1, which now has no decode step and so no TPOT).
    data = run_json(["predict", "--model", "llama2-13b", "--hardware", "h100-sxm",
                     "--batch", "1,64", "--prompt", "896", "--gen", "128"], monkeypatch, capsys)
    assert [d["batch"] for d in data] == [1, 64]
    one, many = data
    assert one["decode"]["time_per_token_s"] == pytest.approx(8.02e-3, rel=0.015)
    assert one["decode_tokens_per_s"] == pytest.approx(124, rel=0.03)
    assert round(one["memory_bytes"] / 1e9, 2) == 26.87
    assert round(many["memory_bytes"] / 1e9, 2) == 79.72 and many["fits"]
    for key in ("model", "hardware", "params", "weight_bytes", "kv_bytes_per_token",
                "kv_cache_bytes", "max_batch", "ttft_s", "prefill", "decode", "ops"):
        assert key in one
    assert one["kv_bytes_per_token"] == 819_200
    assert {"name", "stage", "flops", "bytes", "intensity", "time_s", "bound"} <= set(
        one["ops"][0])


def test_predict_flags_change_the_model(monkeypatch, capsys) -> None:
    base = ["predict", "--batch", "256", "--prompt", "1023", "--gen", "1"]
    gqa = run_json([*base, "--kv-heads", "8"], monkeypatch, capsys)[0]
    assert gqa["kv_bytes_per_token"] == 819_200 // 5 and gqa["fits"]
    mla = run_json([*base, "--attention", "mla", "--kv-lora-rank", "256"], monkeypatch, capsys)[0]
    assert mla["kv_bytes_per_token"] == (256 + 64) * 2 * 40
    cla = run_json([*base, "--kv-heads", "8", "--attention", "cla", "--cla-group", "2"],
                   monkeypatch, capsys)[0]
    assert cla["kv_bytes_per_token"] == gqa["kv_bytes_per_token"] // 2
    fp8 = run_json([*base, "--kv-heads", "8", "--kv-dtype", "fp8", "--quant", "int4"],
                   monkeypatch, capsys)[0]
    # one byte per value plus a float32 scale per token, layer and KV head for K and V
    assert fp8["kv_bytes_per_token"] == gqa["kv_bytes_per_token"] // 2 + 40 * 2 * 8 * 4
    assert fp8["weight_bytes"] < 0.35 * gqa["weight_bytes"]
    ssm = run_json([*base, "--attention", "ssm", "--d-state", "32", "--attn-every", "8"],
                   monkeypatch, capsys)[0]
    assert ssm["kv_bytes_per_token"] == 5 * 2 * 40 * 128 * 2 and ssm["state_bytes"] > 0
    sliding = run_json([*base, "--window", "512", "--global-every", "4"], monkeypatch, capsys)[0]
    assert sliding["kv_cache_bytes"] == 256 * 819_200 // 40 * (30 * 512 + 10 * 1024)
    override = run_json([*base, "--set", "model.overrides.num_layers=20",
                         "--set", "model.attention.kind=mqa"],
                        monkeypatch, capsys)[0]
    assert override["kv_bytes_per_token"] == 2 * 20 * 128 * 2


def test_predict_speculative_flags(monkeypatch, capsys) -> None:
    args = ["predict", "--batch", "1", "--prompt", "512", "--gen", "64"]
    plain = run_json(args, monkeypatch, capsys)[0]
    spec = run_json([*args, "--spec-tokens", "4", "--spec-acceptance", "0.8",
                     "--spec-draft-ratio", "0.05"], monkeypatch, capsys)[0]
    assert spec["speculative"]["expected_tokens_per_step"] == pytest.approx(3.3616)
    assert spec["decode_tokens_per_s"] > 2 * plain["decode_tokens_per_s"]
    assert plain["speculative"] is None


def test_predict_table_output(monkeypatch, capsys) -> None:
    code, out, _ = run_cli(["predict", "--batch", "1,8", "--ops"], monkeypatch, capsys)
    assert code == 0
    assert "llama2-13b" in out and "attn_score" in out and "TPOT" in out


def test_predict_scenario_file(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "lecture.yaml"
    path.write_text(textwrap.dedent("""\
        name: lecture
        dtype: bfloat16
        hardware: h100-sxm
        model:
          preset: llama2-13b
        workload:
          kind: static
          batch_size: [1, 64]
          prompt_len: 896
          gen_len: 128
        """))
    data = run_json(["predict", str(path)], monkeypatch, capsys)
    assert [d["batch"] for d in data] == [1, 64]
    assert data[0]["decode_tokens_per_s"] == pytest.approx(124, rel=0.03)
    assert round(data[1]["memory_bytes"] / 1e9, 2) == 79.72
    code, _, err = run_cli(["predict", str(path), "--batch", "2"], monkeypatch, capsys)
    assert code == 2 and "drop --batch" in err


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "--model", "llama9"],
         "--model: unknown model 'llama9'; allowed: a preset (llama2-7b"),
        (["predict", "--hardware", "tpu9"], "unknown hardware 'tpu9'; allowed: h100-sxm"),
        (["predict", "--batch", "0"], "--batch: each size must be >= 1"),
        (["predict", "--batch", "-4"], "--batch: each size must be >= 1"),
        (["predict", "--batch", "1,x"], "comma-separated integers"),
        (["predict", "--prompt", "0"], "--prompt: must be >= 1 (got 0)"),
        (["predict", "--gen", "-1"], "--gen: must be >= 1 (got -1)"),
        (["predict", "--prompt", "100", "--gen", "10", "--window", "200"],
         "larger than the context"),
        (["predict", "--kv-heads", "7"], "must divide model.num_heads (40)"),
        (["predict", "--kv-heads", "0"], "--kv-heads: must be >= 1 (got 0)"),
        (["predict", "--cla-group", "2"], "--cla-group applies to --attention cla"),
        (["predict", "--attention", "flash"], "unknown value 'flash'"),
        (["predict", "--quant", "int3"], "allowed: none, int8, int4"),
        (["predict", "--set", "model.overrides.num_layerz=3"],
         "model.overrides.num_layerz: unknown key (did you mean num_layers?)"),
        (["predict", "--spec-tokens", "3"], "--spec-acceptance"),
        (["kv", "--models", "llama2-13b,nope"], "--models: unknown model 'nope'"),
        (["kv", "--context", "0"], "--context: must be >= 1 (got 0)"),
        (["roofline", "--batch", "0"], "--batch: each size must be >= 1"),
        (["predict", "--tp", "3"], "parallel.tp=3 must divide the 40 attention heads"),
        (["predict", "--tp", "-1"], "--tp: must be >= 1 (got -1)"),
        (["predict", "--replicas", "0"], "--replicas: must be >= 1 (got 0)"),
        (["predict", "--tp", "2", "--ep", "2"], "needs a mixture-of-experts model"),
        (["predict", "--tp", "2", "--set", "parallel.tp=-3"], "parallel.tp"),
        (["predict", "--prompt", "131072"], "exceeds the 4096-token context of llama2-13b"),
        (["predict", "--kv-bits", "0"], "--kv-bits: must be >= 1 (got 0)"),
        (["predict", "--kv-bits", "33"], "quant.kv_bits must be <= 32"),
        (["predict", "--mem-util", "1.5"], "--mem-util: must be in (0, 1]"),
        (["predict", "--overlap", "some"], "unknown value 'some'; allowed: auto, full, none"),
        (["predict", "--hardware", "nope9", "--tp", "2"], "unknown hardware 'nope9'"),
        (["kv", "--tp", "3"], "parallel.tp=3 must divide the 40 attention heads"),
        (["kv", "--context", "131072"], "exceeds the 4096-token context of llama2-13b"),
        (["roofline", "--tp", "3"], "parallel.tp=3 must divide the 40 attention heads"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, monkeypatch, capsys) -> None:
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 2
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_subprocess_error_has_no_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "infbench.cli", "predict", "--model", "nope"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --model: unknown model 'nope'")
    assert "Traceback" not in proc.stderr and proc.stdout == ""


_NO_TORCH = """
import sys, time
start = time.perf_counter()
from infbench.cli import main
for argv in (["infbench", "predict", "--help"], ["infbench", "predict", "--json"]):
    print("=== " + argv[-1], flush=True)
    sys.argv = argv
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, exc.code
elapsed = time.perf_counter() - start
print(f"RESULT torch={'torch' in sys.modules} elapsed={elapsed:.3f}", file=sys.stderr)
"""


def test_predict_runs_without_torch_and_fast() -> None:
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = proc.stderr.strip().splitlines()[-1]
    assert "torch=False" in result
    assert float(result.split("elapsed=")[1]) < 1.0, result
    help_text, json_text = proc.stdout.split("=== --help\n")[1].split("=== --json\n")
    assert "--kv-heads" in help_text
    assert json.loads(json_text)[0]["model"] == "llama2-13b"


# ------------------------------------------------------------------ kv, models, hardware
def test_kv_json_rows(monkeypatch, capsys) -> None:
    rows = run_json(["kv", "--models", "llama2-13b,llama3-8b,deepseek-v2-lite,mistral-7b",
                     "--context", "8192", "--batch", "8",
                     "--set", "model.overrides.max_seq_len=8192"], monkeypatch, capsys)
    by = {r["model"]: r for r in rows}
    assert by["llama2-13b"]["reduction"] == pytest.approx(1.0)
    assert by["llama2-13b"]["kv_cache_bytes"] == 819_200 * 8192 * 8
    assert by["llama3-8b"]["reduction"] == pytest.approx(4.0)
    assert by["deepseek-v2-lite"]["kv_bytes_per_token"] == (512 + 64) * 2 * 27
    assert by["deepseek-v2-lite"]["attention"] == "mla"
    assert by["mistral-7b"]["reduction"] == pytest.approx(4.0 * 8192 / 4096)
    assert by["llama2-13b"]["max_batch"] < by["llama3-8b"]["max_batch"]


def test_kv_rows_ssm_reduction_counts_the_state() -> None:
    ssm = ModelConfig.from_name("llama2-7b").with_overrides(attention={"kind": "ssm"},
                                                            max_seq_len=100_000)
    short, long = (kv_rows([ssm], context_len=c, batch=1, hw=get_hardware("h100-sxm"))[0]
                   for c in (1000, 100_000))
    assert short.kv_cache_bytes == 0 and short.state_bytes_per_seq > 0
    assert long.reduction == pytest.approx(100 * short.reduction)


def test_kv_plot(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "kv.png"
    code, _, _ = run_cli(["kv", "--plot", str(out)], monkeypatch, capsys)
    assert code == 0 and out.read_bytes().startswith(PNG_MAGIC)
    rows = kv_rows([ModelConfig.from_name(m) for m in ("llama2-13b", "llama3-8b")],
                   context_len=4096, batch=8, hw=get_hardware("h100-sxm"))
    drawn = kv_figure(rows, tmp_path / "kv2.png")
    assert drawn["kv_gb"] == pytest.approx([r.kv_cache_bytes / 1e9 for r in rows])
    assert drawn["mha_gb"] == pytest.approx([r.mha_kv_cache_bytes / 1e9 for r in rows])


def test_models_and_hardware_lists(monkeypatch, capsys) -> None:
    models = {m["model"]: m for m in run_json(["models"], monkeypatch, capsys)}
    assert models["llama2-7b"]["kv_bytes_per_token_bf16"] == 524_288
    assert models["deepseek-v2"]["active_params"] < models["deepseek-v2"]["params"] / 10
    hardware = {h["hardware"]: h for h in run_json(["hardware"], monkeypatch, capsys)}
    assert hardware["h100-sxm"]["ridge_point_bf16"] == pytest.approx(295.3, rel=1e-3)
    code, out, _ = run_cli(["hardware"], monkeypatch, capsys)
    assert code == 0 and "h100-sxm" in out and "datasheet" in out
    code, out, _ = run_cli(["models"], monkeypatch, capsys)
    assert code == 0 and "deepseek-v2-lite" in out


# ------------------------------------------------------------------ roofline
def test_roofline_command_writes_png_and_json(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "roofline.png"
    data = run_json(["roofline", "--model", "llama2-13b", "--batch", "1,64",
                     "--out", str(out)], monkeypatch, capsys)
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert data["ridge_point"] == pytest.approx(989.4e12 / 3.35e12)
    labels = {p["label"]: p for p in data["points"]}
    decode1, decode64 = labels["decode b=1"], labels["decode b=64"]
    assert decode1["intensity"] < decode64["intensity"] < data["ridge_point"]
    assert labels["prefill b=1"]["flops_per_s"] == pytest.approx(data["peak_flops_per_s"])
    assert decode1["flops_per_s"] == pytest.approx(
        decode1["intensity"] * data["bandwidth_bytes_per_s"])
    assert any(p["label"].startswith("attn_score (decode") for p in data["points"])
    assert all(p["kind"] == "predicted" for p in data["points"])


def test_roofline_figure_plots_ridge_points_and_links(tmp_path) -> None:
    hw = get_hardware("h100-sxm")
    points = [
        RooflinePoint("decode predicted", 60.0, 60.0 * hw.bandwidth, "predicted", "decode/b64"),
        RooflinePoint("decode measured", 55.0, 0.7 * 55.0 * hw.bandwidth, "measured",
                      "decode/b64"),
        RooflinePoint("prefill", 2000.0, hw.peak("bfloat16"), "predicted", "prefill/b8"),
        RooflinePoint("gather", 0.0, 0.0, "predicted", "embed"),
    ]
    drawn = roofline_figure(hw, "bfloat16", points, tmp_path / "r.png", title="t")
    assert (tmp_path / "r.png").read_bytes().startswith(PNG_MAGIC)
    ridge = drawn["ridge_point"]
    assert ridge["intensity"] == pytest.approx(hw.ridge_point("bfloat16"))
    assert ridge["flops_per_s"] == pytest.approx(hw.peak("bfloat16"))
    plotted = {p["label"]: p for p in drawn["points"]}
    assert set(plotted) == {"decode predicted", "decode measured", "prefill"}
    assert drawn["skipped"] == ["gather"]
    for p in points[:3]:
        assert plotted[p.label]["intensity"] == pytest.approx(p.intensity)
        assert plotted[p.label]["flops_per_s"] == pytest.approx(p.flops_per_s)
    (link,) = drawn["links"]
    assert link["from"] == pytest.approx([60.0, 60.0 * hw.bandwidth])
    assert link["to"] == pytest.approx([55.0, 0.7 * 55.0 * hw.bandwidth])
    roof = drawn["roofline"]
    for x, y in zip(roof["intensity"], roof["flops_per_s"], strict=True):
        assert y == pytest.approx(min(hw.peak("bfloat16"), x * hw.bandwidth))


# ------------------------------------------------------------------ parallel, issue 16
def test_predict_parallel_json_and_table(monkeypatch, capsys) -> None:
    one, = run_json(["predict", "--model", "llama3-70b", "--batch", "8"], monkeypatch, capsys)
    assert one["max_batch"] == 0 and not one["fits"]
    tp4, = run_json(["predict", "--model", "llama3-70b", "--batch", "8", "--tp", "4",
                     "--replicas", "2"], monkeypatch, capsys)
    assert tp4["fits"] and tp4["parallel"] == {"tp": 4, "pp": 1, "ep": 1, "replicas": 2,
                                               "microbatches": 1, "attention_dp": 1,
                                               "dispatch_dtype": "model", "dense_dp": False,
                                               "devices": 8}
    assert tp4["decode_comm_s"]["all_reduce_s"] > 0
    assert tp4["usable_memory_bytes"] == pytest.approx(81559 * 2**20 * 0.95)
    same, = run_json(["predict", "--model", "llama3-70b", "--batch", "8", "--set",
                      "parallel.tp=4", "--set", "parallel.replicas=2"], monkeypatch, capsys)
    assert same["decode"] == tp4["decode"] and same["memory_bytes"] == tp4["memory_bytes"]
    code, out, _ = run_cli(["predict", "--model", "llama3-70b", "--tp", "2", "--pp", "2",
                            "--batch", "8"], monkeypatch, capsys)
    assert code == 0 and "tp x pp" in out and "pipeline bubble" in out


def test_predict_gen_one_prints_no_tpot(monkeypatch, capsys) -> None:
    row, = run_json(["predict", "--prompt", "1023", "--gen", "1"], monkeypatch, capsys)
    assert row["tpot_s"] is None and row["decode_tokens_per_s"] is None
    code, out, _ = run_cli(["predict", "--prompt", "1023", "--gen", "1"], monkeypatch, capsys)
    line = next(ln for ln in out.splitlines() if "llama2-13b" in ln)
    assert code == 0 and "│    - │            - │" in line


def test_kv_bits_and_tp_in_kv(monkeypatch, capsys) -> None:
    rows = run_json(["kv", "--models", "deepseek-v2", "--kv-bits", "6", "--context", "4096"],
                    monkeypatch, capsys)
    assert rows[0]["kv_bytes_per_token"] == 60 * (432 + 4)
    assert rows[0]["max_batch"] == 0  # 471 GB of weights on one H100
    rows = run_json(["kv", "--models", "deepseek-v2", "--kv-bits", "6", "--tp", "8",
                     "--hardware", "h200"], monkeypatch, capsys)
    assert rows[0]["max_batch"] > 0


def test_scenario_parallel_section(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "tp.yaml"
    path.write_text(textwrap.dedent("""\
        name: tp
        hardware: h100-sxm
        dtype: bfloat16
        model: {preset: llama3-70b}
        parallel: {tp: 4, pp: 2}
        workload: {kind: static, batch_size: 16, prompt_len: 1024, gen_len: 128}
        """))
    row, = run_json(["predict", str(path)], monkeypatch, capsys)
    assert row["parallel"]["devices"] == 8 and row["fits"] and row["pipeline_bubble"] >= 0
    path.write_text(path.read_text().replace("pp: 2", "pp: 0"))
    code, _, err = run_cli(["predict", str(path)], monkeypatch, capsys)
    assert code == 2 and "parallel.pp" in err and err.count("\n") == 1


def test_the_shipped_lecture_scenario_reproduces_the_lecture(monkeypatch, capsys) -> None:
    """scenarios/lecture_llama2_13b.yaml at its own defaults: 26.87 GB, 79.72 GB, 8.02 ms."""
    rows = run_json(["predict", str(REPO / "scenarios" / "lecture_llama2_13b.yaml")],
                    monkeypatch, capsys)
    by = {r["batch"]: r for r in rows}
    assert round(by[1]["memory_bytes"] / 1e9, 2) == 26.87
    assert round(by[64]["memory_bytes"] / 1e9, 2) == 79.72 and by[64]["fits"]
    assert round(by[1]["memory_bytes"] / 3.35e12 * 1e3, 2) == 8.02  # the lecture's formula
    assert by[1]["tpot_s"] == pytest.approx(8.02e-3, rel=0.015)  # the roofline's, 7.91 ms
