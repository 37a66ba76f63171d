"""Caches re-sized off the grid of load factors: a re-sized plan keeps every table's cut, devices and kernel,
fits every tier, costs no more, and matches brute force over the fine load factors; `plan` hands it over
from Python and the command line alike, certified as the plan on the grid was."""
import dataclasses
import json
import time

import numpy as np
import pytest
from conftest import examples, make_table
from hypothesis import given
from test_tiers import tiny_tiered_instances

import shardbench
from costmodels import get_oracle
from instances import Instance, Plan, Shard, TableSharding, Topology, Workload, load_plan, save_instance
from instances.kernels import FUSED_UVM_CACHING, LOAD_FACTOR_GRID
from instances.memory import HBM
from instances.pieces import Pieces
from instances.sharding import row_cuts
from shardbench.cli import main
from solvers import Budget, run_solver
from solvers.cache_sizes import STEP, resize_caches

QUICK = Budget(5.0)


def _cached(instance: Instance, factors: dict[int, float], device=lambda t: 0) -> Plan:
    """Every table whole and cached, table t at factors[t] on device(t)."""
    return Plan(instance.id, tuple(TableSharding("table_wise", (Shard(device(t), (0, table.rows), (0, table.dim)),),
                                                 FUSED_UVM_CACHING, factors[t]) for t, table in enumerate(instance.tables)))


def _one_device(between: tuple[float, float], tables: int = 1) -> Instance:
    """Tables on a single device with host memory for all of them, and HBM between what their caches need at
    the two load factors `between` (each table at the same one)."""
    specs = tuple(make_table(f"t{i}", 4000 * (i + 1), 128, 2.0 + 3 * i) for i in range(tables))
    need = sum(t.weight_bytes for t in specs)
    probe = Instance("one", specs, Topology(1, 1, 64 * need, host_memory_bytes=64 * need), Workload(batch_size=64),
                     sharding_types=("table_wise",)).validate()
    low, high = (int(_cached(probe, dict.fromkeys(range(tables), f)).storage_per_device(probe)[0, HBM]) for f in between)
    return Instance("one", specs, Topology(1, 1, (low + high) // 2, host_memory_bytes=4 * need),
                    Workload(batch_size=64), sharding_types=("table_wise",)).validate()


def _device_cost_and_hbm(instance, oracle, table, factors):
    """Brute force: the table alone on a device, cached at each factor: its cost and HBM bytes."""
    plans = [_cached(instance, {table: f} | {t: 0.05 for t in range(instance.num_tables) if t != table})
             for f in factors]
    out = []
    for plan in plans:
        pieces, _ = Pieces.of_plan(instance, plan)
        priced = oracle.bind(instance, pieces)
        storage = np.maximum(priced.storage, pieces.storage(instance)) if oracle.own_memory else priced.storage
        out.append((float(priced.costs[table]), int(storage[table, HBM])))
    return np.array(out)


@pytest.mark.parametrize("oracle_name", ["analytic", "torchrec"])
def test_a_lone_cache_grows_into_the_hbm_the_grid_leaves_as_brute_force_says(oracle_name):
    oracle = get_oracle(oracle_name)
    instance = _one_device((0.7, 0.9))
    plan = _cached(instance, {0: 0.7}).validate(instance)
    resized = resize_caches(instance, oracle, plan).validate(instance)
    fine = np.round(np.arange(1, round(1 / STEP) + 1) * STEP, 4)
    priced = _device_cost_and_hbm(instance, oracle, 0, fine)
    room = instance.topology.capacity.hbm
    best = fine[np.flatnonzero(priced[:, 1] <= room)][np.argmin(priced[priced[:, 1] <= room, 0])]
    assert resized.tables[0].cache_load_factor == pytest.approx(best)
    assert 0.7 < best < 0.9
    assert oracle.plan_cost(instance, resized) < oracle.plan_cost(instance, plan)


def test_two_caches_on_one_device_match_the_best_pair_of_fine_load_factors_within_a_step():
    oracle = get_oracle("torchrec")
    instance = _one_device((0.3, 0.5), tables=2)
    plan = _cached(instance, {0: 0.3, 1: 0.3}).validate(instance)
    resized = resize_caches(instance, oracle, plan).validate(instance)
    fine = np.round(np.arange(1, round(1 / STEP) + 1) * STEP, 4)
    first, second = (_device_cost_and_hbm(instance, oracle, t, fine) for t in (0, 1))
    total = first[:, None, 0] + second[None, :, 0]
    fits = first[:, None, 1] + second[None, :, 1] <= instance.topology.capacity.hbm
    brute = float(total[fits].min())
    got = oracle.plan_cost(instance, resized)
    assert brute * (1 - 1e-9) <= got <= brute * 1.005
    on_grid = min(oracle.plan_cost(instance, _cached(instance, {0: a, 1: b}))
                  for a in LOAD_FACTOR_GRID for b in LOAD_FACTOR_GRID
                  if _cached(instance, {0: a, 1: b}).storage_per_device(instance)[0, HBM]
                  <= instance.topology.capacity.hbm)
    assert got < on_grid


def _row_wise(instance: Instance, factors: dict[int, float]) -> Plan:
    """Every table cached and cut row-wise over all devices, table t at factors[t]."""
    k = instance.num_devices
    return Plan(instance.id, tuple(TableSharding("row_wise", tuple(Shard(d, rows, (0, table.dim)) for d, rows in
                                                                   enumerate(row_cuts(table.rows, k))),
                                                 FUSED_UVM_CACHING, factors[t]) for t, table in enumerate(instance.tables)))


def test_caches_cut_over_devices_share_the_hbm_as_brute_force_over_pairs_of_load_factors_does():
    # Two row-wise tables on two devices, both cached at 0.3 with HBM to spare: the re-sized pair is no worse
    # than the best pair of load factors 0.01 apart that fits.
    oracle = get_oracle("torchrec")
    one = _one_device((0.3, 0.5), tables=2)
    instance = Instance("two", one.tables, Topology(1, 2, one.topology.memory_bytes // 2,
                                                     host_memory_bytes=one.topology.host_memory_bytes),
                        Workload(batch_size=64), sharding_types=("row_wise",)).validate()
    plan = _row_wise(instance, {0: 0.3, 1: 0.3}).validate(instance)
    resized = resize_caches(instance, oracle, plan).validate(instance)
    fine = np.round(np.arange(1, round(1 / STEP) + 1) * STEP, 4)[::4]
    best = np.inf
    for a in fine:
        pairs = [_row_wise(instance, {0: a, 1: b}) for b in fine]
        fitting = [p for p in pairs if (p.storage_per_device(instance) <= instance.topology.capacity.as_array()).all()
                   and (oracle.storage_per_device(instance, p) <= instance.topology.capacity.as_array()).all()]
        best = min([best] + [oracle.plan_cost(instance, p) for p in fitting])
    got = oracle.plan_cost(instance, resized)
    assert got <= best * (1 + 1e-9) and got < oracle.plan_cost(instance, plan)


def test_a_load_factor_the_instance_fixes_is_never_changed_beside_one_it_leaves_open():
    oracle = get_oracle("torchrec")
    base = _one_device((0.3, 0.5), tables=2)
    fixed = dataclasses.replace(base.tables[0], cache_load_factor=0.3)
    instance = dataclasses.replace(base, tables=(fixed, base.tables[1])).validate()
    resized = resize_caches(instance, oracle, _cached(instance, {0: 0.3, 1: 0.3}).validate(instance))
    assert resized.tables[0].cache_load_factor == 0.3 and resized.tables[1].cache_load_factor > 0.3
    alone = dataclasses.replace(base, tables=(fixed,)).validate()
    assert resize_caches(alone, oracle, _cached(alone, {0: 0.3}).validate(alone)) is None


def test_nothing_is_re_sized_past_the_deadline():
    instance = _one_device((0.7, 0.9))
    plan = _cached(instance, {0: 0.7}).validate(instance)
    assert resize_caches(instance, get_oracle("torchrec"), plan, deadline=time.monotonic() - 1) is None


@examples(20)
@given(tiny_tiered_instances(max_tables=3))
def test_a_resized_plan_keeps_its_cuts_fits_every_tier_and_costs_no_more(instance):
    for oracle_name in ("analytic", "torchrec"):
        oracle = get_oracle(oracle_name)
        found = run_solver("split-greedy", instance, oracle, QUICK, 0)
        if not found.has_plan:
            continue
        resized = resize_caches(instance, oracle, found.plan)
        if resized is None:
            continue
        resized.validate(instance)
        assert (oracle.storage_per_device(instance, resized) <= instance.topology.capacity.as_array()).all()
        assert oracle.plan_cost(instance, resized) <= found.objective * (1 + 1e-12)
        for before, after in zip(found.plan.tables, resized.tables):
            assert (before.sharding_type, before.shards, before.compute_kernel) == \
                (after.sharding_type, after.shards, after.compute_kernel)
            if after.cache_load_factor != before.cache_load_factor:
                assert after.compute_kernel == FUSED_UVM_CACHING and 0 < after.cache_load_factor <= 1


def _short_of_hbm() -> Instance:
    # One table on two devices whose HBM holds its cache at 0.8: the grid's largest cache (0.7) leaves HBM unused.
    one = _one_device((0.7, 0.9))
    return Instance("short", one.tables, Topology(1, 2, one.topology.memory_bytes, host_memory_bytes=one.topology.host_memory_bytes),
                    Workload(batch_size=64), sharding_types=("table_wise",)).validate()


def test_plan_hands_over_the_resized_plan_certified_as_the_plan_on_the_grid(tmp_path, capsys):
    instance = _short_of_hbm()
    result = shardbench.plan(instance, "torchrec", budget=2.0, solvers=["cpsat"])
    assert result.grid_objective is not None and result.objective < result.grid_objective
    assert result.plan.tables[0].cache_load_factor > 0.7
    # The certificate is the grid plan's: cpsat proved it optimal over the grid; the re-sized plan beats it.
    assert result.gap == pytest.approx(0.0, abs=1e-5) and result.bound <= result.grid_objective
    assert result.objective == get_oracle("torchrec").plan_cost(instance, result.plan)
    path = tmp_path / "short.json"
    save_instance(instance, path)
    out = tmp_path / "plan.json"
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "2", "--solvers", "cpsat", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "caches re-sized off the grid of load factors" in printed and "of the plan before its caches were re-sized" in printed
    written = load_plan(out, instance)
    assert written.tables[0].cache_load_factor == result.plan.tables[0].cache_load_factor
    record = json.loads(out.read_text())
    report = record.get("report", record)
    assert report["grid_objective"] == pytest.approx(result.grid_objective)
    # Asked to keep the grid, from Python and the command line alike: the plan on the grid, certified as is.
    kept = shardbench.plan(instance, "torchrec", budget=2.0, solvers=["cpsat"], resize_caches=False)
    assert kept.grid_objective is None and kept.objective == pytest.approx(result.grid_objective)
    assert kept.plan.tables[0].cache_load_factor <= 0.7
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "2", "--solvers", "cpsat", "--grid-caches",
                 "-o", str(out)]) == 0
    assert "re-sized" not in capsys.readouterr().out
    assert load_plan(out, instance).tables[0].cache_load_factor == kept.plan.tables[0].cache_load_factor


def test_a_replan_keeps_its_cache_sizes():
    # A cache re-sized counts as a move in a replan, which the move budget would have to price.
    from instances.moves import previous_plan
    from shardbench.portfolio import resized_caches
    from solvers.candidates import Problem

    instance, oracle = _short_of_hbm(), get_oracle("torchrec")
    plan = _cached(instance, {0: 0.7}).validate(instance)
    cost = oracle.plan_cost(instance, plan)
    assert resized_caches(Problem(instance, oracle), plan, cost, np.inf) is not None
    previous = previous_plan(instance, {"t0": plan.tables[0]})
    assert resized_caches(Problem(instance, oracle, previous=previous), plan, cost, np.inf) is None


def test_every_members_plan_is_re_sized_and_the_lowest_handed_over(monkeypatch):
    # One plan a little dearer on the grid may re-size lower than the best on the grid: the one handed over is
    # the lowest after re-sizing, credited to its member and certified as its own plan on the grid.
    import shardbench.portfolio as portfolio
    from solvers import SolveResult, Status
    from solvers.candidates import Problem

    instance, oracle = _short_of_hbm(), get_oracle("torchrec")
    cheaper, dearer = (_cached(instance, {0: f}).validate(instance) for f in (0.7, 0.5))
    on_grid = {p: oracle.plan_cost(instance, p) for p in (cheaper, dearer)}
    assert on_grid[cheaper] < on_grid[dearer]
    shrink = {cheaper: 0.9, dearer: 0.5}
    monkeypatch.setattr(portfolio, "resized_caches", lambda problem, plan, cost, deadline: (plan, cost * shrink[plan]))
    members = tuple(portfolio.Member(name, SolveResult(Status.FEASIBLE, plan=plan, lower_bound=0.5 * on_grid[cheaper]),
                                     1.0, True) for name, plan in (("a", cheaper), ("b", dearer)))
    race = portfolio.Race(("a", "b"), members, False, 1.0)
    result = portfolio.settle(Problem(instance, oracle), race, (), 0.0, Budget(5.0))
    assert result.solver == "b" and result.plan == dearer
    assert result.objective == pytest.approx(0.5 * on_grid[dearer]) and result.grid_objective == on_grid[dearer]
    assert result.bound == pytest.approx(0.5 * on_grid[cheaper])
    # Without re-sizing, the best on the grid.
    kept = portfolio.settle(Problem(instance, oracle), race, (), 0.0)
    assert kept.solver == "a" and kept.objective == on_grid[cheaper] and kept.grid_objective is None
