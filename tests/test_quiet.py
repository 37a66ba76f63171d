"""Back-ends' stray prints (solvers.quiet) stay off `plan`'s output: HiGHS's debug line on stdout and CP-SAT's
reports of LNS fragments its own checker rejected on stderr; whatever else they print still comes through."""
import ctypes
import dataclasses
import os
from pathlib import Path

import pytest

from costmodels import get_oracle
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from shardbench.cli import main
from solvers import run_solver
from solvers.base import Budget
from solvers.quiet import with_stderr, without_rejected_lns

SHORT = Path(__file__).parent / "data" / "mixed-ebc-ec-short.json"

# As CP-SAT (OR-Tools 9.15) printed them on the zoo's mixed EBC + EC model at 30 s, parameters shortened.
REJECTED = ("Infeasible LNS solution! rins_pump_lns (d=8.08e-01 s=96 t=0.10 p=0.75 stall=3 h=base) solved with "
            "params goo.gle/debugproto   \nrandom_seed: 0\nmax_time_in_seconds: 26.527558895999391\n"
            "search_branching: AUTOMATIC_SEARCH\nnum_workers: 2\n\n")


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


def test_with_stderr_takes_what_c_writes_to_descriptor_2_and_points_it_back(capfd):
    libc = ctypes.CDLL(None)

    def writes():
        os.write(2, b"from the descriptor\n")
        libc.write(2, b"from C\n", 7)
        return 42

    assert with_stderr(writes) == (42, "from the descriptor\nfrom C\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


def test_with_stderr_lets_what_was_written_out_when_the_call_raises(capfd):
    def fails():
        os.write(2, b"why it failed\n")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        with_stderr(fails)
    assert capfd.readouterr().err == "why it failed\n"


def test_cpsat_counts_rejected_fragments_and_passes_other_lines_on(monkeypatch, capfd):
    from ortools.sat.python import cp_model

    solve = cp_model.CpSolver.Solve

    def noisy(self, model, *args, **kwargs):
        os.write(2, (REJECTED + "a warning of its own\n").encode())
        return solve(self, model, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "Solve", noisy)
    # Not proven within a second, so CP-SAT runs on the whole model (as in test_exact_and_search).
    task = sample_tasks(TaskSpec("autoshard", 200, count=1, num_devices=16, memory=MemorySpec(tightness=1.1)))[0]
    instance = dataclasses.replace(task, sharding_types=("table_wise",))
    result = run_solver("cpsat", instance, get_oracle("lookup"), Budget(1.0), 0)
    assert result.plan is not None and result.stats["lns_fragments_rejected"] == 1
    printed = capfd.readouterr().err
    assert "Infeasible LNS" not in printed and "a warning of its own" in printed
