"""pair-balance: a device group solved again is the best layout of its tables (brute force), the solver's
plans are valid, no better than the optimum, no worse than its own start, and the same for any seed."""
import itertools

import numpy as np
import pytest
from conftest import examples
from hypothesis import assume, example, given
from test_sharding import QUICK
from test_tiers import THREE_TINY_TABLES, tiny_tiered_instances

from benchmarks.brute import brute_force_over_options
from costmodels import get_oracle
from instances.io import save_instance
from shardbench.cli import main
from solvers import Candidates, Status, run_solver
from solvers.assembly import Assembly
from solvers.base import OPTIMALITY_TOLERANCE
from solvers.balance import movable, regroup


@examples(25)
@given(tiny_tiered_instances(max_tables=3))
@example(THREE_TINY_TABLES)
def test_a_regrouped_device_pair_is_the_best_layout_of_its_tables(instance):
    """Every table table-wise on one of the two devices, in any of its single-piece options: none of the
    layouts that fit every memory tier has a lighter busiest device than the group's."""
    candidates = Candidates.build(instance, get_oracle("analytic"))
    single = [o for o in range(candidates.live.size) if candidates.live[o]
              and candidates.placement(o) == "free" and candidates.options.options[o].parts == 1]
    chosen = np.array([next((o for o in single if candidates.options.options[o].table == t), -1)
                       for t in range(instance.num_tables)])
    assume((chosen >= 0).all())
    pools = movable(candidates, chosen)
    tables = sorted(pools)
    assembly = Assembly(candidates)
    capacity = assembly.free.copy()
    tiers = list(candidates.binding_tiers)
    best = np.inf
    for layout in itertools.product(*[[(int(o), d) for o in pools[t] for d in (0, 1)] for t in tables]):
        load, used = np.zeros(2), np.zeros_like(capacity)
        for o, d in layout:
            load[d] += candidates.work[o]
            used[d] += candidates.storage[candidates.members(o)[0]]
        if (used[:, tiers] <= capacity[:, tiers]).all():
            best = min(best, float(load.max()))
    found = regroup(assembly, [0, 1], tables, pools, 10.0)
    if best == np.inf:
        assert found is None
        return
    assert found is not None and found.peak == pytest.approx(best, rel=1e-4, abs=1e-12)
    for o, d in found.layout.values():
        assembly.put(o, np.array([d]))
    assert (assembly.free[:, tiers] >= 0).all()
    assert float(assembly.costs().max()) == pytest.approx(found.peak, rel=1e-6, abs=1e-12)


@examples(20)
@given(tiny_tiered_instances(max_tables=3))
@example(THREE_TINY_TABLES)
def test_pair_balance_plans_are_valid_never_below_the_optimum_and_the_same_for_any_seed(instance):
    oracle = get_oracle("analytic")
    optimum = brute_force_over_options(instance, oracle)
    first, second = (run_solver("pair-balance", instance, oracle, QUICK, seed) for seed in (0, 1))
    if optimum is None:
        assert not first.has_plan
        return
    if not first.has_plan:  # a heuristic dead end, with evidence run_solver checked
        assert first.status == Status.NO_PLAN and first.reason
        return
    if first.status == Status.OPTIMAL:  # run_solver's bound met the plan
        assert first.objective == pytest.approx(optimum, rel=OPTIMALITY_TOLERANCE, abs=1e-12)
    assert (first.plan.storage_per_device(instance) <= instance.topology.capacity.as_array()).all()
    assert optimum <= first.objective * (1 + 1e-9)
    assert first.objective <= first.stats["start_objective"] * (1 + 1e-12)
    assert first.plan == second.plan and first.objective == second.objective


def test_pair_balance_runs_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "instance.json"
    save_instance(THREE_TINY_TABLES, path)
    out = tmp_path / "plan.json"
    assert main(["solve", str(path), "--solver", "pair-balance", "--oracle", "analytic", "--budget", "2",
                 "--output", str(out)]) == 0
    assert "pair-balance" in capsys.readouterr().out
    assert out.exists()
