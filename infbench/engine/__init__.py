"""The built-in batched inference engine (nano-vllm / vLLM design)."""
