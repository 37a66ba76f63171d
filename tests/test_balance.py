"""pair-balance: a device group solved again is the best layout of its tables, and a compressed pair the
least work under its cap (brute force); the centre drops its replicas exactly where that costs at most the
saving allowed; a kick deals out only its devices' tables and leaves a layout that fits, or none; the
solver's plans are valid, no better than the optimum, no worse than its first start, and the same for the
same seed, and its bound (the LP over options) no higher than the optimum; a group whose state ended
without gain by its own limits (optimal, or its node limit) is not solved again; a start's hull fit is the work of options that fit (brute force), and
levelling keeps every table once and never raises the busiest device's fit."""
import itertools

import numpy as np
import pytest
from conftest import examples, make_instance, make_table
from hypothesis import assume, example, given
from hypothesis import strategies as st
from test_sharding import QUICK
from test_tiers import THREE_TINY_TABLES, tiny_tiered_instances

from benchmarks.brute import brute_force_over_options
from costmodels import get_oracle
from instances import Instance, Topology, Workload
from instances.io import save_instance
from shardbench.cli import main
from solvers import Candidates, Status, run_solver
from solvers.assembly import Assembly, construct
from solvers.base import OPTIMALITY_TOLERANCE, order_by_cost
from solvers.bounds import lp_bound
from solvers.choice import option_weight
from solvers.balance import (REPLICA_SAVING, HullFit, balanced_start, centre_over, kick, knapsack_choice, level,
                             movable, regroup, split_centre, spread, with_splits, without_replicas)


def _pair_layouts(instance):
    """A two-device assembly of the instance's tables (each in its first single-piece option), the pools,
    and every layout of them that fits every memory tier as (busiest device, work summed, layout)."""
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
    layouts = []
    for layout in itertools.product(*[[(int(o), d) for o in pools[t] for d in (0, 1)] for t in tables]):
        load, used = np.zeros(2), np.zeros_like(capacity)
        for o, d in layout:
            load[d] += candidates.work[o]
            used[d] += candidates.storage[candidates.members(o)[0]]
        if (used[:, tiers] <= capacity[:, tiers]).all():
            layouts.append((float(load.max()), float(load.sum()), layout))
    return assembly, pools, tables, layouts


def _laid_out(assembly, found, tiers):
    for o, d in found.layout.values():
        assembly.put(o, np.array([d]))
    assert (assembly.free[:, tiers] >= 0).all()
    assert float(assembly.costs().max()) == pytest.approx(found.peak, rel=1e-9, abs=1e-12)
    return assembly.costs()


@examples(25)
@given(tiny_tiered_instances(max_tables=3))
@example(THREE_TINY_TABLES)
def test_a_regrouped_device_pair_is_the_best_layout_of_its_tables(instance):
    """Every table table-wise on one of the two devices, in any of its pool's options: none of the layouts
    that fit every memory tier has a lighter busiest device than the group's."""
    assembly, pools, tables, layouts = _pair_layouts(instance)
    found = regroup(assembly, [0, 1], tables, pools, 10.0)
    if not layouts:
        assert found is None
        return
    assert found is not None and found.peak == pytest.approx(min(peak for peak, _, _ in layouts), rel=1e-4, abs=1e-12)
    _laid_out(assembly, found, list(assembly.c.binding_tiers))


@examples(25)
@given(tiny_tiered_instances(max_tables=3), st.data())
@example(THREE_TINY_TABLES, None)
def test_a_group_handed_its_layout_ends_no_worse_than_it_and_at_the_best_given_time(instance, data):
    """Handed one of the layouts that fit as its start, the group keeps at least it however short its time or
    few its nodes (then the same layout every time), and still ends at the best layout given time (brute
    force)."""
    assembly, pools, tables, layouts = _pair_layouts(instance)
    assume(layouts)
    peak, _, layout = layouts[0] if data is None else data.draw(st.sampled_from(layouts))
    start = dict(zip(tables, layout))
    quick = regroup(assembly, [0, 1], tables, pools, 0.0, start=start)
    assert quick is not None and quick.peak <= peak * (1 + 1e-9) and quick.repeatable == quick.proven
    few = [regroup(assembly, [0, 1], tables, pools, 10.0, start=start, nodes=1) for _ in range(2)]
    assert few[0] is not None and few[0].peak <= peak * (1 + 1e-9) and few[0].layout == few[1].layout
    assert few[0].repeatable  # proven, or cut by its node limit: not by time
    found = regroup(assembly, [0, 1], tables, pools, 10.0, start=start)
    assert found is not None and found.peak == pytest.approx(min(p for p, _, _ in layouts), rel=1e-4, abs=1e-12)


@examples(25)
@given(tiny_tiered_instances(max_tables=3), st.data(), st.floats(0.0, 1.0))
@example(THREE_TINY_TABLES, None, 0.5)
def test_a_group_told_what_is_enough_ends_at_or_below_it_where_a_layout_can(instance, data, share):
    """Handed a start and `enough` between the best layout's busiest device and the start's, the group ends
    at a layout that fits with its busiest device at most `enough` (one exists: the best), and never below
    the best (brute force); it claims a proof only where it ends at the best."""
    assembly, pools, tables, layouts = _pair_layouts(instance)
    assume(layouts)
    peak, _, layout = layouts[-1] if data is None else data.draw(st.sampled_from(layouts))
    best = min(p for p, _, _ in layouts)
    enough = best + share * (peak - best)
    found = regroup(assembly, [0, 1], tables, pools, 10.0, start=dict(zip(tables, layout)), enough=enough)
    assert found is not None and best * (1 - 1e-9) <= found.peak <= enough * (1 + 1e-9) + 1e-12
    assert not found.proven or found.peak == pytest.approx(best, rel=1e-4, abs=1e-12)
    _laid_out(assembly, found, list(assembly.c.binding_tiers))


@examples(1)
@given(st.just(THREE_TINY_TABLES))
def test_a_group_told_its_start_is_enough_stops_there_unproven(instance):
    """Where the start already is enough, HiGHS stops at it rather than go on to the better layout it would
    otherwise find and prove."""
    assembly, pools, tables, layouts = _pair_layouts(instance)
    peak, _, layout = max(layouts)
    assert peak > min(layouts)[0]
    found = regroup(assembly, [0, 1], tables, pools, 10.0, start=dict(zip(tables, layout)), enough=peak)
    assert found.peak == pytest.approx(peak, rel=1e-9) and not found.proven and not found.repeatable
    found = regroup(assembly, [0, 1], tables, pools, 10.0, start=dict(zip(tables, layout)))
    assert found.peak == pytest.approx(min(layouts)[0], rel=1e-4) and found.proven


@examples(15)
@given(tiny_tiered_instances(max_tables=3), st.data(), st.booleans())
@example(THREE_TINY_TABLES, None, False)
def test_the_start_handed_to_highs_is_the_layout_and_fits_every_row(instance, data, capped):
    """What HiGHS is handed as its first incumbent is a layout (one column per table, integral) that meets
    every row and column bound of the model — with or without a cap at the start's own busiest device — so
    HiGHS keeps it rather than dropping it as infeasible."""
    import solvers.balance as balance

    assembly, pools, tables, layouts = _pair_layouts(instance)
    assume(layouts)
    peak, _, layout = layouts[0] if data is None else data.draw(st.sampled_from(layouts))
    handed = {}
    real = balance._highs

    def spy(objective, matrix, lower, upper, column_upper, integers, time_limit, start, enough, nodes):
        handed.update(matrix=matrix.tocsr(), lower=np.asarray(lower, float), upper=np.asarray(upper, float),
                      column_upper=column_upper, integers=integers, start=start)
        return real(objective, matrix, lower, upper, column_upper, integers, time_limit, start, enough, nodes)

    balance._highs = spy
    try:
        regroup(assembly, [0, 1], tables, pools, 10.0, cap=peak if capped else None, start=dict(zip(tables, layout)))
    finally:
        balance._highs = real
    x = handed["start"]
    assert x is not None and set(np.unique(x[:handed["integers"]])) <= {0.0, 1.0}
    assert int(x[:handed["integers"]].sum()) == len(tables)
    rows = handed["matrix"] @ x
    assert (rows >= handed["lower"] - 1e-9).all() and (rows <= handed["upper"] + 1e-9).all()
    assert (x >= 0).all() and (x <= handed["column_upper"] + 1e-9).all()


@examples(25)
@given(tiny_tiered_instances(max_tables=3), st.floats(1.0, 2.0))
@example(THREE_TINY_TABLES, 1.0)
def test_a_compressed_device_pair_does_the_least_work_under_its_cap(instance, slack):
    """Given a cap between the best layout's busiest device and twice it, the group does the least work
    summed of the layouts that fit every memory tier with neither device above the cap (brute force)."""
    assembly, pools, tables, layouts = _pair_layouts(instance)
    assume(layouts)
    cap = min(peak for peak, _, _ in layouts) * slack
    least = min(total for peak, total, _ in layouts if peak <= cap)
    found = regroup(assembly, [0, 1], tables, pools, 10.0, cap=cap)
    assert found is not None and found.peak <= cap * (1 + 1e-6)
    costs = _laid_out(assembly, found, list(assembly.c.binding_tiers))
    assert float(costs.sum()) == pytest.approx(least, rel=1e-4, abs=1e-12)


@pytest.mark.parametrize("over", [1, 2, 1000])
@pytest.mark.parametrize("capped", [False, True])
def test_a_group_never_overfills_a_device_by_the_solvers_tolerance(over, capped):
    """Two 1 GB tables that miss sharing a device by `over` bytes and a small busy one: together they would
    level the pair, and HiGHS, holding memory rows only to its tolerance, took that layout at 1-2 bytes over.
    The group must pair the busy table with one of them instead."""
    specs = [(4_000_000, 128, 1.0), (4_000_000, 128, 1.0), (1000, 16, 100.0)]
    sizes = Candidates.build(make_instance(specs, 2, 10**12), get_oracle("analytic"))
    capacity = int(sizes.storage[sizes.members(0)[0], 0] + sizes.storage[sizes.members(1)[0], 0]) - over
    candidates = Candidates.build(make_instance(specs, 2, capacity), get_oracle("analytic"))
    assert [candidates.options.options[o].table for o in range(3)] == [0, 1, 2]
    pools = movable(candidates, np.arange(3))
    assert all(list(pools[t]) == [t] for t in range(3))
    assembly = Assembly(candidates)
    work = candidates.work
    cap = float(work[0] + work[2]) if capped else None
    found = regroup(assembly, [0, 1], [0, 1, 2], pools, 10.0, cap=cap)
    assert found is not None and found.layout[0][1] != found.layout[1][1]
    assert found.peak == pytest.approx(float(work[0] + work[2]), rel=1e-9)
    _laid_out(assembly, found, list(candidates.binding_tiers))


@examples(20)
@given(tiny_tiered_instances(max_tables=3))
@example(THREE_TINY_TABLES)
def test_pair_balance_plans_are_valid_never_below_the_optimum_and_the_same_for_the_same_seed(instance):
    oracle = get_oracle("analytic")
    optimum = brute_force_over_options(instance, oracle)
    first, second = (run_solver("pair-balance", instance, oracle, QUICK, 0) for _ in range(2))
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
    assert first.lower_bound is not None and first.lower_bound <= optimum * (1 + 1e-9)  # the LP's, or an option bound
    assert first.lower_bound >= lp_bound(Candidates.build(instance, oracle)) * (1 - 1e-9)
    assert first.objective <= first.stats["start_objective"] * (1 + 1e-12)
    assert first.stats["start"] in ("knapsack", "one price", "whole options", "split-greedy")
    assert first.plan == second.plan and first.objective == second.objective


def test_pair_balance_runs_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "instance.json"
    save_instance(THREE_TINY_TABLES, path)
    out = tmp_path / "plan.json"
    assert main(["solve", str(path), "--solver", "pair-balance", "--oracle", "analytic", "--budget", "2",
                 "--output", str(out)]) == 0
    assert "pair-balance" in capsys.readouterr().out
    assert out.exists()


def test_a_round_of_triples_after_the_pairs_failed_skips_the_pairs_until_one_helps(monkeypatch):
    """Handed a layout no pair improves (`pairs_tried`), the first round solves groups of three only; once one
    is kept the layout has changed and the next round tries the pairs again, then the triples."""
    import solvers.balance as balance

    class Layout:
        k = 4

        def costs(self):
            return np.array([3.0, 1.0, 2.0, 0.5])

    solved, keep = [], iter([True])
    monkeypatch.setattr(balance, "try_group", lambda assembly, pools, group, deadline, **_: (
        solved.append(len(group)) or next(keep, False)))
    far = float("inf")
    assert balance.rebalance(Layout(), {}, far, triples=True, pairs_tried=True) == (1 + 6, 1)
    assert solved == [3] + [2, 2, 2, 3, 3, 3]
    solved.clear()
    assert balance.rebalance(Layout(), {}, far, triples=True) == (6, 0)
    assert solved == [2, 2, 2, 3, 3, 3]


@st.composite
def four_device_tiered_instances(draw, types=("table_wise",), most_hbm: float = 0.6, batches=(16,)):
    """Three to six tables on four devices, of sharding `types`, HBM short (a tenth to `most_hbm` of what they
    need), host memory around what they need, a batch among `batches`."""
    n = draw(st.integers(3, 6))
    tables = tuple(make_table(f"t{i}", draw(st.integers(4, 40)), 8, draw(st.floats(0.5, 20.0))) for i in range(n))
    need = sum(t.weight_bytes for t in tables)
    hbm = max(1, int(need * draw(st.floats(0.1, most_hbm))))
    host = max(1, int(need * draw(st.floats(0.5, 2.0))))
    batch = batches[0] if len(batches) == 1 else draw(st.sampled_from(batches))
    return Instance("tiny-tiered-4", tables, Topology(1, 4, hbm, host_memory_bytes=host), Workload(batch_size=batch),
                    sharding_types=types).validate()


# Replicas in the centre over every option, and a centre without them that does less work.
DROPPED_REPLICAS = Instance("tiny-replicas", (make_table("t0", 20, 8, 18.818590311799003),
                                              make_table("t1", 7, 8, 19.80250828152176),
                                              make_table("t2", 15, 8, 5.56305177045124)),
                            Topology(1, 4, 336, host_memory_bytes=336), Workload(batch_size=16),
                            sharding_types=("table_wise", "data_parallel")).validate()


@examples(30)
@given(four_device_tiered_instances(types=("table_wise", "data_parallel"), most_hbm=1.5,
                                     batches=(16, 256, 4096)))
@example(DROPPED_REPLICAS)
def test_the_centre_drops_replicas_exactly_where_that_costs_at_most_the_replica_saving(instance):
    """Where the centre over every option keeps data-parallel replicas, the centre is the one without them if
    that does at most REPLICA_SAVING more work, else the one with them; never more work than that."""
    candidates = Candidates.build(instance, get_oracle("analytic"))
    full = centre_over(candidates, candidates.live, float("inf"), 1.0)
    assume(full is not None)
    got = split_centre(candidates, float("inf"), 1.0)
    work = candidates.work
    assert work[got.chosen].sum() <= work[full.chosen].sum() * (1 + REPLICA_SAVING)
    if not candidates.replicated[full.chosen].any():
        assert (got.chosen == full.chosen).all()
        return
    bare = centre_over(candidates, without_replicas(candidates), float("inf"), 1.0)
    cheap = bare is not None and work[bare.chosen].sum() <= work[full.chosen].sum() * (1 + REPLICA_SAVING)
    assert (got.chosen == (bare if cheap else full).chosen).all()
    if instance is DROPPED_REPLICAS:
        assert cheap and not candidates.replicated[got.chosen].any()


def test_the_replica_saving_is_the_threshold_and_the_relaxation_skips_no_centre_within_it(monkeypatch):
    """With the saving allowed just above what the replica-free centre costs, replicas go (a relaxation that
    overstated its bound by 1 % would skip that centre); just below, they stay."""
    import solvers.balance as balance

    candidates = Candidates.build(DROPPED_REPLICAS, get_oracle("analytic"))
    work = candidates.work
    full = centre_over(candidates, candidates.live, float("inf"), 1.0)
    bare = centre_over(candidates, candidates.live & ~candidates.replicated, float("inf"), 1.0)
    ratio = work[bare.chosen].sum() / work[full.chosen].sum()
    for factor, dropped in ((1 - 1e-6, False), (1 + 1e-6, True)):
        monkeypatch.setattr(balance, "REPLICA_SAVING", ratio * factor - 1)
        got = split_centre(candidates, float("inf"), 1.0)
        assert (not candidates.replicated[got.chosen].any()) == dropped


def _four_device_start(instance):
    """The instance's candidates, centre and balanced start (knapsack choice); None where there is none."""
    candidates = Candidates.build(instance, get_oracle("analytic"))
    centre = split_centre(candidates, float("inf"), 1.0)
    assembly = None if centre is None else balanced_start(candidates, centre, knapsack_choice, float("inf"))
    return None if assembly is None else (candidates, centre, assembly)


def _state(assembly):
    chosen, device = assembly.snapshot()
    return chosen, device, assembly.free.copy(), assembly.costs().astype(float)


def _same_state(a, b):
    return all((x == y).all() for x, y in zip(a[:3], b[:3])) and np.allclose(a[3], b[3], rtol=1e-12, atol=0)


def _fits(assembly):
    return (assembly.free[:, list(assembly.c.binding_tiers)] >= 0).all() and (assembly.chosen >= 0).all()


@examples(20)
@given(four_device_tiered_instances(), st.integers(0, 3))
def test_a_kick_deals_out_only_its_devices_tables_and_leaves_a_layout_that_fits_or_none(instance, seed):
    """A kick moves only tables of the busiest device and the two it draws, and ends with every table placed
    once within every binding memory tier; where it finds no layout the assembly is as it was, memory and
    costs included; the same seed deals the same way."""
    layouts = []
    for _ in range(2):
        started = _four_device_start(instance)
        assume(started is not None)
        candidates, centre, assembly = started
        before = {t: int(assembly.device[candidates.members(int(assembly.chosen[t]))[0]]) for t in centre.pools}
        state, busiest = _state(assembly), int(np.argmax(assembly.costs()))
        drawn = np.random.default_rng(seed).choice([d for d in range(4) if d != busiest], 2, replace=False)
        if not kick(assembly, centre.pools, np.random.default_rng(seed), float("inf")):
            assert _same_state(_state(assembly), state)
            return
        after = {t: int(assembly.device[candidates.members(int(assembly.chosen[t]))[0]]) for t in centre.pools}
        moved = {d for t in centre.pools if after[t] != before[t] for d in (after[t], before[t])}
        assert moved <= {busiest, *map(int, drawn)}
        assert _fits(assembly)
        layouts.append(assembly.snapshot())
    assert all((a == b).all() for a, b in zip(*layouts))


def test_a_kick_that_fails_on_a_later_device_puts_back_what_it_had_placed(monkeypatch):
    """Where the second device of a kick finds no layout, the tables the first one took are taken out again and
    every table goes back where it was: the same options, devices, free memory and costs."""
    import solvers.balance as balance

    tables = tuple(make_table(f"t{i}", 40, 8, 2.0 + i) for i in range(8))
    need = sum(t.weight_bytes for t in tables)
    instance = Instance("tiny-tiered-4", tables, Topology(1, 4, need // 2, host_memory_bytes=need),
                        Workload(batch_size=16), sharding_types=("table_wise",)).validate()
    started = _four_device_start(instance)
    assert started is not None
    candidates, centre, assembly = started
    state = _state(assembly)
    real, calls = balance.regroup, []

    def second_fails(*args, **kwargs):
        calls.append(args[1])
        return None if len(calls) == 2 else real(*args, **kwargs)

    monkeypatch.setattr(balance, "regroup", second_fails)
    seed = next(s for s in range(50) if _deals_to_two_devices(assembly, centre.pools, s))
    assert not kick(assembly, centre.pools, np.random.default_rng(seed), float("inf"))
    assert len(calls) == 2 and _same_state(_state(assembly), state)


def _deals_to_two_devices(assembly, pools, seed):
    """Whether a kick with this seed gives tables to at least two of its devices (drawn as `kick` draws)."""
    import solvers.balance as balance

    rng = np.random.default_rng(seed)
    busiest = int(np.argmax(assembly.costs()))
    devices = [busiest, *map(int, rng.choice([d for d in range(assembly.k) if d != busiest], 2, replace=False))]
    tables = balance._on(assembly, pools, devices)
    return len({devices[int(rng.integers(3))] for _ in tables}) >= 2


@examples(10)
@given(four_device_tiered_instances(), st.integers(0, 3))
def test_kicks_never_end_higher_keep_a_layout_that_fits_and_follow_the_seed(instance, seed):
    """From a settled start, kicks end no higher than it, within every tier; where none is kept the layout is
    the start's; the same seed gives the same layout."""
    from solvers.balance import kicks, settle

    ends = []
    for _ in range(2):
        started = _four_device_start(instance)
        assume(started is not None)
        candidates, centre, assembly = started
        settle(assembly, centre.pools, float("inf"))
        state, peak = _state(assembly), assembly.objective()
        stats = kicks(assembly, centre.pools, np.random.default_rng(seed), float("inf"), max_rounds=6)
        # A layout restored after a fruitless kick has its loads summed again in another order: equal up to
        # float rounding, not bit for bit.
        assert stats["kicks"] <= 6 and assembly.objective() <= peak * (1 + 1e-12)
        assert _fits(assembly)
        if not stats["kicks_kept"]:
            assert _same_state(_state(assembly), state)
        ends.append(assembly.snapshot())
    assert all((a == b).all() for a, b in zip(*ends))


@examples(10)
@given(four_device_tiered_instances(), st.sampled_from([None, 1]))
def test_a_settled_layout_is_settled_again_from_its_memo_without_a_solve_and_a_fresh_settle_agrees(instance, nodes):
    """Settled with a memo of the group states that ended without gain by their own limits (optimal, or
    after `nodes` branch-and-bound nodes), settling again with it solves no MILP; settling again without it,
    every group solved afresh, keeps the same layout: the memo only spares solves whose answer is known."""
    from unittest import mock

    import solvers.balance as balance

    started = _four_device_start(instance)
    assume(started is not None)
    _, centre, assembly = started
    spent = set()
    limits = balance.group_limits
    try:
        if nodes is not None:
            mock.patch.object(balance, "group_limits",
                              lambda devices, deadline: (limits(devices, deadline)[0], nodes)).start()
        balance.settle(assembly, centre.pools, float("inf"), spent)
        settled = _state(assembly)
        with mock.patch.object(balance, "regroup", wraps=balance.regroup) as solves:
            balance.settle(assembly, centre.pools, float("inf"), spent)
            assert solves.call_count == 0
            balance.settle(assembly, centre.pools, float("inf"))
            assert solves.call_count > 0 or not any(centre.pools)
    finally:
        mock.patch.stopall()
    assert _same_state(_state(assembly), settled)


@examples(30)
@given(tiny_tiered_instances(max_tables=3), st.floats(0.0, 1.2))
@example(THREE_TINY_TABLES, 0.5)
def test_a_hull_fit_is_the_work_of_pool_options_that_fit_and_no_less_than_the_least_that_fit(instance, share):
    """Over every choice of one pool option per table (brute force): the fit is infinite exactly where none
    fits the room, else no less than the least work of those that fit and the work of one of them."""
    assembly, pools, tables, _ = _pair_layouts(instance)
    candidates = assembly.c
    hbm = candidates.total_storage[:, 0].astype(float)
    room = share * sum(float(hbm[pools[t]].max()) for t in tables)
    fitting = sorted(sum(float(candidates.work[o]) for o in combo)
                     for combo in itertools.product(*[pools[t] for t in tables])
                     if sum(hbm[o] for o in combo) <= room)
    got = HullFit(candidates, pools).work(tables, room)
    if not fitting:
        assert got == np.inf
        return
    assert got >= fitting[0] * (1 - 1e-9)
    assert any(w == pytest.approx(got, rel=1e-9, abs=1e-12) for w in fitting)


@examples(25)
@given(four_device_tiered_instances(most_hbm=1.0))
def test_levelling_keeps_every_table_once_and_never_raises_the_busiest_devices_fit(instance):
    """`level` moves tables between devices only: the same tables, each on one device, the assembly untouched;
    the busiest device's `HullFit` load no higher than the spread's; the same layout every time; nothing
    changed once its deadline has passed or where a tier besides HBM may bind."""
    candidates = Candidates.build(instance, get_oracle("analytic"))
    centre = split_centre(candidates, float("inf"), 1.0)
    assume(centre is not None)
    assembly = with_splits(candidates, centre.chosen, centre.pools)
    assume(assembly is not None)
    where = spread(assembly, knapsack_choice(centre, assembly))
    free, costs = assembly.free.copy(), assembly.costs().copy()
    levelled = level(assembly, where, centre.pools, float("inf"))
    assert (assembly.free == free).all() and (assembly.costs() == costs).all()
    assert sorted(levelled) == sorted(where) and set(levelled.values()) <= set(range(assembly.k))
    assert level(assembly, where, centre.pools, float("inf")) == levelled
    assert level(assembly, where, centre.pools, 0.0) == where
    if candidates.binding_tiers != (0,):
        assert levelled == where
        return
    fit = HullFit(candidates, centre.pools)

    def busiest(layout):
        return max(costs[d] + fit.work([t for t in layout if layout[t] == d], assembly.free[d, 0])
                   for d in range(assembly.k))

    assert busiest(levelled) <= busiest(where) * (1 + 1e-12)


@examples(40)
@given(four_device_tiered_instances(most_hbm=1.0))
def test_levelling_moves_tables_off_a_device_they_overfill_even_where_no_single_move_makes_it_fit(instance):
    """Every table piled on one device that their leanest options overfill: where some table's leanest option
    fits another device's room, levelling ends with less overfilled (an overfull device weighs more the more it
    overfills, not infinitely: a move that leaves it overfull still counts)."""
    candidates = Candidates.build(instance, get_oracle("analytic"))
    assume(candidates.binding_tiers == (0,))
    centre = split_centre(candidates, float("inf"), 1.0)
    assume(centre is not None)
    assembly = with_splits(candidates, centre.chosen, centre.pools)
    assume(assembly is not None)
    fit, room = HullFit(candidates, centre.pools), assembly.free[:, 0].astype(float)

    def overfilled(layout):
        return sum(fit.short([t for t in layout if layout[t] == d], room[d]) for d in range(assembly.k))

    piled = {t: 0 for t in centre.pools}
    assume(overfilled(piled) > 0)
    assume(any(fit.lean_hbm[t] <= room[d] for t in piled for d in range(1, assembly.k)))
    assert overfilled(level(assembly, piled, centre.pools, float("inf"))) < overfilled(piled)


def test_highs_prints_nothing_on_the_commands_stdout_and_what_python_printed_before_goes_out(capfd, monkeypatch):
    """HiGHS 1.12 prints a debug line on the process's stdout when it repairs a solution (a pair MILP in
    `plan` printed 79): whatever a group's solve writes to file descriptor 1 or C's stdio is dropped."""
    import ctypes
    import os

    import highspy
    from scipy.sparse import csr_matrix

    from solvers.balance import _highs

    real = highspy.Highs.run

    def noisy(self):
        os.write(1, b"raw line\n")
        ctypes.CDLL(None).printf(b"buffered line\n")
        return real(self)

    monkeypatch.setattr(highspy.Highs, "run", noisy)
    print("before", end="")
    x, ending = _highs(np.array([1.0]), csr_matrix(np.array([[1.0]])), [1.0], [1.0], np.array([2.0]), 1, 5.0, None)
    print("after")
    ctypes.CDLL(None).fflush(None)  # what C still buffered would show here
    assert x is not None and ending == "optimal" and x[0] == pytest.approx(1.0)
    assert capfd.readouterr().out == "beforeafter\n"


@examples(20)
@given(four_device_tiered_instances(types=("table_wise", "row_wise", "table_row_wise"), most_hbm=1.0))
def test_a_split_leaves_every_other_table_on_its_device_within_memory_or_changes_nothing(instance):
    """Each table `split_choices` names takes more than BIG_SHARE of a device's HBM (those first, most first),
    or is the lightest device's largest in HBM or in work where that device is more than LIGHT_SHARE below
    the others' mean; it comes in its least-work option of several pieces none of which takes more HBM than
    its one piece. `split_one` puts it in that option and every other movable table on the device it was on,
    all within every binding tier, the pools without it — or, finding no room, leaves the assembly as it was."""
    from solvers.balance import BIG_SHARE, LIGHT_SHARE, split_choices, split_one

    started = _four_device_start(instance)
    assume(started is not None)
    candidates, centre, assembly = started
    lightest = int(np.argmin(assembly.costs()))
    device_of = {t: int(assembly.device[candidates.members(int(assembly.chosen[t]))[0]]) for t in centre.pools}
    hbm = candidates.total_storage[:, 0]
    mine = [t for t, d in device_of.items() if d == lightest]
    costs = assembly.costs()
    light = costs[lightest] < (1 - LIGHT_SHARE) * np.delete(costs, lightest).mean()
    big = [hbm[assembly.chosen[t]] > BIG_SHARE * instance.topology.memory_bytes for t in centre.pools]
    choices = split_choices(assembly, centre.pools)
    shares = [hbm[assembly.chosen[t]] for t, _ in choices]
    for i, (table, option) in enumerate(choices):
        assert candidates.options.options[option].parts > 1
        now = int(assembly.chosen[table])
        assert candidates.storage[candidates.members(option), 0].max() <= hbm[now]
        splits = [o for o in candidates.by_table[table] if candidates.live[o]
                  and candidates.options.options[o].parts > 1
                  and candidates.storage[candidates.members(int(o)), 0].max() <= hbm[now]]
        assert candidates.work[option] == min(candidates.work[o] for o in splits)
        if hbm[now] > BIG_SHARE * instance.topology.memory_bytes:
            assert shares[:i + 1] == sorted(shares[:i + 1], reverse=True)
            continue
        assert light and table in mine
        assert hbm[now] == max(hbm[assembly.chosen[t]] for t in mine) or \
            candidates.work[now] == max(candidates.work[assembly.chosen[t]] for t in mine)
    if not light and not any(big):
        assert choices == []
    for table, option in choices:
        state = _state(assembly)
        rest = split_one(assembly, centre.pools, table, option, float("inf"))
        if rest is None:
            assert _same_state(_state(assembly), state)
            continue
        assert set(rest) == set(centre.pools) - {table} and assembly.chosen[table] == option
        assert all(int(assembly.device[candidates.members(int(assembly.chosen[t]))[0]]) == device_of[t] for t in rest)
        assert _fits(assembly)
        assert (assembly.free >= 0).all()
        return


def test_a_start_has_a_table_split_exactly_where_its_lightest_device_is_below_the_share(monkeypatch):
    """With no table taken as big (BIG_SHARE infinite), `split_start` splits nothing where the lightest device
    is within LIGHT_SHARE of the others' mean, and splits where it is below: the threshold is the rule, tried
    on both sides of one start's ratio; with BIG_SHARE just below the largest table's share of a device's
    HBM, that table is split whatever the ratio."""
    import solvers.balance as balance

    tables = (make_table("big", 400, 8, 0.5),) + tuple(make_table(f"t{i}", 40, 8, 4.0 + i) for i in range(7))
    need = sum(t.weight_bytes for t in tables)
    instance = Instance("tiny-tiered-4", tables, Topology(1, 4, need // 3, host_memory_bytes=2 * need),
                        Workload(batch_size=16), sharding_types=("table_wise", "row_wise")).validate()
    started = _four_device_start(instance)
    assert started is not None
    candidates, centre, assembly = started
    costs = assembly.costs()
    lightest = int(np.argmin(costs))
    ratio = costs[lightest] / np.delete(costs, lightest).mean()
    hbm = candidates.total_storage[:, 0]
    largest = max(centre.pools, key=lambda t: hbm[assembly.chosen[t]])
    share = hbm[assembly.chosen[largest]] / instance.topology.memory_bytes
    cases = ((1 - ratio * (1 - 1e-9), np.inf, None),
             (1 - ratio * (1 + 1e-9), np.inf, "any"),
             (1 - ratio * (1 - 1e-9), share * (1 - 1e-9), largest))
    for light, big, split in cases:
        monkeypatch.setattr(balance, "LIGHT_SHARE", light)
        monkeypatch.setattr(balance, "BIG_SHARE", big)
        trial = Assembly(candidates)
        trial.load(*assembly.snapshot())
        pools = balance.split_start(trial, centre.pools, float("inf"))
        assert (pools is centre.pools) == (split is None)
        if split not in (None, "any"):
            assert set(centre.pools) - set(pools) == {split}


# A start whose lightest device stays light: its table of six rows at pooling 14.5 does much of its work.
ONE_LIGHT_DEVICE = Instance("tiny-tiered-4", tuple(make_table(f"t{i}", rows, 8, pooling) for i, (rows, pooling) in
                                                   enumerate([(118, 1.312), (6, 14.517), (14, 9.191), (36, 13.724),
                                                              (38, 16.729), (44, 16.057)])),
                            Topology(1, 4, 1566, host_memory_bytes=8192), Workload(batch_size=16),
                            sharding_types=("table_wise", "row_wise")).validate()


@examples(15)
@given(four_device_tiered_instances(types=("table_wise", "row_wise", "table_row_wise"), most_hbm=1.0))
@example(ONE_LIGHT_DEVICE)
def test_a_settled_start_ends_no_higher_than_it_split_or_not(instance):
    """Split or not, a settled start ends no higher than the start and within every tier; its pools are the
    start's, or the start's without the one table it split, which then sits in an option of several pieces."""
    from solvers.balance import settle_start

    started = _four_device_start(instance)
    assume(started is not None)
    candidates, centre, assembly = started
    peak = assembly.objective()
    pools, spent, run = settle_start(assembly, centre.pools, float("inf"))
    assert assembly.objective() <= peak * (1 + 1e-12) and _fits(assembly)
    if pools is centre.pools:
        assert "split" not in run
        return
    assert run["split"] == sorted(set(centre.pools) - set(pools)) and len(run["split"]) == 1
    assert candidates.options.options[int(assembly.chosen[run["split"][0]])].parts > 1


def test_splitting_a_table_of_a_device_left_light_settles_lower_than_the_start_settled_as_it_was(monkeypatch):
    """The light device's work-heavy table split row-wise over the four devices, the settled layout ends lower
    than the same start settled without it (LIGHT_SHARE 1, BIG_SHARE infinite: nothing is split)."""
    import solvers.balance as balance

    ends = []
    for share, big in ((balance.LIGHT_SHARE, balance.BIG_SHARE), (1.0, np.inf)):
        monkeypatch.setattr(balance, "LIGHT_SHARE", share)
        monkeypatch.setattr(balance, "BIG_SHARE", big)
        _, centre, assembly = _four_device_start(ONE_LIGHT_DEVICE)
        _, _, run = balance.settle_start(assembly, centre.pools, float("inf"))
        ends.append((assembly.objective(), run.get("split")))
    (split, which), (whole, none) = ends
    assert which == [1] and none is None
    assert split < whole * (1 - 0.05)


def _tiny_settled_above_optimum():
    return Instance("tiny-tiered", (make_table("t0", 36, 8, 8.655225245639924),
                                    make_table("t1", 25, 8, 18.75317730814916), make_table("t2", 30, 8, 0.75)),
                    Topology(1, 2, 291, host_memory_bytes=792), Workload(batch_size=16),
                    sharding_types=("table_wise", "row_wise")).validate()


def test_the_time_the_groups_leave_goes_to_local_search_with_option_changes(monkeypatch):
    # Three tiny tables on two devices, HBM short: the groups and kicks settle 6 % above the optimum (brute
    # force) with rounds left; the iterated local search from their plan reaches it.
    import solvers.balance as balance

    instance = _tiny_settled_above_optimum()
    oracle = get_oracle("analytic")
    optimum = brute_force_over_options(instance, oracle)
    searched = run_solver("pair-balance", instance, oracle, QUICK, 0)
    assert searched.objective == pytest.approx(optimum, rel=1e-9)
    assert searched.stats["search"]["kicks"] >= 1
    monkeypatch.setattr(balance, "improve", lambda assembly, *args: {"steps": 0, "kicks": 0})
    settled = run_solver("pair-balance", instance, oracle, QUICK, 0)
    assert settled.objective > optimum * 1.05


@pytest.mark.parametrize("balanced", [True, False])
def test_kicks_come_back_after_a_local_search_slice_that_gains_nothing_from_a_balanced_start_only(monkeypatch, balanced):
    """Without a round cap, from a balanced start the local search after the fruitless kicks has a slice of the
    budget at a time, and kicks come back after a slice that gains nothing; from any other start (or with a
    round cap) it has the time left at once, as where split tables do the work."""
    import time

    import solvers.balance as balance
    from solvers.base import Budget

    calls = []

    def improve(assembly, until, seed, *args):
        calls.append(("search", until, seed))
        return {"steps": 1, "kicks": 0}

    def kicks(assembly, pools, rng, deadline, *args):
        calls.append(("kicks", deadline, None))
        return {"kicks": 1, "kicks_kept": 0}

    monkeypatch.setattr(balance, "improve", improve)
    monkeypatch.setattr(balance, "kicks", kicks)
    if not balanced:
        monkeypatch.setattr(balance, "STARTS", ())
    budget = Budget(0.5)
    began = time.monotonic()
    result = run_solver("pair-balance", _tiny_settled_above_optimum(), get_oracle("analytic"), budget, 0)
    assert (result.stats["start"] in ("knapsack", "one price")) == balanced and calls[0][0] == "kicks"
    searches = [c for c in calls if c[0] == "search"]
    deadline = began + budget.time_limit
    if balanced:
        assert len(searches) >= 2 and [c[0] for c in calls[:4]] == ["kicks", "search", "kicks", "search"]
        assert all(until <= deadline + 0.05 for _, until, _ in searches)
        assert [seed for _, _, seed in searches] == list(range(len(searches)))
        assert result.stats["kicks"] == len(calls) - len(searches)
    else:
        assert len(searches) == 1 and searches[0][1] >= deadline - 0.05


@examples(15)
@given(tiny_tiered_instances(max_tables=3))
@example(THREE_TINY_TABLES)
def test_without_a_balanced_start_the_search_starts_from_the_whole_option_bounds_choice(instance):
    """Where no balanced start finds room, the start is the choice of the bound with whole options, each table
    in its option where that finds room (a leaner one where not), every table placed within every tier; else
    split-greedy's plan."""
    from solvers.balance import unbalanced_start
    from solvers.bounds import integral_choice
    from solvers.candidates import Problem

    problem = Problem(instance, get_oracle("analytic"))
    chosen = integral_choice(problem.candidates, 10.0)
    name, start = unbalanced_start(problem, float("inf"), 10.0)
    if chosen is None:
        assert name == "split-greedy"
        return
    assert name in ("whole options", "split-greedy")
    # Built in the same order with no option but the chosen one, where every table finds room the start is
    # the choice itself; a table that found none took a leaner option, or the start is split-greedy's.
    candidates = problem.candidates
    only_chosen = np.zeros(candidates.live.size, dtype=bool)
    only_chosen[chosen] = True
    fits = isinstance(construct(candidates.restricted(only_chosen), order_by_cost(candidates.biggest[chosen]),
                                chosen, option_weight(candidates)), Assembly)
    if name == "split-greedy":
        assert not fits
        return
    assert (start.chosen >= 0).all()
    assert (start.plan().storage_per_device(instance) <= instance.topology.capacity.as_array()).all()
    assert (start.chosen == chosen).all() or not fits


def test_both_starts_are_built_and_the_lower_is_settled_first(monkeypatch):
    """With the finer load factors of a longer budget one settle can take the whole budget, so the first settled
    is often the only one: whichever order the starts are listed in, the lower goes first. On these six tables
    the one-price start lies 7 % below the knapsack's."""
    import solvers.balance as balance

    instance = Instance("tiny-tiered", tuple(make_table(f"t{i}", rows, 8, pooling) for i, (rows, pooling) in enumerate(
        [(40, 14.06), (27, 10.08), (41, 7.67), (40, 5.21), (21, 12.31), (21, 14.91)])),
        Topology(1, 3, 437, host_memory_bytes=4560), Workload(batch_size=16)).validate()
    built, settled = [], []
    build, settle = balance.balanced_start, balance.settle_start

    def built_start(*args, **kwargs):
        assembly = build(*args, **kwargs)
        built.append(None if assembly is None else assembly.objective())
        return assembly

    def settled_start(assembly, *args):
        settled.append(assembly.objective())
        return settle(assembly, *args)

    monkeypatch.setattr(balance, "balanced_start", built_start)
    monkeypatch.setattr(balance, "settle_start", settled_start)
    for order in (balance.STARTS, balance.STARTS[::-1]):
        built.clear(), settled.clear()
        monkeypatch.setattr(balance, "STARTS", order)
        result = run_solver("pair-balance", instance, get_oracle("analytic"), QUICK, 0)
        assert len(built) == 2 and None not in built and min(built) < max(built) * 0.95
        assert settled[0] == min(built) and result.stats["start_objective"] == min(built)
        assert result.stats["starts_built"] == 2 and result.objective <= min(built) * (1 + 1e-12)
