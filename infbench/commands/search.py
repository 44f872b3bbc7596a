"""`infbench search`: the highest request rate (or concurrency) at which the SLO holds.

The scenario's `search:` block (scenario/search.py) says what to vary and when to stop;
measure/search.py decides each next value from the attainments so far.  Every value is a
point of the scenario with `workload.rate` (or `workload.max_concurrency`) set to it, run
through the same functions as `infbench run` (`measure.bench.run_point` for the engine,
`client.point.run_target_point` for a `target:`), and written the same way: one result file
per try in one run directory with a manifest (results/rundir.py, atomic writes), the CSV,
and `search.json`, the summary (the value found, its bracket and uncertainty, the
attainment at each try).  A boundary repeat (the r-th further try of a value) draws its
workload with `workload.seed + r`, so its verdict covers the arrivals' randomness as well as
the server's.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from infbench.core.errors import UserError

if TYPE_CHECKING:
    from infbench.scenario.point import ScenarioPoint


def register(app: typer.Typer) -> None:
    app.command("search")(search)


def search(
    scenario: Path = typer.Argument(..., help="Scenario YAML file with a search: block."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: search.lo=2"),
    out: Path | None = typer.Option(None, "--out", help="Directory for the result files."),
    device: str | None = typer.Option(None, "--device", help="auto | cpu | cuda"),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Replace the run in --out (removes only its files)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the search summary as JSON on stdout (no table)."),
) -> None:
    """Find the highest workload.rate (or max_concurrency) at which measure.slo holds.

    Brackets from search.lo (doubling, or up to search.hi), bisects to search.tolerance and
    repeats both ends of the bracket search.boundary_repeats times; every point tried is a
    result file in --out, with the manifest and search.json (docs/search.md).
    """
    import json

    from rich.console import Console

    from infbench.core.device import resolve_device
    from infbench.measure.preflight import preflight
    from infbench.measure.search import SearchSpec, summary_doc
    from infbench.measure.search import search as run_search
    from infbench.results import store as results_mod
    from infbench.results.rundir import SEARCH_NAME, RunDir, default_out_dir, read_manifest
    from infbench.results.search import search_line, search_table
    from infbench.scenario.document import validate
    from infbench.scenario.loading import read_document

    if device is not None:
        device = resolve_device(device, "--device")  # fail before any point runs
    source = str(scenario)
    document = read_document(scenario, set_)
    sc = validate(document, source)  # the search block's own errors, before any value is set
    block = sc.search
    if block is None:
        raise UserError(f"{source}: search: required key is missing; `infbench search` needs "
                        "a search: block (over, lo, hi, tolerance, max_points, "
                        "boundary_repeats; docs/search.md)")
    assert sc.measure.slo is not None  # Scenario refuses a search without measure.slo
    slo = sc.measure.slo
    points = _Points(document, source, block.over, block.workload_key, block.is_integer)
    first = points.at(block.lo, 0, 0)
    checked = [first] + ([points.at(block.hi, 1, 0)] if block.hi is not None else [])
    out_dir = out or default_out_dir(f"{first.name}-search", time.strftime("%Y%m%d-%H%M%S"))
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    console = Console(stderr=True, width=width)
    notes = [*preflight(checked, out_dir, device), first.dtype_reason, *first.notes]
    for note in dict.fromkeys(n for n in notes if n):
        console.print(f"note: {note}", highlight=False)
    if not overwrite and out_dir.is_dir() and read_manifest(out_dir) is not None:
        raise UserError(f"{out_dir}: holds a run; use --overwrite to replace it, or another "
                        "--out (a search cannot be resumed)")
    rundir = RunDir.claim(out_dir, [first], scenario_path=source, device=device,
                          overwrite=overwrite)
    spec = SearchSpec(lo=block.lo, hi=block.hi, tolerance=block.tolerance,
                      max_points=block.max_points, boundary_repeats=block.boundary_repeats,
                      target=slo.target, integer=block.is_integer)
    runner = _Runner(rundir, points, first, device, console, source)
    status = "interrupted"
    try:
        outcome = run_search(spec, runner.measure)
        status = "done"
    except UserError:
        status = "failed"
        raise
    finally:
        if status != "done":
            rundir.close(status)
    summary = summary_doc(
        outcome, spec, over=block.over, key=f"workload.{block.workload_key}",
        slo=slo.model_dump(), name=first.name, scenario=source, out_dir=str(out_dir))
    try:
        results_mod.write_json_atomic(out_dir / SEARCH_NAME, summary)
    finally:
        rundir.close("done")
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        out_console = Console(width=width)
        out_console.print(search_table(summary))
        out_console.print(search_line(summary), highlight=False, soft_wrap=True)
    console.print(f"wrote {len(outcome.tries)} result file(s), {rundir.csv_path.name} and "
                  f"{SEARCH_NAME} to {out_dir}", highlight=False)


class _Points:
    """The scenario's one point at a searched value: the document with the workload key set,
    validated as `run` validates a file (so a value the workload refuses is one line)."""

    def __init__(self, document: dict[str, Any], source: str, over: str, key: str,
                 integer: bool) -> None:
        self.document, self.source = document, source
        self.over, self.key, self.integer = over, key, integer
        workload = document.get("workload")
        seed = workload.get("seed", 0) if isinstance(workload, dict) else 0
        self.seed = seed if isinstance(seed, int) else 0

    def at(self, value: float, index: int, repeat: int) -> ScenarioPoint:
        from infbench.scenario.document import set_dotted
        from infbench.scenario.loading import scenario_from_document

        doc = copy.deepcopy(self.document)
        number: float | int = int(value) if self.integer else float(value)
        set_dotted(doc, f"workload.{self.key}", number, self.source, what=f"search.{self.over}")
        if repeat:
            set_dotted(doc, "workload.seed", self.seed + repeat, self.source, what="search")
        expanded = scenario_from_document(doc, self.source).points()
        if len(expanded) != 1:
            raise UserError(f"{self.source}: search: the scenario expands to {len(expanded)} "
                            "points; a search runs one point per value (remove sweep:, "
                            "variants: and the workload lists)")
        return dataclasses.replace(expanded[0], index=index, swept={self.key: number})


class _Runner:
    """Runs and records one try: the result file, the CSV, the manifest, a progress line."""

    def __init__(self, rundir: Any, points: _Points, first: ScenarioPoint, device: str | None,
                 console: Any, source: str) -> None:
        from infbench.measure.bench import ModelCache

        self.rundir, self.points, self.first = rundir, points, first
        self.device, self.console, self.source = device, console, source
        self.cache = ModelCache()
        self.finished: list[dict[str, Any]] = []
        self.repeats: dict[float, int] = {}
        self.t0 = time.perf_counter()

    def measure(self, value: float, index: int, phase: str) -> tuple[float | None,
                                                                       dict[str, Any]]:
        from infbench.measure.bench import run_point
        from infbench.results import store as results_mod
        from infbench.results.accessor import metric

        repeat = self.repeats.get(value, 0)
        self.repeats[value] = repeat + 1
        point = self.first if index == 0 else self.points.at(value, index, repeat)
        if index:
            self.rundir.add_point(point)
        self.rundir.mark(index, "running")
        t_point = time.perf_counter()
        try:
            measure = run_point
            if point.target is not None:  # a server, through the client backend
                from infbench.client.point import run_target_point as measure
            result = measure(point, cache=self.cache, device=self.device)
        except UserError as exc:
            self.rundir.mark(index, "failed", str(exc))
            raise UserError(f"{self.source}: point {index} ({point.label}): {exc}") from None
        except BaseException:
            self.rundir.mark(index, "pending")
            raise
        result["search"] = {"over": self.points.over, "key": f"workload.{self.points.key}",
                            "value": value, "try": index, "phase": phase, "repeat": repeat}
        path = self.rundir.file_for(index)
        results_mod.write_json_atomic(path, result)
        self.finished.append(result)
        results_mod.write_csv_atomic(self.rundir.csv_path,
                                     [results_mod.flatten_for_csv(r) for r in self.finished])
        self.rundir.mark(index, "done")
        attained = metric(result, "slo_attainment")

        def ms(name: str) -> float | None:
            v = metric(result, name)
            return None if v is None else v * 1e3

        self.console.print(
            f"[{index}] {phase} {point.label}: "
            f"{'-' if attained is None else f'{attained:.0%}'} within SLO "
            f"({time.perf_counter() - t_point:.1f} s; {time.perf_counter() - self.t0:.1f} s "
            "total)", highlight=False, soft_wrap=True)
        return attained, {"file": path.name, "seed": point.workload.seed,
                          "goodput_requests_per_s": metric(result, "goodput_requests_per_s"),
                          "ttft_p99_ms": ms("ttft_s.p99"), "tpot_p99_ms": ms("tpot_s.p99")}
