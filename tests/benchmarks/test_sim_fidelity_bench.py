"""`python -m infbench.benchmarks.sim_fidelity`: `--through serve --quick` end to end (a
2-layer llama-small behind `infbench serve`, 8-request Poisson points at three rates), the
request overhead measured at idle and priced once; bad options are one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from infbench.benchmarks import sim_fidelity
from infbench.benchmarks.sim_fidelity_serve import PROBES


@pytest.mark.slow
def test_quick_through_serve_prices_the_measured_overhead_once(tmp_path: Path) -> None:
    out = tmp_path / "fidelity.json"
    # --no-model-steps: the datasheet entry's rates as they are (no calibrate --model)
    assert sim_fidelity.main(["--quick", "--through", "serve", "--hardware", "cpu",
                              "--no-model-steps", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["through"] == "serve" and len(data["rows"]) == 3
    for row in data["rows"]:
        assert len(row["probes"]) == PROBES
        for probe in row["probes"]:  # one prefill step, which is also the only token
            assert probe["steps"] == 1 and 0 < probe["engine_s"] < probe["ttft_s"]
            assert probe["overhead_s"] == pytest.approx(probe["ttft_s"] - probe["engine_s"])
        overhead = row["request_overhead_s"]
        assert overhead > 0
        # 8 requests of 4-12 tokens: at least the longest one's steps, at most one per token
        assert 12 <= row["server_steps"] <= 8 * 12 and row["server_step_s_mean"] > 0
        assert 12 <= row["predicted_steps"] <= 8 * 12
        plain = row["predicted_without_overhead"]
        for pct in ("p50", "p90"):  # the term once in TTFT, never in TPOT or ITL
            assert row[f"ttft_s_{pct}"]["predicted"] == pytest.approx(
                plain[f"ttft_s_{pct}"] + overhead)
            for name in ("tpot_s", "itl_s"):
                assert row[f"{name}_{pct}"]["predicted"] == pytest.approx(
                    plain[f"{name}_{pct}"])
            for name in sim_fidelity.METRICS:
                assert row[f"{name}_{pct}"]["measured"] > 0
    assert [s["model"] for s in data["sweeps"]] == ["llama-small"]
    console = Console(width=220, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for item in sim_fidelity.render(data):
        console.print(item)
    text = console.export_text()
    assert "through infbench serve" in text and "overhead ms" in text and "SLO max rate" in text


@pytest.mark.parametrize(("argv", "word"), [(["--through", "http"], "--through"),
                                            (["--threads", "0"], "--threads"),
                                            (["--models", "gpt2"], "--models")])
def test_bad_options_are_one_error_line(argv: list[str], word: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_fidelity.main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and word in err
    assert not (tmp_path / "x.json").exists()


def test_the_slo_lies_between_the_predicted_p90s_of_the_two_lowest_rates() -> None:
    args = sim_fidelity.parse_args(["--quick", "--hardware", "cpu", "--requests", "24"])
    capacity = sim_fidelity._predicted(sim_fidelity._point(sim_fidelity._doc(
        args, "llama-small", {"kind": "offline"})))["requests_per_s"]
    slo = sim_fidelity._slo_between(args, "llama-small", capacity)
    low, high = (sim_fidelity._predicted(sim_fidelity._point(sim_fidelity._doc(
        args, "llama-small", {"kind": "poisson", "rate": frac * capacity})))
        for frac in (0.3, 0.7))
    for name, key in (("ttft_s", "ttft_ms"), ("tpot_s", "tpot_ms")):
        a, b = 1e3 * low[name]["p90"], 1e3 * high[name]["p90"]  # the geometric mean, rounded
        assert slo[key] == pytest.approx((a * b) ** 0.5, abs=0.06), (name, slo)
        assert min(a, b) - 0.06 < slo[key] < max(a, b) + 0.06
    assert slo["target"] == 0.9
