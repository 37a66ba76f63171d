"""`plan` signalled for real (SIGINT, SIGTERM) while it loads, races, converts and writes: one line, exit 130
or 143, no traceback, no member left, no output nor temporary; SIGKILL's marked leftovers go at the next write;
a signal while a member is forked is held back and raised once the member is on the books."""
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_instance

from instances import SHARDING_TYPES, save_instance
from shardbench.cli import main

# Each stage is slowed down where it happens, so that the signal surely finds the command there: the
# script prints a line once it is there and sleeps until the signal arrives.
SLOW = {
    # The first heavy import of the command line (numpy), found by a finder that waits.
    "import": ("import importlib.abc, time\n"
               "class Slow(importlib.abc.MetaPathFinder):\n"
               "    def find_spec(self, name, path, target=None):\n"
               "        if name == 'numpy':\n"
               "            print('there', flush=True); time.sleep(60)\n"
               "sys.meta_path.insert(0, Slow())\n"),
    # A member that runs until it is killed.
    "race": ("import time\n"
             "from solvers.base import register\n"
             "register('sleeper', 'sleeps')(lambda problem, budget, seed: (print('there', flush=True), "
             "time.sleep(600)))\n"),
    # The conversion to TorchRec's ShardingPlan, after the race and before any write.
    "export": ("import time\n"
               "import interop.export as export\n"
               "def slow(*args, **kwargs):\n"
               "    print('there', flush=True); time.sleep(60)\n"
               "export.to_torchrec = slow\n"),
    # Between the outputs' temporaries: plan.json's is written, the ShardingPlan's not yet.
    "write": ("import time\n"
              "import instances.io as io\n"
              "real, calls = io.temporary_path, []\n"
              "def slow(path):\n"
              "    calls.append(path)\n"
              "    if len(calls) == 2:\n"
              "        print('there', flush=True); time.sleep(60)\n"
              "    return real(path)\n"
              "io.temporary_path = slow\n"),
}


def _instance(tmp_path: Path) -> Path:
    """Small enough at batch 16 that its plan fits TorchRec's storage estimate too (export checks it)."""
    import dataclasses

    path = tmp_path / "instance.json"
    instance = make_instance([(1000, 16, 2.0), (500, 8, 1.0), (200, 8, 1.0)], 2, 10**6, "small", types=SHARDING_TYPES)
    save_instance(dataclasses.replace(instance, workload=dataclasses.replace(instance.workload, batch_size=16)), path)
    return path


def _start(tmp_path: Path, stage: str) -> subprocess.Popen:
    script = f"import sys\n{SLOW[stage]}from shardbench.cli import entry\nsys.exit(entry())\n"
    solvers = "sleeper" if stage == "race" else "lpt"
    return subprocess.Popen([sys.executable, "-c", script, "plan", str(_instance(tmp_path)), "--oracle", "lookup",
                             "--budget", "300" if stage == "race" else "1", "--solvers", solvers,
                             "-o", str(tmp_path / "plan.json"), "--torchrec-out", str(tmp_path / "plan.pt")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_there(process: subprocess.Popen) -> None:
    for line in process.stdout:
        if line.strip() == "there":
            return
    raise AssertionError(f"the command ended before the stage: {process.stderr.read()[-2000:]}")


def _members_running(tmp_path: Path) -> list[str]:
    """Processes whose command line names the test's folder (forked members carry the parent's)."""
    running = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(tmp_path).encode() in (entry / "cmdline").read_bytes():
                running.append(entry.name)
        except OSError:  # a process that ended meanwhile
            pass
    return running


@pytest.mark.parametrize("stage", list(SLOW))
@pytest.mark.parametrize("signum,line,code", [(signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_plan_says_one_line_and_leaves_nothing(stage, signum, line, code, tmp_path):
    process = _start(tmp_path, stage)
    try:
        _wait_there(process)
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    if (stage, signum) == ("import", signal.SIGTERM):  # before the command sets its handler: SIGTERM's own end
        assert (process.returncode, err) == (-signal.SIGTERM, "")
    else:
        assert (process.returncode, err) == (code, f"{line}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["instance.json"]
    assert not _members_running(tmp_path)


def test_sigkill_leaves_marked_temporaries_that_the_next_plan_sweeps(tmp_path):
    process = _start(tmp_path, "write")
    try:
        _wait_there(process)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        process.kill()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "instance.json")
    assert left == [f".plan.json.shardbench-{process.pid}-0.tmp"], left
    assert main(["plan", str(tmp_path / "instance.json"), "--oracle", "lookup", "--budget", "1", "--solvers", "lpt",
                 "-o", str(tmp_path / "plan.json"), "--torchrec-out", str(tmp_path / "plan.pt")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["instance.json", "plan.json", "plan.pt", "plan.sharding.json"]


def test_a_live_writers_temporaries_are_not_swept(tmp_path):
    """Only a dead process's temporaries go: one of a process still running (this one's parent) stays."""
    import os

    from instances.io import sweep_temporaries

    live = tmp_path / f".plan.json.shardbench-{os.getppid()}-0.tmp"
    dead = tmp_path / ".plan.json.shardbench-999999999-0.tmp"
    other = tmp_path / ".other.json.shardbench-999999999-0.tmp"
    for path in (live, dead, other):
        path.write_text("{}")
    sweep_temporaries(tmp_path / "plan.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])
    assert all(re.fullmatch(r"\.[\w.]+\.shardbench-\d+-\d+\.tmp", p.name) for p in tmp_path.iterdir())


def test_a_signal_while_a_member_is_forked_is_held_back_and_raised_once_its_on_the_books():
    """A handler's exception raised inside a fork lands in an at-fork callback, which swallows it: inside
    `_signals_held` a signal is only noted, and raised under the handler that was there on the way out."""
    import os
    import time

    from shardbench.isolation import _signals_held

    class Raised(Exception):
        pass

    def handler(signum, frame):
        raise Raised

    previous = signal.signal(signal.SIGTERM, handler)
    reached = False
    try:
        with pytest.raises(Raised):
            with _signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler would have run by now
                reached = True
        assert reached and signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)
