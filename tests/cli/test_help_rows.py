"""`infbench --help` lists every command in at most two lines (details live in each
command's own --help and in docs/cli.md)."""

from __future__ import annotations

import os
import subprocess
import sys


def _command_rows(columns: int) -> dict[str, int]:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    out = subprocess.run([sys.executable, "-m", "infbench.cli", "--help"], env=env,
                         capture_output=True, text=True, check=True).stdout
    body = out.split("Commands")[1]
    rows: dict[str, int] = {}
    current = None
    for line in body.splitlines():
        if not line.startswith("│"):  # the box's top and bottom edges
            continue
        inner = line[1:]
        if inner[:1] == " " and inner[1:2] not in (" ", ""):  # "│ name   help..."
            current = inner.split()[0]
            rows[current] = 1
        elif current is not None and inner.strip(" │"):
            rows[current] += 1
    return rows


def test_every_command_row_is_at_most_two_lines() -> None:
    for columns in (80, 100):
        rows = _command_rows(columns)
        assert {"predict", "run", "report", "plots", "eval", "serve"} <= set(rows)
        long = {name: n for name, n in rows.items() if n > 2}
        assert not long, f"at {columns} columns: {long}"
