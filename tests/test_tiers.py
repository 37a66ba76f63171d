"""Memory tiers: what each kernel stores where, the options they add, plans that carry their kernels
(schema 3) and are validated on both tiers, exact optima over the enlarged option set against brute force,
oracles that price tiers and the ones that refuse them, and the command line end to end."""
import dataclasses
import itertools
import json
import time

import numpy as np
import pytest
from conftest import examples, make_table
from hypothesis import assume, example, given
from hypothesis import strategies as st
from test_sharding import QUICK, brute_force_over_options

from costmodels import get_oracle
from instances import (
    Instance,
    Plan,
    PlanError,
    Shard,
    TableSharding,
    Topology,
    Workload,
    load_instances,
    load_plan,
    save_instance,
)
from instances.kernels import DENSE, FUSED, FUSED_UVM, FUSED_UVM_CACHING, KERNEL_CODE, kernel_problem
from instances.memory import CACHE_MAP_BYTES_PER_ROW, CACHE_STATE_BYTES_PER_SLOT, HBM, storage
from instances.options import enumerate_options
from instances.sharding import compact, expand, plan_from_dict, plan_to_dict
from shardbench.cli import main
from solvers import Candidates, SolverOracleMismatch, Status, lp_bound, option_bounds, run_solver
from solvers.choice import MEMORY_SHARES, choose_options, knapsack_centre, summed_knapsack, summed_relaxation
from solvers.base import OPTIMALITY_TOLERANCE, Budget
from solvers.candidates import Problem
from solvers.choice import option_weight
from solvers.exact_model import (
    HULL_NEIGHBOURS,
    ExactStart,
    centre_of,
    _leaner,
    completed,
    core_of,
    core_tables,
    exact_start,
    neighbourhoods,
)

GIB = 2**30


def _tiered(hbm: int, host: int, types=("table_wise", "row_wise"), n: int = 3, per_node: int = 2) -> Instance:
    tables = tuple(make_table(f"t{i}", 1000 * (i + 1), 16, 4.0 + i) for i in range(n))
    return Instance("tiered", tables, Topology(1, per_node, hbm, host_memory_bytes=host), Workload(batch_size=64),
                    sharding_types=types).validate()


def test_each_kernel_stores_its_bytes_in_its_tier():
    rows, width, dtype = 1000, 16, 2
    weights = rows * width * dtype
    kernels = [KERNEL_CODE[k] for k in (FUSED, FUSED_UVM, FUSED_UVM_CACHING, DENSE)]
    got = storage([rows] * 4, [width] * 4, [dtype] * 4, "sgd", kernels, [0.0, 0.0, 0.25, 0.0])
    cache = 250 * (width * dtype + CACHE_STATE_BYTES_PER_SLOT) + rows * CACHE_MAP_BYTES_PER_ROW
    assert got.tolist() == [[weights, 0], [0, weights], [cache, weights], [weights, 0]]
    # The optimizer's state stays with the table's rows, in host memory for the host kernels.
    adam = storage([rows], [width], [dtype], "adam", [KERNEL_CODE[FUSED_UVM_CACHING]], [0.25])
    assert adam.tolist() == [[cache, weights + rows * width * 8]]


def test_host_kernels_are_options_only_where_devices_have_host_memory():
    without = _tiered(GIB, 0)
    assert {o.kernel for o in enumerate_options(without)} == {FUSED}
    assert not without.uses_host_memory
    with_host = _tiered(GIB, GIB, types=("table_wise", "data_parallel"))
    options = enumerate_options(with_host)
    assert {o.kernel for o in options if o.sharding_type == "table_wise"} == {FUSED, FUSED_UVM, FUSED_UVM_CACHING}
    assert {o.kernel for o in options if o.sharding_type == "data_parallel"} == {DENSE}
    cached = [o.load_factor for o in options if o.kernel == FUSED_UVM_CACHING and o.table == 0]
    assert cached and all(0 < f < 1 for f in cached) and len(set(cached)) == len(cached)
    assert with_host.restricted_to_kernels((FUSED, DENSE)).uses_host_memory is False


def test_kernel_rules_name_the_problem():
    assert kernel_problem("data_parallel", FUSED, None) and "dense" in kernel_problem("data_parallel", FUSED, None)
    assert "(0, 1]" in kernel_problem("table_wise", FUSED_UVM_CACHING, 1.5)
    assert "(0, 1]" in kernel_problem("table_wise", FUSED_UVM_CACHING, None)
    assert "belongs to" in kernel_problem("row_wise", FUSED, 0.5)
    assert kernel_problem("row_wise", FUSED_UVM_CACHING, 0.3) is None


def _plan(instance: Instance, kernel: str, load_factor: float | None) -> Plan:
    return Plan(instance.id, tuple(TableSharding("table_wise", (Shard(i % 2, (0, t.rows), (0, t.dim)),), kernel,
                                                 load_factor) for i, t in enumerate(instance.tables)))


def test_plans_carry_kernels_through_json_and_results_stores():
    instance = _tiered(GIB, GIB)
    plan = _plan(instance, FUSED_UVM_CACHING, 0.3).validate(instance)
    data = plan_to_dict(plan, instance)
    assert data["schema_version"] == 3
    assert data["tables"][0]["compute_kernel"] == FUSED_UVM_CACHING and data["tables"][0]["cache_load_factor"] == 0.3
    assert plan_from_dict(json.loads(json.dumps(data)), instance) == plan
    assert expand(compact(plan, instance), instance) == plan
    # A plan from before kernels reads as HBM, as it was priced.
    old = {**data, "schema_version": 2, "tables": [{k: v for k, v in t.items() if k not in ("compute_kernel",
                                                                                          "cache_load_factor")}
                                                   for t in data["tables"]]}
    assert all(t.compute_kernel == FUSED for t in plan_from_dict(old, instance).tables)


def test_validation_checks_kernels_and_both_tiers():
    instance = _tiered(GIB, GIB)
    bad_factor = dataclasses.replace(_plan(instance, FUSED_UVM_CACHING, 0.3).tables[0], cache_load_factor=0.0)
    with pytest.raises(PlanError, match="load factor"):
        Plan(instance.id, (bad_factor, *_plan(instance, FUSED, None).tables[1:])).validate(instance)
    no_host = _tiered(GIB, 0)
    with pytest.raises(PlanError, match="no host memory"):
        _plan(no_host, FUSED_UVM, None).validate(no_host)
    tight = _tiered(GIB, 40_000)  # host memory too small for two tables' 32-64 KB of weights on one device
    with pytest.raises(PlanError, match="host memory"):
        _plan(tight, FUSED_UVM, None).validate(tight)


@st.composite
def tiny_tiered_instances(draw, max_tables: int = 2):
    n = draw(st.integers(1, max_tables))
    tables = tuple(make_table(f"t{i}", draw(st.integers(4, 40)), 8, draw(st.floats(0.5, 20.0))) for i in range(n))
    need = sum(t.weight_bytes for t in tables)
    hbm = max(1, int(need * draw(st.floats(0.2, 1.5))))
    host = max(1, int(need * draw(st.floats(0.5, 2.0))))
    types = draw(st.sampled_from([("table_wise", "row_wise"), ("table_wise",)]))
    instance = Instance("tiny-tiered", tables, Topology(1, 2, hbm, host_memory_bytes=host), Workload(batch_size=16),
                        sharding_types=types)
    return instance.validate()


@examples(15)
@given(tiny_tiered_instances())
def test_exact_optimum_over_kernels_and_load_factors_matches_brute_force(instance):
    oracle = get_oracle("analytic")
    optimum = brute_force_over_options(instance, oracle)
    if optimum is None:
        assert not run_solver("cpsat", instance, oracle, QUICK, 0).has_plan
        return
    candidates = Candidates.build(instance, oracle)
    for bound in (*option_bounds(candidates).values(), lp_bound(candidates)):
        assert bound <= optimum * (1 + 1e-6) + 1e-12
    for name in ("cpsat", "milp-highs"):
        result = run_solver(name, instance, oracle, QUICK, 0)
        assert result.status == Status.OPTIMAL, (name, result.reason)
        assert result.objective == pytest.approx(optimum, rel=OPTIMALITY_TOLERANCE, abs=1e-12)
        assert (result.plan.storage_per_device(instance) <= instance.topology.capacity.as_array()).all()
    for name in ("split-greedy", "local-search", "best-greedy"):
        result = run_solver(name, instance, oracle, QUICK, 0)
        if result.has_plan:
            assert optimum <= result.objective * (1 + 1e-9)


@examples(25)
@given(tiny_tiered_instances(max_tables=3), st.sampled_from(MEMORY_SHARES))
def test_the_greedy_option_choice_is_the_best_over_all_choices_that_use_no_more_memory(instance, share):
    """Lagrangian optimality, against brute force: no choice of options (one per table) needs no more memory
    and less work than the greedy's; and the choice stays within its share of the spare memory."""
    candidates = Candidates.build(instance, get_oracle("analytic"))
    assume(all(ids.size for ids in candidates.by_table))
    weight = option_weight(candidates)
    memory = candidates.device_shares(candidates.total_storage)
    chosen = choose_options(candidates, np.inf, weight, share)
    assert all(o in ids for o, ids in zip(chosen, candidates.by_table))
    leanest = [min(ids, key=lambda o: (memory[o], weight[o])) for ids in candidates.by_table]
    spare = instance.num_devices - memory[leanest].sum()
    assert memory[chosen].sum() - memory[leanest].sum() <= max(share * spare, 0.0) + 1e-9
    used, work = memory[chosen].sum(), weight[chosen].sum()
    for combo in itertools.product(*candidates.by_table):
        if memory[list(combo)].sum() <= used + 1e-12:
            assert weight[list(combo)].sum() >= work * (1 - 1e-9) - 1e-15, combo


# Two devices, a hot table between two cold ones: where the floors once ended behind, and where CP-SAT runs
# a neighbourhood.
THREE_TINY_TABLES = Instance("tiny-tiered", tuple(make_table(f"t{i}", 4, 8, p) for i, p in enumerate((1.0, 6.0, 1.0))),
                             Topology(1, 2, 96, host_memory_bytes=192), Workload(batch_size=16),
                             sharding_types=("table_wise", "row_wise")).validate()


@examples(25)
@given(tiny_tiered_instances(max_tables=3))
@example(THREE_TINY_TABLES)
def test_split_greedy_is_no_worse_for_its_floors(instance):
    """Its floors (HBM only, TorchRec's default options) come first, yet it ends no worse than its plans over
    every option would alone, nor than its best floor: the best of each descends (a floor that starts ahead
    can end behind — it once did, on 2 of 30 tiered 80 × 8 tasks under TorchRec's estimator)."""
    from solvers import search

    candidates = Candidates.build(instance, get_oracle("analytic"))
    assume(all(ids.size for ids in candidates.by_table))
    found = search.split_greedy(candidates)
    weight = option_weight(candidates)
    best = {}
    for choice in search._choices(candidates, True, weight):
        plan = search._at_share(candidates, True, None, weight, choice)
        kind = choice.allowed is None
        if isinstance(plan, search.Assembly) and (kind not in best or plan.objective() < best[kind].objective()):
            best[kind] = plan
    for plan in best.values():
        search._descend_on_options(plan)
        assert found.objective() <= plan.objective() * (1 + 1e-12)


def test_tables_kept_whole_still_choose_their_kernel_and_load_factor():
    # 192 KB of tables on 2 devices of 40 KB HBM each: whole tables, so only kernels and caches make room.
    instance = dataclasses.replace(_tiered(GIB, 64 * GIB, types=("table_wise",)), topology=Topology(
        1, 2, 40_000, host_memory_bytes=64 * GIB)).validate()
    oracle = get_oracle("analytic")
    assert Problem(instance, oracle).chooses_options
    result = run_solver("cpsat", instance, oracle, QUICK, 0)
    assert result.stats["optimal_over"] == "enumerated options"
    optimum = brute_force_over_options(instance, oracle)
    assert result.status == Status.OPTIMAL and result.objective == pytest.approx(optimum, rel=OPTIMALITY_TOLERANCE)
    assert len({(t.compute_kernel, t.cache_load_factor) for t in result.plan.tables}) > 1
    searched = run_solver("local-search", instance, oracle, QUICK, 0)
    assert searched.objective == pytest.approx(optimum, rel=1e-9)


def test_a_model_larger_than_hbm_gets_a_plan_with_host_memory_and_a_reason_without():
    tables = tuple(make_table(f"t{i}", 20_000, 32, 2.0 + i) for i in range(6))
    need = sum(t.weight_bytes for t in tables)
    topology = Topology(1, 2, need // 4)
    without = Instance("big", tables, topology, Workload(batch_size=64)).validate()
    result = run_solver("cpsat", without, get_oracle("analytic"), QUICK, 0)
    assert result.status == Status.INFEASIBLE and "--host-memory-bytes" in result.reason
    tiered = dataclasses.replace(without, topology=dataclasses.replace(topology, host_memory_bytes=need))
    for name in ("split-greedy", "local-search", "cpsat", "milp-highs"):
        result = run_solver(name, tiered, get_oracle("analytic"), QUICK, 0)
        assert result.has_plan, (name, result.reason)
        assert set(result.plan.kernels()) & {FUSED_UVM, FUSED_UVM_CACHING}
        assert (result.plan.storage_per_device(tiered) <= tiered.topology.capacity.as_array()).all()


def test_oracles_that_do_not_price_tiers_refuse_them_in_one_line(tmp_path, capsys):
    instance = _tiered(GIB // 1024, GIB)
    with pytest.raises(SolverOracleMismatch, match="host memory"):
        run_solver("split-greedy", instance, get_oracle("lookup"), QUICK, 0)
    save_instance(instance, tmp_path / "i.json")
    for argv in (["solve", str(tmp_path / "i.json"), "--solver", "split-greedy", "--oracle", "lookup"],
                 ["plan", str(tmp_path / "i.json"), "--oracle", "dim", "-o", str(tmp_path / "p.json")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "host memory" in err[0], err
    assert not (tmp_path / "p.json").exists()
    # Held to HBM kernels, the same instance plans under any oracle.
    assert main(["solve", str(tmp_path / "i.json"), "--solver", "lpt", "--oracle", "lookup",
                 "--compute-kernels", "fused,dense"]) == 0


def test_the_command_line_samples_plans_and_writes_kernels(tmp_path, capsys):
    assert main(["instances", "sample", "--tables", "20", "--devices", "4", "--count", "1", "--tightness", "0.5",
                 "--host-memory-bytes", str(64 * GIB), "-o", str(tmp_path / "set")]) == 0
    instance_path = next((tmp_path / "set").glob("*-test-*.json"))
    assert main(["plan", str(instance_path), "--oracle", "analytic", "--budget", "2", "--solvers", "split-greedy",
                 "-o", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert "compute kernels:" in out and "cache load factors" in out or "fused_uvm" in out
    written = json.loads((tmp_path / "plan.json").read_text())
    assert {t["compute_kernel"] for t in written["tables"]} & {FUSED_UVM, FUSED_UVM_CACHING}
    from instances import load_instance

    instance = load_instance(instance_path)
    plan = load_plan(tmp_path / "plan.json", instance)
    assert (plan.storage_per_device(instance) <= instance.topology.capacity.as_array()).all()
    assert np.asarray(written["report"]["lower_bound"]) <= written["report"]["objective"] * (1 + 1e-9)


def test_an_exported_plan_carries_kernels_and_torchrec_rates_it_as_our_oracle_does():
    from interop.export import from_torchrec_plan, rate_with_torchrec, to_torchrec

    instance = _tiered(GIB, 4 * GIB, types=("table_wise", "row_wise", "table_row_wise"), per_node=2)
    t0, t1, t2 = instance.tables
    plan = Plan(instance.id, (
        TableSharding("table_wise", (Shard(1, (0, t0.rows), (0, t0.dim)),), FUSED_UVM),
        TableSharding("row_wise", (Shard(0, (0, 1000), (0, 16)), Shard(1, (1000, 2000), (0, 16))), FUSED_UVM_CACHING,
                      0.3),
        TableSharding("table_row_wise", (Shard(0, (0, 1500), (0, 16)), Shard(1, (1500, 3000), (0, 16))), FUSED,
                      None))).validate(instance)
    sharding_plan = to_torchrec(instance, plan)
    exported = sharding_plan.plan[""]
    assert [exported[t.name].compute_kernel for t in instance.tables] == [FUSED_UVM, FUSED_UVM_CACHING, FUSED]
    assert exported["t1"].cache_params.load_factor == 0.3 and exported["t0"].cache_params is None
    assert from_torchrec_plan(instance, sharding_plan) == plan
    ours = [c.total for c in get_oracle("torchrec").device_costs(instance, plan)]
    assert ours == pytest.approx(rate_with_torchrec(instance, sharding_plan), rel=1e-9)
    # TorchRec's estimator prices the host kernels apart from HBM: the same plan all in HBM costs less.
    fused = Plan(instance.id, tuple(dataclasses.replace(t, compute_kernel=FUSED, cache_load_factor=None)
                                    for t in plan.tables))
    assert get_oracle("torchrec").plan_cost(instance, fused) < max(ours)


def test_a_tiered_plan_loads_safely_and_reads_with_its_kernels_and_memory(tmp_path, capsys):
    """`load_plan` loads a plan with a cached table under torch's safe loading (its CacheParams allowed);
    the readable JSON and show-plan give each table's kernel and load factor and each device's HBM and
    host memory."""
    import shardbench
    from instances import save_plan

    instance = _tiered(GIB, 4 * GIB, types=("table_wise", "row_wise"), per_node=2)
    t0, t1, t2 = instance.tables
    plan = Plan(instance.id, (
        TableSharding("table_wise", (Shard(1, (0, t0.rows), (0, t0.dim)),), FUSED_UVM),
        TableSharding("row_wise", (Shard(0, (0, 1000), (0, 16)), Shard(1, (1000, 2000), (0, 16))), FUSED_UVM_CACHING,
                      0.3),
        TableSharding("table_wise", (Shard(0, (0, t2.rows), (0, t2.dim)),), FUSED))).validate(instance)
    save_instance(instance, tmp_path / "i.json")
    save_plan(plan, instance, tmp_path / "p.json")
    assert main(["export-torchrec", str(tmp_path / "p.json"), "--instance", str(tmp_path / "i.json"),
                 "-o", str(tmp_path / "p.pt")]) == 0
    loaded = shardbench.load_plan(tmp_path / "p.pt").plan[""]
    assert loaded["t1"].compute_kernel == FUSED_UVM_CACHING and loaded["t1"].cache_params.load_factor == 0.3
    readable = json.loads((tmp_path / "p.sharding.json").read_text())
    assert [(readable["tables"][t.name]["compute_kernel"], readable["tables"][t.name]["cache_load_factor"])
            for t in instance.tables] == [(FUSED_UVM, None), (FUSED_UVM_CACHING, 0.3), (FUSED, None)]
    used = plan.storage_per_device(instance)
    assert readable["devices"] == [{"rank": d, "hbm_bytes": int(used[d, 0]), "host_bytes": int(used[d, 1])}
                                   for d in range(2)]
    capsys.readouterr()
    assert main(["show-plan", str(tmp_path / "p.json"), "--instance", str(tmp_path / "i.json"),
                 "--oracle", "analytic"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "table t1: row_wise, fused_uvm_caching, load factor 0.3, on devices 0, 1" in lines
    assert "table t0: table_wise, fused_uvm, on device 1" in lines
    assert all("HBM " in line and "host memory " in line and "GiB" in line
               for line in lines if line.startswith("device "))


def test_a_fixed_cache_load_factor_is_the_only_one_offered():
    instance = _tiered(GIB, GIB)
    fixed = dataclasses.replace(instance, tables=(dataclasses.replace(instance.tables[0], cache_load_factor=0.2),
                                                  *instance.tables[1:])).validate()
    factors = {o.load_factor for o in enumerate_options(fixed) if o.kernel == FUSED_UVM_CACHING and o.table == 0}
    assert factors == {0.2}
    from instances import instance_from_dict, instance_to_dict

    assert instance_from_dict(json.loads(json.dumps(instance_to_dict(fixed)))) == fixed
    with pytest.raises(Exception, match="cache_load_factor"):
        dataclasses.replace(fixed, tables=(dataclasses.replace(fixed.tables[0], cache_load_factor=1.5),)).validate()


def test_a_table_name_with_a_dot_is_refused_in_one_line(tmp_path, capsys):
    """TorchRec names modules after tables and forbids dots: such a name would only fail at export."""
    spec = tmp_path / "spec.toml"
    spec.write_text('world_size = 2\nhbm_cap = "1GiB"\nbatch_size = 8\n[[tables]]\nname = "user.id"\n'
                    "num_embeddings = 100\nembedding_dim = 8\n")
    assert main(["instances", "import-torchrec", str(spec), "-o", str(tmp_path / "i.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tables[0].name" in err[0] and "'.'" in err[0], err
    assert not (tmp_path / "i.json").exists()


WHOLE_TABLE_HEURISTICS = ("best-greedy", "lpt", "size-greedy", "lookup-greedy", "oracle-greedy", "round-robin")


@examples(20)
@given(tiny_tiered_instances(max_tables=3))
def test_solvers_of_whole_tables_honour_host_memory(instance):
    # Whole tables with host memory choose a kernel each: where a whole-table plan exists (brute force over
    # every kernel, load factor and device), the safety net finds one, none says whole tables cannot fit,
    # and every plan any of them returns is valid on both tiers.
    whole = instance.restricted_to(("table_wise",))
    oracle = get_oracle("analytic")
    optimum = brute_force_over_options(whole, oracle)
    results = {name: run_solver(name, instance, oracle, QUICK, 0) for name in WHOLE_TABLE_HEURISTICS}
    for name, result in results.items():
        if result.has_plan:
            result.plan.validate(instance)
            assert optimum is not None and result.objective >= optimum * (1 - 1e-9), name
        elif optimum is not None:
            assert "whole tables" not in result.reason or "need more memory" not in result.reason, (name, result.reason)
            assert "whole in its leanest kernel" not in result.reason, (name, result.reason)
    if optimum is not None:
        assert results["best-greedy"].has_plan, results["best-greedy"].reason


def test_a_plan_that_contradicts_its_instance_is_refused(tmp_path, capsys):
    # A table whose cache the instance fixes at 0.3 cannot be planned at 0.05, nor in a kernel it does not
    # allow: show-plan and export refuse such a plan file in one line naming the table.
    base = _tiered(GIB, GIB)
    fixed = dataclasses.replace(base, tables=(dataclasses.replace(base.tables[0], cache_load_factor=0.3,
                                                                  compute_kernels=(FUSED, FUSED_UVM_CACHING)),
                                              *base.tables[1:])).validate()
    with pytest.raises(PlanError, match="t0: cache load factor 0.05 is not the 0.3"):
        _plan(fixed, FUSED_UVM_CACHING, 0.05).validate(fixed)
    with pytest.raises(PlanError, match="t0: compute kernel fused_uvm is not allowed"):
        _plan(fixed, FUSED_UVM, None).validate(fixed)
    _plan(fixed, FUSED_UVM_CACHING, 0.3).validate(fixed)
    save_instance(fixed, tmp_path / "i.json")
    (tmp_path / "p.json").write_text(json.dumps(plan_to_dict(_plan(fixed, FUSED_UVM_CACHING, 0.05), fixed)))
    for command in (["show-plan", str(tmp_path / "p.json"), "--instance", str(tmp_path / "i.json"), "--oracle", "analytic"],
                    ["export-torchrec", str(tmp_path / "p.json"), "--instance", str(tmp_path / "i.json"),
                     "-o", str(tmp_path / "plan.pt")]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "t0: cache load factor 0.05" in err[0]
    assert not (tmp_path / "plan.pt").exists()


@examples(25)
@given(tiny_tiered_instances(max_tables=3), st.sampled_from([np.inf, 0.5, 2.0]))
def test_the_summed_knapsack_is_the_least_work_that_fits_the_memory_summed_over_devices(instance, level):
    """Against brute force over every choice of options (one per table, pieces below the level where the
    table has such options): none fits the capacity summed over devices with less work, and none does less
    work than the knapsack's LP relaxation."""
    candidates = Candidates.build(instance, get_oracle("analytic"))
    assume(all(ids.size for ids in candidates.by_table))
    level = level * max(float(candidates.biggest[ids].min()) for ids in candidates.by_table)
    capacity = instance.capacity.sum(axis=0)
    pools = []
    for ids in candidates.by_table:
        below = ids[candidates.biggest[ids] <= level * (1 + 1e-12)]
        pools.append(below if below.size else ids[candidates.biggest[ids] == candidates.biggest[ids].min()])
    fitting = [list(combo) for combo in itertools.product(*pools)
               if all(candidates.total_storage[list(combo), tier].sum() <= capacity[tier]
                      for tier in candidates.binding_tiers)]
    chosen = summed_knapsack(candidates, 10.0, level)
    if not fitting:
        assert chosen is None
        return
    assert chosen is not None and all(o in pool for o, pool in zip(chosen, pools))
    assert all(candidates.total_storage[chosen, tier].sum() <= capacity[tier] for tier in candidates.binding_tiers)
    least = min(candidates.work[combo].sum() for combo in fitting)
    assert candidates.work[chosen].sum() <= least * (1 + 1e-6) + 1e-15
    # Its relaxation bounds every choice that fits from below, whatever the level.
    assert summed_relaxation(candidates) <= least * (1 + 1e-9) + 1e-15


def test_neighbourhoods_widen_around_the_knapsack_and_only_cut_the_live_options(monkeypatch):
    import solvers.exact_model as exact_model

    instance = sorted(load_instances("instances/sets/workloads-tiers-n40-k4-hbm0.5"), key=lambda i: i.id)[0]
    candidates = Candidates.build(instance, get_oracle("analytic"))
    live = candidates.live.copy()
    centres = []
    monkeypatch.setattr(exact_model, "knapsack_centre", lambda *args: centres.append(knapsack_centre(*args)) or
                        centres[-1])
    cuts = neighbourhoods(candidates, centre_of(candidates, Budget(10.0).begun()))
    assert len(cuts) == len(HULL_NEIGHBOURS) > 1
    assert np.array_equal(candidates.live, live)  # the candidates themselves are untouched
    centre = centres[-1]
    hbm = candidates.total_storage[:, HBM]
    for narrow, wide in zip(cuts, cuts[1:]):
        assert (narrow.live <= wide.live).all() and wide.live.sum() > narrow.live.sum()
    for width, cut in zip(HULL_NEIGHBOURS, cuts):
        assert cut.live.sum() < live.sum()
        for table, option in enumerate(centre):
            kept = cut.by_table[table]
            assert option in kept and (candidates.layout[kept] == candidates.layout[option]).all()
            # The rest of the table's options in the cut: a run of its hull's, by HBM, around the centre's.
            hull = candidates.search_options[table]
            line = hull[candidates.layout[hull] == candidates.layout[option]]
            line = line[np.argsort(hbm[line], kind="stable")]
            at = np.flatnonzero(np.isin(line, kept))
            assert at.size and (np.diff(at) == 1).all()
            if option in line:
                here = int(np.flatnonzero(line == option)[0])
                assert at[0] == max(0, here - width) and at[-1] == min(line.size - 1, here + width)
            else:
                assert at.size <= 2 * width
    # Without host memory no table trades HBM for cost: no neighbourhood.
    hbm_only = dataclasses.replace(instance, topology=dataclasses.replace(instance.topology, host_memory_bytes=0))
    hbm_only = Candidates.build(hbm_only.validate(), get_oracle("analytic"))
    assert centre_of(hbm_only, Budget(10.0).begun()) is None and neighbourhoods(hbm_only, None) == []


@examples(15)
@given(tiny_tiered_instances(max_tables=3))
@example(THREE_TINY_TABLES)
def test_no_bound_proved_over_a_neighbourhood_reaches_cpsats_result(instance):
    """Every neighbourhood run is made to claim an absurd bound: CP-SAT still reports a bound no higher than
    the brute-force optimum, and calls a plan optimal only at that optimum."""
    import solvers.cpsat as cpsat_module

    oracle = get_oracle("analytic")
    optimum = brute_force_over_options(instance, oracle)
    assume(optimum is not None)
    cut_ids = set()
    restricted, run = Candidates.restricted, cpsat_module._run

    def tagged(self, keep):
        cut = restricted(self, keep)
        cut_ids.add(id(cut))
        return cut

    def claiming(candidates, *args, **kwargs):
        done = run(candidates, *args, **kwargs)
        return dataclasses.replace(done, proven=1e30) if id(candidates) in cut_ids else done

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Candidates, "restricted", tagged)
        patch.setattr(cpsat_module, "_run", claiming)
        result = run_solver("cpsat", instance, oracle, QUICK, 0)
    assert result.lower_bound <= optimum * (1 + 1e-6) + 1e-15
    if result.status == Status.OPTIMAL:
        assert result.objective == pytest.approx(optimum, rel=OPTIMALITY_TOLERANCE, abs=1e-12)
    if cut_ids:
        assert result.stats["neighbourhoods"]


@examples(15)
@given(tiny_tiered_instances(max_tables=3))
@example(THREE_TINY_TABLES)
def test_the_model_over_some_tables_is_their_own_optimum_and_bounds_the_whole(instance):
    """What CP-SAT proves over some of the tables alone is the brute-force optimum of those tables (or the lower
    bound it is given, where that is higher), so it bounds the whole: from no start, from the whole's optimum
    as its lower bound, and hinted with a plan of every table. Over every table, its plan is one that fits."""
    from solvers.cpsat import _run

    oracle = get_oracle("analytic")
    optimum = brute_force_over_options(instance, oracle)
    assume(optimum is not None)
    problem = Problem(instance, oracle)
    hinted = exact_start(problem, QUICK.begun(), 0)
    n = instance.num_tables
    for size in range(1, n + 1):
        for tables in itertools.combinations(range(n), size):
            alone = brute_force_over_options(
                dataclasses.replace(instance, tables=tuple(instance.tables[t] for t in tables)), oracle)
            for start in (ExactStart(None, 0.0), ExactStart(None, optimum), hinted):
                run = _run(problem.candidates, start, time.monotonic() + 10, 0.0, 0, 1, tables=np.array(tables))
                assert run.stats["cpsat_status"] == "OPTIMAL"
                assert alone * (1 - 1e-6) - 1e-15 <= run.proven <= optimum * (1 + 1e-6) + 1e-15
                assert run.proven <= max(alone, start.lower_bound) * (1 + 1e-6) + 1e-15
                assert [o >= 0 for o in run.found[0]] == [t in tables for t in range(n)]
            whole = completed(problem.candidates, run.found)
            if size == n:
                assert whole is not None
            if whole is not None:
                assert (whole.chosen >= 0).all()
                # A given table keeps its cut and at most its HBM (it may only have given HBM up).
                c = problem.candidates
                for t in tables:
                    given, kept = run.found[0][t], whole.chosen[t]
                    assert c.layout[kept] == c.layout[given]
                    assert c.total_storage[kept, HBM] <= c.total_storage[given, HBM]
                plan = whole.plan()
                plan.validate(instance)
                assert oracle.plan_cost(instance, plan) >= optimum * (1 - 1e-9)


# Two tables do 97 % of the work of two devices, each more than a device's share of HBM: the LP mixes their
# caches and cuts; the exact model over the two alone sees what the whole optimum must pay (found by a search of
# random draws of this shape, `analytic`).
CORE_HEAVY = Instance("core-heavy", (make_table("t0", 53, 8, 16.23), make_table("t1", 47, 8, 15.81),
                                     make_table("t2", 8, 8, 0.5)),
                      Topology(1, 2, 748, host_memory_bytes=3456), Workload(batch_size=16),
                      sharding_types=("table_wise", "row_wise", "column_wise")).validate()


def test_cpsat_keeps_the_bound_and_the_plan_of_the_few_tables_that_do_most_of_the_work(monkeypatch):
    import solvers.cpsat as cpsat_module

    oracle = get_oracle("analytic")
    candidates = Candidates.build(CORE_HEAVY, oracle)
    optimum, lp = brute_force_over_options(CORE_HEAVY, oracle), lp_bound(candidates)
    run = cpsat_module._run

    def core_alone(candidates, start, *args, tables=None, **kwargs):
        done = run(candidates, start, *args, tables=tables, **kwargs)
        return done if tables is not None else dataclasses.replace(done, found=None, proven=0.0)

    monkeypatch.setattr(cpsat_module, "_run", core_alone)  # every run but the core's finds and proves nothing
    result = run_solver("cpsat", CORE_HEAVY, oracle, QUICK, 0)
    core = result.stats["core"]
    assert core["cpsat_status"] == "OPTIMAL" and lp < core["bound"]
    assert core["bound"] * (1 - 1e-9) <= result.lower_bound <= optimum * (1 + 1e-6)
    assert result.objective <= core["plan"] * (1 + 1e-9)
    # By their least work both heavy tables are the core, and the model over the two alone proves more than
    # twice the LP.
    problem = Problem(CORE_HEAVY, oracle)
    heavy = core_tables(problem, None)
    assert heavy.tolist() == [0, 1]
    proven = run(problem.candidates, ExactStart(None, 0.0), time.monotonic() + 10, 0.0, 0, 1, tables=heavy).proven
    assert 2 * lp < proven <= optimum * (1 + 1e-6)
    # None: where the tables are alike (each a core table, so the core is every table), or caches are offered
    # load factors beside the grid's.
    alike = dataclasses.replace(CORE_HEAVY, tables=tuple(make_table(f"t{i}", 50, 8, 16.0) for i in range(3)))
    assert core_tables(Problem(alike.validate(), oracle), None) is None
    assert core_tables(Problem(CORE_HEAVY, oracle, load_factors={0: (0.33,)}), None) is None



def test_the_core_is_the_few_tables_that_do_most_of_the_work():
    assert core_of(np.array([5.0, 4.0, 0.5, 0.5]), 2).tolist() == [0, 1]
    assert core_of(np.array([1.0, 1.0, 1.0]), 2) is None          # alike: the core would be every table
    # On 8 devices a table is heavy from 0.05 of all the work: four of them at 0.4 of it are not half of it.
    assert core_of(np.array([1.0] * 4 + [0.1] * 60), 8) is None
    assert core_of(np.array([1.0] * 4 + [0.1] * 30), 8).tolist() == [0, 1, 2, 3]
    assert core_of(np.array([1.0] * 9 + [0.01]), 8) is None       # nine heavy tables: more than CORE_TABLES
    # A core the price stage names is the core, whatever the load factors offered.
    problem = Problem(CORE_HEAVY, get_oracle("analytic"), load_factors={0: (0.33,)}, core=(1,))
    assert core_tables(problem, None).tolist() == [1]


def _core_cached(small: int = 4, small_rows: int = 300, small_kernels=None) -> Instance:
    """Two tables that do most of the work, each larger than a device's HBM, beside `small` small ones."""
    small = tuple(dataclasses.replace(make_table(f"s{i}", small_rows, 16, 1.0), compute_kernels=small_kernels)
                  for i in range(small))
    return Instance("core-cached", (make_table("t0", 6000, 16, 8.0), make_table("t1", 8000, 16, 8.0), *small),
                    Topology(1, 2, 100 * 1024, host_memory_bytes=2**30), Workload(batch_size=64),
                    sharding_types=("table_wise", "row_wise")).validate()


def test_completing_a_core_plan_gives_up_its_caches_hbm_where_another_table_finds_no_room():
    from solvers.assembly import Assembly, Trial

    instance = _core_cached(1, 2100, small_kernels=(FUSED,))  # the small table needs HBM
    candidates = Candidates.build(instance, get_oracle("analytic"))
    options, hbm = candidates.options.options, candidates.total_storage[:, HBM]
    given = Assembly(candidates)
    for table in (0, 1):  # each big table whole on a device, with the largest cache that fits it
        cached = [int(o) for o in candidates.by_table[table] if options[o].kernel == FUSED_UVM_CACHING
                  and options[o].sharding_type == "table_wise"]
        for option in sorted(cached, key=lambda o: -hbm[o]):
            trial = given.fit(option)
            if isinstance(trial, Trial):
                given.put(option, trial.devices)
                break
    found = given.snapshot()
    assert (found[0][:2] >= 0).all() and not any(isinstance(given.fit(int(o)), Trial)
                                                 for o in candidates.by_table[2])
    whole = completed(candidates, found)
    assert whole is not None and (whole.chosen >= 0).all()
    whole.plan().validate(instance)
    assert all(candidates.layout[whole.chosen[t]] == candidates.layout[found[0][t]] for t in (0, 1))
    assert all(hbm[whole.chosen[t]] <= hbm[found[0][t]] for t in (0, 1))
    assert any(hbm[whole.chosen[t]] < hbm[found[0][t]] for t in (0, 1))
    # One step gives up HBM where the busiest device then ends lowest.
    peaks = []
    for table in (0, 1):
        step = Assembly(candidates)
        step.load(*found)
        option = int(step.chosen[table])
        same = [int(o) for o in candidates.by_table[table]
                if candidates.layout[o] == candidates.layout[option] and hbm[o] < hbm[option]]
        assert candidates.leaner(option).tolist() == same and same
        among = candidates.by_table[table][::2]
        assert candidates.leaner(option, among).tolist() == [o for o in same if o in among]
        _, devices = step.take(table)
        step.put(max(same, key=lambda o: hbm[o]), devices)
        peaks.append(step.objective())
    stepped = Assembly(candidates)
    stepped.load(*found)
    assert _leaner(stepped, np.array([0, 1])) and stepped.objective() == pytest.approx(min(peaks), rel=1e-12)


def test_an_option_fits_at_devices_only_where_its_pieces_together_fit_each_of_them():
    from solvers.assembly import Assembly

    instance = _core_cached(1, 2100, small_kernels=(FUSED,))
    candidates = Candidates.build(instance, get_oracle("analytic"))
    halves = next(int(o) for o in candidates.by_table[2] if candidates.options.options[o].sharding_type == "row_wise")
    assembly = Assembly(candidates)
    half = int(assembly.memory[candidates.members(halves)][0, HBM])
    assembly.free[0, HBM] = half + half // 2  # room for one half on device 0, not for both
    assert assembly.fits_at(halves, np.array([0, 1])) and not assembly.fits_at(halves, np.array([0, 0]))


def test_plan_offers_the_core_fine_load_factors_and_plans_it_alone_first_on_long_budgets(monkeypatch, tmp_path,
                                                                                       capsys):
    import shardbench
    import shardbench.pipeline as pipeline

    instance = _core_cached()
    path, out = tmp_path / "core.json", tmp_path / "plan.json"
    save_instance(instance, path)
    monkeypatch.setattr(pipeline, "GUIDE_SHARE", 0.9)  # the LP's time, so that a slow machine finds the core too
    # Below CORE_BUDGET_S no core and nothing more offered, and the report names the tables a longer budget
    # would plan alone first, and how to ask for it.
    short_priced = pipeline.price(instance, get_oracle("torchrec"), Budget(2.0), whole_tables=False, guide=True,
                                  plans_core=True)
    assert short_priced.problem.core == () and short_priced.core_later == (0, 1) and short_priced.fine == ()
    assert not any(set(pipeline.CORE_LOAD_FACTORS) & set(f) for f in short_priced.problem.load_factors.values())
    short = shardbench.plan(instance, "torchrec", budget=2.0, solvers=["cpsat"])
    assert short.core == () and short.core_later == (0, 1)
    assert any(short.plan.tables[t].cache_load_factor is not None for t in (0, 1))
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "2", "--solvers", "cpsat", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert ("note: 2 tables do most of the work (t0, t1), and the plan caches some of them; with a budget of at "
            "least 30 s (--budget 30) CP-SAT plans them alone first") in said and "offered up to" not in said
    assert json.loads(out.read_text())["report"]["core_tables_from_budget"] == {"tables": [0, 1], "budget": 30.0}
    # Where HBM holds those tables, finer caches would not matter: nothing said.
    roomy = dataclasses.replace(instance, topology=dataclasses.replace(instance.topology, memory_bytes=8 * 2**20))
    roomy = roomy.validate()
    assert pipeline.price(roomy, get_oracle("torchrec"), Budget(2.0), whole_tables=False, guide=True,
                          plans_core=True).core_later == (0, 1)  # the same tables do most of the work
    fused = shardbench.plan(roomy, "torchrec", budget=2.0, solvers=["cpsat"])
    assert all(fused.plan.tables[t].cache_load_factor is None for t in (0, 1)) and fused.core_later == ()
    # No member that plans a core alone: nothing said of a longer budget, nor, where the core is offered its
    # load factors, of planning it alone.
    assert shardbench.plan(instance, "torchrec", budget=2.0, solvers=["pair-balance"]).core_later == ()
    monkeypatch.setattr(pipeline, "CORE_BUDGET_S", 1.0)
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "3", "--solvers", "pair-balance",
                 "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "(t0, t1) offered up to 40 more each" in said and "alone" not in said and "note:" not in said
    result = shardbench.plan(instance, "torchrec", budget=3.0, solvers=["cpsat"])
    assert result.core == (0, 1) and result.core_later == ()
    result.plan.validate(instance)
    cpsat = next(m.result for m in result.members if m.solver == "cpsat")
    assert cpsat.stats["core"]["tables"] == 2  # CP-SAT solved the named core first
    plans = [m.result.objective for m in result.members if m.result is not None and m.result.plan is not None]
    assert all(m.result.lower_bound is None or m.result.lower_bound <= min(plans) * (1 + 1e-9)
               for m in result.members if m.result is not None)
    priced = pipeline.price(instance, get_oracle("torchrec"), Budget(3.0), whole_tables=False, guide=True)
    assert priced.problem.core == (0, 1)
    assert all(set(pipeline.CORE_LOAD_FACTORS) <= set(priced.problem.load_factors[t]) for t in (0, 1))
    assert core_tables(priced.problem, None).tolist() == [0, 1]
    assert priced.fine == ()  # where a core is named, the other caches are not offered the fine load factors
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "3", "--solvers", "cpsat", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "offered up to 40 more each and planned alone first" in said and "note:" not in said
    report = json.loads(out.read_text())["report"]
    assert report["core_tables"] == [0, 1] and report["core_tables_from_budget"] is None


def test_plan_offers_every_open_cache_fine_load_factors_on_long_budgets_where_no_core_is_named(monkeypatch, tmp_path,
                                                                                             capsys):
    import shardbench
    import shardbench.pipeline as pipeline

    instance = Instance("spread-cached", tuple(make_table(f"t{i}", 3000, 16, 4.0) for i in range(6)),
                        Topology(1, 2, 100 * 1024, host_memory_bytes=2**30), Workload(batch_size=64),
                        sharding_types=("table_wise", "row_wise")).validate()
    path, out = tmp_path / "spread.json", tmp_path / "plan.json"
    save_instance(instance, path)
    monkeypatch.setattr(pipeline, "GUIDE_SHARE", 0.9)  # the LP's time, so that a slow machine finds it too
    oracle = get_oracle("torchrec")
    base, guide = pipeline.guided(instance, oracle, Budget(3.0).begun())
    assert guide.load_factors and pipeline.core_found(base, guide) == ()  # the LP caches tables; no core
    # Below CORE_BUDGET_S the grid and the guide's load factors alone.
    short = pipeline.price(instance, oracle, Budget(3.0), whole_tables=False, guide=True)
    assert short.fine == () and not any(set(pipeline.FINE_LOAD_FACTORS) & set(f) - set(guide.load_factors[t])
                                        for t, f in short.problem.load_factors.items())
    monkeypatch.setattr(pipeline, "CORE_BUDGET_S", 1.0)
    priced = pipeline.price(instance, oracle, Budget(3.0), whole_tables=False, guide=True)
    assert priced.fine == tuple(range(instance.num_tables)) and priced.problem.core == ()
    assert all(set(pipeline.FINE_LOAD_FACTORS) <= set(priced.problem.load_factors[t]) for t in priced.fine)
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "3", "--solvers", "pair-balance",
                 "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "6 tables' caches offered up to 49 more (0.0221–0.9411) on a budget of at least 1 s" in said
    assert json.loads(out.read_text())["report"]["fine_load_factors"] == {
        "tables": list(range(6)), "load_factors": list(pipeline.FINE_LOAD_FACTORS)}
    result = shardbench.plan(instance, "torchrec", budget=3.0, solvers=["pair-balance"])
    assert result.fine == tuple(range(6))
    result.plan.validate(instance)
    assert shardbench.plan(instance, "torchrec", budget=3.0, solvers=["pair-balance"], resize_caches=False).fine == ()
    unguided = pipeline.price(instance, oracle, Budget(3.0), whole_tables=False, guide=False)
    assert unguided.fine == () and not unguided.problem.load_factors
    # The limit counts the options then enumerated, the guide's load factors included: at it they are offered,
    # one below it the grid stays; and nothing where a core is named.
    exact = len(enumerate_options(instance, pipeline.offered(guide, (), priced.fine)))
    for limit, tables in ((exact, priced.fine), (exact - 1, ())):
        with monkeypatch.context() as patch:
            patch.setattr(pipeline, "FINE_OPTIONS", limit)
            assert pipeline.fine_tables(base, guide, ()) == tables
    assert pipeline.fine_tables(base, guide, (0,)) == ()
    # Where HBM holds every table, the LP caches none: nothing offered.
    roomy = dataclasses.replace(instance, topology=dataclasses.replace(instance.topology, memory_bytes=8 * 2**20))
    roomy = roomy.validate()
    roomy_base, roomy_guide = pipeline.guided(roomy, oracle, Budget(3.0).begun())
    assert roomy_guide.work is not None and not roomy_guide.load_factors  # the LP ran and caches nothing
    assert pipeline.fine_tables(roomy_base, roomy_guide, ()) == ()
    assert pipeline.price(roomy, oracle, Budget(3.0), whole_tables=False, guide=True).fine == ()
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "FINE_OPTIONS", exact - 1)
        assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "3", "--solvers", "pair-balance",
                     "-o", str(out)]) == 0
        said = capsys.readouterr().out
        assert "tables' caches" not in said and "cache load factors beside the grid's" in said
        assert json.loads(out.read_text())["report"]["fine_load_factors"] is None
