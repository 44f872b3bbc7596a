"""The evaluation text every machine has offline: CPython's documentation topics.

`pydoc_data.topics.topics` maps about 80 topic names (``"assert"``, ``"for"``,
``"specialnames"``, ...) to the English text of the Python language reference that
`help()` shows; it ships with every CPython, so perplexity needs no download.

The split is fixed by topic name, not by position, so a topic that a newer CPython
adds or drops does not move the others between splits: a topic belongs to the
calibration split when ``zlib.crc32(name) % 4 == 1`` (on CPython 3.11: 23 of 79 topics,
about 17% of the characters), and to the held-out test split otherwise.  Each split is
its topics' texts, sorted by name, joined with blank lines.  The text itself differs
between CPython versions, so every figure computed on it records `text_id()`.
"""

from __future__ import annotations

import platform
import zlib
from functools import cache

from infbench.core.errors import UserError

SPLITS = ("calibration", "test")
_CALIBRATION_BUCKET = 1  # crc32(name) % 4 == 1: about a sixth of the text on CPython 3.11
_NUM_BUCKETS = 4


def _topics() -> dict[str, str]:
    import pydoc_data.topics

    return dict(pydoc_data.topics.topics)


def split_of(name: str) -> str:
    """Which split a topic belongs to (fixed by its name alone)."""
    is_calibration = zlib.crc32(name.encode("utf-8")) % _NUM_BUCKETS == _CALIBRATION_BUCKET
    return "calibration" if is_calibration else "test"


def topic_names(split: str) -> list[str]:
    """The topic names of one split, sorted."""
    _check_split(split)
    return sorted(name for name in _topics() if split_of(name) == split)


@cache
def eval_text(split: str) -> str:
    """The whole text of one split: its topics sorted by name, joined with blank lines."""
    topics = _topics()
    return "\n\n".join(topics[name].strip() for name in topic_names(split))


def text_id(split: str = "test") -> str:
    """Names the exact text: e.g. ``pydoc_data.topics CPython 3.11.7 split=test``."""
    _check_split(split)
    return f"pydoc_data.topics CPython {platform.python_version()} split={split}"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"evaluation text split {split!r} is unknown; allowed: "
                        f"{', '.join(SPLITS)}")
