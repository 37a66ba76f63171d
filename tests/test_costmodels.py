import math

import numpy as np
import pytest
from conftest import examples, make_instance, small_instances
from hypothesis import given
from hypothesis import strategies as st

from costmodels import UnknownOracleError, get_oracle, heuristic_costs, oracle_names
from costmodels.base import DeviceCost, Oracle, RecomputingDeviceState
from instances import Plan


def test_heuristic_costs_follow_their_definitions():
    instance = make_instance([(1000, 16, 2.5), (100, 32, 0.25)], 2, 10**9)
    assert list(heuristic_costs(instance, "size")) == [16000.0, 3200.0]
    assert list(heuristic_costs(instance, "dim")) == [16.0, 32.0]
    assert list(heuristic_costs(instance, "lookup")) == [40.0, 8.0]  # sub-1 pooling is not truncated to 0
    assert list(heuristic_costs(instance, "size-lookup")) == pytest.approx([40.0 * 3, 8.0 * 2])


def test_unknown_oracle_lists_the_known_ones():
    with pytest.raises(UnknownOracleError, match="lookup"):
        get_oracle("nope")
    assert {"size", "dim", "lookup", "size-lookup"} <= set(oracle_names())


@examples(30)
@given(small_instances(tight=False), st.sampled_from(["size", "dim", "lookup", "size-lookup"]), st.data())
def test_additive_state_and_breakdown_agree(instance, name, data):
    oracle = get_oracle(name)
    assignment = data.draw(st.lists(st.integers(0, instance.num_devices - 1), min_size=instance.num_tables,
                                    max_size=instance.num_tables))
    state = oracle.new_state(instance)
    for t, d in enumerate(assignment):
        state.add(t, d)
    plan = Plan.table_wise(instance, assignment)
    totals = [c.total for c in oracle.device_costs(instance, plan)]
    assert state.costs() == pytest.approx(totals)
    assert oracle.plan_cost(instance, plan) == pytest.approx(max(totals))
    costs = oracle.table_costs(instance)
    assert sum(totals) == pytest.approx(costs.sum())
    state.remove(0, assignment[0])
    assert state.cost(assignment[0]) == pytest.approx(totals[assignment[0]] - costs[0])


class SquareRootOracle(Oracle):
    """A non-additive oracle (fusion-like: sublinear in the device's lookup work) for protocol tests."""
    name = "sqrt-lookup"

    def price_device(self, instance, pieces, members):
        pooling = np.array([t.pooling_factor for t in instance.tables])[pieces.table]
        work = (pieces.width * pooling * pieces.lookup_share(instance))[list(members)].sum()
        return DeviceCost(total=math.sqrt(work))


def test_recomputing_state_tracks_a_non_additive_oracle():
    instance = make_instance([(10, 4, 1.0), (10, 4, 3.0), (10, 4, 5.0)], 2, 10**6)
    oracle = SquareRootOracle()
    state = oracle.new_state(instance)
    assert isinstance(state, RecomputingDeviceState)
    state.add(0, 0)
    state.add(1, 0)
    assert state.cost(0) == pytest.approx(math.sqrt(16.0))
    assert state.cost_if_added(2, 0) == pytest.approx(math.sqrt(36.0))
    assert state.cost(0) == pytest.approx(4.0)  # asking does not place
    state.remove(0, 0)
    assert state.cost(0) == pytest.approx(math.sqrt(12.0))
    assert list(state.costs_if_added(2, np.array([0, 1]))) == pytest.approx([math.sqrt(32.0), math.sqrt(20.0)])
    with pytest.raises(TypeError, match="not additive"):
        oracle.table_costs(instance)
