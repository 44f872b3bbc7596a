"""Checkpoint metadata: config.json and GGUF readers, the model-family tables (no torch)."""
