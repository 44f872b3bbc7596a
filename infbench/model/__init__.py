"""The model: one mixer class per KV scheme, weight loaders (HF directory, GGUF) and tokenizers.

This package's `__init__` imports nothing: the analytic CLI reads model shapes through
`infbench.checkpoint.metadata` without torch and has to start instantly.  The
torch-using modules (`transformer`, `layers`, `linear`, `context`, `loader`,
`tokenizer`) are imported explicitly by the engine and the tests.
"""
