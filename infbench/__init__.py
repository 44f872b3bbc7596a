"""infbench: LLM inference performance toolkit."""
__version__ = "0.1.0"
