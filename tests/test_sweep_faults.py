"""Faults in sweeps: a bench process killed with SIGKILL at random points and resumed loses and duplicates
nothing and ends with the leaderboard of an uninterrupted run; a second bench process on the same store
is refused; the cells of a killed sweep die with it."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.leaderboard import leaderboard_rows
from benchmarks.store import Store, StoreError, cell_key, read_records
from instances import save_instance_set
from instances.sampler import MemorySpec, TaskSpec, sample_tasks

SOLVERS = ["lpt", "lookup-greedy", "size-greedy", "dim-greedy", "round-robin", "best-greedy"]


def _suite(folder: Path, solvers=SOLVERS, time_limit=1, name="faults") -> Path:
    if not (folder / "set").exists():
        tasks = sample_tasks(TaskSpec("autoshard", 30, count=4, memory=MemorySpec(tightness=1.5)))
        save_instance_set(tasks, folder / "set", {})
    path = folder / f"{name}.toml"
    path.write_text(f'name = "{name}"\ninstances = "set"\nresults = "out/{name}.jsonl"\noracles = ["lookup", "size"]\n'
                    f"solvers = {json.dumps(solvers)}\ntime_limits = [{time_limit}]\nrandom_seeds = [0, 1, 2]\n"
                    "workers = 2\n")
    return path


def _bench(suite: Path, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardbench.cli", "bench", str(suite), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _deterministic(records):
    """What must not depend on interruptions: per cell, the status, objective and plan."""
    return {cell_key(r): (r["status"], r.get("objective"), json.dumps(r.get("plan"))) for r in records}


def _board(records):
    return [(r.oracle, r.solver, r.cells, r.with_plan, r.optimal, r.objective, r.balance, r.speedup, r.gap)
            for r in leaderboard_rows(records)]


def test_sigkill_at_random_points_then_resume_loses_and_duplicates_nothing(tmp_path):
    reference = _suite(tmp_path / "reference")
    assert _bench(reference).wait(timeout=300) == 0
    expected = read_records(reference.parent / "out" / "faults.jsonl")
    suite = _suite(tmp_path / "killed")
    store = suite.parent / "out" / "faults.jsonl"
    rng = np.random.default_rng(5)
    for delay in rng.uniform(0.3, 2.5, size=6):
        process = _bench(suite)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        if store.exists():
            read_records(store)  # every complete line is a record; only a last line may be cut short
    assert _bench(suite).wait(timeout=300) == 0
    lines = store.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # no corrupt line, not even a last one
    keys = [cell_key(r) for r in records]
    assert len(keys) == len(set(keys)) == len(expected)
    assert _deterministic(records) == _deterministic(expected)
    assert _board(records) == _board(expected)


def test_a_second_bench_process_on_the_same_store_is_refused(tmp_path):
    suite = _suite(tmp_path, solvers=["local-search"], time_limit=3)
    first = _bench(suite)
    lock = tmp_path / "out" / ".faults.jsonl.lock"
    deadline = time.monotonic() + 30
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = _bench(suite)
    assert second.wait(timeout=60) == 2
    message = second.stderr.read().strip().splitlines()
    assert len(message) == 1 and "another bench process" in message[0] and str(first.pid) in message[0]
    assert first.wait(timeout=300) == 0
    records = read_records(tmp_path / "out" / "faults.jsonl")
    assert len({cell_key(r) for r in records}) == len(records)
    assert not lock.exists()


def test_store_lock_and_truncated_line_repair(tmp_path):
    path = tmp_path / "s.jsonl"
    record = {"instance": "i", "solver": "lpt", "oracle": "lookup", "time_limit": 1.0, "seed": 0, "status": "no_plan",
              "solve_time": 0.1}
    with Store(path) as store:
        with pytest.raises(StoreError, match="another bench process"):
            Store(path)
        store.append(record)
    path.write_text(path.read_text() + '{"instance": "i", "sol')  # a write cut short
    with Store(path) as store:
        assert store.records() == [record]
        store.append({**record, "seed": 1})
    assert [r["seed"] for r in read_records(path)] == [0, 1]  # the next record was not glued onto the cut
    path.write_text(path.read_text() + "1\n")
    with pytest.raises(StoreError, match="s.jsonl:3: not a result record"):
        read_records(path)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_cells_of_a_killed_sweep_die_with_it(tmp_path):
    suite = _suite(tmp_path, solvers=["local-search"], time_limit=60)
    process = _bench(suite)
    deadline = time.monotonic() + 30
    cells = []
    while not cells and time.monotonic() < deadline:
        time.sleep(0.1)
        cells = [c for c in _children(process.pid) if _alive(c)]
    assert cells, "no cell started"
    time.sleep(0.5)
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 5
    while any(_alive(c) for c in cells) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(c) for c in cells)
    for cell in cells:  # reap in case they were re-parented to us
        try:
            os.waitpid(cell, os.WNOHANG)
        except ChildProcessError:
            pass
