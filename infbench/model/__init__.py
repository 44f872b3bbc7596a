"""The Llama-family model, its weight loaders and its tokenizer.

This package's `__init__` must not import torch: the analytic CLI reads model
shapes through `infbench.model.configs` and has to start instantly.  The
torch-using modules (`transformer`, `layers`, `linear`, `context`, `loader`,
`tokenizer`) are imported explicitly by the engine and the tests.
"""

from __future__ import annotations

from infbench.model.configs import config_from_gguf, config_from_hf_dir, resolve_gguf

__all__ = ["config_from_gguf", "config_from_hf_dir", "resolve_gguf"]
