"""What a scenario asks for either runs, is refused by name, or is recorded as switched off.

`speculative` on a model whose state cannot roll back (linear attention, SSM) is refused
by `run` with the reason, while `predict` keeps pricing it.  Prefix
caching on a recurrent-state model, or CUDA graphs where the engine runs eagerly, are
switched off by the engine: the result says so (`engine_disabled`) and stderr notes it once
per point.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infbench.core.errors import UserError
from infbench.scenario.schema import load_scenario

_BASE = {
    "name": "downgrade", "device": "cpu", "dtype": "float32", "hardware": "cpu",
    "model": {"preset": "tiny", "overrides": {"max_seq_len": 64, "num_layers": 2}},
    "workload": {"kind": "static", "batch_size": [1, 2], "prompt_len": 8, "gen_len": 3},
    "engine": {"block_size": 4},
    "measure": {"warmup": 0, "repeats": 1},
}


def _points(tmp: Path, **changes: object) -> list[object]:
    doc = {**_BASE, **changes}
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path).points()  # type: ignore[return-value]


def test_run_refuses_speculation_it_cannot_roll_back_but_predict_prices_it(
        tmp_path: Path) -> None:
    from infbench.hardware.spec import get_hardware
    from infbench.measure.bench import run_point
    from infbench.measure.prediction import predict_point

    point = _points(tmp_path, speculative={"method": "ngram", "num_tokens": 3},
                    model={**_BASE["model"],  # type: ignore[dict-item]
                           "attention": {"kind": "linear"}})[0]
    with pytest.raises(UserError, match="speculative.method='ngram': the model has "
                                        "linear-attention or SSM layers") as info:
        run_point(point)
    assert str(tmp_path / "s.yaml") in str(info.value)
    predicted = predict_point(point, point.model_config(), get_hardware("cpu"))  # type: ignore[attr-defined]
    assert predicted  # the analytic side keeps pricing it


def test_switched_off_features_are_recorded_and_noted_per_point(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from infbench.measure.bench import ModelCache, run_point

    points = _points(tmp_path, model={**_BASE["model"],  # type: ignore[dict-item]
                                      "attention": {"kind": "linear", "attn_every": 2}},
                     engine={"block_size": 4, "enable_prefix_caching": True,
                             "cuda_graphs": True})
    cache = ModelCache()
    results = [run_point(p, cache=cache) for p in points]
    err = capsys.readouterr().err
    for result in results:
        features = {d["feature"]: d["reason"] for d in result["engine_disabled"]}
        assert set(features) == {"enable_prefix_caching", "cuda_graphs"}, features
        assert "recurrent" in features["enable_prefix_caching"]
    assert err.count("engine.enable_prefix_caching is off") == len(points) == 2
    assert err.count("engine.cuda_graphs is off") == 2


def test_nothing_recorded_when_nothing_is_switched_off(tmp_path: Path) -> None:
    from infbench.measure.bench import run_point

    result = run_point(_points(tmp_path)[0])
    assert result["engine_disabled"] == []
