"""Scrape a target's Prometheus `/metrics` while a client run runs: KV usage, queues, caching.

The client sees latencies; the server's own gauges say why they are what they are (a KV
cache that is full, requests waiting, preemptions, prefix-cache hits).  `MetricsScraper` is a
task on the client's event loop: one GET at the start of the first measured repeat (the
baseline of the counters), one every `target.metrics_interval_s`, and one after the last
repeat.  It has a session (and so a connection) of its own, so a scrape never waits for,
or holds, a slot of the requests' pool; the text is parsed with prometheus_client's parser
in a worker thread, after a line filter keeps only the families named in `SOURCES`, so the
event loop that timestamps the streams does no parsing.

Each server kind names the same quantities differently (`SOURCES`; the names checked
against vLLM's v1 `vllm/v1/metrics/loggers.py`, SGLang's `srt/metrics/collector.py`, TGI's
`backends/v3/src/backend.rs` and `queue.rs`, and llama.cpp's `tools/server/server-task.cpp`):

- vLLM: `vllm:kv_cache_usage_perc` (v0: `vllm:gpu_cache_usage_perc`),
  `vllm:num_requests_running` / `_waiting`, the counters `vllm:num_preemptions`,
  `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` (tokens; exposed with `_total`);
  v0's `vllm:gpu_prefix_cache_hit_rate` gauge when the counters are absent.
- SGLang: `sglang:token_usage`, `sglang:num_running_reqs`, `sglang:num_queue_reqs`, the
  counters `sglang:num_retracted_requests` (its preemptions), `sglang:prompt_tokens` and
  `sglang:cached_tokens`, and the `sglang:cache_hit_rate` gauge (the last prefill batch's).
- infbench serve (serve/metrics.py): vLLM's names under `infbench:`.
- TGI: `tgi_batch_current_size` (running) and `tgi_queue_size` (waiting); nothing else.
- llama.cpp's server (`--metrics`): `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, and `llamacpp:kv_cache_usage_ratio` where a build has it.

A sample name found under several label sets (vLLM's `engine`, the router's `replica`) is
summed, except KV usage, a fraction, which is averaged.  The kind is the first of `SOURCES`
whose names the first scrape holds.  The summary: mean and max of the gauges over the
scrapes taken between the first and the last (those two bracket the run and are idle by
construction); preemptions and the prefix-cache hit rate from the counters' change between
the first and the last scrape (hits / queries, so the warm-up's requests do not count), or,
without the counters, the mean of the hit-rate gauge.

A target without metrics (an HTTP error, no connection, a body that is not Prometheus text,
none of the names above) gets one note on stderr from the first scrape (once per URL, not
once per point of a sweep) and no more scrapes; the run goes on and the result records the
URL and why.  A later scrape that fails is
counted, with one note.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

_MAX_BYTES = 16 * 2**20  # vLLM's text with every histogram is a few hundred kB
_TIMEOUT_S = 5.0  # one scrape; a slower one skips the ticks it overran
# URLs whose missing metrics were noted: a sweep's every point tries again, but says so once.
_NOTED_URLS: set[str] = set()


@dataclass(frozen=True)
class MetricNames:
    """One server kind's sample names for each quantity, first match wins (counters with
    their `_total`, as the text format writes them)."""

    kv_usage: tuple[str, ...]  # gauge, 0..1
    running: tuple[str, ...]  # gauge: requests being computed
    waiting: tuple[str, ...]  # gauge: requests queued for admission
    preemptions: tuple[str, ...]  # counter
    prefix_queries: tuple[str, ...]  # counter: prompt tokens looked up in the prefix cache
    prefix_hits: tuple[str, ...]  # counter: prompt tokens found there
    hit_rate: tuple[str, ...] = ()  # gauge, read only without the counters

    def items(self) -> list[tuple[str, tuple[str, ...]]]:
        return [("kv_usage", self.kv_usage), ("running", self.running),
                ("waiting", self.waiting), ("preemptions", self.preemptions),
                ("prefix_cache_queries", self.prefix_queries),
                ("prefix_cache_hits", self.prefix_hits),
                ("prefix_cache_hit_rate", self.hit_rate)]


SOURCES: dict[str, MetricNames] = {
    "vllm": MetricNames(
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        running=("vllm:num_requests_running",), waiting=("vllm:num_requests_waiting",),
        preemptions=("vllm:num_preemptions_total",),
        prefix_queries=("vllm:prefix_cache_queries_total",),
        prefix_hits=("vllm:prefix_cache_hits_total",),
        hit_rate=("vllm:gpu_prefix_cache_hit_rate",)),
    "sglang": MetricNames(
        kv_usage=("sglang:token_usage",), running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        preemptions=("sglang:num_retracted_requests_total",),
        prefix_queries=("sglang:prompt_tokens_total",),
        prefix_hits=("sglang:cached_tokens_total",), hit_rate=("sglang:cache_hit_rate",)),
    "infbench": MetricNames(
        kv_usage=("infbench:kv_cache_usage_perc",), running=("infbench:num_requests_running",),
        waiting=("infbench:num_requests_waiting",),
        preemptions=("infbench:num_preemptions_total",),
        prefix_queries=("infbench:prefix_cache_queries_total",),
        prefix_hits=("infbench:prefix_cache_hits_total",)),
    # TGI's router (huggingface/text-generation-inference backends/v3/src/backend.rs and
    # queue.rs set the gauges, router/src/server.rs describes them): the running batch and
    # the queue.  It exports no KV-cache usage, preemption or prefix-cache figure.
    "tgi": MetricNames(
        kv_usage=(), running=("tgi_batch_current_size",), waiting=("tgi_queue_size",),
        preemptions=(), prefix_queries=(), prefix_hits=()),
    # llama.cpp's server (ggml-org/llama.cpp tools/server/server-task.cpp, to_metrics;
    # before 2025 examples/server/server.cpp): slots processing and tasks deferred for a
    # free slot; kv_cache_usage_ratio (used cells / n_ctx) only in the builds that still
    # export it.  Its prompt_tokens_total counts prompt tokens evaluated, not looked up in
    # a cache, so it is no prefix-cache query count and is not read.
    "llamacpp": MetricNames(
        kv_usage=("llamacpp:kv_cache_usage_ratio",), running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",), preemptions=(), prefix_queries=(),
        prefix_hits=()),
}
_AVERAGED = frozenset({"kv_usage", "prefix_cache_hit_rate"})  # fractions: mean over labels
_GAUGES = ("kv_usage", "running", "waiting")
_WANTED = frozenset(n for names in SOURCES.values() for _, ns in names.items() for n in ns)
# A line is parsed when it names one of the families: its samples, or its # HELP / # TYPE.
_FAMILIES = frozenset(n.removesuffix("_total") for n in _WANTED)


class MetricsError(Exception):
    """Why a body is no server's metrics (one line)."""


def parse_samples(text: str) -> dict[str, list[float]]:
    """The values of every sample `SOURCES` names, one per label set, by sample name.

    Lines of other families are dropped before prometheus_client parses the rest (vLLM's
    text is mostly histogram buckets); a line it cannot parse is a MetricsError."""
    kept = "\n".join(line for line in text.splitlines() if _is_kept(line))
    values: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(kept + "\n"):
            for sample in family.samples:
                if sample.name in _WANTED:
                    values.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"not Prometheus text: {' '.join(str(exc).split())[:160]}") from None
    return values


def _is_kept(line: str) -> bool:
    """The line is a sample of a wanted name or the HELP / TYPE line of its family (split,
    not matched: the cheapest test per line of vLLM's mostly-histogram text)."""
    if line.startswith("#"):
        parts = line.split(" ", 3)
        return len(parts) > 2 and parts[1] in ("HELP", "TYPE") and parts[2] in _FAMILIES
    return line.split("{", 1)[0].split(" ", 1)[0] in _WANTED


def detect_source(samples: dict[str, list[float]]) -> str | None:
    """The first server kind whose names the samples hold (None: no known names)."""
    return next((kind for kind, names in SOURCES.items()
                 if any(n in samples for _, ns in names.items() for n in ns)), None)


def quantities(samples: dict[str, list[float]],
               names: MetricNames) -> dict[str, tuple[str, float]]:
    """(the sample name read, its value) per quantity the server reports, by the quantity's
    key (`MetricNames.items`)."""
    out: dict[str, tuple[str, float]] = {}
    for key, candidates in names.items():
        name = next((n for n in candidates if samples.get(n)), None)
        if name is not None:
            found = samples[name]
            out[key] = (name, sum(found) / len(found) if key in _AVERAGED else sum(found))
    return out


def _mean_max(points: list[list[float]]) -> tuple[float | None, float | None]:
    if not points:
        return None, None
    values = [v for _, v in points]
    return sum(values) / len(values), max(values)


def _delta(points: list[list[float]]) -> float | None:
    """A counter's increase from the first scrape to the last (a reset: the last value)."""
    if len(points) < 2:
        return None
    first, last = points[0][1], points[-1][1]
    return last - first if last >= first else last


def summarize(series: dict[str, list[list[float]]]) -> dict[str, Any]:
    """The summary of a scrape series; see the module docstring for the rules."""
    summary: dict[str, Any] = {}
    inner = {k: v[1:-1] for k, v in series.items()}  # between the bracketing scrapes
    for key, name in (("kv_usage", "kv_usage"), ("running", "running"),
                      ("waiting", "waiting")):
        summary[f"{name}_mean"], summary[f"{name}_max"] = _mean_max(inner.get(key, []))
    summary["preemptions"] = _delta(series.get("preemptions", []))
    queries = _delta(series.get("prefix_cache_queries", []))
    hits = _delta(series.get("prefix_cache_hits", []))
    summary["prefix_cache_queries"], summary["prefix_cache_hits"] = queries, hits
    rate = None
    if queries is not None and hits is not None:
        rate = hits / queries if queries > 0 else None
    elif "prefix_cache_hit_rate" in series:
        rate = _mean_max(inner["prefix_cache_hit_rate"])[0]
    summary["prefix_cache_hit_rate"] = rate
    summary["num_samples"] = max((len(v) for v in inner.values()), default=0)
    return summary


@dataclass
class MetricsScraper:
    """Scrape `url` every `interval_s` between `start()` and `stop()`; `result()` after."""

    url: str
    interval_s: float
    where: str  # the point, for the notes
    headers: dict[str, str] = field(default_factory=dict)
    source: str | None = None
    error: str | None = None
    num_scrapes: int = 0
    num_failed: int = 0
    series: dict[str, list[list[float]]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # quantity -> the sample name read
    _session: aiohttp.ClientSession | None = None
    _task: asyncio.Task[None] | None = None
    _t0: float = 0.0
    _warned: bool = False

    @classmethod
    def for_target(cls, target: Any, api_key: str | None, where: str) -> MetricsScraper | None:
        """A scraper for a TargetSection (None with `metrics: false`); the API key goes
        only to the API's own host."""
        url = target.metrics_url
        if url is None:
            return None
        headers = {"Accept": "text/plain"}
        if api_key and urlsplit(url)[:2] == urlsplit(target.base_url)[:2]:
            headers["Authorization"] = f"Bearer {api_key}"
        return cls(url, target.metrics_interval_s, where, headers)

    async def start(self) -> None:
        """The baseline scrape, then the periodic task (none when the first one failed)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1),
            timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S))
        self._t0 = time.perf_counter()
        await self._scrape()
        if self.error is None:
            self._task = asyncio.create_task(self._every_interval())

    async def stop(self) -> None:
        """End the periodic task and take the closing scrape."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.error is None and self._session is not None:
            await self._scrape()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _every_interval(self) -> None:
        tick = 1
        while True:
            due = self._t0 + tick * self.interval_s
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await self._scrape()
            # a scrape slower than the interval skips the ticks it overran
            tick = max(tick + 1, int((time.perf_counter() - self._t0) / self.interval_s) + 1)

    async def _scrape(self) -> None:
        assert self._session is not None
        t = time.perf_counter() - self._t0
        try:
            text = await self._get()
            samples = await asyncio.to_thread(parse_samples, text)
            if self.source is None:
                self.source = detect_source(samples)
                if self.source is None:
                    raise MetricsError("none of the vLLM, SGLang, TGI, llama.cpp or infbench "
                                       "serve metric names client/server_metrics.py reads")
            values = quantities(samples, SOURCES[self.source])
        except MetricsError as exc:
            self._failed(str(exc))
            return
        self.num_scrapes += 1
        for key, (name, value) in values.items():
            self.names.setdefault(key, name)
            self.series.setdefault(key, []).append([round(t, 4), value])

    async def _get(self) -> str:
        assert self._session is not None
        try:
            async with self._session.get(self.url, headers=self.headers,
                                         allow_redirects=False) as resp:
                if resp.status != 200:
                    raise MetricsError(f"HTTP {resp.status}")
                body = await resp.content.read(_MAX_BYTES + 1)
                if len(body) > _MAX_BYTES:
                    raise MetricsError(f"an answer of more than {_MAX_BYTES} bytes")
                return body.decode("utf-8", errors="replace")
        except asyncio.TimeoutError:
            raise MetricsError(f"no answer within {_TIMEOUT_S:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            text = " ".join((str(exc) or type(exc).__name__).split())[:160]
            raise MetricsError(f"{type(exc).__name__}: {text}") from None

    def _failed(self, reason: str) -> None:
        if self.num_scrapes == 0:  # the first scrape: the target has no metrics for us
            self.error = reason
            if self.url in _NOTED_URLS:
                return
            _NOTED_URLS.add(self.url)
            print(f"note: {self.where}: no server metrics from {self.url} ({reason}); the "
                  "run goes on without them (target.metrics: false turns scraping off)",
                  file=sys.stderr)
            return
        self.num_failed += 1
        if not self._warned:
            self._warned = True
            print(f"note: {self.where}: a scrape of {self.url} failed ({reason}); later "
                  "failures are only counted (telemetry.server_metrics.num_failed)",
                  file=sys.stderr)

    def result(self) -> dict[str, Any]:
        """`telemetry.server_metrics` of the result."""
        out: dict[str, Any] = {"url": self.url, "source": self.source,
                               "interval_s": self.interval_s}
        if self.error is not None:
            return {**out, "error": self.error}
        out.update({"names": self.names, "num_scrapes": self.num_scrapes,
                    "num_failed": self.num_failed, "series": self.series,
                    "summary": summarize(self.series)})
        return out


class ThreadedScraper:
    """A `MetricsScraper` on an event loop of its own, in a thread of this process, between
    enter and exit: for the parent of `target.workers` (client/workers.py), whose own thread
    blocks on its workers' passes while they stream.  The workers timestamp the streams in
    their processes, so the parent's thread costs them nothing; the baseline scrape is taken
    before enter returns, the closing one before exit returns, as `start()` and `stop()` do
    for the one-process client."""

    def __init__(self, scraper: MetricsScraper) -> None:
        self.scraper = scraper
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finish: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),),
                                        name="infbench-metrics", daemon=True)

    async def _main(self) -> None:
        self._loop, self._finish = asyncio.get_running_loop(), asyncio.Event()
        try:
            await self.scraper.start()
        finally:
            self._ready.set()
        try:
            await self._finish.wait()
        finally:
            await self.scraper.stop()

    def __enter__(self) -> ThreadedScraper:
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._loop is not None and self._finish is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._finish.set)
        self._thread.join()
