"""Back-ends' stray prints (solvers.quiet) stay off `plan`'s output: HiGHS's debug line on stdout and CP-SAT's
reports of LNS fragments its own checker rejected on stderr; whatever else they print still comes through."""
import ctypes
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from costmodels import get_oracle
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from shardbench.cli import main
from solvers import run_solver
from solvers.base import Budget
from solvers.quiet import RejectedLns, with_stderr_sorted

SHORT = Path(__file__).parent / "data" / "mixed-ebc-ec-short.json"

# As CP-SAT (OR-Tools 9.15) printed them on the zoo's mixed EBC + EC model at 30 s, parameters shortened.
REJECTED = ("Infeasible LNS solution! rins_pump_lns (d=8.08e-01 s=96 t=0.10 p=0.75 stall=3 h=base) solved with "
            "params goo.gle/debugproto   \nrandom_seed: 0\nmax_time_in_seconds: 26.527558895999391\n"
            "search_branching: AUTOMATIC_SEARCH\nnum_workers: 2\n\n")


def without_rejected_lns(printed: str) -> tuple[str, int]:
    """What `RejectedLns` keeps of `printed`, line by line, and how many reports it dropped."""
    sorter = RejectedLns()
    return "".join(line for line in printed.splitlines(keepends=True) if sorter.keeps(line)), sorter.count


def test_plan_prints_no_stray_line_from_highs(tmp_path, capfd):
    # `pair-balance`'s bound with whole options printed it among the report before its MILP was silenced.
    assert main(["plan", str(SHORT), "--oracle", "torchrec", "--budget", "3", "--solvers", "pair-balance",
                 "-o", str(tmp_path / "plan.json")]) == 0
    printed = capfd.readouterr().out
    assert "best plan: pair-balance" in printed and "Highs" not in printed


def test_rejected_lns_reports_are_dropped_and_everything_else_kept():
    nested = "Infeasible LNS solution! rnd_var_lns solved with params\nnum_workers: 2\nsub {\n  depth: 1\n}\n\n"
    printed = "before\n" + REJECTED + "E1208 a line of its own\n" + nested + REJECTED + "after: the end\n"
    assert without_rejected_lns(printed) == ("before\nE1208 a line of its own\nafter: the end\n", 3)
    assert without_rejected_lns("nothing of the kind\n") == ("nothing of the kind\n", 0)
    assert without_rejected_lns("") == ("", 0)


def test_an_absl_prefix_is_taken_and_a_line_like_a_parameter_outside_a_record_kept():
    prefixed = "E1208 01:02:03.456789 123 cp_model_solver.cc:1234] " + REJECTED
    assert without_rejected_lns(prefixed + "random_seed: 7\n") == ("random_seed: 7\n", 1)


def test_what_c_writes_to_descriptor_2_is_passed_on_as_it_comes_less_the_reports(capfd):
    libc = ctypes.CDLL(None)
    sorter = RejectedLns()

    def writes():
        os.write(2, b"from the descriptor\n")
        libc.write(2, REJECTED.encode(), len(REJECTED.encode()))
        libc.write(2, b"from C\n", 7)
        return 42

    assert with_stderr_sorted(writes, sorter) == 42 and sorter.count == 1
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "from the descriptor\nfrom C\nafter\n"


def test_what_was_written_before_the_call_raised_is_out(capfd):
    def fails():
        os.write(2, b"why it failed\n")
        raise ValueError("boom")

    opened = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match="boom"):
        with_stderr_sorted(fails, RejectedLns())
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "why it failed\nafter\n" and len(os.listdir("/proc/self/fd")) == opened


def test_a_line_is_passed_on_while_the_call_still_runs(capfd):
    def writes_and_waits():
        os.write(2, b"early\n")
        seen, until = "", time.monotonic() + 10
        while "early" not in seen and time.monotonic() < until:
            time.sleep(0.01)
            seen += capfd.readouterr().err
        return seen

    assert "early" in with_stderr_sorted(writes_and_waits, RejectedLns())


def test_with_descriptor_2_closed_the_call_runs_as_it_is():
    code = ("import os; os.close(2)\n"
            "from solvers.quiet import RejectedLns, with_stderr_sorted\n"
            "print(with_stderr_sorted(lambda: 42, RejectedLns()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0 and done.stdout == "42\n"


def test_cpsat_counts_rejected_fragments_over_all_its_runs_and_passes_other_lines_on(monkeypatch, capfd):
    from ortools.sat.python import cp_model

    solve, calls = cp_model.CpSolver.Solve, []

    def noisy(self, model, *args, **kwargs):
        calls.append(1)
        os.write(2, (REJECTED + "a warning of its own\n").encode())
        return solve(self, model, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "Solve", noisy)
    # Not proven within a second, so CP-SAT runs on the whole model (as in test_exact_and_search).
    task = sample_tasks(TaskSpec("autoshard", 200, count=1, num_devices=16, memory=MemorySpec(tightness=1.1)))[0]
    instance = dataclasses.replace(task, sharding_types=("table_wise",))
    result = run_solver("cpsat", instance, get_oracle("lookup"), Budget(1.0), 0)
    assert result.plan is not None and calls and result.stats["lns_fragments_rejected"] == len(calls)
    printed = capfd.readouterr().err
    assert "Infeasible LNS" not in printed and printed.count("a warning of its own") == len(calls)
