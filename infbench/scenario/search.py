"""The scenario's `search:` section: what `infbench search` varies and when it stops.

    search:
      over: rate            # rate (workload.rate, req/s) | concurrency (workload.max_concurrency)
      lo: 1                 # the first value tried
      hi: 64                # optional: the bracket's top; unset: double from lo until a fail
      tolerance: 0.1        # stop bisecting when (first fail - last pass) <= tolerance * pass
      max_points: 12        # points run at most, boundary repeats included
      boundary_repeats: 3   # tries of each end of the final bracket (median attainment)

Validated once with the scenario (pydantic, extra keys refused); the checks that need the
other sections (an SLO to hold, a workload kind the searched key applies to, the key not
also swept) live in `Scenario` (scenario/document.py), so a bad block is one line naming
the file and the key before anything runs.  The search itself is measure/search.py.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from infbench.scenario.values import PosFloat, Section

SearchOver = Literal["rate", "concurrency"]
SEARCH_OVER: tuple[str, ...] = typing.get_args(SearchOver)
# The workload key each `over` sets at every point the search runs.
SEARCH_KEYS = {"rate": "rate", "concurrency": "max_concurrency"}
MAX_SEARCH_POINTS = 100
MAX_BOUNDARY_REPEATS = 20


class SearchSection(Section):
    """search: the capacity search of `infbench search` (docs/search.md)."""

    over: SearchOver = "rate"
    """rate: workload.rate (req/s, kind poisson); concurrency: workload.max_concurrency."""
    lo: PosFloat
    """The first value tried; the search reports none when it misses the SLO here."""
    hi: PosFloat | None = None
    """The top of the bracket; unset: doubled from lo until a value misses the SLO."""
    tolerance: Annotated[float, Field(gt=0, lt=1, strict=True, allow_inf_nan=False)] = 0.1
    """Relative width at which bisection stops: (first fail - last pass) <= tolerance x
    last pass (concurrency stops at a width of 1 at the latest)."""
    max_points: Annotated[int, Field(ge=2, le=MAX_SEARCH_POINTS, strict=True)] = 12
    """Points run at most, each boundary repeat counted."""
    boundary_repeats: Annotated[int, Field(ge=1, le=MAX_BOUNDARY_REPEATS, strict=True)] = 3
    """Tries of each end of the final bracket; a value passes when the median of its tries'
    attainments reaches measure.slo.target."""

    @field_validator("lo", "hi")
    @classmethod
    def _whole_concurrency(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("over") == "concurrency" and (
                value != int(value)):
            raise ValueError(f"a concurrency is a whole number of requests in flight "
                             f"(got {value:g})")
        return value

    @field_validator("hi")
    @classmethod
    def _above_lo(cls, value: float | None, info: ValidationInfo) -> float | None:
        lo = info.data.get("lo")
        if value is not None and lo is not None and value <= lo:
            raise ValueError(f"must be > search.lo ({lo:g}) (got {value:g})")
        return value

    @property
    def is_integer(self) -> bool:
        return self.over == "concurrency"

    @property
    def workload_key(self) -> str:
        """The workload key the search sets: rate or max_concurrency."""
        return SEARCH_KEYS[self.over]
