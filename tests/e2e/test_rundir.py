"""A run owns its --out directory (manifest, lock, --resume, --overwrite) and validates first.

Most tests run the CLI in-process with `bench.run_point` replaced by a recorder that
returns a real result of the tiny scenario (measured once per module), so they check
which points run without paying for the engine; one test kills a real run.
"""

from __future__ import annotations

import copy
import csv
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli, tiny_scenario

from infbench.results.gate import load_results
from infbench.results.rundir import LOCK_NAME, MANIFEST_NAME, read_manifest, safe_name

TINY = tiny_scenario()


def scenario(tmp: Path, text: str = TINY, name: str = "s.yaml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of TINY through the real engine (2 points)."""
    tmp = tmp_path_factory.mktemp("measured")
    out = tmp / "out"
    res = subprocess.run([sys.executable, "-m", "infbench.cli", "run",
                          str(scenario(tmp)), "--out", str(out)],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, measured: Path) -> list[int]:
    """Replace run_point by a recorder returning the measured result of that point index."""
    import infbench.measure.bench

    ran: list[int] = []
    real = {json.loads(f.read_text())["point_index"]: json.loads(f.read_text())
            for f in measured.glob("tiny_run_*.json")}

    def fake(point: Any, **_kw: Any) -> dict[str, Any]:
        ran.append(point.index)
        result = copy.deepcopy(real[min(point.index, max(real))])
        result.update(name=point.name, label=point.label, point_index=point.index,
                      scenario=point.to_dict())
        return result

    monkeypatch.setattr(infbench.measure.bench, "run_point", fake)
    return ran


def copy_run(measured: Path, dest: Path) -> Path:
    shutil.copytree(measured, dest)
    return dest


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != LOCK_NAME}


# ------------------------------------------------------------------ ownership
def test_a_run_writes_a_manifest_of_done_points_and_releases_its_lock(measured: Path) -> None:
    manifest = read_manifest(measured)
    assert manifest is not None and manifest.status == "done"
    assert [(p.index, p.file, p.status) for p in manifest.points] == [
        (0, "tiny_run_000.json", "done"), (1, "tiny_run_001.json", "done")]
    assert all(p.started and p.finished for p in manifest.points)
    assert manifest.scenario_hash.startswith("sha256:") and manifest.infbench_version
    assert manifest.git_sha and manifest.csv == "tiny_run.csv"
    fd = os.open(measured / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again once the run ended
    finally:
        os.close(fd)


def test_a_second_run_into_a_directory_being_written_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    os.write(fd, b"4242\n")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "another run" holds the directory
    try:
        code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)),
                               "--out", str(out))
    finally:
        os.close(fd)
    assert code == 2 and calls == []
    assert err.strip() == (f"error: {out}: another infbench run (pid 4242) is writing this "
                           "directory")
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]


def test_a_rerun_into_a_finished_directory_is_refused_and_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measured: Path, calls: list[int]) -> None:
    out = copy_run(measured, tmp_path / "out")
    before = snapshot(out)
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out))
    assert code == 2 and calls == []
    assert "holds a run of 'tiny_run' (2/2 points done" in err and "--resume" in err
    assert err.count("error:") == 1 and snapshot(out) == before


def test_a_directory_of_old_results_without_a_manifest_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measured: Path, calls: list[int]) -> None:
    out = copy_run(measured, tmp_path / "out")
    (out / MANIFEST_NAME).unlink()
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out))
    assert code == 2 and "holds 2 result file(s)" in err and calls == []
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out),
                           "--resume")
    assert code == 2 and "no manifest.json" in err and calls == []


def test_resume_after_a_kill_runs_only_the_points_not_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measured: Path, calls: list[int]) -> None:
    out = copy_run(measured, tmp_path / "out")
    # What a SIGKILL during point 1 leaves: point 1 "running", no file, run "running".
    doc = json.loads((out / MANIFEST_NAME).read_text())
    doc["status"] = "running"
    doc["points"][1].update(status="running", finished=None)
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    (out / "tiny_run_001.json").unlink()
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out),
                           "--resume")
    assert code == 0, err
    assert calls == [1] and "1 point(s) done, 1 to run" in err
    manifest = read_manifest(out)
    assert manifest is not None and manifest.status == "done" and len(manifest.resumed) == 1
    assert [p.status for p in manifest.points] == ["done", "done"]
    rows = list(csv.DictReader((out / "tiny_run.csv").open()))
    assert [r["point_index"] for r in rows] == ["0", "1"]
    # a finished run resumed again has nothing left to run
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out),
                           "--resume")
    assert code == 0 and calls == [1]


def test_resume_reruns_a_done_point_whose_file_is_damaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measured: Path, calls: list[int]) -> None:
    out = copy_run(measured, tmp_path / "out")
    (out / "tiny_run_000.json").write_text('{"kind": "infbench.run", "metr')  # hand-damaged
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out),
                           "--resume")
    assert code == 0, err
    assert calls == [0] and len(load_results([out])) == 2


def test_resume_with_a_different_scenario_is_refused_naming_the_difference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measured: Path, calls: list[int]) -> None:
    out = copy_run(measured, tmp_path / "out")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out),
                           "--resume", "--set", "workload.gen_len=7")
    assert code == 2 and calls == []
    assert "point 0: workload.gen_len (run: 6, now: 7)" in err
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out),
                           "--resume", "--set", "workload.batch_size=[1,3,5]")
    assert code == 2 and "number of sweep points (run: 2, now: 3)" in err


def test_resume_and_overwrite_are_mutually_exclusive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)),
                           "--out", str(tmp_path / "o"), "--resume", "--overwrite")
    assert code == 2 and "mutually exclusive" in err and calls == []


def test_overwrite_with_a_smaller_sweep_leaves_no_stale_points_and_keeps_user_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measured: Path, calls: list[int]) -> None:
    out = copy_run(measured, tmp_path / "out")
    (out / "notes.txt").write_text("mine")
    (out / "other.json").write_text('{"not": "a result"}')
    small = TINY.replace("batch_size: [1, 3]", "batch_size: [1]")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, small)),
                           "--out", str(out), "--overwrite")
    assert code == 0, err
    assert calls == [0]
    assert sorted(p.name for p in out.iterdir()) == [
        LOCK_NAME, MANIFEST_NAME, "notes.txt", "other.json", "tiny_run.csv", "tiny_run_000.json"]
    assert [r["point_index"] for r in load_results([out])] == [0]  # what report sees
    code, stdout, _ = run_cli(monkeypatch, capsys, "report", str(out))
    assert code == 0 and "batch_size=3" not in stdout


def test_report_reads_only_the_points_the_manifest_lists_as_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measured: Path) -> None:
    out = copy_run(measured, tmp_path / "out")
    shutil.copy(out / "tiny_run_001.json", out / "tiny_run_007.json")  # a stray result
    doc = json.loads((out / MANIFEST_NAME).read_text())
    doc["points"][1]["status"] = "running"  # complete file, but not recorded as done
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    assert [Path(r["_path"]).name for r in load_results([out])] == ["tiny_run_000.json"]
    code, stdout, err = run_cli(monkeypatch, capsys, "report", str(out), "--json")
    assert code == 0, err
    assert [row["label"] for row in json.loads(stdout)] == ["batch_size=1"]
    # an older run directory without a manifest: every result JSON, as before
    (out / MANIFEST_NAME).unlink()
    assert len(load_results([out])) == 3


@pytest.mark.parametrize("damage", [b"{", b"\xff\xfe", b"[" * 5000, b'{"kind": "x"}',
                                    b'{"kind": "infbench.run_manifest", "schema_version": 1, '
                                    b'"points": [{"index": 0, "file": 7}]}'])
def test_a_damaged_manifest_is_one_line_and_overwrite_replaces_it(
        damage: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], measured: Path, calls: list[int]) -> None:
    out = copy_run(measured, tmp_path / "out")
    (out / MANIFEST_NAME).write_bytes(damage)
    for args in (["report", str(out)],
                 ["run", str(scenario(tmp_path)), "--out", str(out)],
                 ["run", str(scenario(tmp_path)), "--out", str(out), "--resume"]):
        code, _, err = run_cli(monkeypatch, capsys, *args)
        assert code == 2 and err.startswith(f"error: {out / MANIFEST_NAME}: "), err
        assert err.count("\n") == 1 and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out),
                           "--overwrite")
    assert code == 0, err
    assert calls == [0, 1] and read_manifest(out) is not None


# ------------------------------------------------------------------ names and --out
@pytest.mark.parametrize("name", ["../../evil", "/etc/evil", ".hidden/../evil", "a b:c*d"])
def test_a_scenario_name_never_writes_outside_out(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], calls: list[int]) -> None:
    out = tmp_path / "a" / "b" / "out"
    text = TINY.replace("name: tiny_run", f"name: {json.dumps(name)}")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, text)),
                           "--out", str(out))
    assert code == 0, err
    stem = safe_name(name)
    assert stem and not stem.startswith(".") and "/" not in stem
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted([LOCK_NAME, MANIFEST_NAME, f"{stem}.csv", f"{stem}_000.json",
                              f"{stem}_001.json"])
    everything = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert everything <= {*out.iterdir(), tmp_path / "s.yaml"}
    assert not Path("/etc/evil_000.json").exists()


def test_safe_names_are_bounded_and_plain() -> None:
    assert safe_name("../../evil") == "evil"
    assert safe_name("/etc/x") == "etc_x"
    assert safe_name("...") == "run"
    assert len(safe_name("x" * 500)) == 64
    assert safe_name("llama-3.1_8b") == "llama-3.1_8b"


def test_default_out_dir_uses_the_sanitized_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    monkeypatch.chdir(tmp_path)
    text = TINY.replace("name: tiny_run", 'name: "../../evil"')
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, text)))
    assert code == 0, err
    (made,) = (tmp_path / "results" / "runs").iterdir()
    assert made.name.startswith("evil-") and (made / "evil_000.json").is_file()


def test_out_that_is_a_file_or_under_a_file_is_one_line_before_any_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, needle in ((afile, "is a file, not a directory"),
                        (afile / "sub" / "out", "lies under")):
        code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)),
                               "--out", str(out))
        assert code == 2 and needle in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert calls == [] and afile.read_text() == "x"


def test_read_only_out_is_one_line_before_any_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores permission bits: simulate what a user would see
        import infbench.results.rundir

        monkeypatch.setattr(infbench.results.rundir, "is_writable", lambda _path: False)
    else:
        ro.chmod(0o555)
    try:
        for out in (ro, ro / "new"):
            code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)),
                                   "--out", str(out))
            assert code == 2 and "not writable" in err and "Traceback" not in err, err
    finally:
        ro.chmod(0o755)
    assert calls == [] and list(ro.iterdir()) == []


# ------------------------------------------------------------------ validate before measuring
def test_a_point_beyond_the_context_is_refused_before_any_point_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    bad = TINY.replace("prompt_len: 10", "prompt_len: [10, 60]")  # 60 + 6 > max_seq_len 64
    out = tmp_path / "out"
    start = time.perf_counter()
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, bad)),
                           "--out", str(out))
    assert code == 2 and calls == [] and not out.exists()
    assert time.perf_counter() - start < 30
    assert "point 1 (batch_size=1,prompt_len=60)" in err
    assert "60 + 6 = 66 tokens exceeds the model context (model max_seq_len 64" in err


def test_drawn_lengths_beyond_the_context_are_refused_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    # mean 50 + 6 fits 64, but a uniform +-50% spread draws prompts up to 75
    bad = TINY.replace("prompt_len: 10,", "prompt_len: 50, prompt_len_dist: uniform,").replace(
        "batch_size: [1, 3]", "batch_size: 16")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, bad)),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and calls == [] and "(longest drawn) exceeds the model context" in err


def test_a_point_that_cannot_fit_memory_is_refused_before_any_point_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    import infbench.measure.preflight

    monkeypatch.setattr(infbench.measure.preflight, "free_memory_bytes", lambda _dev: 1000)
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and calls == [] and not (tmp_path / "out").exists()
    assert "point 0 (batch_size=1): predicted memory" in err
    assert "exceeds the free memory of cpu (0.00 GB)" in err


def test_a_kv_byte_budget_too_small_for_one_sequence_is_refused_before_any_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)),
                           "--out", str(tmp_path / "out"), "--set", "engine.kv_cache_memory=100")
    assert code == 2 and calls == [] and "engine.kv_cache_memory=100 bytes" in err


def test_a_missing_gate_baseline_is_refused_before_any_point_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    missing = tmp_path / "nope"
    gated = TINY + f"gate: {{metric: output_tokens_per_s, baseline: {missing}}}\n"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, gated)),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and calls == [] and not (tmp_path / "out").exists()
    assert f"gate.baseline: {missing} does not exist" in err
    no_baseline = TINY + "gate: {metric: output_tokens_per_s}\n"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, no_baseline)),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and calls == [] and "no baseline result file given" in err


def test_an_incompatible_gate_baseline_is_refused_before_any_point_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measured: Path, calls: list[int]) -> None:
    gated = (TINY.replace("gen_len: 6", "gen_len: 5")
             + f"gate: {{metric: output_tokens_per_s, baseline: {measured}}}\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, gated)),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and calls == [] and "scenario.workload.gen_len differs" in err
    more = (TINY.replace("batch_size: [1, 3]", "batch_size: [1, 3, 5]")
            + f"gate: {{metric: output_tokens_per_s, baseline: {measured}}}\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, more)),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and calls == [] and "has no point tiny_run[2]" in err
    ok = TINY + f"gate: {{metric: output_tokens_per_s, baseline: {measured}, " \
                "max_regression: 0.99}\n"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path, ok)),
                           "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert calls == [0, 1]


def test_sigterm_mid_sweep_records_the_stop_and_resume_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        calls: list[int]) -> None:
    import infbench.measure.bench

    fake = infbench.measure.bench.run_point

    def terminated_at_point_1(point: Any, **kw: Any) -> dict[str, Any]:
        if point.index == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # a cancelled CI job, mid-point
        return fake(point, **kw)

    monkeypatch.setattr(infbench.measure.bench, "run_point", terminated_at_point_1)
    out = tmp_path / "out"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out))
    assert code == 143 and "1/2 point(s) done" in err and "--resume" in err
    manifest = read_manifest(out)
    assert manifest is not None and manifest.status == "interrupted"
    assert [p.status for p in manifest.points] == ["done", "pending"]
    assert sorted(p.name for p in out.glob("tiny_run*")) == ["tiny_run.csv", "tiny_run_000.json"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    monkeypatch.setattr(infbench.measure.bench, "run_point", fake)
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario(tmp_path)), "--out", str(out),
                           "--resume")
    assert code == 0, err
    assert calls == [0, 1]  # point 1 stopped before it ran; resumed: only point 1


# ------------------------------------------------------------------ a real kill
def test_sigkill_mid_sweep_leaves_complete_files_and_resume_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    three = TINY.replace("batch_size: [1, 3]", "batch_size: [1, 2, 3]").replace(
        "repeats: 1", "repeats: 2")
    path = scenario(tmp_path, three)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "infbench.cli", "run", str(path),
                             "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "tiny_run_000.json").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "the run wrote no point in 120 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    files = sorted(out.glob("tiny_run_*.json"))
    for f in files:  # every file there is complete
        assert json.loads(f.read_text())["kind"] == "infbench.run"
    manifest = read_manifest(out)
    assert manifest is not None
    done = {p.file for p in manifest.done()}
    assert done <= {f.name for f in files}
    # The kill can land between a point's JSON and the CSV that follows it: no CSV yet is
    # consistent (it lists no point); a CSV that exists lists only complete points.
    csv_path = out / "tiny_run.csv"
    rows = list(csv.DictReader(csv_path.open())) if csv_path.exists() else []
    assert {f"tiny_run_{int(r['point_index']):03d}.json" for r in rows} <= {f.name for f in files}
    # the kernel released the lock with the process: --resume finishes the rest
    res = subprocess.run([sys.executable, "-m", "infbench.cli", "run", str(path),
                          "--out", str(out), "--resume"], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr
    manifest = read_manifest(out)
    assert manifest is not None and [p.status for p in manifest.points] == ["done"] * 3
    assert len(load_results([out])) == 3
    assert len(list(csv.DictReader((out / "tiny_run.csv").open()))) == 3
