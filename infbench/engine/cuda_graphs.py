"""CUDA graphs for decode steps (`engine.cuda_graphs: true`, GPU only).

At small batch a decode step is hundreds of short kernel launches, and on a fast
GPU the CPU cannot issue them as fast as they run.  As in vLLM and gpt-fast, the
whole decode forward (embedding -> layers -> LM head) is captured once per
batch-size bucket (1, 2, 4, 8, 16, 24, 32, ... up to max_num_seqs) and replayed
with the step's inputs copied into static buffers.  Padding rows get slot -1
(store_kv skips them) and context length 0 (the decode kernel returns zeros), so
they neither write the cache nor produce NaNs.  Block tables are padded to the
width a sequence of max_seq_len tokens needs, which fixes the kernels' grids.

Prefill and mixed steps, MLA and recurrent-state models run eagerly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from infbench.engine.kv_cache import KVCache
from infbench.model.context import AttentionContext, LanguageModel
from infbench.model.ops import Ops


def batch_buckets(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max(max_num_seqs, 16) + 1, 8))
    return [s for s in sizes if s < max_num_seqs] + [max_num_seqs]


class DecodeGraphs:
    """Captured decode forwards keyed by padded batch size."""

    def __init__(self, model: LanguageModel, kv: KVCache, ops: Ops, device: torch.device,
                 max_num_seqs: int, max_seq_len: int,
                 make_context: Callable[..., AttentionContext]) -> None:
        self.model = model
        self.kv = kv
        self.ops = ops
        self.device = device
        self.buckets = batch_buckets(max_num_seqs)
        self.max_blocks = math.ceil(max_seq_len / kv.block_size)
        self.make_context = make_context
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}

    def bucket(self, batch: int) -> int | None:
        for size in self.buckets:
            if size >= batch:
                return size
        return None

    def _static(self, size: int) -> dict[str, torch.Tensor]:
        dev = self.device
        return {
            "input_ids": torch.zeros(size, dtype=torch.long, device=dev),
            "positions": torch.zeros(size, dtype=torch.long, device=dev),
            "slot_mapping": torch.full((size,), -1, dtype=torch.long, device=dev),
            "tables": torch.zeros(size, self.max_blocks, dtype=torch.int32, device=dev),
            "context_lens": torch.zeros(size, dtype=torch.int32, device=dev),
        }

    def _forward(self, buf: dict[str, torch.Tensor]) -> torch.Tensor:
        ctx = self.make_context(buf)
        hidden = self.model(buf["input_ids"], buf["positions"], ctx)  # (P, H)
        return self.model.compute_logits(hidden)  # (P, V) float32

    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]:
        buf = self._static(size)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up: Triton JIT and lazy cuBLAS init
            for _ in range(2):
                self._forward(buf)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            buf["logits"] = self._forward(buf)
        return graph, buf

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor | None:
        """Replay the bucket's graph for a decode-only batch; None if it does not fit."""
        batch, width = tables.shape
        size = self.bucket(batch)
        if size is None or width > self.max_blocks:
            return None
        if size not in self.graphs:
            self.graphs[size] = self._capture(size)
        graph, buf = self.graphs[size]
        buf["input_ids"][:batch].copy_(input_ids)
        buf["positions"][:batch].copy_(positions)
        buf["slot_mapping"].fill_(-1)
        buf["slot_mapping"][:batch].copy_(slot_mapping)
        buf["tables"].zero_()
        buf["tables"][:batch, :width].copy_(tables)
        buf["context_lens"].zero_()
        buf["context_lens"][:batch].copy_(context_lens)
        graph.replay()
        return buf["logits"][:batch]
