"""`predict --efficiency`: the fit of bandwidth / compute fractions, leave-one-out, the flag."""

from __future__ import annotations

import dataclasses
import json

import pytest
from cli_helpers import run_args

from infbench.core.errors import UserError
from infbench.hardware.spec import get_hardware
from infbench.measure.efficiency import (
    TimeParts,
    engine_efficiency,
    fit_engine,
    fit_fractions,
    parse_efficiency,
    time_parts,
)
from infbench.measure.prediction import Efficiency, derate
from infbench.measure.published import PublishedRow, price_row


def test_the_fit_recovers_known_fractions_from_a_synthetic_table() -> None:
    # memory-heavy and compute-heavy rows measured at exactly 60% / 80% of the peaks
    shapes = [(1.0, 0.0, 0.0), (2.0, 0.1, 0.01), (0.2, 3.0, 0.0), (0.5, 1.0, 0.05)]
    parts = [TimeParts(m, c, f, m / 0.6 + c / 0.8 + f) for m, c, f in shapes]
    bw, cp, has_bw, has_cp = fit_fractions(parts)
    assert (has_bw, has_cp) == (True, True)
    assert bw == pytest.approx(0.6, abs=0.005) and cp == pytest.approx(0.8, abs=0.005)


def test_a_fraction_no_row_depends_on_stays_at_one_undetermined() -> None:
    parts = [TimeParts(1.0, 0.0, 0.0, 2.0), TimeParts(3.0, 0.0, 0.0, 6.0)]
    bw, cp, has_bw, has_cp = fit_fractions(parts)
    assert bw == pytest.approx(0.5, abs=0.005)
    assert (cp, has_cp) == (1.0, False)


def test_a_faster_than_roofline_row_clamps_at_one() -> None:
    bw, _, _, _ = fit_fractions([TimeParts(1.0, 0.0, 0.0, 0.5)])
    assert bw == 1.0


def _row(id_: str, batch: int | None, prompt: int, gen: int, metric: str = "output_tokens_per_s",
         value: float = 1.0) -> PublishedRow:
    return PublishedRow(id=id_, engine="vllm", model="llama2-7b", gpu="a100-80g", gpus=1,
                        prompt_len=prompt, gen_len=gen, batch=batch, metric=metric,
                        scope="total", value=value, source="synthetic")


def _measured_at(row: PublishedRow, eff: Efficiency) -> PublishedRow:
    """The row with the value the roofline predicts at `eff`: a table the fit must explain."""
    return dataclasses.replace(row, value=price_row(row, eff).predicted)


SYNTHETIC = [_row("b1-decode", 1, 16, 256), _row("b8-itl", 8, 512, 64, "itl_ms"),
             _row("max-long-gen", None, 128, 1024), _row("max-prefill", None, 4096, 16),
             _row("b32-prefill", 32, 2048, 4)]


def test_fit_and_leave_one_out_on_a_synthetic_table() -> None:
    truth = Efficiency(0.7, 0.55)
    rows = [_measured_at(r, truth) for r in SYNTHETIC]
    fit = fit_engine("vllm", rows)
    assert fit.rows == tuple(r.id for r in SYNTHETIC)
    assert fit.bandwidth_determined and fit.compute_determined
    assert fit.efficiency.bandwidth == pytest.approx(0.7, abs=0.02)
    assert fit.efficiency.compute == pytest.approx(0.55, abs=0.02)
    assert max(fit.fit_errors) < 0.03
    # leave-one-out: each row predicted from the fit of the other four
    assert len(fit.loo_errors) == len(rows) and fit.loo_max < 0.05
    assert "leave-one-out error: median" in fit.summary()
    # the fractions alone (the under-load table's derating): the fit's, without its errors
    assert engine_efficiency("vllm", rows) == fit.efficiency
    with pytest.raises(UserError, match="a fit needs 2"):
        engine_efficiency("sglang", rows)


def test_leave_one_out_sees_a_row_the_others_do_not_explain() -> None:
    truth = Efficiency(0.7, 0.55)
    rows = [_measured_at(r, truth) for r in SYNTHETIC]
    odd = dataclasses.replace(rows[0], value=rows[0].value / 3)  # 3x slower than the others
    fit = fit_engine("vllm", [odd, *rows[1:]])
    assert fit.loo_errors[0] > 1.0  # held out, the others' fit predicts ~3x its value
    assert fit.loo_errors[0] == fit.loo_max


def test_time_parts_are_exact_at_the_peaks() -> None:
    for row in SYNTHETIC:
        rp = price_row(row)
        t = time_parts(rp)
        p = rp.price.prediction
        expected = p.time_per_token_s if row.metric == "itl_ms" else p.e2e_s
        assert t.at(1.0, 1.0) == pytest.approx(expected, rel=1e-9)


def test_derate_scales_bandwidth_and_every_peak_not_the_interconnect() -> None:
    hw = get_hardware("h100-sxm")
    low = derate(hw, Efficiency(0.5, 0.25))
    assert low.bandwidth == hw.bandwidth * 0.5
    assert low.peak_flops == {k: v * 0.25 for k, v in hw.peak_flops.items()}
    assert low.interconnect == hw.interconnect and low.memory_bytes == hw.memory_bytes


@pytest.mark.parametrize("text", ["0", "-0.5", "1.01", "nan", "inf", "fast", "vLLM2"])
def test_bad_values_are_refused_in_one_line(text: str) -> None:
    with pytest.raises(UserError) as info:
        parse_efficiency(text)
    message = str(info.value)
    assert "\n" not in message and "allowed:" in message and "(0, 1]" in message


def test_a_number_is_both_fractions() -> None:
    eff, fit = parse_efficiency("0.6")
    assert (eff.bandwidth, eff.compute, fit) == (0.6, 0.6, None)


def _ok(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = run_args(args, capsys)
    assert code == 0, err
    return out


def test_the_flag_derates_the_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["predict", "--model", "llama2-7b", "--hardware", "a100-80g", "--prompt", "16",
            "--gen", "64", "--json"]
    plain = json.loads(_ok(args, capsys))[0]
    half = json.loads(_ok([*args, "--efficiency", "0.5"], capsys))[0]
    assert half["tpot_s"] == pytest.approx(2 * plain["tpot_s"])  # memory-bound decode
    assert half["efficiency"]["bandwidth"] == 0.5


def test_the_flag_with_an_engine_prints_its_fit(capsys: pytest.CaptureFixture[str]) -> None:
    out = _ok(["predict", "--model", "llama2-7b", "--hardware", "a100-80g",
               "--efficiency", "gpt-fast"], capsys)
    assert "efficiency gpt-fast:" in out and "leave-one-out error: median" in out


@pytest.mark.parametrize(("value", "message"), [
    ("1.5", "a fraction must be in (0, 1]"),
    ("trt", "unknown engine"),
])
def test_the_flag_refuses_bad_values_in_one_line(value: str, message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_args(["predict", "--efficiency", value], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err


def test_the_flag_refuses_a_calibrated_profile() -> None:
    hw = dataclasses.replace(get_hardware("h100-sxm"), extra={"calibrated": True})
    with pytest.raises(UserError, match="calibrated profile"):
        derate(hw, Efficiency(0.5, 0.5))


def test_the_flag_derates_a_scenario_and_the_set_path(tmp_path, capsys) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nhardware: a100-80g\nmodel: {preset: llama2-7b}\n"
                        "workload: {kind: static, batch_size: 1, prompt_len: 16, gen_len: 64}\n")
    base = ["predict", "--json"]
    plain = json.loads(_ok([*base, str(scenario)], capsys))[0]
    half = json.loads(_ok([*base, str(scenario), "--efficiency", "0.5"], capsys))[0]
    assert half["tpot_s"] == pytest.approx(2 * plain["tpot_s"])
    sets = ["--model", "llama2-7b", "--set", "hardware=a100-80g", "--prompt", "16", "--gen",
            "64"]
    plain = json.loads(_ok([*base, *sets], capsys))[0]
    half = json.loads(_ok([*base, *sets, "--efficiency", "0.5"], capsys))[0]
    assert half["tpot_s"] == pytest.approx(2 * plain["tpot_s"])
    assert half["efficiency"]["summary"].startswith("efficiency: 50%")
