"""The Ray executor: the same records as the local one for deterministic solvers, a cell past its deadline
cancelled and recorded, a dead worker an error row, and a killed sweep that resumes without loss. A local
Ray instance of 2 CPUs, started once for the module."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"
ray = pytest.importorskip("ray")

from benchmarks.distributed import ray_map, run_cells_ray  # noqa: E402
from benchmarks.metrics import degree_of_balance  # noqa: E402
from benchmarks.cells import Cell  # noqa: E402
from benchmarks.runner import run_suite  # noqa: E402
from benchmarks.store import cell_key, read_records  # noqa: E402
from benchmarks.suite import load_suite  # noqa: E402
from instances import save_instance_set  # noqa: E402
from instances.sampler import MemorySpec, TaskSpec, sample_tasks  # noqa: E402

SOLVERS = ["lpt", "best-greedy", "split-greedy", "round-robin"]


def _ray_pids(prefix: bytes = b"ray::") -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(prefix):
                    pids.add(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    before = _ray_pids()
    # Workers inherit the environment at start: measurements land in a fresh cache, never a user's.
    os.environ["SHARDBENCH_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()
    _reap_orphans(before)


def _reap_orphans(before: set[int]) -> None:
    """Ray's node agents can outlive a driver killed with SIGKILL (ray-project/ray#59162): end ours."""
    for pid in _ray_pids() - before:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _suite(folder: Path, solvers=SOLVERS, time_limit=1) -> Path:
    if not (folder / "set").exists():
        tasks = sample_tasks(TaskSpec("autoshard", 20, count=3, memory=MemorySpec(tightness=1.5)))
        save_instance_set(tasks, folder / "set", {})
    path = folder / "r.toml"
    path.write_text(f'name = "r"\ninstances = "set"\nresults = "out/r.jsonl"\noracles = ["lookup", "analytic"]\n'
                    f"solvers = {json.dumps(solvers)}\nsharding = [\"table_wise\", \"instance\"]\n"
                    f"time_limits = [{time_limit}]\nrandom_seeds = [0, 1]\nworkers = 2\n")
    return path


def _deterministic(records):
    return {cell_key(r): (r["status"], r.get("objective"), json.dumps(r.get("plan"))) for r in records}


def test_ray_gives_the_local_records(tmp_path, cluster):
    local = run_suite(load_suite(_suite(tmp_path / "local")), quiet=True)
    remote = run_suite(load_suite(_suite(tmp_path / "ray")), quiet=True, executor="ray")
    assert len(remote) == len(local) > 20
    assert _deterministic(remote) == _deterministic(local)
    assert all(r["status"] == "feasible" or r["status"] == "optimal" for r in remote)


def _cell(tmp_path, time_limit: float, deadline: float | None) -> Cell:
    instance = sample_tasks(TaskSpec("autoshard", 20, count=1, memory=MemorySpec(tightness=1.5)))[0]
    return Cell(instance, "local-search", "lookup", time_limit, 0, "lookup", deadline=deadline)


def test_a_cell_past_its_deadline_is_cancelled_and_recorded(tmp_path, cluster):
    records = []
    started = time.monotonic()
    run_cells_ray([_cell(tmp_path, 60.0, 2.0)], 2, records.append)
    assert time.monotonic() - started < 30
    assert len(records) == 1 and records[0]["status"] == "timeout" and "deadline of 2 s" in records[0]["error"]


def test_a_worker_that_dies_becomes_an_error_row(tmp_path, cluster):
    records = []
    runner = threading.Thread(target=run_cells_ray, args=([_cell(tmp_path, 30.0, None)], 2, records.append))
    runner.start()
    deadline = time.monotonic() + 60
    workers = []
    while not workers and time.monotonic() < deadline:
        time.sleep(0.2)
        workers = _ray_pids(b"ray::_run_one_cell")
    assert workers, "the cell's task never started"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    runner.join(timeout=120)
    assert not runner.is_alive()
    assert len(records) == 1 and records[0]["status"] == "error" and "ray task failed" in records[0]["error"]


def test_a_killed_ray_sweep_resumes_without_loss(tmp_path):
    before = _ray_pids()
    reference = run_suite(load_suite(_suite(tmp_path / "reference")), quiet=True)
    suite = _suite(tmp_path / "killed")
    command = [sys.executable, "-m", "shardbench.cli", "bench", str(suite), "--executor", "ray", "--workers", "2"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    store = suite.parent / "out" / "r.jsonl"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not store.exists() or len(store.read_text().splitlines()) < 5):
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    try:
        partial = read_records(store)
        assert 0 < len(partial) < len(reference)
        assert subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                              timeout=300).returncode == 0
    finally:
        _reap_orphans(before)
    records = [json.loads(line) for line in store.read_text().splitlines()]
    assert len({cell_key(r) for r in records}) == len(records) == len(reference)
    assert _deterministic(records) == _deterministic(reference)


def test_ray_map_yields_every_result(cluster):
    assert sorted(ray_map(degree_of_balance, [[1.0, 2.0], [2.0, 2.0], [1.0, 4.0]], address=None)) == [0.25, 0.5, 1.0]


def test_measure_fans_out_and_resumes_by_id(tmp_path, cluster):
    from functools import partial

    from costmodels.dataset import collect, load_dataset
    from costmodels.measured import Protocol

    protocol = Protocol(warmups=1, runs=3, trim=1, batch=32, seed=0, max_rows=1024)
    out = tmp_path / "costs.jsonl"
    run_many = partial(ray_map, address=None, workers=2)
    assert collect(out, 3, 1, 32, 0, protocol, run_many=run_many) == 3
    assert collect(out, 4, 1, 32, 0, protocol, run_many=run_many) == 1
    records = load_dataset(out)
    assert sorted(r["id"] for r in records) == [0, 1, 2, 3]
    assert all(r["device"].startswith("cpu") and r["total_s"] > 0 for r in records)


def test_ray_executor_flags_are_checked(tmp_path, capsys):
    from shardbench.cli import main

    suite = _suite(tmp_path)
    assert main(["bench", str(suite), "--address", "127.0.0.1:1"]) == 2
    assert "only with --executor ray" in capsys.readouterr().err
    assert main(["bench", str(suite), "--executor", "dask"]) == 2
    assert main(["bench", str(suite), "--executor", "ray", "--address", "127.0.0.1:1"]) == 2
    assert "cannot reach a Ray cluster at 127.0.0.1:1" in capsys.readouterr().err
    assert main(["bench", str(suite), "--executor", "ray", "--address", "nowhere"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
