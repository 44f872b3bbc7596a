"""The Python API: `LLM(model).generate(prompts, params)`, vLLM's offline interface.

`LLM` loads a model (a preset, an HF directory or a GGUF file, resolved like the CLI's
`--model`), sizes one `Engine` for any prompt up to `max_model_len` tokens with
`max_num_seqs` sequences at once (`KVSizing.for_max_model_len`, the same path
`infbench generate` takes), and `generate` serves a batch of prompts to completion
with continuous batching, returning one `RequestOutput` per prompt in input order.

The prefix cache stays warm across `generate` calls, as in vLLM; benchmark runs
(`Engine.run` without `keep_prefix_cache`) start cold instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from infbench.checkpoint.metadata import model_source
from infbench.core.config import DTYPES, KV_QUANT, EngineConfig, ModelConfig
from infbench.core.device import auto_dtype, available_memory_bytes, resolve_device
from infbench.core.errors import UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.engine.engine import Engine, KVSizing
from infbench.engine.records import RequestRecord, StepRecord
from infbench.engine.request import Request, SamplingParams
from infbench.model import loader
from infbench.model.tokenizer import Tokenizer

__all__ = ["LLM", "CompletionOutput", "RequestMetrics", "RequestOutput", "SamplingParams"]

# On a CPU the KV pool is RAM the whole machine shares: a fraction of it would zero tens
# of GB a few prompts never touch.  vLLM's CPU backend also takes a fixed KV space.
CPU_KV_CACHE_BYTES = 4 << 30
_ENGINE_DEFAULTS = EngineConfig()

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class CompletionOutput:
    """One sample of a prompt: `text` is None when the model has no tokenizer."""

    text: str | None
    token_ids: list[int]
    finish_reason: str  # length (max_tokens or max_model_len) | stop (stop_token_ids) | eos
    index: int = 0  # sample index, 0 .. n - 1


@dataclass(frozen=True)
class RequestMetrics:
    """Seconds from the `generate` call (every prompt arrives at once) to its tokens."""

    ttft_s: float  # first token of the first sample
    e2e_s: float  # last token of the last sample
    num_cached_prompt_tokens: int  # prompt tokens served from the prefix cache


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]  # n samples, by index
    metrics: RequestMetrics


class LLM:
    """A model plus an engine sized for it, vLLM-style: `LLM(model).generate(prompts)`.

    `model` is a preset name, an HF checkpoint directory, a `.gguf` file, `smollm2-135m`
    (the packaged real model), or a `LoadedModel` already loaded (its dtype and device).
    `kv_cache_memory` is a fraction of the memory free after the weights (<= 1) or bytes
    (> 1); unset, 0.9 on a GPU and min(4 GiB, 0.9 of free RAM) on a CPU.  `num_kv_blocks`
    fixes the pool instead.  Either way it never exceeds what `max_num_seqs` sequences of
    `max_model_len` tokens can occupy.  `kv_quant` stores the KV cache as int8 (or fp8 on
    a CUDA GPU of compute capability 8.9+) with per-token, per-head scales, as the
    scenario key `model.quant.kv` does.
    """

    def __init__(
        self,
        model: str | loader.LoadedModel,
        *,
        dtype: str = "auto",
        device: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int = _ENGINE_DEFAULTS.max_num_seqs,
        max_num_batched_tokens: int = _ENGINE_DEFAULTS.max_num_batched_tokens,
        block_size: int = _ENGINE_DEFAULTS.block_size,
        kv_cache_memory: float | None = None,
        num_kv_blocks: int | None = None,
        enable_prefix_caching: bool = _ENGINE_DEFAULTS.enable_prefix_caching,
        backend: str = _ENGINE_DEFAULTS.backend,
        seed: int = 0,
        num_threads: int | None = None,
        kv_quant: str = "none",
        speculative: SpeculativeConfig | None = None,
        source: dict[str, str] | None = None,
    ) -> None:
        """`speculative`: speculative decoding (a scenario's section; docs/speculative.md);
        `source`, the model source of a loaded `model`, lets a quantized self-draft load."""
        if kv_quant not in KV_QUANT:
            raise UserError(f"kv_quant={kv_quant!r}: allowed: {', '.join(KV_QUANT)}")
        if kv_cache_memory is not None and num_kv_blocks is not None:
            raise UserError("give kv_cache_memory or num_kv_blocks, not both")
        if num_kv_blocks is not None:
            _check_int("num_kv_blocks", num_kv_blocks)
        if isinstance(model, loader.LoadedModel):
            self._loaded = model
            param = next(model.model.parameters())
            self.device = _same("device", device, param.device.type)
            self.dtype = _same("dtype", dtype, str(param.dtype).removeprefix("torch."))
        else:
            if not isinstance(model, str) or not model:
                raise UserError(f"model must be a preset, a directory or a .gguf file, "
                                f"got {model!r}")
            self.device = resolve_device(device, "device")
            self.dtype = _resolve_dtype(dtype, self.device)
            source = model_source(model, "model")  # fail on a bad name before loading
            self._loaded = loader.load_model(source, dtype=self.dtype, device=self.device,
                                             seed=seed)
        cfg = self._loaded.config
        self.max_model_len = cfg.max_seq_len if max_model_len is None else max_model_len
        _check_int("max_model_len", self.max_model_len)
        if self.max_model_len > cfg.max_seq_len:
            raise UserError(f"max_model_len={self.max_model_len} exceeds the model context "
                            f"({cfg.name}: {cfg.max_seq_len} tokens)")
        if kv_cache_memory is None:
            kv_cache_memory = _ENGINE_DEFAULTS.kv_cache_memory
            if self.device == "cpu":
                free = available_memory_bytes(torch.device("cpu"))
                kv_cache_memory = float(min(CPU_KV_CACHE_BYTES, int(kv_cache_memory * free)))
        self.engine_config = EngineConfig(
            block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, backend=backend,
            kv_cache_memory=kv_cache_memory, enable_prefix_caching=enable_prefix_caching,
            num_threads=num_threads)
        sizing = KVSizing.for_max_model_len(self.max_model_len, self.engine_config,
                                            num_kv_blocks)
        self.engine = Engine.create(self._loaded, self.engine_config, self.device, self.dtype,
                                    sizing=sizing, seed=seed, kv_quant=kv_quant,
                                    speculative=speculative, source=source)
        self._ids = itertools.count()
        self.last_steps: list[StepRecord] = []

    @property
    def config(self) -> ModelConfig:
        return self._loaded.config

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._loaded.tokenizer

    # ---------------------------------------------------------------- generate
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt (text or token ids); one output per prompt, in input order.

        A prompt with `max_tokens` past `max_model_len` stops there (finish_reason
        "length"), as in vLLM; a prompt of `max_model_len` tokens or more is refused.
        """
        items = _as_prompt_list(prompts)
        params = self._params(sampling_params, len(items))
        requests: list[Request] = []
        texts: list[str | None] = []
        for i, (item, sp) in enumerate(zip(items, params, strict=True)):
            text, ids = self._encode(i, item)
            room = self.max_model_len - len(ids)
            if room < 1:
                raise UserError(f"prompt {i} has {len(ids)} tokens; max_model_len="
                                f"{self.max_model_len} leaves no room to generate")
            if sp.n > self.engine_config.max_num_seqs:
                raise UserError(f"prompt {i}: n={sp.n} samples exceed max_num_seqs="
                                f"{self.engine_config.max_num_seqs}")
            sampling = replace(sp, max_tokens=min(sp.max_tokens, room))
            requests.append(Request(str(next(self._ids)), tuple(ids), sampling, n=sp.n))
            texts.append(text)
        if not requests:
            return []
        try:
            run = self.engine.run(requests, realtime_arrivals=False, keep_prefix_cache=True)
        except BaseException:
            self.engine.reset()  # leave no half-served sequences for the next call
            raise
        self.last_steps = run.steps  # the engine's step records of this call
        by_request: dict[str, list[RequestRecord]] = {r.request_id: [] for r in requests}
        for rec in run.requests:
            by_request[rec.request_id.partition("/")[0]].append(rec)
        return [self._output(req, text, by_request[req.request_id])
                for req, text in zip(requests, texts, strict=True)]

    def _params(self, given: SamplingParams | Sequence[SamplingParams] | None,
                num_prompts: int) -> list[SamplingParams]:
        if given is None:
            return [SamplingParams()] * num_prompts
        if isinstance(given, SamplingParams):
            return [given] * num_prompts
        params = list(given)
        if len(params) != num_prompts:
            raise UserError(f"{len(params)} sampling params for {num_prompts} prompts; give one "
                            "SamplingParams or one per prompt")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise UserError(f"sampling_params[{i}] is a {type(p).__name__}, "
                                "not a SamplingParams")
        return params

    def _encode(self, index: int, prompt: Prompt) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of one prompt, checked against the vocabulary."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise UserError(f"model {self.config.name!r} has no tokenizer; give prompts as "
                                "token ids")
            text: str | None = prompt
            ids = self.tokenizer.encode(prompt)
        else:
            text, ids = None, list(prompt)
        if not ids:
            raise UserError(f"prompt {index} is empty")
        vocab = self.config.vocab_size
        for t in ids:
            if not _is_int(t) or not 0 <= t < vocab:
                raise UserError(f"prompt {index}: token {t!r} is outside the vocabulary "
                                f"(0..{vocab - 1})")
        return text, [int(t) for t in ids]

    def _output(self, request: Request, prompt: str | None,
                records: list[RequestRecord]) -> RequestOutput:
        records = sorted(records, key=lambda r: int(r.request_id.partition("/")[2] or 0))
        tok = self.tokenizer
        outputs = [CompletionOutput(
            text=tok.decode(rec.output_ids, skip_special_tokens=True) if tok else None,
            token_ids=list(rec.output_ids), finish_reason=rec.finish_reason, index=j)
            for j, rec in enumerate(records)]
        metrics = RequestMetrics(
            ttft_s=min(r.first_token_s for r in records) - records[0].arrival_s,
            e2e_s=max(r.finish_s for r in records) - records[0].arrival_s,
            num_cached_prompt_tokens=records[0].num_cached_prompt_tokens)
        return RequestOutput(request.request_id, prompt, list(request.prompt_ids), outputs,
                             metrics)

    def __repr__(self) -> str:
        kv = self.engine.kv
        return (f"LLM({self.config.name!r}, dtype={self.dtype}, device={self.device}, "
                f"max_model_len={self.max_model_len}, kv_blocks={kv.num_blocks}x"
                f"{self.engine_config.block_size})")


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text, or a list of token ids) or a list of them -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, Sequence):
        raise UserError(f"prompts must be a string, token ids or a list of them, "
                        f"got {type(prompts).__name__}")
    if prompts and all(_is_int(p) for p in prompts):
        return [prompts]  # type: ignore[list-item]  # one prompt of token ids
    out: list[Prompt] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str) or (isinstance(p, Sequence) and all(_is_int(t) for t in p)):
            out.append(p)  # type: ignore[arg-type]  # str or ids, checked just above
        else:
            raise UserError(f"prompt {i} must be a string or a list of token ids, "
                            f"got {type(p).__name__}")
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{key} must be an integer >= 1, got {value!r}")


def _resolve_dtype(dtype: str, device: str) -> str:
    """auto: bfloat16 on a GPU and on a CPU with native bf16, else float32 (`auto_dtype`)."""
    if dtype == "auto":
        return auto_dtype(device)[0]
    if dtype not in DTYPES:
        raise UserError(f"dtype {dtype!r} unknown; allowed: auto, {', '.join(DTYPES)}")
    return dtype


def _same(key: str, asked: str, actual: str) -> str:
    """A loaded model fixes its dtype and device: `auto` or the same value."""
    if asked not in ("auto", actual):
        raise UserError(f"{key}={asked!r}, but the loaded model is already on {actual}")
    return actual
