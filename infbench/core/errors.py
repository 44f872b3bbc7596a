"""Error types that the CLI turns into one-line messages with exit code 2.

Anything the user can fix (a bad YAML key, an unknown preset, a checkpoint that
does not exist, a model that does not fit) raises `UserError`; the CLI prints
`error: <message>` on stderr without a traceback.  Programming errors keep their
tracebacks.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a one-line message naming the file, the key and what is allowed."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """An invalid model, attention, quantization or engine configuration."""


class ResultSchemaError(UserError):
    """A result file that is missing, malformed or from another schema version."""


class DoesNotFitError(UserError):
    """Weights plus the minimum KV cache do not fit the memory budget."""


class DamagedFileError(UserError):
    """A file that exists but cannot be parsed (truncated, corrupted, wrong format)."""
