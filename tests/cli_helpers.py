"""Helpers shared by the tests that drive the CLI (found through pytest's pythonpath).

`run_cli` runs `infbench.cli.main` in-process, as a user's command line would, and returns
(exit code, stdout, stderr); `tiny_scenario` is the few-second scenario the end-to-end
tests run through the real engine (a random 2-layer model on the CPU).
"""

from __future__ import annotations

import sys

import pytest

from infbench import cli


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["infbench", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
        raise SystemExit(0)  # main() returns normally on success
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def tiny_scenario(name: str = "tiny_run", batch_size: str = "[1, 3]", prompt_len: int = 10,
                  gen_len: int = 6, warmup: int = 0, repeats: int = 1) -> str:
    return f"""
name: {name}
device: cpu
dtype: float32
hardware: cpu
model: {{preset: tiny, overrides: {{max_seq_len: 64}}}}
workload: {{kind: static, batch_size: {batch_size}, prompt_len: {prompt_len},
  gen_len: {gen_len}, seed: 0}}
engine: {{block_size: 4, max_num_batched_tokens: 32}}
measure: {{warmup: {warmup}, repeats: {repeats}}}
"""


def run_args(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`cli.main(args)` without touching sys.argv: (exit code, stdout, stderr)."""
    try:
        cli.main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err
