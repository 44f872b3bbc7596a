"""The Medusa and EAGLE proposers (engine/spec/heads.py): fed the target's features through
`observe` as the engine feeds them, their drafts equal the heads computed directly, also
after chunked, re-sent and stale features; epochs, num_drafts 0, release and reset; and
inside the engine greedy speculation with either head equals plain greedy decoding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_draft_heads import (
    eagle_full_drafts,
    features_of,
    random_eagle,
    random_medusa,
    tiny_target,
)

from infbench.core.config import EngineConfig
from infbench.core.errors import ConfigError, UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.engine.engine import Engine, KVSizing
from infbench.engine.request import SamplingParams
from infbench.engine.spec.base import SpecRequest
from infbench.engine.spec.heads import EagleProposer, MedusaProposer, load_head_proposer
from infbench.model.draft_train import save_draft_heads
from infbench.model.loader import load_model
from tests.engine_helpers import greedy_recompute, random_requests


def request(seq_id: int, ids: list[int], k: int, epoch: int = 0) -> SpecRequest:
    return SpecRequest(seq_id, list(ids), k, SamplingParams(), [], epoch)


def prompts(*lengths: int, seed: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


def test_medusa_proposer_drafts_the_heads_argmax_from_f_l_minus_2() -> None:
    target = tiny_target()
    heads = random_medusa(target, 3)
    proposer = MedusaProposer(target, heads)
    assert proposer.needs_features and proposer.name == "medusa"
    seqs = prompts(9, 5)
    feats = [features_of(target, s) for s in seqs]
    proposer.observe(10, 0, 0, feats[0][:4])
    proposer.observe(10, 0, 4, feats[0][4:8])  # f_0..f_7 of 9 tokens
    proposer.observe(11, 0, 0, feats[1][:4])
    out = proposer.propose([request(10, seqs[0], 2), request(11, seqs[1], 5),
                            request(12, [1, 2, 3], 3)])
    assert out[0].tokens == heads.draft(target, feats[0][7:8], 2)[0].tolist()
    assert out[1].tokens == heads.draft(target, feats[1][3:4], 3)[0].tolist()  # at most K
    assert out[2].tokens == []  # no features observed
    assert all(p.probs is None for p in out)
    assert proposer.propose([request(10, seqs[0], 0)])[0].tokens == []
    # Features of positions >= L-1 (not yet valid) are ignored: L=5 drafts from f_3.
    proposer.observe(13, 0, 0, feats[0])
    assert proposer.propose([request(13, seqs[0][:5], 1)])[0].tokens == \
        heads.draft(target, feats[0][3:4], 1)[0].tolist()


def test_medusa_proposer_epochs_release_and_reset() -> None:
    target = tiny_target()
    proposer = MedusaProposer(target, random_medusa(target))
    ids = prompts(6)[0]
    feats = features_of(target, ids)
    proposer.observe(1, 0, 0, feats[:5])
    assert proposer.propose([request(1, ids, 2, epoch=1)])[0].tokens == []  # preempted
    proposer.observe(1, 1, 0, feats[:5])  # recomputed under the new epoch
    assert len(proposer.propose([request(1, ids, 2, epoch=1)])[0].tokens) == 2
    proposer.release(1)
    assert proposer.propose([request(1, ids, 2, epoch=1)])[0].tokens == []
    proposer.observe(1, 1, 0, feats[:5])
    proposer.reset()
    assert proposer.propose([request(1, ids, 2, epoch=1)])[0].tokens == []
    with pytest.raises(ValueError, match="never observed"):
        proposer.observe(2, 0, 3, feats[:2])


def test_eagle_proposer_equals_the_full_forward_across_steps() -> None:
    """Two sequences decoded step by step, as the engine would: a chunked prefill, then
    each step observes the accepted positions (some drafts taken, a rollback re-sends)."""
    target = tiny_target()
    head = random_eagle(target)
    proposer = EagleProposer(target, head)
    assert proposer.name == "eagle" and proposer.needs_features
    seqs = prompts(12, 20)
    full = [features_of(target, s) for s in seqs]
    # Prefill: 0..6 then 7..10 of sequence 0; 0..18 of sequence 1 (L = 12 and 20).
    proposer.observe(0, 0, 0, full[0][:7])
    proposer.observe(0, 0, 7, full[0][7:11])
    proposer.observe(1, 0, 0, full[1][:19])

    def check(lengths: list[int], ks: list[int]) -> None:
        reqs = [request(b, seqs[b][:n], k) for b, (n, k) in enumerate(zip(lengths, ks,
                                                                          strict=True))]
        out = proposer.propose(reqs)
        for b, (n, k) in enumerate(zip(lengths, ks, strict=True)):
            expect, _ = eagle_full_drafts(head, target, full[b], seqs[b][:n], k)
            assert out[b].tokens == expect[:k] and out[b].probs is None, (b, n)

    check([12, 20], [4, 2])
    check([12, 20], [3, 1])  # asked again without new features: the same drafts
    # Sequence 1 rolls back: features of 19..20 arrive, then 17..18 are re-sent.
    seqs[1] += prompts(3, seed=9)[0]
    full[1] = features_of(target, seqs[1])
    proposer.observe(1, 0, 19, full[1][19:21])
    proposer.observe(1, 0, 17, full[1][17:19])  # drops 19..20 again: L must be 19 now
    check([12, 19], [2, 5])
    proposer.observe(1, 0, 18, full[1][18:22])  # this step's input and 3 accepted drafts
    check([12, 23], [0, 3])
    # A preempted sequence starts over under its new epoch.
    proposer.observe(0, 1, 0, full[0][:11])
    out = proposer.propose([request(0, seqs[0], 3, epoch=1)])
    assert out[0].tokens == eagle_full_drafts(head, target, full[0], seqs[0], 3)[0]
    proposer.release(0)
    proposer.reset()
    assert proposer.propose([request(1, seqs[1], 3)])[0].tokens == []


def test_load_head_proposer_checks_the_method(tmp_path: Path) -> None:
    target = tiny_target()
    path = save_draft_heads(tmp_path / "m.safetensors", random_medusa(target), target)
    assert isinstance(load_head_proposer("medusa", path, target), MedusaProposer)
    with pytest.raises(UserError, match="holds medusa heads, not eagle ones"):
        load_head_proposer("eagle", path, target)


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_engine_greedy_speculation_with_heads_equals_plain_greedy(method: str,
                                                                  tmp_path: Path) -> None:
    loaded = load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=3)
    target = loaded.model
    heads: Any = random_medusa(target) if method == "medusa" else random_eagle(target)
    path = save_draft_heads(tmp_path / f"{method}.safetensors", heads, target)
    requests = random_requests([5, 9, 13], 12, 256, seed=1)
    cfg = EngineConfig(block_size=4, backend="torch", max_num_seqs=2)
    engine = Engine.create(loaded, cfg, "cpu", "float32", seed=0,
                           speculative=SpeculativeConfig(method, 3, heads=str(path)),
                           sizing=KVSizing.for_requests(requests, cfg.block_size),
                           source={"preset": "tiny"})
    out = engine.run(requests, realtime_arrivals=False)
    for r in requests:
        assert out.outputs[r.request_id] == greedy_recompute(target, r.prompt_ids,
                                                             r.sampling.max_tokens)
    drafts = [d for s in out.steps for d in s.spec_drafts]
    assert drafts and max(drafts) <= 3


def test_more_draft_tokens_than_medusa_heads_is_refused(tmp_path: Path) -> None:
    """Head i drafts token i + 1: k above the head count would silently draft fewer."""
    loaded = load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=3)
    heads = random_medusa(loaded.model)
    path = save_draft_heads(tmp_path / "m.safetensors", heads, loaded.model)
    cfg = EngineConfig(block_size=4, backend="torch", max_num_seqs=2)
    requests = random_requests([5], 4, 256, seed=1)

    def create(k: int) -> Engine:
        return Engine.create(loaded, cfg, "cpu", "float32", seed=0,
                             speculative=SpeculativeConfig("medusa", k, heads=str(path)),
                             sizing=KVSizing.for_requests(requests, cfg.block_size),
                             source={"preset": "tiny"})

    n = heads.num_heads
    assert create(n) is not None
    with pytest.raises(ConfigError, match=f"speculative.num_tokens {n + 1} exceeds the {n} "
                                          "Medusa heads"):
        create(n + 1)
