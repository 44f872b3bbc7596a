"""One definition per concept: each scenario section is derived from its config, and the
registries (weight formats, proposers, mixers) are what the schema and the docs' tables list."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from infbench.core import config, formats
from infbench.core.gguf_types import NATIVE_FORMATS
from infbench.core.speculative import HEAD_METHODS, SPECULATIVE_METHODS, SpeculativeConfig
from infbench.scenario import engine, model, workload
from infbench.scenario.document import Scenario
from infbench.scenario.errors import _model_class

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ sections derived from configs
@pytest.mark.parametrize("section, cls, left_out", [
    (model.QuantSection, config.QuantConfig, {"native_mix", "kv_bits"}),
    (model.PruneSection, config.PruneConfig, set()),
    (engine.EngineSection, config.EngineConfig, set()),
    (engine.SpeculativeSection, SpeculativeConfig, set()),
    (workload.WorkloadSection, workload.WorkloadPoint, set()),
], ids=lambda v: getattr(v, "__name__", ""))
def test_each_section_is_its_config(section: Any, cls: type, left_out: set[str]) -> None:
    fields = [f for f in dataclasses.fields(cls) if f.name not in left_out]
    assert list(section.model_fields) == [f.name for f in fields]
    built = section()
    for f in fields:
        value = getattr(built, f.name)
        expected = f.default
        if f.name in workload.SWEEPABLE_WORKLOAD:
            expected = None if expected is None else [expected]
        if (cls, f.name) == (SpeculativeConfig, "draft_cost_ratio"):
            expected = None  # resolved per method by .config()
        assert value == expected, f.name


def test_the_section_describes_each_key_with_the_configs_docstring() -> None:
    docs = Scenario.model_json_schema()["$defs"]
    assert docs["QuantSection"]["properties"]["group_size"]["description"] == (
        "int4: input columns per group (32, 64 or 128).")
    assert docs["SpeculativeSection"]["properties"]["num_tokens"]["description"] == (
        "Draft tokens proposed per step (k).")
    assert "shared system prompt" in docs["WorkloadSection"]["properties"][
        "shared_prefix_len"]["description"]


def test_a_point_s_speculative_config_resolves_the_draft_cost() -> None:
    assert engine.SpeculativeSection(method="draft").config().draft_cost_ratio == 0.1
    assert engine.SpeculativeSection(method="ngram").config().draft_cost_ratio == 0.0
    assert engine.SpeculativeSection(method="ngram", draft_cost_ratio=0.3).config() == (
        SpeculativeConfig("ngram", draft_cost_ratio=0.3))


# ------------------------------------------------------------------ the registries
def _enum(section: str, key: str) -> tuple[Any, ...]:
    prop = Scenario.model_json_schema()["$defs"][section]["properties"][key]
    return tuple(prop.get("enum") or next(p["enum"] for p in prop["anyOf"] if "enum" in p))


def test_weight_formats_are_one_table() -> None:
    assert formats.WEIGHT_QUANT == config.WEIGHT_QUANT == tuple(formats.WEIGHT_FORMATS)
    assert set(formats.QUANTIZED_WEIGHTS) < set(formats.WEIGHT_QUANT)
    assert _enum("QuantSection", "weights") == formats.WEIGHT_QUANT
    assert _enum("SpeculativeSection", "draft_quant") == formats.DRAFT_QUANT
    assert _enum("SpeculativeSection", "draft_group_size") == formats.INT4_GROUP_SIZES
    text = Scenario.model_json_schema()["$defs"]["QuantSection"]["properties"]["weights"][
        "description"]
    assert all(t in text for t in NATIVE_FORMATS)  # Q4_K and Q6_K too


def test_proposers_are_one_list() -> None:
    assert _enum("SpeculativeSection", "method") == SPECULATIVE_METHODS
    assert set(HEAD_METHODS) <= set(SPECULATIVE_METHODS)


@pytest.mark.parametrize("kind", config.ATTENTION_KINDS)
def test_each_attention_kind_maps_to_one_mixer(kind: str) -> None:
    extra = {"sliding": {"window": 16}, "mla": {"kv_lora_rank": 32}}.get(kind, {})
    attention = config.AttentionConfig(kind=kind, **extra)
    cfg = config.ModelConfig.from_name("tiny").with_overrides(attention=attention)
    assert {s.mixer for s in cfg.layers()} == {config.KIND_MIXER[kind]}
    assert set(config.KIND_MIXER.values()) == set(config.MIXERS)


# ------------------------------------------------------------------ the docs' tables
_ROW = re.compile(r"^\| `([a-z_.]+)` \| `([a-z0-9_ ]+)` \|", re.M)


def _literals(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) is Literal:
        return set(typing.get_args(annotation))
    return {v for arg in typing.get_args(annotation) for v in _literals(arg)}


def _field(dotted: str) -> Any:
    cls: Any = Scenario
    *heads, last = dotted.split(".")
    for part in heads:
        cls = _model_class(cls.model_fields[part].annotation)
    return cls.model_fields[last].annotation


def test_the_scenario_key_tables_list_the_allowed_values() -> None:
    """Every `| key | \\`a b c\\` |` row of docs/scenarios.md whose key takes a Literal lists
    exactly that Literal's values (the backend, proposer and weights rows had drifted)."""
    checked = 0
    heading = ""
    for line in (REPO / "docs" / "scenarios.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            found = re.fullmatch(r"## `([a-z_.]+)`", line)
            heading = found.group(1) if found else ""
        row = _ROW.match(line)
        if row is None:
            continue
        key, values = row.groups()
        for dotted in (key, f"{heading}.{key}"):
            try:
                allowed = _literals(_field(dotted))
            except (KeyError, AttributeError):
                continue
            if allowed:
                assert {str(v) for v in allowed} == set(values.split()), dotted
                checked += 1
            break
    assert checked >= 15


def test_the_quantization_table_lists_the_allowed_values() -> None:
    text = (REPO / "docs" / "quantization.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `model\.(quant\.[a-z_]+)` \| ((?:`[a-z0-9_]+`(?:, )?)+) \|", text,
                      re.M)
    assert {key for key, _ in rows} >= {"quant.weights", "quant.method", "quant.kv"}
    for key, values in rows:
        assert set(re.findall(r"`([a-z0-9_]+)`", values)) == {
            str(v) for v in _literals(_field("model." + key))}, key


def test_the_quantization_pages_list_the_native_types() -> None:
    native = set(NATIVE_FORMATS)
    for page, pattern in (("scenarios.md", r"`quant.weights` \|.*?GGUF file's ([A-Z0-9_/]+) "),
                          ("quantization.md", r"native: a GGUF file's own ([A-Z0-9_/]+) "),
                          ("quantization-gguf.md", r"stores as ([A-Z0-9_, ]+?) or (Q\d_\w+)")):
        text = (REPO / "docs" / page).read_text(encoding="utf-8")
        found = re.search(pattern, text)
        assert found is not None, page
        listed = set(re.split(r"[/, ]+", " ".join(found.groups()))) - {""}
        assert listed == native, page
