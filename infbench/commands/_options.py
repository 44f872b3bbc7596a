"""Shared validators for command-line options: bad values are refused at the boundary.

Each function here is a Typer `callback=`: it receives the converted value, returns it
unchanged when it is allowed and raises `typer.BadParameter` otherwise.  Click attaches
the option to the exception, and `infbench.cli` prints it as one line naming the option:
`error: --top-k: must be >= 0 (got -1)`.  None (an option left at its None default)
always passes; the command body applies its own default.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import typer

from infbench.checkpoint.metadata import model_source  # noqa: F401  (opt.model_source)
from infbench.core.config import (
    ACTIVATION_QUANT,
    ATTENTION_KINDS,
    BACKENDS,
    DEVICES,
    DTYPES,
    FEATURE_MAPS,
    KV_QUANT,
    WEIGHT_QUANT,
)
from infbench.core.formats import FP8_SCALES


def _int_at_least(minimum: int) -> Callable[[int | None], int | None]:
    def check(value: int | None) -> int | None:
        if value is not None and value < minimum:
            raise typer.BadParameter(f"must be >= {minimum} (got {value})")
        return value

    return check


# The largest seed torch's generators take; infbench.scenario.schema.MAX_SEED is the same bound
# (not imported: that module pulls in pydantic, and the CLI imports this one on startup).
MAX_SEED = 2**63 - 1


def seed(value: int | None) -> int | None:
    """A random seed in [0, 2**63 - 1]."""
    if value is not None and not 0 <= value <= MAX_SEED:
        raise typer.BadParameter(f"must be in [0, 2**63 - 1] (got {value})")
    return value


positive_int = _int_at_least(1)
"""A count that must be at least 1 (tokens, batch, heads, ranks, group sizes)."""

non_negative_int = _int_at_least(0)
"""A count where 0 is meaningful (`--top-k 0`: off)."""


def _check_finite(value: float) -> None:
    if not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number (got {value})")


def non_negative_float(value: float | None) -> float | None:
    """A finite float >= 0 (`--temperature`, `--spec-draft-ratio`)."""
    if value is not None:
        _check_finite(value)
        if value < 0:
            raise typer.BadParameter(f"must be >= 0 (got {value})")
    return value


def positive_finite(value: float | None) -> float | None:
    """A finite number > 0 (a learning rate)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a finite number > 0 (got {value})")
    return value


def note(message: str) -> None:
    """Progress on stderr (stdout keeps the table or the JSON)."""
    print(message, file=sys.stderr, flush=True)


def unit_interval(value: float | None) -> float | None:
    """A finite float in [0, 1] (a rate such as `--spec-acceptance`)."""
    if value is not None:
        _check_finite(value)
        if not 0.0 <= value <= 1.0:
            raise typer.BadParameter(f"must be in [0, 1] (got {value})")
    return value


def probability_mass(value: float | None) -> float | None:
    """A finite float in (0, 1] (`--top-p`: 1 keeps every token)."""
    if value is not None:
        _check_finite(value)
        if not 0.0 < value <= 1.0:
            raise typer.BadParameter(f"must be in (0, 1] (got {value})")
    return value


def parse_positive_list(text: str) -> list[int]:
    """'1,8,64' -> [1, 8, 64]; refuses '', '1,,2', '0' and non-integers with BadParameter."""
    parts = [part.strip() for part in text.split(",")]
    if any(not part for part in parts):
        raise typer.BadParameter(
            f"expected comma-separated integers >= 1 such as 1,8,64 (got {text!r})")
    sizes: list[int] = []
    for part in parts:
        try:
            size = int(part)
        except ValueError:
            raise typer.BadParameter(
                f"expected comma-separated integers >= 1 such as 1,8,64; {part!r} is not an "
                f"integer (got {text!r})") from None
        if size < 1:
            raise typer.BadParameter(f"each size must be >= 1 (got {size} in {text!r})")
        sizes.append(size)
    return sizes


def positive_int_list(value: str | None) -> str | None:
    """A comma-separated list of counts, kept as text for the command body to split."""
    if value is not None:
        parse_positive_list(value)
    return value


def token_id_list(value: str | None) -> str | None:
    """Comma-separated token ids >= 0 (`--prompt-ids 1,2,3`): no empty entries."""
    if value is None:
        return value
    parts = [part.strip() for part in value.split(",")]
    if any(not part for part in parts):
        raise typer.BadParameter(
            f"expected comma-separated token ids such as 1,2,3 (got {value!r})")
    for part in parts:
        try:
            token = int(part)
        except ValueError:
            raise typer.BadParameter(
                f"expected comma-separated token ids such as 1,2,3; {part!r} is not an integer "
                f"(got {value!r})") from None
        if token < 0:
            raise typer.BadParameter(f"token ids must be >= 0 (got {token})")
    return value


def name_list(value: str | None) -> str | None:
    """A comma-separated list of names (`--models a,b`): no empty entries."""
    if value is not None:
        parts = [part.strip() for part in value.split(",")]
        if any(not part for part in parts):
            raise typer.BadParameter(f"expected comma-separated names (got {value!r})")
    return value


def non_empty(value: str | None) -> str | None:
    """A string option that must not be empty or blank (`--model ''`)."""
    if value is not None and not value.strip():
        raise typer.BadParameter("must not be empty")
    return value


def utf8_text(value: str | None) -> str | None:
    """Text that must be valid UTF-8: undecodable bytes in argv reach Python as surrogate
    escapes, which no tokenizer takes."""
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise typer.BadParameter(f"not valid UTF-8 (bytes {value[exc.start:exc.end]!a} at "
                                     f"character {exc.start})") from None
    return value


def output_file(value: Path | None) -> Path | None:
    """A file the command will write: not an existing directory (`--csv .`).  A path that
    cannot even be looked at (a name too long) passes here: the command's
    `core.io.check_output_file` or the atomic writer says why in one line."""
    try:
        is_dir = value is not None and value.is_dir()
    except OSError:
        is_dir = False
    if is_dir:
        raise typer.BadParameter(f"{value} is a directory; expected a file name")
    return value


def one_of(allowed: tuple[str, ...]) -> Callable[[str | None], str | None]:
    """A name from `allowed` (the tuples of core/config.py, the same the scenario schema uses)."""
    def check(value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise typer.BadParameter(f"must not be empty; allowed: {', '.join(allowed)}")
        if value is not None and value not in allowed:
            raise typer.BadParameter(f"unknown value {value!r}; allowed: {', '.join(allowed)}")
        return value

    return check


dtype = one_of(DTYPES)
dtype_or_auto = one_of(("auto", *DTYPES))
attention_kind = one_of(ATTENTION_KINDS)
feature_map = one_of(FEATURE_MAPS)
weight_quant = one_of(WEIGHT_QUANT)
kv_quant = one_of(KV_QUANT)
activation_quant = one_of(ACTIVATION_QUANT)
fp8_scales = one_of(FP8_SCALES)
backend = one_of(BACKENDS)
device = one_of(DEVICES)


def choices(allowed: tuple[str, ...]) -> str:
    """'a | b | c' for a help text."""
    return " | ".join(allowed)


ACTIVATIONS_HELP = ("What quantized projections multiply: float (weight-only) | int8 (llama.cpp's "
                    "int8 blocks) | fp8 (W8A8, with --quant fp8: the float8 peak) | fp4 "
                    "(W4A4, with --quant mxfp4/nvfp4: the float4 peak) (default: float).")
FP8_SCALES_HELP = ("fp8 weight scales: tensor | channel | block (128x128 tiles) "
                   "(default: channel; --quant fp8 only).")
MODEL_HELP = "A preset name, a Hugging Face model directory (config.json) or a .gguf file."
