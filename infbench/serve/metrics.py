"""Server metrics in the Prometheus text format (version 0.0.4), under vLLM's names.

vLLM's `vllm:` metrics are kept by name with an `infbench:` prefix, so dashboards and
scrapers written for vLLM need only the prefix changed.  Request-level metrics (latency
histograms, token counters, finished requests) are observed on the asyncio side, where
the client's view of a request is known; the engine's gauges and counters (running and
waiting sequences, KV usage, preemptions, prefix-cache queries and hits in prompt tokens,
steps and the seconds they took)
come from the `EngineStats` snapshot the engine thread publishes after every step.  All of
it is read and written on the event loop's thread, except the snapshot, which is replaced
whole (one reference assignment) and never mutated.

The text format is a few lines per metric, so it is written here rather than through
prometheus_client (which the client's scraper, client/server_metrics.py, uses to read it).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Bucket bounds (seconds).  Wider at the low end than a GPU server needs, because a CPU
# serving a tiny model answers in milliseconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class EngineStats:
    """The engine's state after its last step (published by the engine thread)."""

    num_running: int = 0  # sequences in the running batch
    num_waiting: int = 0  # sequences queued for admission
    kv_usage: float = 0.0  # used KV blocks / all blocks
    num_preemptions: int = 0  # since the server started
    # Prompt tokens of the sequences admitted since the start, and those of them found in
    # the prefix cache (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Engine steps run and the seconds they took (StepRecord.duration_s summed): the
    # engine's own time, which a client's latency minus it leaves the server's overhead
    # (benchmarks/sim_fidelity_serve.py prices it from these).
    num_steps: int = 0
    step_seconds: float = 0.0


class Histogram:
    """Cumulative-bucket histogram: bucket counts, sum and count of the observations."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, total = [], 0
        for bound, n in zip((*self.bounds, None), self.counts, strict=True):
            total += n
            le = "+Inf" if bound is None else _number(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {total}')
        out.append(f"{name}_sum{{{labels}}} {_number(self.sum)}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class ServerMetrics:
    """Everything /metrics reports; `render` writes it as Prometheus text."""

    def __init__(self, model_name: str, engine_stats: Callable[[], EngineStats]) -> None:
        self.model_name = model_name
        self.engine_stats = engine_stats
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_finished = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def finish_request(self, reason: str, prompt_tokens: int, generation_tokens: int,
                       e2e_s: float) -> None:
        """A request left the server (all its samples done, or aborted)."""
        self.requests_finished[reason] += 1
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        self.e2e.observe(e2e_s)

    def render(self) -> str:
        stats = self.engine_stats()
        label = f'model_name="{_escape(self.model_name)}"'
        out: list[str] = []

        def scalar(name: str, kind: str, help_: str, value: float) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}",
                        f"{name}{{{label}}} {_number(value)}"])

        scalar("infbench:num_requests_running", "gauge",
               "Sequences in the engine's running batch.", stats.num_running)
        scalar("infbench:num_requests_waiting", "gauge",
               "Sequences waiting to be scheduled.", stats.num_waiting)
        scalar("infbench:kv_cache_usage_perc", "gauge",
               "KV-cache usage: 1 means 100 percent of the blocks are in use.", stats.kv_usage)
        scalar("infbench:num_preemptions_total", "counter",
               "Sequences preempted (recomputed later) since the start.", stats.num_preemptions)
        scalar("infbench:prefix_cache_queries_total", "counter",
               "Prompt tokens of the sequences admitted, looked up in the prefix cache.",
               stats.prefix_cache_queries)
        scalar("infbench:prefix_cache_hits_total", "counter",
               "Prompt tokens found in the prefix cache at admission.", stats.prefix_cache_hits)
        scalar("infbench:engine_steps_total", "counter",
               "Engine steps run since the start.", stats.num_steps)
        scalar("infbench:engine_step_seconds_total", "counter",
               "Seconds the engine's steps took since the start.", stats.step_seconds)
        scalar("infbench:prompt_tokens_total", "counter",
               "Prompt tokens of the requests served.", self.prompt_tokens)
        scalar("infbench:generation_tokens_total", "counter",
               "Tokens generated for the requests served.", self.generation_tokens)
        name = "infbench:request_success_total"
        out.extend([f"# HELP {name} Requests finished, by finish reason.",
                    f"# TYPE {name} counter"])
        out.extend(f'{name}{{{label},finished_reason="{r}"}} {n}'
                   for r, n in self.requests_finished.items())
        for hist, name, help_ in (
                (self.ttft, "infbench:time_to_first_token_seconds", "Time to first token."),
                (self.itl, "infbench:inter_token_latency_seconds",
                 "Time between the token batches of a request (one per engine step)."),
                (self.e2e, "infbench:e2e_request_latency_seconds",
                 "Request latency from arrival to the last token.")):
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} histogram"])
            out.extend(hist.lines(name, label))
        return "\n".join(out) + "\n"


def _number(value: float) -> str:
    """Integers without a fraction, other floats in Python's shortest repr."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
