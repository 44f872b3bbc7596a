"""The scenario file's `parallel:` section (pydantic), kept out of `scenario/schema.py`.

```yaml
parallel:
  tp: 4          # tensor parallel degree (divides the attention heads)
  pp: 2          # pipeline stages
  ep: 1          # expert parallel degree within tp (MoE models)
  replicas: 1    # data-parallel copies of the whole model
  microbatches:  # pipeline micro-batches (default: pp)
```

The analytic model reads it (`predict`, and the prediction next to a measured run); the
engine runs one device, so `run` measures a `parallel:` scenario's single-device twin only
when every degree is 1.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from infbench.core.parallel import MAX_DEVICES, ParallelConfig

Degree = Annotated[int, Field(ge=1, le=MAX_DEVICES, strict=True)]


class ParallelSection(BaseModel):
    """How the model is spread over devices (core/parallel.py has the pricing rules)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tp: Degree = 1
    """Tensor parallel degree: heads, MLP width and vocabulary split this many ways."""
    pp: Degree = 1
    """Pipeline stages: the layers split into this many consecutive stages."""
    ep: Degree = 1
    """Expert parallel degree within the tp devices of a stage (divides tp; MoE only)."""
    replicas: Degree = 1
    """Data-parallel replicas of the whole model: throughput x replicas."""
    microbatches: Annotated[int, Field(ge=1, strict=True)] | None = None
    """Pipeline micro-batches (default: pp)."""

    def config(self) -> ParallelConfig:
        return ParallelConfig(self.tp, self.pp, self.ep, self.replicas, self.microbatches)
