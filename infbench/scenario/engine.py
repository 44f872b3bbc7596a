"""The scenario's `engine:` and `speculative:` sections, derived from core's `EngineConfig` and
`SpeculativeConfig` (scenario/derive.py): the keys, defaults and allowed values are the
configs' own; what only the YAML needs (bounds, the checks between keys) is added here."""

from __future__ import annotations

import typing
from typing import Annotated

from pydantic import Field, model_validator

from infbench.core.config import EngineConfig
from infbench.core.speculative import HEAD_METHODS, MAX_SPEC_TOKENS, SpeculativeConfig
from infbench.scenario.derive import section_from
from infbench.scenario.values import MAX_BYTES, Fraction, NonNegFloat, Section


def _check_speculative(spec: SpeculativeConfig) -> None:
    """The checks between the keys of `speculative:`: a ValueError naming the key."""
    m = spec.method
    draft_only = {"draft_model": spec.draft_model, "draft_layers": spec.draft_layers,
                  "draft_quant": None if spec.draft_quant == "none" else spec.draft_quant}
    for key, value in draft_only.items():
        if value is not None and m != "draft":
            raise ValueError(f"{key} is a setting of method draft (method is {m!r})")
    if m in HEAD_METHODS and not spec.heads:
        raise ValueError(f"method {m} needs heads: the checkpoint of "
                         f"`infbench train-draft --method {m}`")
    if spec.heads is not None and m not in HEAD_METHODS:
        raise ValueError(f"heads is a setting of methods {' and '.join(HEAD_METHODS)} "
                         f"(method is {m!r})")
    if spec.ngram_min > spec.ngram_max:
        raise ValueError(f"ngram_min ({spec.ngram_min}) must be <= ngram_max "
                         f"({spec.ngram_max})")


class _SpeculativeChecks(Section):
    """What `speculative:` adds to SpeculativeConfig's fields: the checks between them and the
    resolved config."""

    @model_validator(mode="after")
    def _consistent(self) -> _SpeculativeChecks:
        _check_speculative(self.config())
        return self

    def config(self) -> SpeculativeConfig:
        """The resolved config: draft_cost_ratio unset -> 0.1 for method draft, else 0 (for
        mtp: priced from the MTP module's layer and head, roofline.analysis.mtp_step_s)."""
        values = self.model_dump()
        if values["draft_cost_ratio"] is None:
            values["draft_cost_ratio"] = 0.1 if values["method"] == "draft" else 0.0
        return SpeculativeConfig(**values)


if typing.TYPE_CHECKING:
    EngineSection = Section
    SpeculativeSection = _SpeculativeChecks
else:
    EngineSection = section_from(EngineConfig, "EngineSection", module=__name__, types={
        "kv_cache_memory": Annotated[float, Field(gt=0, le=MAX_BYTES, strict=True,
                                                  allow_inf_nan=False)]})
    # acceptance and draft_cost_ratio are priced by `predict` only; the ratio's default
    # depends on the method (_SpeculativeChecks.config resolves it).
    SpeculativeSection = section_from(
        SpeculativeConfig, "SpeculativeSection", base=_SpeculativeChecks, module=__name__,
        types={"acceptance": Fraction, "draft_cost_ratio": NonNegFloat | None,
               "num_tokens": Annotated[int, Field(gt=0, le=MAX_SPEC_TOKENS, strict=True)]},
        defaults={"draft_cost_ratio": None})
