"""The one map from dtype names to torch dtypes.

The names are `core.config.DTYPE_BYTES`'s (the analytic model prices the same ones);
the map lives here because `core` does not import torch.
"""

from __future__ import annotations

import torch

from infbench.core.config import DTYPE_BYTES
from infbench.core.errors import ConfigError

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_BYTES}


def torch_dtype(name: str, key: str = "dtype") -> torch.dtype:
    """The torch dtype called `name`; `key` names the setting in the one-line error."""
    if name not in TORCH_DTYPES:
        raise ConfigError(f"{key}: unknown dtype {name!r}; allowed: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]
