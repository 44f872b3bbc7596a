"""The scenario's `model:` section: one source (preset | path | gguf) and its changes.

`model.quant`, `model.prune`, `model.attention` and `model.overrides` are derived from core's
`QuantConfig`, `PruneConfig`, `AttentionConfig` and `ModelConfig` (scenario/derive.py), so a
key, its default and its allowed values are written once, in core.  The validated, frozen
`ModelSection` is also the point's model (`ScenarioPoint.model`), with `weights` resolved to
what the loader will run.
"""

from __future__ import annotations

import copy
import typing
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from infbench.core.config import (
    PRESETS,
    AttentionConfig,
    ModelConfig,
    ModelWeights,
    PruneConfig,
    QuantConfig,
)
from infbench.core.formats import weight_formats_text
from infbench.scenario.derive import section_from
from infbench.scenario.values import MAX_VALUE, PosFloat, Section

if typing.TYPE_CHECKING:  # the derived sections, as mypy sees them
    QuantSection = Section
    PruneSection = Section
    AttentionSection = Section
    OverridesSection = Section
else:
    QuantSection = section_from(
        QuantConfig, "QuantSection", exclude=("native_mix", "kv_bits"), module=__name__,
        types={"outlier_threshold": PosFloat}, docs={"weights": weight_formats_text()})
    PruneSection = section_from(PruneConfig, "PruneSection", module=__name__, types={
        "layers": Annotated[int, Field(ge=0, le=MAX_VALUE, strict=True)],
        "mlp_fraction": Annotated[float, Field(ge=0, lt=1, strict=True, allow_inf_nan=False)]})
    AttentionSection = section_from(
        AttentionConfig, "AttentionSection", optional=True, module=__name__,
        doc="Attention/mixer settings; unset fields keep the model's own (see "
            "config.AttentionConfig).")
    # Every ModelConfig field, optional; model.attention has its own section.
    OverridesSection = section_from(
        ModelConfig, "OverridesSection", exclude=("attention",), optional=True,
        types={"moe": dict[str, Any], "rope_scaling": dict[str, Any]}, module=__name__,
        doc="ModelConfig fields to replace; only the keys set are applied.")


class ModelSection(Section):
    preset: str | None = None
    """A preset name from infbench.core.config.PRESETS."""
    path: str | None = None
    """A Hugging Face model directory (config.json + safetensors)."""
    gguf: str | None = None
    """A .gguf file, or `smollm2-135m` for the packaged SmolLM2-135M-Instruct."""
    overrides: OverridesSection = Field(default_factory=OverridesSection)
    """ModelConfig fields to replace, e.g. {num_layers: 2}."""
    attention: AttentionSection = Field(default_factory=AttentionSection)
    quant: QuantSection = Field(default_factory=QuantSection)
    prune: PruneSection = Field(default_factory=PruneSection)
    weights: ModelWeights = "auto"
    """auto: a preset naming a released model (smollm2-135m) runs its real weights when they are
    installed; random: seeded random weights, enough for benchmarks of shapes.  In a point:
    real | random, resolved as the loader will (the gate compares it between runs)."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value.lower() not in PRESETS:
            raise ValueError(f"unknown value {value!r}; allowed: {', '.join(PRESETS)}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        given = [k for k in ("preset", "path", "gguf") if getattr(self, k) is not None]
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ValueError(f"give exactly one of preset, path, gguf (got {got})")
        return self

    def source(self) -> dict[str, str]:
        """{"preset" | "path" | "gguf": value}: what the loader and the readers take."""
        return {k: v for k, v in (("preset", self.preset), ("path", self.path),
                                  ("gguf", self.gguf)) if v is not None}

    def changes(self) -> dict[str, Any]:
        """overrides + attention (the keys the scenario set) as `ModelConfig.with_overrides`
        and `load_model` take them."""
        out = self.overrides.model_dump(exclude_unset=True)
        attention = self.attention.model_dump(exclude_unset=True)
        if attention:
            out["attention"] = attention
        return out

    def quant_config(self) -> QuantConfig:
        """model.quant as core's config (its cross-key checks run here: a ConfigError)."""
        return QuantConfig(**self.quant.model_dump())

    def prune_config(self) -> PruneConfig:
        return PruneConfig(**self.prune.model_dump())

    def to_dict(self) -> dict[str, Any]:
        """The stored form inside a result (the keys results have always had): overrides and
        attention as set, quant and prune with every key."""
        return {**self.source(),
                "overrides": copy.deepcopy(self.overrides.model_dump(exclude_unset=True)),
                "attention": self.attention.model_dump(exclude_unset=True),
                "quant": self.quant.model_dump(), "prune": self.prune.model_dump(),
                "weights": self.weights}
