"""The Ray executor: suite cells and cost measurements fanned out over a Ray cluster (a local one sized to
the machine, or an existing one by address). Records stream back to the caller as they finish, so stores,
resume and leaderboards behave as with the local executor. Ray is imported only here, on request."""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cells import Cell

# Beyond its own deadline (enforced inside the worker, which kills the cell's process group), a cell's task
# gets this long before the driver cancels the task itself: a worker that hangs outside the cell.
DRIVER_GRACE_S = 60.0
CONNECT_TIMEOUT_S = 10.0
GPU_ORACLES = ("measured",)  # cells that time kernels take a GPU where the cluster has one


class RayUnavailableError(RuntimeError):
    """Ray is not installed or the cluster cannot be reached."""


@contextmanager
def ray_session(address: str | None, num_cpus: int | None = None) -> Iterator[Any]:
    """Joins the cluster at `address`, or starts a local instance (all cores unless `num_cpus`), and shuts
    down what it started."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailableError(f"the ray executor needs ray installed ({exc})") from exc
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address:
        _check_reachable(address)
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                     log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayUnavailableError(f"cannot reach a Ray cluster at {address!r}: {exc}") from exc
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """Ray itself retries an unreachable address for many minutes: a plain connection first, to fail fast."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise RayUnavailableError(f"--address: expected HOST:PORT (or ray://HOST:PORT, or auto), got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise RayUnavailableError(f"--address: cannot reach a Ray cluster at {address}: {exc}") from exc


def _run_one_cell(cell: Cell) -> dict:
    """In a Ray worker: the cell under the local runner (its own process, deadline, process-group kill)."""
    from .cells import run_cells

    records: list[dict] = []
    run_cells([cell], 1, records.append)
    return records[0]


def run_cells_ray(cells: list[Cell], workers: int | None, on_record: Callable[[dict], None],
                  progress: Callable[[dict], None] | None = None, address: str | None = None) -> None:
    """Each cell is a Ray task (one CPU; a GPU for measuring cells where the cluster has GPUs). At most
    `workers` tasks are in flight (default: the cluster's CPUs), so a task starts when it is submitted and
    the driver's deadline is a safety net over the worker's own. A task that dies becomes an error row,
    one cancelled at the driver's deadline a timeout row."""
    from .cells import cell_deadline, error_record

    with ray_session(address, workers) as ray:
        has_gpus = ray.cluster_resources().get("GPU", 0) > 0
        capacity = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        remote = ray.remote(max_retries=0)(_run_one_cell)
        pending = list(reversed(cells))
        running: dict = {}
        while pending or running:
            while pending and len(running) < capacity:
                cell = pending.pop()
                gpus = 1 if has_gpus and ({cell.oracle, cell.judge} & set(GPU_ORACLES)) else 0
                ref = remote.options(num_cpus=1, num_gpus=gpus).remote(cell)
                running[ref] = (cell, time.monotonic())
            nearest = min(started + cell_deadline(c) + DRIVER_GRACE_S for c, started in running.values())
            ready, _ = ray.wait(list(running), num_returns=1, timeout=max(0.0, nearest - time.monotonic()))
            now = time.monotonic()
            for ref in list(running):
                cell, started = running[ref]
                record = None
                if ref in ready:
                    try:
                        record = ray.get(ref)
                    except Exception as exc:  # the worker died or Ray lost the task: an error row
                        record = error_record(cell, f"ray task failed: {type(exc).__name__}: {exc}"[:2000],
                                              now - started)
                elif now - started > cell_deadline(cell) + DRIVER_GRACE_S:
                    ray.cancel(ref, force=True)
                    record = error_record(cell, f"killed after {now - started:.1f} s: its ray task outlived the "
                                                f"cell's deadline of {cell_deadline(cell):g} s", now - started, "timeout")
                if record is not None:
                    del running[ref]
                    on_record(record)
                    if progress:
                        progress(record)


def ray_map(fn: Callable[[Any], dict], items: Iterable[Any], address: str | None,
            workers: int | None = None) -> Iterator[dict]:
    """fn over items as Ray tasks (one GPU each where the cluster has GPUs, one CPU otherwise), results
    yielded as they finish. `fn` must be importable by the workers."""
    with ray_session(address, workers) as ray:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
        remote = ray.remote(max_retries=0)(fn).options(num_cpus=1, num_gpus=gpus)
        capacity = workers or max(1, int(ray.cluster_resources().get("GPU" if gpus else "CPU", 1)))
        queue = iter(items)
        running = []
        for item in queue:
            running.append(remote.remote(item))
            if len(running) >= capacity:
                break
        while running:
            ready, running = ray.wait(running, num_returns=1)
            yield ray.get(ready[0])
            for item in queue:
                running.append(remote.remote(item))
                break
