"""Every quantized run result carries its accuracy next to its speed (measure/accuracy.py).

The model is a tiny random Llama with a byte-level tokenizer (tests/eval_checkpoint.py), so
a point, its accuracy and its unquantized reference take about a second.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_checkpoint import write_tiny_with_tokenizer

from infbench.core.errors import UserError
from infbench.measure.bench import ModelCache, run_point
from infbench.results.accessor import metric, metric_names
from infbench.results.gate import is_lower_better
from infbench.results.report import accuracy_table, report_frame, run_summary
from infbench.results.store import flatten_for_csv, validate_result
from infbench.scenario.schema import load_scenario


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_with_tokenizer(tmp_path_factory.mktemp("tiny_acc"))


def _points(tmp_path: Path, model: str, measure: str = "", batch: str = "1") -> list:
    path = tmp_path / "s.yaml"
    path.write_text(f"""
name: acc
device: cpu
dtype: float32
hardware: cpu
model: {model}
workload: {{kind: static, batch_size: {batch}, prompt_len: 8, gen_len: 4, seed: 0}}
engine: {{block_size: 4, max_num_batched_tokens: 32}}
measure: {{warmup: 0, repeats: 1{measure}}}
""")
    return load_scenario(path).points()


def test_quantized_point_carries_accuracy(tiny_dir: Path, tmp_path: Path) -> None:
    points = _points(tmp_path, f"{{path: {tiny_dir}, quant: {{weights: int8}}}}",
                     ", eval_tokens: 150", batch="[1, 2]")
    cache = ModelCache()
    results = [run_point(p, cache=cache) for p in points]
    acc = results[0]["accuracy"]
    assert acc["tokens"] == 150 and acc["agreement_prompts"] == 8
    assert acc["agreement_tokens"] == 32 and "split=test" in acc["text_id"]
    assert 100 < acc["perplexity"] < 400 and acc["reference_perplexity"] != acc["perplexity"]
    assert metric(results[0], "accuracy.perplexity_change") == pytest.approx(
        acc["perplexity"] / acc["reference_perplexity"] - 1)
    assert 0 <= metric(results[0], "accuracy.greedy_agreement") <= 1
    # the sweep measured the quantized model and its reference once, both points carry them
    assert len(cache.accuracy) == 2 and results[1]["accuracy"] == acc
    validate_result(results[0], "test")
    df = report_frame(results)
    assert list(df["perplexity"]) == [acc["perplexity"]] * 2
    assert "greedy_agreement" in df.columns
    assert run_summary(results[0])["accuracy.greedy_agreement"] == acc["greedy_agreement"]
    assert flatten_for_csv(results[0])["perplexity"] == acc["perplexity"]
    assert accuracy_table(results) is not None


def test_plain_point_measures_perplexity_only_when_asked(tiny_dir: Path, tmp_path: Path) -> None:
    plain = run_point(_points(tmp_path, f"{{path: {tiny_dir}}}")[0])
    assert "accuracy" not in plain
    assert "perplexity" not in report_frame([plain]).columns
    assert accuracy_table([plain]) is None
    asked = run_point(_points(tmp_path, f"{{path: {tiny_dir}}}", ", eval_tokens: 100")[0])
    acc = asked["accuracy"]
    assert acc["tokens"] == 100 and acc["perplexity"] > 1
    assert acc["reference_perplexity"] is None and acc["greedy_agreement"] is None


def test_model_without_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = "{preset: tiny, overrides: {max_seq_len: 64}, quant: {weights: int8}}"
    result = run_point(_points(tmp_path, tiny)[0])
    assert "accuracy" not in result
    assert "accuracy not measured" in capsys.readouterr().err
    with pytest.raises(UserError, match="measure.eval_tokens: model .* has no tokenizer"):
        run_point(_points(tmp_path, tiny, ", eval_tokens: 64")[0])


def test_eval_tokens_key_is_validated(tmp_path: Path) -> None:
    for bad in ("1", "0", "'many'", "2.5"):
        with pytest.raises(UserError, match="measure.eval_tokens"):
            _points(tmp_path, "{preset: tiny}", f", eval_tokens: {bad}")


def test_accuracy_names_read_and_gate_the_right_way() -> None:
    names = metric_names("accuracy")
    for name in ("accuracy.perplexity", "accuracy.perplexity_change",
                 "accuracy.greedy_agreement"):
        assert name in names
    assert is_lower_better("accuracy.perplexity")
    assert is_lower_better("accuracy.perplexity_change")
    assert not is_lower_better("accuracy.greedy_agreement")
    assert metric({"accuracy": None}, "accuracy.perplexity") is None
    with pytest.raises(UserError, match="unknown metric"):
        metric({}, "accuracy.perplexty")


def test_pruned_point_is_compared_with_the_unpruned_model(tiny_dir: Path,
                                                          tmp_path: Path) -> None:
    model = f"{{path: {tiny_dir}, prune: {{layers: 1, calibration_tokens: 64}}}}"
    result = run_point(_points(tmp_path, model, ", eval_tokens: 120")[0])
    acc = result["accuracy"]
    assert result["model_config"]["num_layers"] == 1
    assert acc["reference_perplexity"] is not None and acc["greedy_agreement"] is not None
    assert acc["perplexity"] != acc["reference_perplexity"]
