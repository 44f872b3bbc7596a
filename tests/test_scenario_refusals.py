"""Settings that used to be accepted and then ignored or failed at run time are refused
when the scenario loads, in one line naming the key (docs/bad-input.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infbench.core.errors import UserError
from infbench.scenario.schema import load_scenario

TARGET = """name: t
target:
  kind: openai
  base_url: http://127.0.0.1:9/v1
  model: m
  tokenizer: smollm2-135m
  endpoint: chat
{extra}workload: {{kind: static, batch_size: 1, prompt_len: 8, gen_len: 4}}
"""


def _load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    try:
        load_scenario(path).points()
    except UserError as exc:
        return str(exc)
    return ""


def test_empty_variants_are_refused(tmp_path: Path) -> None:
    msg = _load(tmp_path, "name: v\nmodel: {preset: tiny}\nvariants: []\n")
    assert msg.endswith("variants: needs at least one variant (remove the key for none)"), msg


@pytest.mark.parametrize(("k", "ok"), [(1, True), (1024, True), (1025, False), (5000, False)])
def test_draft_tokens_are_bounded(tmp_path: Path, k: int, ok: bool) -> None:
    msg = _load(tmp_path, f"name: s\nmodel: {{preset: tiny}}\n"
                          f"speculative: {{method: ngram, num_tokens: {k}}}\n")
    assert (msg == "") == ok, msg
    if not ok:
        assert f"speculative.num_tokens: must be <= 1024 (got {k})" in msg


def test_chat_target_sends_text_unless_told_tokens(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(TARGET.format(extra=""))
    target = load_scenario(path).points()[0].target
    assert target is not None and target.prompt_format == "text"
    msg = _load(tmp_path, TARGET.format(extra="  prompt_format: tokens\n"))
    assert msg.endswith("target.prompt_format: endpoint chat takes text messages; allowed with "
                        "chat: text"), msg


def test_int4_without_a_group_takes_the_largest_that_divides(tmp_path: Path) -> None:
    """SmolLM2's projections read 576 and 1536 columns: 128 does not divide 576, 64 does."""
    path = tmp_path / "q.yaml"
    path.write_text("name: q\nmodel: {preset: smollm2-135m, quant: {weights: int4}}\n")
    point = load_scenario(path).points()[0]
    assert point.quant_config().group_size == 64
    assert point.to_dict()["model"]["quant"]["group_size"] == 64  # what ran is recorded
    assert point.notes and "int4 groups of 64" in point.notes[0]
    path.write_text("name: q\nmodel: {preset: llama-small, quant: {weights: int4}}\n")
    point = load_scenario(path).points()[0]
    assert point.quant_config().group_size == 128 and point.notes == ()
    path.write_text("name: q\nmodel: {preset: smollm2-135m, quant: {weights: int4, "
                    "group_size: 32}}\n")
    assert load_scenario(path).points()[0].quant_config().group_size == 32


def test_an_exponent_without_a_dot_is_a_number(tmp_path: Path) -> None:
    """YAML 1.2 reads 1e-9 as a float (PyYAML's YAML 1.1 made it a string), so a rate that
    low reaches the duration bound instead of 'must be a number'."""
    body = ("name: r\nmodel: {preset: tiny}\n"
            "workload: {kind: poisson, rate: RATE, num_requests: 10}\n")
    msg = _load(tmp_path, body.replace("RATE", "1e-9"))
    assert "workload.rate: 10 requests at 1e-09/s" in msg and "max_duration_s" in msg, msg
    assert _load(tmp_path, body.replace("RATE", "2E1")) == ""
    path = tmp_path / "s.yaml"
    path.write_text(body.replace("RATE", "5"))
    point = load_scenario(path, ("workload.rate=4e1",)).points()[0]
    assert point.workload.rate == 40.0
