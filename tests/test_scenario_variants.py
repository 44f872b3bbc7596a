"""The scenario's `variants:` block: named configurations one after another, each with the
sweep and workload lists inside it."""

from __future__ import annotations

import pytest

from infbench.core.errors import UserError
from infbench.scenario.schema import load_scenario

BASE = """
name: v
device: cpu
dtype: float32
model: {preset: tiny}
workload: {kind: static, batch_size: [1, 4], prompt_len: 8, gen_len: 4}
"""


def _load(tmp_path, text):
    f = tmp_path / "s.yaml"
    f.write_text(BASE + text)
    return load_scenario(f)


def test_variants_run_in_order_with_the_lists_inside(tmp_path):
    s = _load(tmp_path, """
sweep: {engine.block_size: [8, 16]}
variants:
  - {label: fp32}
  - {label: bf16, dtype: bfloat16}
  - {model.quant: {weights: int4, group_size: 32}, model.quant.method: rtn}
""")
    points = s.points()
    assert len(points) == 3 * 2 * 2
    assert [p.label for p in points[:4]] == [
        "variant=fp32,engine.block_size=8,batch_size=1",
        "variant=fp32,engine.block_size=8,batch_size=4",
        "variant=fp32,engine.block_size=16,batch_size=1",
        "variant=fp32,engine.block_size=16,batch_size=4"]
    assert {p.dtype for p in points[4:8]} == {"bfloat16"}
    q = points[8].quant_config()
    assert (q.weights, q.group_size, q.method) == ("int4", 32, "rtn")
    assert points[8].label.startswith("variant=model.quant=")
    assert points[0].quant_config().weights == "none"  # variants do not leak into each other
    assert [p.index for p in points] == list(range(12))


@pytest.mark.parametrize("text,match", [
    ("variants:\n  - {modle.quant.weights: int8}\n", r"variants: \[0\]\.modle\.quant\.weights: "
                                                    "unknown key"),
    ("variants:\n  - {label: a}\n  - {label: a, dtype: bfloat16}\n", "'a' is used twice"),
    ("variants:\n  - {label: ''}\n", "non-empty string"),
    ("variants:\n  - {model.quant.weights: int3}\n", "int3"),
])
def test_bad_variants_fail_at_load(tmp_path, text, match):
    with pytest.raises(UserError, match=match):
        _load(tmp_path, text).points()
