"""The tiers benchmark's rivals: TorchRec's planner offered its host kernels where devices have host
memory, TorchRec's offload proposer sizing caches from our curves, and our one-global-load-factor
baseline; each plan reads back and validates on both tiers."""
import dataclasses

import pytest
from conftest import make_table

from costmodels import get_oracle
from instances import Instance, Topology, Workload
from instances.kernels import FUSED_UVM_CACHING, HOST_KERNELS
from solvers import Budget, Status, run_solver

KIB = 2**10


def _tight(hbm: int = 60 * KIB) -> Instance:
    """Three tables (192 KiB) on two devices whose HBM holds less than all of them; host memory plentiful."""
    tables = tuple(make_table(f"t{i}", 1000 * (i + 1), 16, 4.0 + i) for i in range(3))
    return Instance("tight", tables, Topology(1, 2, hbm, host_memory_bytes=2**30), Workload(batch_size=64),
                    sharding_types=("table_wise", "row_wise")).validate()


def _stored_within_both_tiers(instance, plan):
    return (plan.storage_per_device(instance) <= instance.topology.capacity.as_array()).all()


def test_torchrec_is_offered_its_host_kernels_and_host_memory_where_devices_have_it():
    from interop.common import torchrec_constraints, torchrec_topology

    instance = _tight()
    assert all(set(HOST_KERNELS) <= set(c.compute_kernels) for c in torchrec_constraints(instance).values())
    assert {d.storage.ddr for d in torchrec_topology(instance).devices} == {2**30}
    no_host = dataclasses.replace(instance, topology=dataclasses.replace(instance.topology, host_memory_bytes=0,
                                                                        memory_bytes=2**30))
    assert not any(set(HOST_KERNELS) & set(c.compute_kernels) for c in torchrec_constraints(no_host).values())


@pytest.mark.parametrize("peer", ["torchrec-planner", "torchrec-offload"])
def test_torchrecs_plans_of_a_model_larger_than_hbm_read_back_and_validate(peer):
    instance = _tight()
    result = run_solver(peer, instance, get_oracle("torchrec"), Budget(5.0))
    assert result.status == Status.FEASIBLE, result.reason
    plan = result.plan.validate(instance)
    assert _stored_within_both_tiers(instance, plan)
    assert any(t.compute_kernel in HOST_KERNELS for t in plan.tables)


def test_the_offload_proposer_caches_every_table_it_may_and_grows_caches_from_its_start():
    from interop.peer import OFFLOAD_START_LOAD_FACTOR, offload_constraints

    instance = _tight()
    constraints = offload_constraints(instance)
    assert all(c.compute_kernels == [FUSED_UVM_CACHING] and c.cache_params.stats is not None
               for c in constraints.values())
    stats = constraints["t0"].cache_params.stats
    assert stats.expected_miss_rate(1.0) == pytest.approx(0.0) and stats.expected_miss_rate(0.0) == pytest.approx(1.0)
    plan = run_solver("torchrec-offload", instance, get_oracle("torchrec"), Budget(5.0)).plan
    assert all(t.cache_load_factor >= OFFLOAD_START_LOAD_FACTOR - 1e-9 for t in plan.tables
               if t.compute_kernel == FUSED_UVM_CACHING)


def test_the_global_load_factor_baseline_caches_at_one_load_factor_and_keeps_a_tables_own():
    instance = _tight(40 * KIB)
    fixed = dataclasses.replace(instance, tables=(dataclasses.replace(instance.tables[0], cache_load_factor=0.5),
                                                  *instance.tables[1:])).validate()
    for case, first in ((instance, 0.2), (fixed, 0.5)):
        result = run_solver("global-lf", case, get_oracle("analytic"), Budget(1.0), seed=0)
        assert result.status == Status.FEASIBLE, result.reason
        plan = result.plan.validate(case)
        assert _stored_within_both_tiers(case, plan)
        assert any(t.compute_kernel in HOST_KERNELS for t in plan.tables)
        for i, sharding in enumerate(plan.tables):
            if sharding.compute_kernel == FUSED_UVM_CACHING:
                assert sharding.cache_load_factor == (first if i == 0 else 0.2)


def test_a_plan_off_the_enumerated_options_is_neither_bounded_nor_called_optimal_by_their_bound():
    # TorchRec's offload proposer sizes caches off our grid (0.328, say): such a plan is priced as it is, but
    # the bound over our options says nothing about it — none is reported for it, none clamped to it, and it
    # is never called optimal by it.
    from instances import Plan, Shard, TableSharding
    from solvers.base import _REGISTRY, SolveResult, register

    instance = _tight(hbm=2**30)

    def off_grid(problem, budget, seed):
        tables = tuple(TableSharding("table_wise", (Shard(i % 2, (0, t.rows), (0, t.dim)),), FUSED_UVM_CACHING, 0.328)
                       for i, t in enumerate(problem.instance.tables))
        return SolveResult(Status.FEASIBLE, plan=Plan(problem.instance.id, tables))

    register("off-grid", "caches at 0.328", splits=True, peer=True)(off_grid)
    try:
        result = run_solver("off-grid", instance, get_oracle("torchrec"), Budget(5.0), 0)
    finally:
        del _REGISTRY["off-grid"]
    assert result.status == Status.FEASIBLE and result.lower_bound is None
    assert "cache of 0.328" in result.stats["outside_options"]
    on_grid = run_solver("split-greedy", instance, get_oracle("torchrec"), Budget(5.0), 0)
    assert "outside_options" not in on_grid.stats and on_grid.lower_bound is not None
