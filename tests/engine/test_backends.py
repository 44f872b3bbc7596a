"""The engine gives the same tokens with the Triton kernels (interpreter) and the torch refs."""

from __future__ import annotations

import os

import pytest
import torch

from infbench.core.config import EngineConfig
from infbench.core.errors import ConfigError
from infbench.engine.backend import get_ops, resolve_backend
from infbench.engine.engine import Engine, KVSizing
from infbench.engine.request import Request, SamplingParams
from infbench.model.loader import load_model


def _run(backend: str, requests):
    loaded = load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=3)
    cfg = EngineConfig(block_size=4, max_num_batched_tokens=16, backend=backend)
    engine = Engine.create(loaded, cfg, "cpu", "float32",
                           sizing=KVSizing.for_requests(requests, cfg.block_size))
    res = engine.run(requests)
    return engine, res


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="needs the Triton interpreter or a GPU")
def test_triton_backend_equals_torch_backend():
    reqs = [Request(f"r{i}", tuple(range(3 + i, 3 + i + n)),
                    SamplingParams(max_tokens=5, ignore_eos=True))
            for i, n in enumerate([7, 13, 3])]
    e_triton, triton_res = _run("triton", reqs)
    e_torch, torch_res = _run("torch", reqs)
    assert e_triton.ops.name == "triton" and e_torch.ops.name == "torch"
    assert triton_res.outputs == torch_res.outputs
    # chunked prefill (budget 16) mixed prefill and decode in one step: both kernels ran
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in triton_res.steps)


def test_auto_picks_the_cpu_kernels_on_cpu_and_triton_needs_the_interpreter(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_backend("auto", cpu) == "cpu"  # the C++ kernels build on this machine
    assert get_ops("torch", cpu).name == "torch"
    assert get_ops("cpu", cpu).name == "cpu"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="TRITON_INTERPRET"):
        resolve_backend("triton", cpu)


def test_without_the_cpu_kernels_auto_falls_back_to_torch_and_cpu_is_an_error(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("INFBENCH_CPU_KERNELS", "0")
    with pytest.warns(UserWarning, match="torch reference kernels.*INFBENCH_CPU_KERNELS=0"):
        assert resolve_backend("auto", cpu) == "torch"
    with pytest.raises(ConfigError, match="engine.backend: 'cpu' is unavailable here.*allowed"):
        resolve_backend("cpu", cpu)
    with pytest.raises(ConfigError, match="runs on the CPU"):
        resolve_backend("cpu", torch.device("meta"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_backend_gives_the_torch_backend_tokens(dtype):
    """Same greedy tokens through the C++ kernels and the torch references, with
    chunked prefill mixing prefill and decode in one step."""
    reqs = [Request(f"r{i}", tuple(range(3 + i, 3 + i + n)),
                    SamplingParams(max_tokens=6, ignore_eos=True))
            for i, n in enumerate([7, 13, 3, 40])]
    results = {}
    for backend in ("cpu", "torch"):
        loaded = load_model({"preset": "tiny"}, dtype=dtype, device="cpu", seed=3)
        cfg = EngineConfig(block_size=4, max_num_batched_tokens=16, backend=backend)
        engine = Engine.create(loaded, cfg, "cpu", dtype,
                               sizing=KVSizing.for_requests(reqs, cfg.block_size))
        assert engine.ops.name == backend
        results[backend] = engine.run(reqs)
    assert results["cpu"].outputs == results["torch"].outputs
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in results["cpu"].steps)
