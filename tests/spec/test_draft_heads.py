"""Medusa and EAGLE draft heads (model/draft_heads.py) and their checkpoint file
(model/draft_train.py): drafts are the argmax of the heads, EAGLE's incremental drafting
equals its full-sequence forward, a saved file loads back to the same drafts, and a file
made for another model (or no draft-head file at all) is a one-line UserError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from infbench.core.errors import UserError
from infbench.model.context import DenseContext
from infbench.model.draft_heads import EagleHead, MedusaHeads
from infbench.model.draft_train import load_draft_heads, new_heads, save_draft_heads
from infbench.model.loader import load_model


def tiny_target(seed: int = 3, **overrides: Any) -> Any:
    return load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=seed,
                      overrides=overrides or None).model


def random_medusa(target: Any, num_heads: int = 3) -> MedusaHeads:
    heads = MedusaHeads(target.config.hidden_size, num_heads)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return heads


def random_eagle(target: Any) -> EagleHead:
    head = new_heads("eagle", target, 1, seed=1)
    assert isinstance(head, EagleHead)
    with torch.no_grad():  # larger than the training init: drafts far from ties
        for p in head.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
    return head


def features_of(target: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return target(torch.tensor(ids), torch.arange(len(ids)), DenseContext.single(len(ids)))


def eagle_full_drafts(head: EagleHead, target: Any, features: torch.Tensor, ids: list[int],
                      k: int) -> tuple[list[int], torch.Tensor]:
    """Drafts by re-running the full forward over the real rows plus every draft row so far;
    returns them and the outputs g of the real rows."""
    length = len(ids)
    feats, tokens = features[:length - 1], torch.tensor(ids[1:])  # rows j = 0..L-2
    drafts: list[int] = []
    with torch.no_grad():
        for _ in range(k):
            g = head(feats, target.embed_tokens(tokens), [0, len(tokens)])
            drafts.append(int(target.compute_logits(g[-1:]).argmax(-1)))
            feats = torch.cat([feats, g[-1:]])
            tokens = torch.cat([tokens, torch.tensor(drafts[-1:])])
        g_real = head(features[:length - 1], target.embed_tokens(torch.tensor(ids[1:])),
                      [0, length - 1])
    return drafts, g_real


def test_medusa_drafts_are_each_heads_argmax() -> None:
    target = tiny_target()
    heads = random_medusa(target)
    f = torch.randn(5, 64)
    drafts = heads.draft(target, f, 5)  # more than K: K drafts
    assert drafts.shape == (5, 3)
    for i, block in enumerate(heads.blocks):
        out = f + F.silu(block(f))
        assert drafts[:, i].tolist() == target.compute_logits(out).argmax(-1).tolist()
    assert heads.draft(target, f, 0).shape == (5, 0)
    # New heads are the identity: each head drafts the target's own next token.
    zero = MedusaHeads(64, 2)
    expect = target.compute_logits(f).argmax(-1)
    assert (zero.draft(target, f, 2) == expect[:, None]).all()


def test_eagle_incremental_drafting_equals_the_full_forward() -> None:
    target = tiny_target()
    head = random_eagle(target)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (11, 7)]
    feats = [features_of(target, p) for p in prompts]
    with torch.no_grad():
        # Catch up in uneven chunks, both sequences batched in one extend per chunk.
        caches = [head.empty_cache(), head.empty_cache()]
        outs: list[list[torch.Tensor]] = [[], []]
        for cuts in ([0, 4, 0, 2], [4, 10, 2, 6]):  # (start, end) of rows per sequence
            spans = [(cuts[0], cuts[1]), (cuts[2], cuts[3])]
            rows = torch.cat([f[a:b] for f, (a, b) in zip(feats, spans, strict=True)])
            toks = torch.tensor([t for p, (a, b) in zip(prompts, spans, strict=True)
                                 for t in p[a + 1:b + 1]])
            out, caches = head.extend(rows, target.embed_tokens(toks),
                                      [b - a for a, b in spans], caches)
            outs[0].append(out[:spans[0][1] - spans[0][0]])
            outs[1].append(out[spans[0][1] - spans[0][0]:])
        assert [c.length for c in caches] == [10, 6]
        last = torch.stack([outs[0][-1][-1], outs[1][-1][-1]])
        drafts = head.draft(target, last, caches, [5, 3])
        assert head.draft(target, last, caches, [0, 2]) == [[], drafts[1][:2]]
    assert [c.length for c in caches] == [10, 6]  # speculative rows did not stay
    for b in range(2):
        expect, g_real = eagle_full_drafts(head, target, feats[b], prompts[b], [5, 3][b])
        torch.testing.assert_close(torch.cat(outs[b]), g_real, rtol=1e-4, atol=1e-5)
        assert drafts[b] == expect


def test_save_load_round_trip_gives_identical_drafts(tmp_path: Path) -> None:
    target = tiny_target()
    medusa, eagle = random_medusa(target), random_eagle(target)
    f = torch.randn(4, 64)
    for heads in (medusa, eagle):
        path = save_draft_heads(tmp_path / f"{type(heads).__name__}.safetensors", heads, target)
        loaded = load_draft_heads(path, target)
        assert type(loaded) is type(heads)
        assert all(torch.equal(a, b) for a, b in zip(heads.state_dict().values(),
                                                     loaded.state_dict().values(), strict=True))
        if isinstance(heads, MedusaHeads):
            assert isinstance(loaded, MedusaHeads)
            assert torch.equal(loaded.draft(target, f, 3), heads.draft(target, f, 3))
        else:
            assert isinstance(loaded, EagleHead)
            ids = list(range(3, 12))
            feats = features_of(target, ids)
            a, _ = eagle_full_drafts(heads, target, feats, ids, 4)
            b, _ = eagle_full_drafts(loaded, target, feats, ids, 4)
            assert a == b
    # A bfloat16 load of the same model matches the fingerprint; the heads follow its dtype.
    bf16 = load_model({"preset": "tiny"}, dtype="bfloat16", device="cpu", seed=3).model
    assert next(load_draft_heads(tmp_path / "MedusaHeads.safetensors", bf16).parameters()
                ).dtype == torch.bfloat16


def _one_error(path: Path, target: Any) -> str:
    with pytest.raises(UserError) as exc:
        load_draft_heads(path, target)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_file_for_another_model_or_no_draft_file_is_one_error(tmp_path: Path) -> None:
    target = tiny_target()
    path = save_draft_heads(tmp_path / "m.safetensors", random_medusa(target), target)
    assert "hidden_size 64 in the file, 32" in _one_error(path, tiny_target(hidden_size=32))
    assert "other weights" in _one_error(path, tiny_target(seed=4))
    assert "no such" in _one_error(tmp_path / "missing.safetensors", target)
    plain = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(plain))
    assert "not an infbench draft-head file" in _one_error(plain, target)
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(path.read_bytes()[:200])
    assert "damaged" in _one_error(damaged, target)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    assert "damaged" in _one_error(garbage, target)
