"""`infbench run`, `infbench generate` and `infbench schema`."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from infbench.checkpoint.metadata import model_source
from infbench.commands import _options as opt
from infbench.core.errors import UserError
from infbench.core.formats import DRAFT_QUANT
from infbench.core.speculative import MAX_SPEC_TOKENS, SPECULATIVE_METHODS

if TYPE_CHECKING:
    from infbench.scenario.point import ScenarioPoint


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("generate")(generate)
    app.command("schema")(schema)


def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: workload.batch_size=8"),
    out: Path | None = typer.Option(None, "--out", help="Directory for result files."),
    device: str | None = typer.Option(None, "--device", help="auto | cpu | cuda"),
    resume: bool = typer.Option(False, "--resume",
                                help="Finish the run in --out: run only its points not done."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Replace the run in --out (removes only its files)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the run's summary as JSON on stdout (no table)."),
    ray_address: str | None = typer.Option(
        None, "--ray", help="Run target points' client workers as actors of this Ray cluster: "
        "local (one on loopback for this run), auto, HOST:PORT (docs/workers.md)."),
    ray_engine_points: bool = typer.Option(
        False, "--ray-engine-points", help="With --ray: engine points run on the cluster's "
        "nodes, one per node (its GPU nodes, else its CPU nodes)."),
) -> None:
    """Run every sweep point of a scenario through the engine and save the results.

    The run owns its --out directory (manifest.json + a lock): a directory that holds
    another run is refused unless --resume (only the points not done) or --overwrite.
    The whole sweep is validated before the first point is measured.
    """
    from rich.console import Console

    from infbench.core.device import resolve_device
    from infbench.measure.bench import ModelCache, run_point
    from infbench.measure.preflight import preflight
    from infbench.results import store as results_mod
    from infbench.results.goodput import json_rate, max_rate_line, max_rate_summaries
    from infbench.results.report import accuracy_table, run_summary, run_table
    from infbench.results.rundir import RunDir, default_out_dir
    from infbench.scenario.schema import load_scenario

    if resume and overwrite:
        raise UserError("--resume and --overwrite are mutually exclusive; give one")
    if ray_engine_points and ray_address is None:
        raise UserError("--ray-engine-points needs --ray ADDRESS (local: a cluster on "
                        "loopback)")
    ray = _RayRun(ray_address, ray_engine_points, device)  # ray installed, else one line
    if device is not None:
        device = resolve_device(device, "--device")  # fail before any point runs
    sc = load_scenario(scenario, set_)
    points = sc.points()
    out_dir = out or default_out_dir(points[0].name, time.strftime("%Y%m%d-%H%M%S"))
    # Logs (CI, pipes) get 120 columns instead of rich's 80, so the table is not truncated.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    console = Console(stderr=True, width=width)
    for note in preflight(points, out_dir, device):
        console.print(f"note: {note}", highlight=False)
    for reason in dict.fromkeys([p.dtype_reason for p in points if p.dtype_reason]
                                + [note for p in points for note in p.notes]):
        console.print(f"note: {reason}", highlight=False)
    ray.connect()  # before the run directory is claimed: an unreachable cluster writes nothing
    rundir = RunDir.claim(out_dir, points, scenario_path=str(scenario), device=device,
                          resume=resume, overwrite=overwrite)
    finished = rundir.done_results()
    todo = [p for p in points if p.index in set(rundir.pending())]
    if finished:
        console.print(f"resuming {out_dir}: {len(finished)} point(s) done, {len(todo)} to run")
    cache = ModelCache()
    failure: UserError | None = None
    csv_path = rundir.csv_path
    status = "interrupted"
    previous = _exit_on_sigterm()
    # A bar redrawn in place needs a terminal; a log (CI, a pipe, nohup) gets one line per
    # finished point instead of nothing until the end.
    progress = _RunProgress(console, sc.name, len(points), len(finished),
                            live=sys.stderr.isatty())
    try:
        with progress, ray.dispatching(todo):
            for point in todo:
                progress.start_point(point)
                rundir.mark(point.index, "running")
                try:
                    measure = ray.engine or run_point
                    if point.target is not None:  # a server, through the client backend
                        from infbench.client.point import run_target_point as measure

                        measure = ray.target(measure)
                    result = measure(point, cache=cache, device=device,
                                     on_step=progress.on_step, on_phase=progress.on_phase)
                except UserError as exc:
                    failure = UserError(f"{scenario}: point {point.index} ({point.label}): {exc}")
                    rundir.mark(point.index, "failed", str(exc))
                    break
                except BaseException:
                    rundir.mark(point.index, "pending")  # interrupted: --resume reruns it
                    raise
                path = rundir.file_for(point.index)
                results_mod.write_json_atomic(path, result)
                result["_path"] = str(path)
                finished.append(result)
                finished.sort(key=lambda r: r.get("point_index", 0))
                results_mod.write_csv_atomic(
                    csv_path, [results_mod.flatten_for_csv(r) for r in finished])
                rundir.mark(point.index, "done")
                progress.finish_point(point, result)
        status = "failed" if failure is not None else "done"
    finally:
        rundir.close(status)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if status == "interrupted":
            console.print(f"stopped: {len(finished)}/{len(points)} point(s) done in {out_dir}; "
                          "finish with --resume", highlight=False)
    max_rates = max_rate_summaries(finished)  # a rate sweep run with measure.slo
    if as_json:  # stdout is one JSON document; notes and the gate's verdict stay on stderr
        print(json.dumps({
            "scenario": str(scenario), "name": sc.name, "out_dir": str(out_dir),
            "status": status, "csv": str(csv_path) if finished else None,
            "num_points": len(points), "points": [run_summary(r) for r in finished],
            **({"slo_max_rates": [{**m, "max_rate": json_rate(m["max_rate"]),
                                   "rates": [json_rate(x) for x in m["rates"]]}
                                  for m in max_rates]} if max_rates else {}),
        }, indent=2))
    elif finished:
        Console(width=width).print(run_table(finished))
        accuracy = accuracy_table(finished)  # quantized / pruned points: beside the speed
        if accuracy is not None:
            Console(width=width).print(accuracy)
        for summary in max_rates:
            Console(width=width).print(max_rate_line(summary), highlight=False, soft_wrap=True)
        from infbench.results.under_load import predicted_results

        for summary in max_rate_summaries(predicted_results(finished)):  # the simulated points
            Console(width=width).print(f"predicted {max_rate_line(summary)}", highlight=False,
                                       soft_wrap=True)
    if finished:
        console.print(f"wrote {len(finished)} result file(s) and {csv_path} to {out_dir}")
    if failure is not None:
        raise failure
    gate = points[0].gate
    if gate is not None and finished:
        from infbench.results.gate import gate_from_scenario

        code = gate_from_scenario(gate, finished, console)
        if code:
            raise typer.Exit(code)


class _RayRun:
    """`--ray` / `--ray-engine-points` for one run (client/ray_cluster.py); inert without."""

    def __init__(self, address: str | None, engine_points: bool, device: str | None) -> None:
        self.engine_points, self.device = engine_points, device
        self.cluster: Any = None
        self.dispatch: Any = None
        if address is not None:
            from infbench.client.ray_cluster import RayCluster

            self.cluster = RayCluster(address)  # checks that ray imports and the address

    def connect(self) -> None:
        if self.cluster is None:
            return
        self.cluster.__enter__()
        if self.engine_points:
            from infbench.client.ray_cluster import EngineDispatch

            try:
                EngineDispatch.nodes_for(self.cluster, self.device)  # no fitting node: here
            except BaseException:
                self.cluster.__exit__()
                raise

    def dispatching(self, todo: list[ScenarioPoint]) -> _RayRun:
        """Engine points of `todo` sent to the cluster (--ray-engine-points); a context
        that stops what is left of them and disconnects."""
        if self.cluster is not None and self.engine_points:
            from infbench.client.ray_cluster import EngineDispatch

            try:
                self.dispatch = EngineDispatch(self.cluster, todo, self.device)
            except BaseException:
                self.cluster.__exit__()
                raise
        return self

    def __enter__(self) -> _RayRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.dispatch is not None:
            self.dispatch.cancel()
        if self.cluster is not None:
            self.cluster.__exit__()

    @property
    def engine(self) -> Any:
        return None if self.dispatch is None else self.dispatch.measure

    def target(self, measure: Any) -> Any:
        if self.cluster is None:
            return measure
        from infbench.client.ray_cluster import target_measure

        return target_measure(measure)


class _RunProgress:
    """Progress of a run: an overall bar over points and, per point, requests finished out
    of requests (per repeat; steps are not known in advance). Without a terminal: one line
    per finished point with its headline figures and elapsed time, on stderr."""

    def __init__(self, console: Any, name: str, num_points: int, num_done: int,
                 live: bool) -> None:
        self.console, self.live = console, live
        self.num_points, self.num_done = num_points, num_done
        self.name = name
        self.bar: Any = None
        self.overall: Any = None
        self.task: Any = None
        self.total_requests = 0
        self.in_system = 0
        self.finished_requests = 0
        self.t0 = self.t_point = time.perf_counter()

    def __enter__(self) -> _RunProgress:
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total} {task.fields[unit]}"),
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.__enter__()
            self.overall = self.bar.add_task(self.name, total=self.num_points,
                                             completed=self.num_done, unit="points")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def start_point(self, point: ScenarioPoint) -> None:
        from infbench.measure.bench import client_concurrency

        w = point.workload
        # num_requests (resolved by kind: static's default is batch_size), each sampled n times
        self.total_requests = int(w.num_prompts) * int(getattr(w, "samples_per_prompt", 1) or 1)
        # Arrivals over time, or a client cap: requests join the system while it runs.
        self.realtime = w.is_realtime or client_concurrency(w) is not None
        self.label = point.label
        self.t_point = time.perf_counter()
        self._reset_requests()
        if self.bar is not None:
            self.task = self.bar.add_task(point.label, total=self.total_requests,
                                          unit="requests")

    def _reset_requests(self) -> None:
        # Requests admitted at t=0 are all in the system before the first step; Poisson
        # arrivals join later, so a drop in (running + waiting) counts finishes from 0.
        self.in_system = 0 if self.realtime else self.total_requests
        self.finished_requests = 0

    def on_phase(self, msg: str) -> None:
        self._reset_requests()  # each warm-up and repeat serves every request again
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.label}: {msg}", completed=0)

    def on_step(self, record: Any) -> None:
        now = int(record.num_running) + int(record.num_waiting)
        # A step's net drop in live sequences is requests finished (a lower bound when a
        # Poisson arrival lands in the same step), never more than the total.
        self.finished_requests = min(self.total_requests,
                                     self.finished_requests + max(0, self.in_system - now))
        self.in_system = now
        if self.bar is not None:
            self.bar.update(self.task, completed=self.finished_requests)

    def finish_point(self, point: ScenarioPoint, result: dict[str, Any]) -> None:
        from infbench.results.accessor import metric

        self.num_done += 1
        if self.bar is not None:
            self.bar.remove_task(self.task)
            self.bar.advance(self.overall)
            return

        def ms(name: str) -> str:
            value = metric(result, name)
            return "-" if value is None else f"{value * 1e3:.1f} ms"

        tps = metric(result, "output_tokens_per_s")
        good = metric(result, "goodput_requests_per_s")
        attained = metric(result, "slo_attainment")
        slo = ("" if good is None or attained is None else
               f", goodput {good:.2f} req/s ({attained:.0%} within SLO)")
        self.console.print(
            f"[{self.num_done}/{self.num_points}] {point.label}: "
            f"{'-' if tps is None else f'{tps:,.1f}'} output tok/s, TTFT p50 {ms('ttft_s.p50')}, "
            f"TPOT p50 {ms('tpot_s.p50')}{slo} ({time.perf_counter() - self.t_point:.1f} s; "
            f"{time.perf_counter() - self.t0:.1f} s total)", highlight=False, soft_wrap=True)


def _exit_on_sigterm() -> Any:
    """SIGTERM (a cancelled CI job) unwinds like Ctrl-C, so the manifest records the stop."""
    def handler(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: keep the default (the manifest still says running)
        return None


def _spec_method(value: str) -> str:
    allowed = SPECULATIVE_METHODS
    if value not in allowed:
        raise typer.BadParameter(f"{value!r}; allowed: {', '.join(allowed)}")
    return value


def _spec_tokens(value: int) -> int:
    opt.positive_int(value)
    if value > MAX_SPEC_TOKENS:
        raise typer.BadParameter(f"must be <= {MAX_SPEC_TOKENS} (got {value})")
    return value


def _draft_quant(value: str) -> str:
    if value not in DRAFT_QUANT:
        raise typer.BadParameter(f"{value!r}; allowed: {', '.join(DRAFT_QUANT)}")
    return value


def generate(
    model: str = typer.Option(
        ..., "--model", callback=opt.non_empty,
        help=f"{opt.MODEL_HELP} A preset of a released model (smollm2-135m) runs its real "
             "weights when installed."),
    random_weights: bool = typer.Option(
        False, "--random-weights", help="Seeded random weights with the model's shapes "
                                        "(model.weights: random in a scenario)."),
    prompt: str | None = typer.Option(None, "--prompt", callback=opt.utf8_text,
                                      help="Prompt text."),
    prompt_ids: str | None = typer.Option(
        None, "--prompt-ids", callback=opt.token_id_list, help="Token ids: 1,2,3"),
    max_tokens: int = typer.Option(64, "--max-tokens", callback=opt.positive_int,
                                   help="Tokens to generate (>= 1)."),
    temperature: float = typer.Option(0.0, "--temperature", callback=opt.non_negative_float,
                                      help="0 is greedy (finite, >= 0)."),
    top_k: int = typer.Option(0, "--top-k", callback=opt.non_negative_int,
                              help="Keep the k likeliest tokens; 0: off."),
    top_p: float = typer.Option(1.0, "--top-p", callback=opt.probability_mass,
                                help="Nucleus mass in (0, 1]; 1: off."),
    seed: int = typer.Option(0, "--seed", callback=opt.seed, help="0 .. 2**63 - 1."),
    chat: bool = typer.Option(False, "--chat", help="Apply the model's chat template."),
    output_ids: bool = typer.Option(False, "--output-ids", help="Print token ids, not text."),
    device: str = typer.Option("auto", "--device", callback=opt.non_empty),
    dtype: str = typer.Option("auto", "--dtype", callback=opt.dtype_or_auto,
                              help="auto (bfloat16 on a GPU or a CPU with native bf16, else "
                                   f"float32), {opt.choices(opt.DTYPES)}"),
    backend: str = typer.Option("auto", "--backend", callback=opt.backend,
                                help=opt.choices(opt.BACKENDS)),
    speculative: str = typer.Option(
        "none", "--speculative", callback=_spec_method,
        help="Speculative decoding: none, ngram (prompt lookup), draft (a draft model; the "
             "target itself unless --draft-model), medusa or eagle (--draft-heads)."),
    num_spec: int = typer.Option(4, "--num-speculative-tokens", callback=_spec_tokens,
                                 help=f"Draft tokens per step k (1 .. {MAX_SPEC_TOKENS})."),
    draft_model: str | None = typer.Option(
        None, "--draft-model", help=f"Draft model (--speculative draft). {opt.MODEL_HELP}"),
    draft_layers: int | None = typer.Option(
        None, "--draft-layers", callback=opt.positive_int,
        help="Keep the draft's first N layers (the target's when no --draft-model: the "
             "layer-skipping self-draft)."),
    draft_quant: str = typer.Option("none", "--draft-quant", callback=_draft_quant,
                                    help="Quantize the draft: none, int8, int4 (groups of 64)."),
    draft_heads: str | None = typer.Option(
        None, "--draft-heads", help="Medusa / EAGLE checkpoint from `infbench train-draft`."),
) -> None:
    """Complete one prompt: the completion on stdout, speed on stderr."""
    from infbench.core.config import EngineConfig
    from infbench.core.device import auto_dtype, resolve_device
    from infbench.engine.llm import LLM
    from infbench.engine.request import SamplingParams
    from infbench.model.loader import load_model

    if (prompt is None) == (prompt_ids is None):
        raise UserError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    spec = _spec_config(speculative, num_spec, draft_model, draft_layers, draft_quant,
                        draft_heads)
    dev = resolve_device(device)
    if dtype == "auto":
        dtype, why = auto_dtype(dev)
        print(f"note: dtype auto -> {dtype} ({why})", file=sys.stderr)
    loaded = load_model(model_source(model), dtype=dtype, device=dev, seed=seed,
                        weights="random" if random_weights else "auto")
    print(f"note: {model}: weights {loaded.weights}", file=sys.stderr)
    tok = loaded.tokenizer
    if prompt_ids is not None:
        try:
            ids = [int(x) for x in prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise UserError(
                f"--prompt-ids: not a comma-separated list of ints: {prompt_ids!r}") from None
        if chat:
            raise UserError("--chat applies to --prompt text, not to --prompt-ids")
    else:
        if tok is None:
            raise UserError(f"model {model!r} has no tokenizer; use --prompt-ids and --output-ids")
        text = prompt or ""
        if chat:
            text = tok.apply_chat_template([{"role": "user", "content": text}])
        ids = tok.encode(text, add_special_tokens=not chat)
    bad = [i for i in ids if not 0 <= i < loaded.config.vocab_size]
    if bad:
        raise UserError(f"--prompt-ids: {bad[0]} is outside the vocabulary "
                        f"(0..{loaded.config.vocab_size - 1})")
    context = loaded.config.max_seq_len
    if len(ids) + max_tokens > context:
        raise UserError(f"prompt ({len(ids)} tokens) + --max-tokens ({max_tokens}) exceeds the "
                        f"model context ({context} tokens)")
    # The Python API's engine, sized for exactly this one sequence (nothing more is zeroed).
    llm = LLM(loaded, backend=backend, seed=seed, max_num_seqs=1,
              max_model_len=len(ids) + max_tokens,
              kv_cache_memory=EngineConfig.kv_cache_memory, speculative=spec,
              source=model_source(model))
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                            max_tokens=max_tokens, seed=seed)
    out = llm.generate([ids], params)[0]
    toks = out.outputs[0].token_ids
    if output_ids or tok is None:
        print(",".join(str(t) for t in toks))
    else:
        print(tok.decode(toks))
    ttft = out.metrics.ttft_s
    decode_s = out.metrics.e2e_s - ttft
    tps = (len(toks) - 1) / decode_s if len(toks) > 1 and decode_s > 0 else float("nan")
    print(f"{len(ids)} prompt tokens, {len(toks)} generated ({out.outputs[0].finish_reason}); "
          f"TTFT {ttft * 1e3:.1f} ms, decode {tps:.1f} tokens/s, backend {llm.engine.ops.name}, "
          f"device {dev}, dtype {dtype}", file=sys.stderr)
    if spec is not None:
        from infbench.measure.speculative import acceptance

        acc = acceptance(llm.last_steps)
        if acc["num_verifications"]:
            print(f"speculative {spec.label}, k={spec.num_tokens}: {acc['num_accepted_tokens']}"
                  f"/{acc['num_draft_tokens']} drafts accepted "
                  f"({acc['acceptance_rate']:.0%}), {acc['mean_accepted_tokens']:.2f} tokens "
                  f"per verification", file=sys.stderr)
        else:
            print(f"speculative {spec.label}: no drafts were proposed", file=sys.stderr)


def _spec_config(method: str, k: int, draft_model: str | None, draft_layers: int | None,
                 draft_quant: str, heads: str | None) -> Any:
    """The generate flags as a scenario's speculative section (its checks, its errors)."""
    from pydantic import ValidationError

    from infbench.scenario.schema import SpeculativeSection

    if method == "none":
        given = [flag for flag, v in (("--draft-model", draft_model),
                                      ("--draft-layers", draft_layers),
                                      ("--draft-heads", heads)) if v is not None]
        if given or draft_quant != "none":
            raise UserError(f"{(given or ['--draft-quant'])[0]} needs --speculative")
        return None
    try:
        sec = SpeculativeSection.model_validate({
            "method": method, "num_tokens": k, "draft_model": draft_model,
            "draft_layers": draft_layers, "draft_quant": draft_quant, "heads": heads})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"--speculative {method}: {first['msg'].removeprefix('Value error, ')}"
                        ) from None
    return sec.config()


def schema(
    results: bool = typer.Option(False, "--results",
                                 help="The result file's schema instead of the scenario's."),
    out: Path | None = typer.Option(None, "--out", callback=opt.output_file,
                                    help="Write the schema to this file (atomically)."),
) -> None:
    """Print the JSON Schema of a scenario file (default) or of a result file (--results)."""
    if results:
        from infbench.results.schema import json_schema

        doc = json_schema()
    else:
        from infbench.scenario.schema import scenario_json_schema

        doc = scenario_json_schema()
    text = json.dumps(doc, indent=2)
    if out is None:
        print(text)
        return
    from infbench.core.io import write_text_atomic

    try:
        write_text_atomic(out, text + "\n")
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write ({exc.strerror or exc})") from exc
    print(f"wrote {out}")
