"""infbench's version, importable by every layer (the package root re-exports it; the
root's lazy `LLM` export would otherwise make a reader of `__version__` depend on the
engine)."""

__version__ = "0.1.0"
