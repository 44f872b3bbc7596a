"""Scraping a target's /metrics during a client run (client/server_metrics.py): parsing each
server's names, the summary's rules, the mock with vLLM's and SGLang's names and without
/metrics, `report`, and `infbench serve`'s own counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_args
from serve_helpers import MODEL_NAME, start_server

from infbench.client.mock_server import MockConfig, MockServer
from infbench.client.server_metrics import (
    SOURCES,
    MetricsError,
    detect_source,
    parse_samples,
    quantities,
    summarize,
)
from infbench.results.store import load_result

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 200.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 9.5
"""


def test_vllm_text_sums_counts_over_engines_and_averages_kv_usage() -> None:
    samples = parse_samples(VLLM_TEXT)
    assert detect_source(samples) == "vllm"
    values = {k: v for k, (_, v) in quantities(samples, SOURCES["vllm"]).items()}
    assert values == {"running": 4.0, "kv_usage": 0.375, "prefix_cache_queries": 1200.0,
                      "prefix_cache_hits": 300.0}


def test_old_vllm_names_other_servers_and_text_that_is_not_prometheus() -> None:
    old = parse_samples('vllm:gpu_cache_usage_perc{model_name="m"} 0.75\n'
                        'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.5\n')
    assert detect_source(old) == "vllm"
    assert quantities(old, SOURCES["vllm"]) == {
        "kv_usage": ("vllm:gpu_cache_usage_perc", 0.75),
        "prefix_cache_hit_rate": ("vllm:gpu_prefix_cache_hit_rate", 0.5)}
    assert detect_source(parse_samples("lmdeploy_queue 3\nprocess_cpu_seconds_total 1\n")) \
        is None
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse_samples("vllm:num_requests_running{model_name= 3\n")


# As TGI's router writes it (metrics-rs's Prometheus exporter: no labels on these gauges,
# counters without _total, histograms with buckets).
TGI_TEXT = """\
# HELP tgi_request_success Number of successful requests
# TYPE tgi_request_success counter
tgi_request_success 12
# HELP tgi_batch_current_size Current batch size
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 3
# HELP tgi_queue_size Current queue size
# TYPE tgi_queue_size gauge
tgi_queue_size 5
# HELP tgi_batch_current_max_tokens Maximum tokens for the current batch
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 2048
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 3
tgi_request_duration_bucket{le="+Inf"} 12
tgi_request_duration_sum 4.25
tgi_request_duration_count 12
"""

# As llama.cpp's server writes it with --metrics (HELP, TYPE, one unlabelled sample each;
# kv_cache_usage_ratio as the builds that export it write it).
LLAMACPP_TEXT = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3469
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.4375
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7
"""


@pytest.mark.parametrize(("text", "kind", "expected"), [
    (TGI_TEXT, "tgi", {"running": ("tgi_batch_current_size", 3.0),
                       "waiting": ("tgi_queue_size", 5.0)}),
    (LLAMACPP_TEXT, "llamacpp", {"running": ("llamacpp:requests_processing", 4.0),
                                 "waiting": ("llamacpp:requests_deferred", 2.0),
                                 "kv_usage": ("llamacpp:kv_cache_usage_ratio", 0.4375)}),
    # a llama.cpp build without the KV gauge: running and waiting only
    ("\n".join(line for line in LLAMACPP_TEXT.splitlines() if "kv_cache" not in line),
     "llamacpp", {"running": ("llamacpp:requests_processing", 4.0),
                  "waiting": ("llamacpp:requests_deferred", 2.0)}),
])
def test_tgi_and_llamacpp_expositions_map_to_running_waiting_and_kv(
        text: str, kind: str, expected: dict[str, tuple[str, float]]) -> None:
    samples = parse_samples(text)
    assert detect_source(samples) == kind
    assert quantities(samples, SOURCES[kind]) == expected


def test_summary_gauges_between_the_brackets_counters_from_end_to_end() -> None:
    series = {"running": [[0, 0], [1, 4], [2, 2], [3, 0]],
              "kv_usage": [[0, 0.0], [1, 0.5], [2, 0.25], [3, 0.0]],
              "preemptions": [[0, 10], [1, 11], [2, 12], [3, 13]],
              "prefix_cache_queries": [[0, 100], [3, 500]],
              "prefix_cache_hits": [[0, 50], [3, 150]]}
    s = summarize(series)
    assert (s["running_mean"], s["running_max"]) == (3.0, 4)
    assert (s["kv_usage_mean"], s["kv_usage_max"]) == (0.375, 0.5)
    assert (s["waiting_mean"], s["waiting_max"]) == (None, None)  # the server has none
    assert s["preemptions"] == 3 and s["num_samples"] == 2
    assert s["prefix_cache_hit_rate"] == 0.25  # (150 - 50) / (500 - 100)
    # a counter reset (the server restarted): its value since the reset
    assert summarize({"preemptions": [[0, 9], [1, 2]]})["preemptions"] == 2
    # only a hit-rate gauge (SGLang without its counters): its mean between the brackets
    assert summarize({"prefix_cache_hit_rate": [[0, 0], [1, 0.5], [2, 0.7], [3, 0]]})[
        "prefix_cache_hit_rate"] == pytest.approx(0.6)


def scenario(tmp_path: Path, base_url: str, target_extra: str = "", model: str = "mock-model",
             workload: str = "num_requests: 6, prompt_len: 8, gen_len: 10, "
                             "max_concurrency: 4", interval: str = "0.02") -> Path:
    path = tmp_path / "scraped.yaml"
    path.write_text(f"""
name: scraped
target: {{kind: openai, base_url: '{base_url}', model: {model}, metrics_interval_s: {interval}
          {target_extra}}}
model: {{preset: tiny}}
workload: {{kind: offline, seed: 3, {workload}}}
measure: {{warmup: 1, repeats: 2}}
""")
    return path


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_run_scrapes_the_mock_and_report_shows_the_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    config = MockConfig(token_delay_s=0.01, metrics=kind, metrics_preempt_every=2,
                        keep_bodies=False)
    with MockServer(config) as server:
        out = tmp_path / "out"
        code, _, err = run_args(["run", str(scenario(tmp_path, server.base_url)),
                                 "--out", str(out)], capsys)
    assert code == 0, err
    assert "no server metrics" not in err
    sm = load_result(out / "scraped_000.json")["telemetry"]["server_metrics"]
    assert sm["source"] == kind and sm["url"] == server.base_url[:-3] + "/metrics"
    assert sm["num_failed"] == 0 and sm["num_scrapes"] >= 3
    s = sm["summary"]
    # 4 streams at once, 2 of them "running" (0.1 KV each), 2 waiting; the mock's
    # counters move by known amounts over the 12 measured requests (warm-up excluded)
    assert s["running_max"] == 2 and s["waiting_max"] == 2
    assert s["kv_usage_max"] == pytest.approx(0.2) and 0 < s["kv_usage_mean"] <= 0.2 + 1e-9
    assert s["preemptions"] == 6  # requests 8, 10, ..., 18 of the server's 18
    assert s["prefix_cache_queries"] == 12 * 8
    assert s["prefix_cache_hit_rate"] == pytest.approx(0.25)
    t = [p[0] for p in sm["series"]["running"]]
    assert t == sorted(t) and t[0] == 0
    code, table, _ = run_args(["report", str(out)], capsys)
    assert code == 0 and "server metrics" in table and "25.0" in table
    code, rows, _ = run_args(["report", str(out), "--json"], capsys)
    row = json.loads(rows)[0]
    assert row["server_metrics_source"] == kind and row["server_preemptions"] == 6


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_run_with_two_workers_is_scraped_from_the_parent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    """target.workers: 2 streams from two processes while the parent scrapes (client/
    workers.py, ThreadedScraper): the counters move by exactly the measured requests'."""
    config = MockConfig(token_delay_s=0.01, metrics=kind, metrics_preempt_every=2,
                        keep_bodies=False)
    with MockServer(config) as server:
        out = tmp_path / "out"
        code, _, err = run_args(["run", str(scenario(tmp_path, server.base_url,
                                                     ", workers: 2")),
                                 "--out", str(out)], capsys)
    assert code == 0, err
    assert "no server metrics" not in err and "not scraped" not in err
    result = load_result(out / "scraped_000.json")
    assert result["telemetry"]["client"]["workers"]["count"] == 2
    sm = result["telemetry"]["server_metrics"]
    assert sm["source"] == kind and sm["num_failed"] == 0 and sm["num_scrapes"] >= 3
    s = sm["summary"]
    assert s["preemptions"] == 6 and s["prefix_cache_queries"] == 12 * 8  # warm-up excluded
    assert s["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert s["num_samples"] >= 1 and 1 <= s["running_max"] <= 2  # streams seen mid-run
    t = [p[0] for p in sm["series"]["running"]]
    assert t == sorted(t) and t[0] == 0


@pytest.mark.parametrize("kind", ["tgi", "llamacpp"])
def test_tgi_and_llamacpp_mocks_give_their_gauges_and_no_counters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    with MockServer(MockConfig(token_delay_s=0.01, metrics=kind, keep_bodies=False)) as server:
        out = tmp_path / "out"
        code, _, err = run_args(["run", str(scenario(tmp_path, server.base_url)),
                                 "--out", str(out)], capsys)
    assert code == 0, err
    sm = load_result(out / "scraped_000.json")["telemetry"]["server_metrics"]
    assert sm["source"] == kind and sm["num_failed"] == 0
    s = sm["summary"]
    assert s["running_max"] == 2 and s["waiting_max"] == 2  # 4 streams, 2 "running"
    if kind == "llamacpp":
        assert s["kv_usage_max"] == pytest.approx(0.2)
    else:
        assert s["kv_usage_max"] is None and "kv_usage" not in sm["names"]
    # neither server counts preemptions or prefix-cache lookups
    assert s["preemptions"] is None and s["prefix_cache_hit_rate"] is None
    code, rows, _ = run_args(["report", str(out), "--json"], capsys)
    row = json.loads(rows)[0]
    assert code == 0 and row["server_metrics_source"] == kind
    assert row["server_running_max"] == 2 and row["server_preemptions"] is None


def test_a_target_without_metrics_says_so_once_and_the_run_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MockServer(MockConfig(keep_bodies=False)) as server:
        path = scenario(tmp_path, server.base_url,
                        workload="num_requests: 2, prompt_len: 8, gen_len: [3, 4]")
        out = tmp_path / "out"
        code, _, err = run_args(["run", str(path), "--out", str(out)], capsys)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "no server metrics" in line]
    assert len(notes) == 1 and "(HTTP 404)" in notes[0], err  # two points, one note
    for i in (0, 1):
        sm = load_result(out / f"scraped_00{i}.json")["telemetry"]["server_metrics"]
        assert sm["error"] == "HTTP 404" and sm["source"] is None and "summary" not in sm
    code, _, err = run_args(["report", str(out)], capsys)
    assert code == 0 and "server metrics: none from" in err


def test_metrics_false_scrapes_nothing(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with MockServer(MockConfig(metrics="vllm", keep_bodies=False)) as server:
        path = scenario(tmp_path, server.base_url, ", metrics: false",
                        workload="num_requests: 2, prompt_len: 8, gen_len: 3")
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert "server_metrics" not in load_result(tmp_path / "out" / "scraped_000.json")[
        "telemetry"]


@pytest.mark.parametrize(("extra", "interval", "message"), [
    (", metrics: metrics", "1", "target.metrics: got 'metrics'; allowed: true, false, a path"),
    (", metrics: 1", "1", "target.metrics: got 1; allowed: true, false"),
    (", metrics: 'http://me:pw@h:9/metrics'", "1",
     "target.metrics: must not carry credentials"),
    ("", "0", "target.metrics_interval_s: must be > 0"),
    ("", "'1'", "target.metrics_interval_s: "),
])
def test_bad_metrics_keys_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       extra: str, interval: str, message: str) -> None:
    path = scenario(tmp_path, "http://127.0.0.1:9/v1", extra, interval=interval)
    code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}: {message}"), err
    assert "pw" not in err and not (tmp_path / "out").exists()


def test_infbench_serve_metrics_scraped_summary_is_sane(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = start_server(max_num_seqs=2)
    try:
        path = scenario(tmp_path, server.url + "/v1", model=MODEL_NAME,
                        workload="num_requests: 6, prompt_len: 12, shared_prefix_len: 8, "
                                 "gen_len: 6, max_concurrency: 4")
        out = tmp_path / "out"
        code, _, err = run_args(["run", str(path), "--out", str(out)], capsys)
    finally:
        server.stop()
    assert code == 0, err
    result = load_result(out / "scraped_000.json")
    sm = result["telemetry"]["server_metrics"]
    assert sm["source"] == "infbench" and sm["num_failed"] == 0
    s = sm["summary"]
    assert 0 < s["kv_usage_max"] <= 1 and 0 <= s["kv_usage_mean"] <= s["kv_usage_max"]
    assert 1 <= s["running_max"] <= 2  # max_num_seqs 2
    assert 0 <= s["waiting_max"] <= 2  # 4 in flight at most
    assert s["preemptions"] == 0
    # every measured prompt was looked up once, in tokens; the shared 8-token prefix (two
    # 4-token blocks) was cached by the warm-up, so at least 8 of each 12 hit
    assert s["prefix_cache_queries"] == 2 * 6 * 12 == 2 * result["metrics"]["num_prompt_tokens"]
    assert 8 / 12 <= s["prefix_cache_hit_rate"] <= 1


def test_prefix_groups_read_the_scraped_hit_rate_as_the_measured_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """workload.prefix (results/prefix.py) takes a target run's measured hit rate from
    telemetry.server_metrics.summary.prefix_cache_hit_rate."""
    with MockServer(MockConfig(metrics="vllm", metrics_hit_fraction=0.5,
                               keep_bodies=False)) as server:
        path = scenario(tmp_path, server.base_url,
                        workload="num_requests: 4, prompt_len: 12, gen_len: 2, "
                                 "prefix: {num_groups: 2, length: 8}")
        out = tmp_path / "out"
        code, _, err = run_args(["run", str(path), "--out", str(out)], capsys)
    assert code == 0, err
    section = load_result(out / "scraped_000.json")["prefix"]
    assert section["measured_hit_rate"] == pytest.approx(0.5)
    assert section["measured_from"] == "telemetry.server_metrics.summary.prefix_cache_hit_rate"
