"""The scenario file's `parallel:` section (pydantic), derived from `core.parallel.ParallelConfig`
(the keys, defaults and their docs are the config's; the bounds are added here).

```yaml
parallel:
  tp: 4          # tensor parallel degree (divides the attention heads)
  pp: 2          # pipeline stages
  ep: 1          # expert parallel degree within tp (MoE models)
  replicas: 1    # data-parallel copies of the whole model
  microbatches:  # pipeline micro-batches (default: pp)
  attention_dp: 1         # attention data-parallel ranks within tp (MoE: experts ep = tp)
  dispatch_dtype: model   # the MoE all-to-all dispatch: model (its dtype) | float8
  dense_dp: false         # under attention_dp: the dense MLP on each rank's own tokens
  disaggregated:          # or prefill and decode on separate pools, each its own layout:
    prefill: {tp: 8, replicas: 2}     #   2 prefill instances of 8 devices
    decode: {tp: 8, attention_dp: 8}  #   1 decode instance of 8 devices
```

The analytic model reads it (`predict`, and the prediction next to a measured run); the
engine runs one device, so `run` measures a `parallel:` scenario's single-device twin only
when every degree is 1.
"""

from __future__ import annotations

import typing
from typing import Annotated

from pydantic import Field

from infbench.core.parallel import MAX_DEVICES, Disaggregation, ParallelConfig
from infbench.scenario.derive import section_from
from infbench.scenario.values import Section

Degree = Annotated[int, Field(ge=1, le=MAX_DEVICES, strict=True)]


_TYPES = {**dict.fromkeys(("tp", "pp", "ep", "replicas", "attention_dp"), Degree),
          "microbatches": Annotated[int, Field(ge=1, strict=True)] | None}


class _PoolConfigOf(Section):
    """A pool of `parallel.disaggregated`: the layout keys of `parallel:`, no nesting."""

    def config(self) -> ParallelConfig:
        return ParallelConfig(**self.model_dump())


if typing.TYPE_CHECKING:
    PoolSection = _PoolConfigOf
else:
    PoolSection = section_from(
        ParallelConfig, "PoolSection", base=_PoolConfigOf, module=__name__,
        exclude=("disaggregated",), types=_TYPES)


class DisaggregatedSection(Section):
    """`parallel.disaggregated`: the prefill and the decode pool, both required."""

    prefill: PoolSection
    """The layout of a prefill instance (replicas: the prefill instances)."""
    decode: PoolSection
    """The layout of a decode instance (replicas: the decode instances)."""


class _ParallelConfigOf(Section):
    """What `parallel:` adds to ParallelConfig's fields: the config it resolves to."""

    def config(self) -> ParallelConfig:
        values = self.model_dump(exclude={"disaggregated"})
        pools = getattr(self, "disaggregated", None)
        if pools is not None:
            values["disaggregated"] = Disaggregation(pools.prefill.config(),
                                                     pools.decode.config())
        return ParallelConfig(**values)


if typing.TYPE_CHECKING:
    ParallelSection = _ParallelConfigOf
else:
    ParallelSection = section_from(
        ParallelConfig, "ParallelSection", base=_ParallelConfigOf, module=__name__,
        types={**_TYPES, "disaggregated": DisaggregatedSection | None})
