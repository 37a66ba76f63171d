"""run_solver verifies every claim a solver makes, and the exact solvers' edge cases: zero and tiny
costs, byte counts near int64, proven infeasibility, a MILP plan over memory by its tolerance, and an
early stop when the heuristic start is already optimal."""
import math

import pytest
from conftest import make_instance, make_table

from costmodels import get_oracle
from instances import Instance, InstanceError, Topology, Workload, instance_to_dict
from instances.model import instance_from_dict
from solvers import (
    Budget,
    BudgetError,
    Cause,
    ClaimError,
    SolveResult,
    Status,
    run_solver,
)
from solvers.base import _REGISTRY, NoPlan, planned, register

LOOKUP = get_oracle("lookup")
BUDGET = Budget(5.0)


@pytest.fixture
def plugins():
    """Solvers that claim what their plan does not support."""
    def round_robin_claiming_optimal(problem, budget, seed):
        instance = problem.instance
        return planned(instance, [t % instance.num_devices for t in range(instance.num_tables)], Status.OPTIMAL)

    def claims_infeasible(problem, budget, seed):
        return SolveResult(Status.INFEASIBLE, reason="trust me")

    def nan_bound(problem, budget, seed):
        return planned(problem.instance, (0,) * problem.instance.num_tables, lower_bound=math.nan)

    def quick_timeout(problem, budget, seed):
        return SolveResult(Status.NO_PLAN, reason="ran out of time", no_plan=NoPlan(Cause.TIME_LIMIT))

    def false_dead_end(problem, budget, seed):
        return SolveResult(Status.NO_PLAN, reason="stuck", no_plan=NoPlan(Cause.DEAD_END, table=0, need=1, most_free=5))

    fns = {"t-optimal": round_robin_claiming_optimal, "t-infeasible": claims_infeasible, "t-nan": nan_bound,
           "t-timeout": quick_timeout, "t-dead-end": false_dead_end}
    for name, fn in fns.items():
        register(name, "claims too much on purpose")(fn)
    yield fns
    for name in fns:
        _REGISTRY.pop(name)


def test_claims_are_verified_in_one_place(plugins):
    instance = make_instance([(10, 8, p) for p in (9, 1, 1, 1)], 2, 10**6)
    optimal = run_solver("t-optimal", instance, LOOKUP, BUDGET)
    assert optimal.status == Status.FEASIBLE and "claimed optimal without a bound" in optimal.reason
    assert optimal.lower_bound == pytest.approx(72.0)  # the combinatorial bound comes with every plan
    infeasible = run_solver("t-infeasible", instance, LOOKUP, BUDGET)
    assert infeasible.status == Status.NO_PLAN and infeasible.no_plan.cause == Cause.UNPROVEN
    nan = run_solver("t-nan", instance, LOOKUP, BUDGET)
    assert nan.status == Status.FEASIBLE and math.isfinite(nan.lower_bound) and "dropped_bound" in nan.stats
    for name in ("t-timeout", "t-dead-end"):
        with pytest.raises(ClaimError):
            run_solver(name, instance, LOOKUP, BUDGET)


def test_budgets_and_seeds_are_checked():
    for limit in (0, -1, math.nan, math.inf, True):
        with pytest.raises(BudgetError):
            Budget(limit)
    instance = make_instance([(10, 8, 1.0)], 1, 10**6)
    for seed in (-1, 2**40, 1.5):
        with pytest.raises(BudgetError):
            run_solver("lpt", instance, LOOKUP, BUDGET, seed)


def _instance(sizes, devices, capacity, pooling=0.0, dtype_bytes=1, dim=1):
    tables = tuple(make_table(f"t{i}", size, dim, pooling, dtype_bytes=dtype_bytes) for i, size in enumerate(sizes))
    return Instance("i", tables, Topology(1, devices, capacity), Workload(), sharding_types=("table_wise",)).validate()


@pytest.mark.parametrize("name", ["cpsat", "milp-cbc", "milp-highs"])
def test_exact_solvers_find_a_plan_when_every_cost_is_zero_and_greedy_dead_ends(name):
    instance = _instance([5, 4, 3, 3, 3, 2], 2, 10)  # only {5,3,2} / {4,3,3} fits
    assert run_solver("best-greedy", instance, LOOKUP, BUDGET).status == Status.NO_PLAN
    result = run_solver(name, instance, LOOKUP, BUDGET)
    assert result.status == Status.OPTIMAL and result.objective == 0.0


@pytest.mark.parametrize("name", ["cpsat", "milp-cbc", "milp-highs"])
def test_exact_solvers_handle_tiny_costs(name):
    instance = _instance([1, 2, 3], 2, 100, pooling=1e-300)
    result = run_solver(name, instance, LOOKUP, BUDGET)
    assert result.status == Status.OPTIMAL and result.objective == pytest.approx(3e-300, rel=1e-6)


def test_byte_counts_near_int64_stay_exact():
    big = 2**56  # the largest capacity an instance may name; four tables of half of it
    instance = _instance([2**38] * 4, 2, big, pooling=1.0, dtype_bytes=4, dim=2**15)
    assert instance.table_storage()[:, 0].sum() == 2 * big
    result = run_solver("cpsat", instance, LOOKUP, BUDGET)
    assert result.status == Status.OPTIMAL
    assert sorted(result.plan.assignment) == [0, 0, 1, 1]
    data = instance_to_dict(instance)
    data["tables"][0]["rows"] = 2**61
    with pytest.raises(InstanceError) as caught:
        instance_from_dict(data)
    assert caught.value.field == "tables[0].rows"


@pytest.mark.parametrize("name", ["cpsat", "milp-cbc", "milp-highs"])
def test_a_proven_infeasibility_is_reported_as_such(name):
    instance = _instance([6, 6, 6], 2, 10)  # fits in total, but no two tables share a device
    assert run_solver(name, instance, LOOKUP, BUDGET).status == Status.INFEASIBLE


def test_a_milp_plan_over_memory_by_its_tolerance_is_not_reported_and_not_blamed_on_time():
    # Any two of these tables overflow a device by exactly one byte: HiGHS's tolerance accepts that.
    instance = _instance([5_000_000] * 3, 2, 9_999_999, pooling=1.0)
    result = run_solver("milp-highs", instance, LOOKUP, BUDGET)
    assert not result.has_plan and result.status in (Status.NO_PLAN, Status.INFEASIBLE)
    if result.status == Status.NO_PLAN:
        assert result.no_plan.cause == Cause.OVERFLOW and "time" not in result.reason


@pytest.mark.parametrize("name", ["cpsat", "milp-highs"])
def test_exact_solvers_stop_when_the_start_meets_the_bound(name):
    # One table is heavier than all others together: LPT is optimal and the max-table bound proves it.
    instance = make_instance([(10, 8, 100.0)] + [(10, 8, 1.0)] * 40, 8, 10**6)
    result = run_solver(name, instance, LOOKUP, Budget(30.0))
    assert result.status == Status.OPTIMAL and "meets the lower bound" in result.stats["note"]
