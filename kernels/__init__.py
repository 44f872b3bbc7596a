"""Triton kernels for the inference hot path, each with a torch reference (leaf package)."""
