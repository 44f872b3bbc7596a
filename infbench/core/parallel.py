"""How one model is spread over devices: tensor, pipeline and expert parallel, replicas.

No torch and no pydantic here (the analytic commands import it on their start-up path);
the scenario file's `parallel:` section is validated by `scenario/parallel.py` and
becomes this dataclass.

- tp: tensor parallel degree.  Attention heads, the MLP's intermediate width and the
  vocabulary are split `tp` ways; two all-reduces per layer (after the attention output
  and after the MLP) and one after the vocabulary-parallel embedding, plus an all-gather
  of the logits.  KV heads are split too; when there are fewer KV heads than `tp` each
  device keeps one whole KV head (replicated), and an MLA latent cache is replicated on
  every device (as vLLM does).
- pp: pipeline stages: the layers are split into `pp` consecutive stages (the first
  `num_layers % pp` stages get one layer more); the embedding lives on the first stage and
  the final norm and LM head on the last.  A token's activations hop between stages.
- ep: expert parallel degree within the `tp` devices of a stage (`ep` divides `tp`): the
  routed experts are spread over `ep` groups of `tp / ep` devices; tokens go to their
  experts by an all-to-all (dispatch) and come back by another (combine), which replace
  the MoE layer's all-reduce.
- attention_dp: attention data parallel within the `tp` devices of a stage (SGLang's
  `--enable-dp-attention` with `--dp attention_dp`; it divides tp, MoE models only): the
  tp devices form `attention_dp` ranks of `tp / attention_dp` devices; each rank holds the
  attention weights (split over its devices) and the KV cache of its own 1/attention_dp
  of the sequences, so the attention and its cache are replicated attention_dp ways instead
  of split.  The MoE layers run expert parallel over all tp devices (`ep` becomes tp): each
  device dispatches its tokens to their experts by an all-to-all and gets them back by
  another.  The dense MLP layers and the LM head run tensor parallel over all tp devices on
  the tokens gathered from every rank (SGLang's default), the embedding is replicated.
- dense_dp: under attention_dp, the dense MLP layers run data parallel like the attention
  (SGLang's `--moe-dense-tp-size 1`): each rank runs them on its own tokens, split over its
  tp / attention_dp devices (replicated when a rank is one device), with a rank all-reduce
  after them instead of the all-gather and reduce-scatter over all tp devices.
- dispatch_dtype: what the MoE all-to-all's dispatch carries: the model dtype, or float8
  (DeepEP's FP8 dispatch: one byte per value plus a float32 scale per 128); the combine
  returns the expert outputs in the model dtype.
- disaggregated: prefill and decode on separate pools (DistServe; SGLang's and vLLM's
  prefill/decode disaggregation), each pool its own layout (`Disaggregation`): the prompt's
  KV cache crosses from a prefill instance to a decode instance over the link between them.
  The top-level degrees stay 1 then: each pool sets its own.
- replicas: independent copies of the whole (tp x pp) model serving different requests
  (data parallel): throughput x replicas at unchanged per-request latency.
- microbatches: how many micro-batches the batch is cut into for the pipeline (default:
  `pp`, as vLLM runs one per stage); irrelevant when pp is 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from infbench.core.config import MAX_BATCH, ModelConfig, check_count
from infbench.core.errors import ConfigError

MAX_DEVICES = 65536  # sanity limit of one degree (a TPU v5p pod is 8,960 chips)
DispatchDtype = Literal["model", "float8"]
DISPATCH_DTYPES: tuple[str, ...] = get_args(DispatchDtype)
FP8_SCALE_GROUP = 128  # values per float32 scale of an FP8 dispatch (DeepEP's layout)


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (the degrees that split n things evenly)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _allowed(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "")


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is spread over devices (the scenario's `parallel:` section is derived
    from these fields and their docstrings, scenario/parallel.py)."""

    tp: int = 1
    """Tensor parallel degree: heads, MLP width and vocabulary split this many ways."""
    pp: int = 1
    """Pipeline stages: the layers split into this many consecutive stages."""
    ep: int = 1
    """Expert parallel degree within the tp devices of a stage (divides tp; MoE only; all
    tp devices under attention_dp)."""
    replicas: int = 1
    """Data-parallel replicas of the whole model: throughput x replicas."""
    microbatches: int | None = None
    """Pipeline micro-batches (default: pp)."""
    attention_dp: int = 1
    """Attention data-parallel ranks within tp (divides tp; MoE only): each rank holds the
    attention and KV of its 1/attention_dp of the sequences; the experts run ep = tp."""
    dispatch_dtype: Annotated[str, DispatchDtype] = "model"
    """What the MoE all-to-all dispatch carries: the model dtype, or float8 (the combine
    stays in the model dtype)."""
    dense_dp: bool = False
    """Under attention_dp: the dense MLP layers run on each rank's own tokens, split over its
    tp / attention_dp devices, instead of over all tp devices on every rank's tokens."""
    disaggregated: Disaggregation | None = None
    """Prefill and decode on separate pools, {prefill: {tp, ...}, decode: {tp, ...}}, each
    pool a layout of these keys (replicas: the pool's instances)."""

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "ep", "replicas", "attention_dp"):
            check_count("parallel", key, getattr(self, key), MAX_DEVICES)
        if self.microbatches is not None:
            check_count("parallel", "microbatches", self.microbatches, MAX_BATCH)
        if self.dispatch_dtype not in DISPATCH_DTYPES:
            raise ConfigError(f"parallel.dispatch_dtype: unknown value {self.dispatch_dtype!r}; "
                              f"allowed: {', '.join(DISPATCH_DTYPES)}")
        if not isinstance(self.dense_dp, bool):
            raise ConfigError(f"parallel.dense_dp: {self.dense_dp!r} is not a boolean; "
                              "allowed: true, false")
        if self.dense_dp and self.attention_dp == 1 and self.disaggregated is None:
            raise ConfigError("parallel.dense_dp needs attention data parallelism (the dense "
                              "MLP runs on each attention rank's tokens); allowed: dense_dp "
                              "with attention_dp > 1, or leave it out")
        if self.tp % self.ep:
            raise ConfigError(f"parallel.ep={self.ep} must divide parallel.tp={self.tp} (the "
                              "experts of a stage are spread over its tp devices); allowed: "
                              f"{_allowed(divisors(self.tp))}")
        if self.tp % self.attention_dp:
            raise ConfigError(f"parallel.attention_dp={self.attention_dp} must divide "
                              f"parallel.tp={self.tp} (each attention rank is tp / attention_dp "
                              f"devices); allowed: {_allowed(divisors(self.tp))}")
        if self.disaggregated is not None:
            self._check_pools(self.disaggregated)
        if self.attention_dp > 1:
            if self.ep not in (1, self.tp):
                raise ConfigError(
                    f"parallel.ep={self.ep} with attention_dp={self.attention_dp}: the MoE "
                    f"layers run expert parallel over all tp={self.tp} devices; allowed: ep "
                    f"{self.tp}, or leave it out")
            object.__setattr__(self, "ep", self.tp)  # the frozen field's derived value

    def _check_pools(self, pools: Disaggregation) -> None:
        """With disaggregation the pools carry the layouts: the top level stays at 1."""
        top = {key: getattr(self, key) for key in ("tp", "pp", "ep", "replicas", "attention_dp")
               if getattr(self, key) != 1}
        if self.microbatches is not None:
            top["microbatches"] = self.microbatches
        if self.dispatch_dtype != "model":
            top["dispatch_dtype"] = self.dispatch_dtype
        if self.dense_dp:
            top["dense_dp"] = self.dense_dp
        if top:
            key, value = next(iter(top.items()))
            raise ConfigError(f"parallel.{key}={value} next to parallel.disaggregated: each "
                              f"pool sets its own layout; allowed: disaggregated.prefill.{key} "
                              f"and disaggregated.decode.{key}")
        for name, pool in (("prefill", pools.prefill), ("decode", pools.decode)):
            if pool.disaggregated is not None:
                raise ConfigError(f"parallel.disaggregated.{name}.disaggregated: a pool is one "
                                  "layout; allowed keys: tp, pp, ep, replicas, microbatches, "
                                  "attention_dp, dispatch_dtype, dense_dp")

    @property
    def trivial(self) -> bool:
        """One device, one replica: the model is priced exactly as without parallelism."""
        return (self.tp, self.pp, self.ep, self.replicas) == (1, 1, 1, 1) and \
            self.disaggregated is None

    @property
    def attention_tp(self) -> int:
        """Devices one attention rank's heads are split over (tp with no attention dp)."""
        return self.tp // self.attention_dp

    def rank_batch(self, batch: int) -> int:
        """Sequences of the fullest attention rank when `batch` are spread over the ranks."""
        return math.ceil(batch / self.attention_dp)

    @property
    def devices_per_replica(self) -> int:
        if self.disaggregated is not None:  # one prefill and one decode instance
            d = self.disaggregated
            return d.prefill.devices_per_replica + d.decode.devices_per_replica
        return self.tp * self.pp

    @property
    def devices(self) -> int:
        if self.disaggregated is not None:
            return self.disaggregated.prefill.devices + self.disaggregated.decode.devices
        return self.devices_per_replica * self.replicas

    def num_microbatches(self, batch: int) -> int:
        """Micro-batches of a batch: `microbatches` (default pp), at most one per sequence."""
        return max(1, min(self.microbatches or self.pp, batch))

    def check_model(self, cfg: ModelConfig) -> None:
        """The split must fit the model's shape: the attention's tp (tp / attention_dp)
        divides the heads (and the KV heads, or the KV heads divide it), pp is at most the
        layers, ep and attention_dp need routed experts ep divides.  Each refusal names
        both numbers and the degrees that would divide.  Disaggregated: each pool's."""
        if self.disaggregated is not None:
            for name, pool in (("prefill", self.disaggregated.prefill),
                               ("decode", self.disaggregated.decode)):
                try:
                    pool.check_model(cfg)
                except ConfigError as exc:
                    text = str(exc).replace("parallel.", f"parallel.disaggregated.{name}.")
                    raise ConfigError(text) from None
            return
        at = self.attention_tp
        what = f"parallel.tp={at}" if self.attention_dp == 1 else \
            f"parallel.tp / attention_dp = {self.tp} / {self.attention_dp} = {at}"
        if cfg.num_heads % at:
            raise ConfigError(f"{what} must divide the {cfg.num_heads} attention heads "
                              f"of {cfg.name}; allowed: {_allowed(divisors(cfg.num_heads))}")
        kvh = cfg.kv_heads
        if cfg.attention.kind != "mla" and kvh % at and at % kvh:
            fits = [d for d in divisors(cfg.num_heads) if kvh % d == 0 or d % kvh == 0]
            raise ConfigError(f"{what} and the {kvh} KV heads of {cfg.name} must divide "
                              f"one another; allowed: {_allowed(fits)}")
        if self.pp > cfg.num_layers:
            raise ConfigError(f"parallel.pp={self.pp} is more stages than the {cfg.num_layers} "
                              f"layers of {cfg.name}; allowed: 1..{cfg.num_layers}")
        if self.attention_dp > 1 and cfg.moe is None:
            raise ConfigError(f"parallel.attention_dp={self.attention_dp} needs a "
                              f"mixture-of-experts model (the MoE layers run expert parallel "
                              f"over the group); {cfg.name} has no routed experts; allowed: "
                              "attention_dp 1 (replicas for data-parallel copies)")
        if self.ep > 1:
            if cfg.moe is None:
                raise ConfigError(f"parallel.ep={self.ep} needs a mixture-of-experts model; "
                                  f"{cfg.name} has no routed experts; allowed: ep 1")
            if cfg.moe.num_experts % self.ep:
                source = "" if self.attention_dp == 1 else \
                    f" (attention_dp={self.attention_dp}: ep is all tp={self.tp} devices)"
                raise ConfigError(f"parallel.ep={self.ep}{source} must divide the "
                                  f"{cfg.moe.num_experts} routed experts of {cfg.name}; "
                                  f"allowed: {_allowed(divisors(cfg.moe.num_experts))}")

    def stage_layers(self, num_layers: int) -> list[range]:
        """The layer indices of each pipeline stage (the first num_layers % pp get one more)."""
        base, extra = divmod(num_layers, self.pp)
        stages, start = [], 0
        for s in range(self.pp):
            n = base + (1 if s < extra else 0)
            stages.append(range(start, start + n))
            start += n
        return stages


SINGLE = ParallelConfig()


@dataclass(frozen=True)
class Disaggregation:
    """Prefill and decode pools (`parallel.disaggregated`): TTFT is a prefill instance's
    prefill plus the transfer of the prompts' KV cache to a decode instance, TPOT the decode
    instance's step; the pools' `replicas` are their instances (xPyD), and the throughput is
    the slower pool's, over the devices of both."""

    prefill: ParallelConfig
    """The layout of one prefill instance (replicas: how many there are)."""
    decode: ParallelConfig
    """The layout of one decode instance (replicas: how many there are)."""
