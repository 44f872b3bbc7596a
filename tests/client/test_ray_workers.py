"""`infbench run --ray`: client workers as Ray actors and engine points as Ray tasks, on a
local Ray cluster the test starts on loopback (skipped when ray is not installed)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import run_args, tiny_scenario

from infbench.client.mock_server import MockConfig, MockServer

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local cluster for the module (`--ray local`'s own start), its workers without the
    C++ kernels' first build (the torch references run the tiny model)."""
    from infbench.client.ray_cluster import RayCluster

    mp = pytest.MonkeyPatch()
    mp.setenv("INFBENCH_CPU_KERNELS", "0")  # inherited by the cluster's workers
    before = signal.getsignal(signal.SIGTERM)
    with RayCluster("local"):
        yield
    mp.undo()
    assert signal.getsignal(signal.SIGTERM) is before  # ray's own handler not left behind


def test_engine_points_run_on_the_cluster_into_one_run_dir(
        cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_scenario(name="tiny_ray"))
    out = tmp_path / "out"
    code, _, err = run_args(["run", str(path), "--out", str(out), "--ray", "local",
                             "--ray-engine-points"], capsys)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(p["status"] for p in manifest["points"]) == ["done", "done"]
    results = [json.loads((out / f"tiny_ray_00{i}.json").read_text()) for i in (0, 1)]
    assert [r["metrics"]["num_requests"] for r in results] == [1, 3]
    assert all(r["env"]["ray_node"] for r in results)  # measured on a node of the cluster
    assert (out / "tiny_ray.csv").read_text().count("\n") == 3  # header + two points


def test_target_workers_as_actors_share_one_schedule(
        cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        tokenizer_dir: Path) -> None:
    config = MockConfig(token_delay_s=0.002, metrics="vllm", metrics_preempt_every=2)
    with MockServer(config) as server:
        path = tmp_path / "target.yaml"
        path.write_text(f"""
name: target_ray
target: {{kind: openai, base_url: '{server.base_url}', model: mock-model, workers: 2,
          tokenizer: '{tokenizer_dir}'}}
workload: {{kind: poisson, rate: 200, num_requests: 6, prompt_len: 8, gen_len: 4, seed: 3,
            max_concurrency: 4}}
measure: {{warmup: 0, repeats: 1}}
""")
        out = tmp_path / "out"
        code, _, err = run_args(["run", str(path), "--out", str(out), "--ray", "local"],
                                capsys)
    assert code == 0, err
    result = json.loads((out / "target_ray_000.json").read_text())
    assert len(config.received) == 6 and result["metrics"]["num_requests"] == 6
    workers = result["telemetry"]["client"]["workers"]
    assert workers["start_method"] == "ray actors" and workers["count"] == 2
    assert workers["requests"] == [3, 3] and workers["max_concurrency"] == [2, 2]
    assert sorted(r["worker"] for r in result["requests"]) == [0, 0, 0, 1, 1, 1]
    assert result["telemetry"]["client"]["send_error_s"]["p99"] < 0.25
    # the parent scraped /metrics while the actors streamed (client/server_metrics.py)
    sm = result["telemetry"]["server_metrics"]
    assert sm["source"] == "vllm" and sm["num_failed"] == 0 and sm["num_scrapes"] >= 2
    assert sm["summary"]["preemptions"] == 3  # requests 2, 4, 6 of the 6, no warm-up


def test_ray_engine_points_without_ray_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_scenario())
    code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "o"),
                             "--ray-engine-points"], capsys)
    assert code == 2
    assert err.strip() == "error: --ray-engine-points needs --ray ADDRESS (local: a cluster " \
        "on loopback)"
    assert not (tmp_path / "o").exists()


class _FakeRay:
    """Just what EngineDispatch calls: remote(fn).options(...).remote(point, device), get."""

    class exceptions:  # noqa: N801 (ray's name)
        class RayTaskError(Exception):
            pass

    def __init__(self) -> None:
        self.sent: list[int] = []

    def remote(self, *args: object) -> object:  # ray.remote(fn), then .remote(point, dev)
        return self.send(*args) if len(args) == 2 else self

    def options(self, **_: object) -> _FakeRay:
        return self

    def send(self, point: object, _device: object) -> int:
        index = int(point.index)  # type: ignore[attr-defined]
        self.sent.append(index)
        return index

    def get(self, ref: int) -> dict[str, int]:
        return {"index": ref}

    def cancel(self, *_: object, **__: object) -> None:
        pass


def test_one_point_per_node_and_a_target_point_is_a_barrier() -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from infbench.client.ray_cluster import EngineDispatch

    fake = _FakeRay()
    nodes = [{"Alive": True, "NodeID": c * 56, "Resources": {"CPU": 2.0}} for c in "ab"]
    cluster = SimpleNamespace(ray=fake, nodes=lambda: nodes)
    points: list[Any] = [SimpleNamespace(index=i, target=t) for i, t in
              enumerate([None, None, None, "server", None])]
    dispatch = EngineDispatch(cast(Any, cluster), points, None)
    assert dispatch.device == "cpu" and fake.sent == [0, 1]  # two nodes: two in flight
    assert dispatch.measure(points[0]) == {"index": 0}
    assert fake.sent == [0, 1, 2]  # the freed node takes the next engine point
    dispatch.measure(points[1])
    dispatch.measure(points[2])
    assert fake.sent == [0, 1, 2]  # point 3 is a target: nothing runs past it meanwhile
    dispatch.measure(points[4])  # after the target point was measured here
    assert fake.sent == [0, 1, 2, 4]
