"""The scenario's value types and limits, defined once, and the base of every section.

Values are strict: a count is a plain integer (`true`, `2.5` and `"8"` are refused, not
coerced), a real number is finite, and every count or rate is at most `MAX_VALUE` (2**24).
The sections (scenario/model.py, engine.py, workload.py, measure.py) are typed by these.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# Sanity limits: larger values are typos or overflows, not workloads (same bound as the
# engine's and the analytic model's MAX_TOKENS / MAX_BATCH).
MAX_VALUE = 2**24
MAX_POINTS = 10_000  # sweep points of one scenario
MAX_SEED = 2**63 - 1
MAX_BYTES = 2.0**50  # engine.kv_cache_memory given in bytes

# strict: YAML `true`, `2.5` or `"8"` is an error, never silently a count of 1, 2 or 8.
PosInt = Annotated[int, Field(gt=0, le=MAX_VALUE, strict=True)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_VALUE, strict=True)]
PosFloat = Annotated[float, Field(gt=0, le=MAX_VALUE, strict=True, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, le=MAX_VALUE, strict=True, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, strict=True, allow_inf_nan=False)]
StrictBool = Annotated[bool, Field(strict=True)]
Percentile = Annotated[float, Field(gt=0, le=100, strict=True, allow_inf_nan=False)]


def short_repr(value: Any) -> str:
    """repr on one line, at most 80 characters (a fuzzed value can be a huge nested list)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."


def _rate_value(value: Any) -> Any:
    """`inf`, `.inf` or "inf" (vLLM's --request-rate inf: every request at t=0) -> math.inf."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", ".inf", "infinity"):
        return math.inf
    return value


def _rate_check(value: Any) -> Any:
    """A rate is a finite number in (0, 2**24] or inf (PosFloat's checks, inf let through)."""
    if isinstance(value, float) and value == math.inf:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number > 0 or inf (got {short_repr(value)})")
    if not math.isfinite(value) or not value > 0:
        raise ValueError(f"must be a number > 0 or inf (got {short_repr(value)})")
    if value > MAX_VALUE:
        raise ValueError(f"must be <= {MAX_VALUE} (2**24, infbench's sanity limit) or inf "
                         f"(got {short_repr(value)})")
    return float(value)


# Requests per second: a number in (0, 2**24] or inf (given as .inf, inf or "inf").
Rate = Annotated[float, BeforeValidator(_rate_check), BeforeValidator(
    _rate_value, json_schema_input_type=Union[float, str])]


def parse_fraction(value: Any) -> float:
    """The one parser of regression thresholds: '5%' -> 0.05, 0.05 -> 0.05, in [0, 1).

    A bare number of 1 or more is refused as ambiguous (is 5 meant as 5% or 500%?), and a
    threshold of 100% or more would pass any regression.  Raises ValueError with the reason.
    """
    if isinstance(value, bool):
        raise ValueError(f"must be a fraction like 0.05 or a percentage like '5%' (got {value!r})")
    text = str(value).strip()
    try:
        frac = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"must be a fraction like 0.05 or a percentage like '5%' "
                         f"(got {value!r})") from None
    if not 0 <= frac < 1:  # also refuses NaN
        raise ValueError(f"must be in [0, 1) as a fraction or [0%, 100%) as a percentage "
                         f"(got {value!r})")
    return frac


class Section(BaseModel):
    """A scenario section: unknown keys refused, the attribute docstrings its descriptions,
    frozen (a point holds its sections as they were validated)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True,
                              use_attribute_docstrings=True, frozen=True)
