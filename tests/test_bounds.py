"""The packing bound (solvers.bounds.packing_bound) and the packing heuristic (solvers.packing): the bound
never exceeds the brute-force optimum over the enumerated options, split and tiered instances included,
and never falls below the combinatorial bounds it starts from; packed plans stay under their target."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import examples, make_table
from hypothesis import given
from hypothesis import strategies as st
from test_sharding import brute_force_over_options, tiny_split_instances
from test_tiers import tiny_tiered_instances

from costmodels import get_oracle
from instances import Instance, Topology, Workload
from instances.io import load_instance
from solvers import Candidates, lp_bound, option_bounds
from solvers.bounds import integral_bound, packing_bound
from solvers.packing import FITS, pack, packed
from solvers.choice import option_weight


@examples(25)
@given(tiny_split_instances(), st.sampled_from(["lookup", "analytic", "size-lookup"]))
def test_packing_bound_is_below_the_optimum_over_split_options(instance, oracle_name):
    oracle = get_oracle(oracle_name)
    candidates = Candidates.build(instance, oracle)
    bounds = option_bounds(candidates)
    optimum = brute_force_over_options(instance, oracle)
    if not bounds:  # some table has no option that fits a device: no plan, nothing to bound
        assert optimum is None
        return
    if optimum is not None:
        assert bounds["packing"] <= optimum * (1 + 1e-9) + 1e-15
    assert bounds["packing"] >= max(bounds["average"], bounds["pigeonhole"])


@examples(15)
@given(tiny_tiered_instances(), st.sampled_from(["analytic", "torchrec"]))
def test_packing_bound_is_below_the_optimum_with_host_memory(instance, oracle_name):
    oracle = get_oracle(oracle_name)
    candidates = Candidates.build(instance, oracle)
    bounds = option_bounds(candidates)
    optimum = brute_force_over_options(instance, oracle)
    if not bounds:  # some table has no option that fits a device: no plan, nothing to bound
        assert optimum is None
        return
    if optimum is not None:
        assert bounds["packing"] <= optimum * (1 + 1e-9) + 1e-15
    assert bounds["packing"] >= max(bounds["average"], bounds["pigeonhole"])


def _two_tables() -> Instance:
    # Splitting the large table costs more work than its whole piece leaves room for: below the whole
    # table's cost only its column-wise option remains, which the LP (and the average) mix fractionally.
    tables = (make_table("big", 37, 8, 2.362104543017174), make_table("small", 1, 8, 1.8717370608519945))
    total = sum(t.weight_bytes for t in tables)
    return Instance("two", tables, Topology(1, 2, 3 * total), Workload(batch_size=16)).validate()


def test_packing_bound_reaches_the_optimum_where_the_lp_does_not():
    instance, oracle = _two_tables(), get_oracle("analytic")
    candidates = Candidates.build(instance, oracle)
    optimum = brute_force_over_options(instance, oracle)
    bound = option_bounds(candidates)["packing"]
    assert lp_bound(candidates) < optimum * (1 - 0.04)
    assert bound == pytest.approx(optimum, rel=1e-8)
    assert bound <= optimum


def test_packing_bound_weighs_memory_against_cost_as_the_oracle_prices_it():
    # TorchRec's estimator prices a table moved to host memory so dearly that only a weight on cost far
    # from 0.5 proves what the LP proves: with 0.5 alone the bound stayed at half the LP's.
    path = Path(__file__).parents[1] / "instances/sets/tiers-n80-k8-hbm0.5/autoshard-n80-k8-s0-test-090.json"
    candidates = Candidates.build(load_instance(path), get_oracle("torchrec"))
    low = max(option_bounds(candidates)["average"], option_bounds(candidates)["pigeonhole"])
    lp = lp_bound(candidates)
    assert packing_bound(candidates, low, mixes=(0.5,)) < 0.6 * lp
    assert option_bounds(candidates)["packing"] > 0.99 * lp


def test_packing_bound_keeps_a_bound_it_cannot_improve():
    instance, oracle = _two_tables(), get_oracle("analytic")
    candidates = Candidates.build(instance, oracle)
    optimum = brute_force_over_options(instance, oracle)
    assert packing_bound(candidates, optimum * 0.999) >= optimum * 0.999
    assert packing_bound(candidates, 0.0) == 0.0


@examples(25)
@given(tiny_split_instances(), st.sampled_from(["lookup", "analytic"]), st.floats(0.5, 2.0))
def test_packed_plans_stay_under_their_target_and_fit(instance, oracle_name, share):
    oracle = get_oracle(oracle_name)
    candidates = Candidates.build(instance, oracle)
    if any(ids.size == 0 for ids in candidates.by_table):
        return
    weight = option_weight(candidates)
    target = share * option_bounds(candidates)["packing"]
    for fit in FITS:
        assembly = pack(candidates, target, weight, fit)
        if assembly is None:
            continue
        plan = assembly.plan()
        plan.validate(instance)
        assert oracle.plan_cost(instance, plan) <= target * (1 + 1e-9)
    best = packed(candidates, option_bounds(candidates)["packing"], None, weight)
    optimum = brute_force_over_options(instance, oracle)
    if best is not None:
        best.plan().validate(instance)
        assert optimum is not None and optimum <= best.objective() * (1 + 1e-9)


def test_packing_keeps_large_tables_whole_where_balancing_splits_them():
    # Three tables of 3 units and three of 1 on 3 devices: best-fit puts a large and a small table on
    # each device (4 units) without splitting anything.
    tables = tuple(make_table(f"l{i}", 30, 8, 3.0) for i in range(3)) + \
        tuple(make_table(f"s{i}", 10, 8, 1.0) for i in range(3))
    instance = Instance("mix", tables, Topology(1, 3, 10**9), Workload(batch_size=16),
                        sharding_types=("table_wise", "column_wise")).validate()
    oracle = get_oracle("lookup")
    candidates = Candidates.build(instance, oracle)
    whole = np.array([oracle.table_costs(instance)[t] for t in range(6)])
    best = packed(candidates, option_bounds(candidates)["packing"], None, option_weight(candidates))
    assert best is not None
    assert best.objective() == pytest.approx(whole.sum() / 3, rel=1e-9)


def test_the_bound_with_whole_options_reaches_the_optimum_where_the_lp_mixes_them():
    # The LP mixes the large table's whole piece with its column-wise cut; chosen whole, one or the other.
    instance, oracle = _two_tables(), get_oracle("analytic")
    candidates = Candidates.build(instance, oracle)
    optimum = brute_force_over_options(instance, oracle)
    assert lp_bound(candidates) < optimum * (1 - 0.04)
    assert integral_bound(candidates, 10.0) == pytest.approx(optimum, rel=1e-4)
    assert integral_bound(candidates, 10.0) <= optimum


@examples(25)
@given(st.one_of(tiny_split_instances(), tiny_tiered_instances(max_tables=3)),
       st.sampled_from(["lookup", "analytic", "torchrec"]))
def test_the_bound_with_whole_options_lies_between_the_lp_and_the_optimum(instance, oracle_name):
    oracle = get_oracle(oracle_name)
    candidates = Candidates.build(instance, oracle)
    optimum = brute_force_over_options(instance, oracle)
    whole = integral_bound(candidates, 10.0)
    if optimum is None:  # the model leaves out how pieces pack on devices: it may still find a choice
        return
    assert whole is not None and whole <= optimum * (1 + 1e-9)
    assert whole >= lp_bound(candidates) * (1 - 2e-6)
