import dataclasses

import pytest
from conftest import brute_force_optimum, examples, make_instance, small_instances
from hypothesis import given
from hypothesis import strategies as st
from test_costmodels import SquareRootOracle

from costmodels import get_oracle
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from solvers import (
    Budget,
    Candidates,
    Problem,
    SolverOracleMismatch,
    Status,
    best_additive_lower_bound,
    get_solver,
    lp_bound,
    run_solver,
)
from solvers.base import OPTIMALITY_TOLERANCE
from solvers.greedy import best_greedy

EXACT = ["cpsat", "milp-cbc", "milp-highs"]
QUICK = Budget(10.0, max_rounds=20)


@examples(25)
@given(small_instances(max_tables=7, max_devices=3), st.sampled_from(["lookup", "size-lookup"]))
def test_exact_solvers_find_the_brute_force_optimum(instance, oracle_name):
    oracle = get_oracle(oracle_name)
    optimum = brute_force_optimum(instance, oracle.table_costs(instance))
    heuristics = [run_solver(n, instance, oracle, QUICK, 0) for n in ("lpt", "best-greedy", "local-search")]
    for name in EXACT:
        result = run_solver(name, instance, oracle, QUICK, 0)
        if optimum is None:
            assert result.status in (Status.INFEASIBLE, Status.NO_PLAN)
            continue
        assert result.status == Status.OPTIMAL, (name, result)
        assert result.objective == pytest.approx(optimum, rel=OPTIMALITY_TOLERANCE, abs=1e-9)
        assert result.lower_bound <= result.objective * (1 + 1e-12)
        for h in heuristics:
            if h.has_plan:
                assert result.objective <= h.objective * (1 + 1e-9)


@pytest.fixture(scope="module")
def medium_instance():
    task = sample_tasks(TaskSpec("autoshard", 200, count=1, num_devices=16, memory=MemorySpec(tightness=1.1)))[0]
    return dataclasses.replace(task, sharding_types=("table_wise",))


@pytest.mark.parametrize("name", EXACT)
def test_time_limited_exact_run_is_feasible_with_a_bound(name, medium_instance):
    oracle = get_oracle("lookup")
    result = run_solver(name, medium_instance, oracle, Budget(1.0), 0)
    assert result.status == Status.FEASIBLE  # 200 real-valued costs on 16 devices are not proved in a second
    assert 0 < result.lower_bound <= result.objective
    assert result.lower_bound >= best_additive_lower_bound(oracle.table_costs(medium_instance), 16) * (1 - 1e-9)
    assert result.stats["certified_gap"] > 0


def test_cpsat_states_its_rounding_error(medium_instance):
    result = run_solver("cpsat", medium_instance, get_oracle("lookup"), Budget(1.0), 0)
    error = result.stats["rounding_error_bound"]
    assert 0 <= error <= 0.5 * medium_instance.num_tables / result.stats["scale"]


@examples(30)
@given(small_instances(max_tables=10, max_devices=4), st.sampled_from(["size", "lookup", "size-lookup"]))
def test_every_bound_is_below_every_objective(instance, oracle_name):
    oracle = get_oracle(oracle_name)
    costs = oracle.table_costs(instance)
    combinatorial = best_additive_lower_bound(costs, instance.num_devices)
    lp = lp_bound(Candidates.build(instance, oracle))
    for name in ["lpt", "best-greedy", "oracle-greedy", "local-search", "random-search", *EXACT]:
        result = run_solver(name, instance, oracle, QUICK, 0)
        if not result.has_plan:
            continue
        assert combinatorial <= result.objective * (1 + 1e-9)
        assert lp is not None and lp <= result.objective * (1 + 1e-9)
        if result.lower_bound is not None:
            assert result.lower_bound <= result.objective * (1 + 1e-9)


def test_lp_relaxation_is_none_only_without_room():
    oracle = get_oracle("lookup")
    roomy = make_instance([(1, 1, 3.0), (1, 1, 2.0), (1, 1, 1.0)], 2, 4)
    assert lp_bound(Candidates.build(roomy, oracle)) == pytest.approx(3.0, rel=1e-6)
    cramped = make_instance([(3, 1, 3.0), (3, 1, 2.0), (3, 1, 1.0)], 3, 4)  # 6 B per table, 4 B per device
    assert lp_bound(Candidates.build(cramped, oracle)) is None


@examples(30)
@given(small_instances(max_tables=12, max_devices=4), st.integers(0, 5))
def test_local_search_never_worsens_its_start_nor_breaks_memory(instance, seed):
    oracle = get_oracle("lookup")
    start = best_greedy(Problem(instance, oracle))
    result = run_solver("local-search", instance, oracle, QUICK, seed)
    if start.plan is None:
        assert not result.has_plan
        return
    assert result.objective <= oracle.plan_cost(instance, start.plan) * (1 + 1e-12)
    assert (result.plan.storage_per_device(instance) <= instance.topology.capacity.as_array()).all()


def test_local_search_and_oracle_greedy_run_on_a_non_additive_oracle():
    instance = make_instance([(10, 8, p) for p in (9, 7, 5, 4, 3, 2, 1, 1)], 3, 10**6)
    oracle = SquareRootOracle()
    greedy = run_solver("oracle-greedy", instance, oracle, QUICK, 0)
    searched = run_solver("local-search", instance, oracle, QUICK, 0)
    assert greedy.status == searched.status == Status.FEASIBLE
    assert searched.objective <= greedy.objective + 1e-12
    with pytest.raises(SolverOracleMismatch):
        run_solver("cpsat", instance, oracle, QUICK, 0)


def test_local_search_improves_a_real_task():
    instance = sample_tasks(TaskSpec("autoshard", 80, count=1, memory=MemorySpec(tightness=1.1)))[0]
    oracle = get_oracle("lookup")
    start = oracle.plan_cost(instance, best_greedy(Problem(instance, oracle)).plan)
    result = run_solver("local-search", instance, oracle, Budget(60.0, max_rounds=50), 0)
    assert result.objective < start
    assert result.stats["steps"] > 0


def test_random_search_is_best_of_its_samples():
    instance = make_instance([(10, 8, p) for p in range(1, 13)], 3, 10**6)
    oracle = get_oracle("lookup")
    one = run_solver("random-search", instance, oracle, Budget(10.0, max_rounds=1), 3)
    many = run_solver("random-search", instance, oracle, Budget(10.0, max_rounds=200), 3)
    assert one.stats["samples"] == 1 and many.stats["samples"] == 200
    assert many.objective <= one.objective
    assert get_solver("random-search").stochastic
