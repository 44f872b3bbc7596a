"""Self-distillation training of draft heads (model/draft_train.py) on a tiny random Llama
with a byte-level tokenizer: a few steps lower the held-out loss, the run is seeded, and
bad settings are one-line UserErrors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from eval_checkpoint import write_tiny_with_tokenizer

from infbench.core.errors import UserError
from infbench.model.draft_heads import EagleHead, MedusaHeads
from infbench.model.draft_train import DraftTrainConfig, self_distill_data, train_draft_heads
from infbench.model.loader import load_model

SMALL: dict[str, Any] = dict(num_sequences=6, heldout_sequences=2, prompt_tokens=16,
                             new_tokens=40, batch_positions=64, batch_sequences=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tiny_with_tokenizer(tmp_path_factory.mktemp("tiny_draft_train"))
    return load_model({"path": str(path)}, dtype="float32", device="cpu")


def test_data_is_the_targets_own_greedy_text_and_features(tiny: Any) -> None:
    config = DraftTrainConfig("medusa", 1, **SMALL)
    data = self_distill_data(tiny.model, tiny.tokenizer, config)
    assert data.token_ids.shape == (6, 56) and data.features.shape == (6, 56, 64)
    assert data.num_train == 4
    with torch.no_grad():
        logits = tiny.model.compute_logits(data.features[0])
    # Every generated token is the argmax of the previous position's features.
    assert logits[15:-1].argmax(-1).tolist() == data.token_ids[0, 16:].tolist()


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_a_few_steps_lower_the_loss_and_are_seeded(tiny: Any, method: str) -> None:
    config = DraftTrainConfig(method, 12, num_heads=2, lr=3e-3, **SMALL)
    first = train_draft_heads(tiny.model, tiny.tokenizer, config)
    report = first.report
    assert report.final_loss < report.initial_loss
    assert report.train_losses[-1] < report.train_losses[0]
    assert len(report.train_losses) == 12 and report.steps == 12
    assert report.train_positions == 4 * 40 and report.heldout_positions > 0
    assert 0 <= report.head1_accuracy <= 1
    expected_type = MedusaHeads if method == "medusa" else EagleHead
    assert isinstance(first.heads, expected_type)
    assert len(report.head_accuracy) == (2 if method == "medusa" else 1)
    again = train_draft_heads(tiny.model, tiny.tokenizer, config)
    assert again.report.train_losses == report.train_losses
    for a, b in zip(first.heads.state_dict().values(), again.heads.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kw, needle", [
    (dict(method="lookahead"), "draft method 'lookahead' is unknown; allowed: medusa, eagle"),
    (dict(steps=0), "steps must be >= 1"),
    (dict(num_heads=0), "num_heads must be >= 1"),
    (dict(lr=float("nan")), "lr must be a finite number > 0"),
    (dict(num_sequences=2, heldout_sequences=2), "must exceed heldout_sequences"),
], ids=["method", "steps", "heads", "lr", "heldout"])
def test_bad_settings_are_one_line_errors(kw: dict[str, Any], needle: str) -> None:
    args = {"method": "medusa", "steps": 1, **kw}
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        DraftTrainConfig(**args)


def test_sequences_longer_than_the_model_are_refused(tiny: Any, tmp_path: Path) -> None:
    config = DraftTrainConfig("eagle", 1, prompt_tokens=200, new_tokens=100)
    with pytest.raises(UserError, match="sequences of 300 tokens; model .* allows 256"):
        train_draft_heads(tiny.model, tiny.tokenizer, config)
