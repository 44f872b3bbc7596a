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
```

The analytic model reads it (`predict`, and the prediction next to a measured run); the
engine runs one device, so `run` measures a `parallel:` scenario's single-device twin only
when every degree is 1.
"""

from __future__ import annotations

import typing
from typing import Annotated

from pydantic import Field

from infbench.core.parallel import MAX_DEVICES, ParallelConfig
from infbench.scenario.derive import section_from
from infbench.scenario.values import Section

Degree = Annotated[int, Field(ge=1, le=MAX_DEVICES, strict=True)]


class _ParallelConfigOf(Section):
    """What `parallel:` adds to ParallelConfig's fields: the config it resolves to."""

    def config(self) -> ParallelConfig:
        return ParallelConfig(**self.model_dump())


if typing.TYPE_CHECKING:
    ParallelSection = _ParallelConfigOf
else:
    ParallelSection = section_from(
        ParallelConfig, "ParallelSection", base=_ParallelConfigOf, module=__name__,
        types={**dict.fromkeys(("tp", "pp", "ep", "replicas", "attention_dp"), Degree),
               "microbatches": Annotated[int, Field(ge=1, strict=True)] | None})
