"""Work run in forked processes under hard deadlines, so that a solver that crashes, hangs or eats memory
costs its own result and nothing else: `plan` runs its portfolio members this way, and the benchmark
runner its cells."""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable

PR_SET_PDEATHSIG = 1  # linux/prctl.h
HELD = (signal.SIGINT, signal.SIGTERM)  # the signals a parent holds back while it forks a child


@dataclass(frozen=True)
class Job:
    """`work` runs in the child and returns a picklable value; `deadline` is the wall-clock seconds it may
    take before its process group is killed; `key` is the caller's handle on it."""

    key: Any
    work: Callable[[], Any]
    deadline: float


@dataclass(frozen=True)
class Outcome:
    """How a job ended: `ok` (value is what work returned), `error` (value is the exception with its
    traceback), `died` (value is the exit code) or `killed` at its deadline; after `elapsed` seconds."""

    job: Job
    kind: str
    value: Any
    elapsed: float


def kill_deadline(time_limit: float) -> float:
    """Wall-clock a solver run may take before it is killed: its budget plus room for start-up and checks
    (on large instances pricing the options runs past small budgets; a run killed early loses its plan)."""
    return 1.5 * time_limit + 10.0


def _die_with_parent(parent: int) -> None:
    """A child must not outlive its parent, even one killed with SIGKILL: the kernel sends this process
    SIGKILL when its parent dies. It also leads its own process group, so that a child killed at its
    deadline takes along whatever it started (CBC runs as a separate program)."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the deadline kill still applies
        pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _child(connection, job: Job, parent: int) -> None:
    # Ctrl-C is the parent's to handle (it kills its children): a child ignores it, even in the moment before
    # it leaves the terminal's process group, so that it never prints a traceback of its own. SIGTERM ends a
    # child quietly, as the default does (the parent may have made it an exception).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent)
    if "torch" in sys.modules:
        # Jobs are the parallel unit: a torch thread pool per job on top would oversubscribe the cores,
        # and OpenMP's spinning threads then slow every small network call by two orders of magnitude.
        sys.modules["torch"].set_num_threads(1)
    try:
        connection.send(("ok", job.work()))
    except BaseException as exc:  # the parent turns anything the work raises into an outcome
        connection.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
    finally:
        connection.close()


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM that arrive inside are noted, not raised, and raised again on the way out under the
    handlers that were there. Raised inside a fork, they would land in an at-fork callback, which swallows
    them: `plan` then waited out a member's deadline (a SIGTERM on 4 of 12 runs beside two busy loops).
    Blocking them in this thread was not enough, as a signal may go to another of the process's threads
    (BLAS's) and Python still runs the handler here. Off the main thread, where Python runs no handler, and
    for a signal whose handler Python did not install, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    ours = [s for s in HELD if signal.getsignal(s) is not None]
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in ours}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if arrived:
            signal.raise_signal(arrived[0])


def kill_group(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.join(1.0)


def run_isolated(jobs: Iterable[Job], workers: int, on_outcome: Callable[[Outcome], None],
                 stop: Callable[[Outcome], bool] | None = None) -> bool:
    """Runs the jobs, `workers` at a time, each in its own forked process. When an outcome satisfies
    `stop`, the jobs still running are killed (they leave no outcome), the rest are not started, and True
    is returned."""
    context = mp.get_context("fork")
    pending = deque(jobs)
    running: dict = {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                job = pending.popleft()
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_child, args=(sender, job, os.getpid()), daemon=True)
                # Until the child is on the books, so that the cleanup below finds it to kill.
                with _signals_held():
                    process.start()
                    sender.close()
                    running[receiver] = (process, job, time.monotonic())
            now = time.monotonic()
            nearest = min(started + job.deadline for _, job, started in running.values())
            ready = wait(list(running), timeout=max(0.0, nearest - now))
            now = time.monotonic()
            for receiver in list(running):
                process, job, started = running[receiver]
                outcome = None
                if receiver in ready:
                    try:
                        kind, payload = receiver.recv()
                        outcome = Outcome(job, kind, payload, now - started)
                    except EOFError:
                        process.join(1.0)
                        outcome = Outcome(job, "died", process.exitcode, now - started)
                elif now - started > job.deadline:
                    kill_group(process)
                    outcome = Outcome(job, "killed", None, now - started)
                if outcome is not None:
                    process.join(1.0)
                    kill_group(process)  # anything the job left running (a solver's helper program) goes too
                    receiver.close()
                    del running[receiver]
                    on_outcome(outcome)
                    if stop is not None and stop(outcome):
                        for other in list(running):
                            kill_group(running.pop(other)[0])
                            other.close()
                        pending.clear()
                        return True
        return False
    except BaseException:  # Ctrl-C or an error in a callback: no job outlives the caller
        for receiver, (process, _, _) in running.items():
            kill_group(process)
            receiver.close()
        raise
