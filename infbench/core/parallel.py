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
- replicas: independent copies of the whole (tp x pp) model serving different requests
  (data parallel): throughput x replicas at unchanged per-request latency.
- microbatches: how many micro-batches the batch is cut into for the pipeline (default:
  `pp`, as vLLM runs one per stage); irrelevant when pp is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from infbench.core.config import MAX_BATCH, ModelConfig, check_count
from infbench.core.errors import ConfigError

MAX_DEVICES = 65536  # sanity limit of one degree (a TPU v5p pod is 8,960 chips)


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is spread over devices (the scenario's `parallel:` section is derived
    from these fields and their docstrings, scenario/parallel.py)."""

    tp: int = 1
    """Tensor parallel degree: heads, MLP width and vocabulary split this many ways."""
    pp: int = 1
    """Pipeline stages: the layers split into this many consecutive stages."""
    ep: int = 1
    """Expert parallel degree within the tp devices of a stage (divides tp; MoE only)."""
    replicas: int = 1
    """Data-parallel replicas of the whole model: throughput x replicas."""
    microbatches: int | None = None
    """Pipeline micro-batches (default: pp)."""

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "ep", "replicas"):
            check_count("parallel", key, getattr(self, key), MAX_DEVICES)
        if self.microbatches is not None:
            check_count("parallel", "microbatches", self.microbatches, MAX_BATCH)
        if self.tp % self.ep:
            raise ConfigError(f"parallel.ep={self.ep} must divide parallel.tp={self.tp} (the "
                              "experts of a stage are spread over its tp devices)")

    @property
    def trivial(self) -> bool:
        """One device, one replica: the model is priced exactly as without parallelism."""
        return (self.tp, self.pp, self.ep, self.replicas) == (1, 1, 1, 1)

    @property
    def devices_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def devices(self) -> int:
        return self.devices_per_replica * self.replicas

    def num_microbatches(self, batch: int) -> int:
        """Micro-batches of a batch: `microbatches` (default pp), at most one per sequence."""
        return max(1, min(self.microbatches or self.pp, batch))

    def check_model(self, cfg: ModelConfig) -> None:
        """The split must fit the model's shape: tp divides the heads (and the KV heads, or
        the KV heads divide tp), pp is at most the layers, ep needs routed experts it divides."""
        if cfg.num_heads % self.tp:
            raise ConfigError(f"parallel.tp={self.tp} must divide the {cfg.num_heads} attention "
                              f"heads of {cfg.name}")
        kvh = cfg.kv_heads
        if cfg.attention.kind != "mla" and kvh % self.tp and self.tp % kvh:
            raise ConfigError(f"parallel.tp={self.tp} and the {kvh} KV heads of {cfg.name} must "
                              "divide one another")
        if self.pp > cfg.num_layers:
            raise ConfigError(f"parallel.pp={self.pp} is more stages than the {cfg.num_layers} "
                              f"layers of {cfg.name}")
        if self.ep > 1:
            if cfg.moe is None:
                raise ConfigError(f"parallel.ep={self.ep} needs a mixture-of-experts model; "
                                  f"{cfg.name} has no routed experts")
            if cfg.moe.num_experts % self.ep:
                raise ConfigError(f"parallel.ep={self.ep} must divide the "
                                  f"{cfg.moe.num_experts} routed experts of {cfg.name}")

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
