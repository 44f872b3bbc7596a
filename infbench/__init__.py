"""infbench: LLM inference performance toolkit.

`from infbench import LLM, SamplingParams` is the Python API (`infbench/engine/llm.py`).
It is exported lazily (module `__getattr__`): `import infbench` and the analytic commands
(`predict`, `kv`, `report`, `compare`) must start without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infbench.core.version import __version__

__all__ = ["LLM", "CompletionOutput", "RequestMetrics", "RequestOutput", "SamplingParams",
           "__version__"]

if TYPE_CHECKING:
    from infbench.engine.llm import (
        LLM,
        CompletionOutput,
        RequestMetrics,
        RequestOutput,
        SamplingParams,
    )

_LAZY = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from infbench.engine import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'infbench' has no attribute {name!r}")
