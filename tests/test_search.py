"""Local search's moves over memory tiers: the options its changes and kicks try (each table's lower convex
hull of (HBM, work) per cut), and the trades of HBM between two tables that no single option change can
make; and re-tiering a device (its tables' kernels and caches re-chosen as a knapsack over its HBM), alone or with
a table moved or swapped."""
import copy
import itertools
import time

import numpy as np
import pytest
from conftest import examples, make_table
from hypothesis import given
from hypothesis import strategies as st

from costmodels import get_oracle
from instances import Instance, Topology, Workload, load_instances
from instances.kernels import FUSED, FUSED_UVM_CACHING
from instances.memory import HBM
from solvers.assembly import Assembly, Stuck, Trial
from solvers.candidates import Candidates
from solvers.choice import on_lower_hull, option_weight
from solvers.retier import Retier
from solvers.search import COST_NOISE, _at_share, _choices, _Search, improve, split_greedy


def _beaten(points: list[tuple[int, int]], m: int, c: int) -> bool:
    """Brute force: some point takes no more memory for less cost, or a chord between two points passes
    strictly below (m, c) (exact in integers)."""
    if any(mi <= m and ci < c for mi, ci in points):
        return True
    return any(mi < m < mj and (c - ci) * (mj - mi) > (cj - ci) * (m - mi)
               for mi, ci in points for mj, cj in points)


@examples(200)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), min_size=1, max_size=12))
def test_the_lower_hull_keeps_exactly_what_no_point_or_mix_of_two_beats(points):
    memory, cost = (np.array(column) for column in zip(*points))
    kept = on_lower_hull(memory, cost)
    assert kept.tolist() == [not _beaten(points, m, c) for m, c in points]
    # The leanest point that is cheapest for its memory, and the cheapest that is leanest, are vertices.
    assert kept[np.lexsort((cost, memory))[0]] and kept[np.lexsort((memory, cost))[0]]


def test_the_lower_hull_of_a_small_set():
    # Vertices (0, 10), (5, 4), (10, 0); (3, 8) lies above the chord (0, 10)-(5, 4) (6.4 there), (7, 3)
    # above (5, 4)-(10, 0) (2.4 there); (12, 0) is on the flat part beyond the cheapest point, (12, 1)
    # above it; the repeated (5, 4) is on the hull as well.
    points = [(0, 10), (10, 0), (5, 4), (3, 8), (7, 3), (12, 0), (12, 1), (5, 4)]
    memory, cost = (np.array(column) for column in zip(*points))
    assert on_lower_hull(memory, cost).tolist() == [True, True, True, False, False, True, False, True]


def _tiered_candidates() -> Candidates:
    instance = sorted(load_instances("instances/sets/workloads-tiers-n40-k4-hbm0.5"), key=lambda i: i.id)[0]
    return Candidates.build(instance, get_oracle("analytic"))


def test_search_options_are_each_cuts_hull_and_keep_its_ends():
    candidates = _tiered_candidates()
    hbm, weight = candidates.total_storage[:, HBM], option_weight(candidates)
    pruned = 0
    for ids, kept in zip(candidates.by_table, candidates.search_options):
        assert set(kept.tolist()) <= set(ids.tolist())
        for layout in np.unique(candidates.layout[ids]):
            same = ids[candidates.layout[ids] == layout]
            mine = set(kept[candidates.layout[kept] == layout].tolist())
            assert mine == set(same[on_lower_hull(hbm[same], weight[same])].tolist())
            # The cut's leanest option and its cheapest are always tried.
            assert int(same[np.lexsort((weight[same], hbm[same]))[0]]) in mine
            assert int(same[np.lexsort((hbm[same], weight[same]))[0]]) in mine
            pruned += same.size - len(mine)
    assert pruned > 0  # the tiers task has cache sizes above the hull


def _trade_instance() -> Instance:
    """One device with HBM for one table in full and the other's smallest cache: a hot table cached, a cold
    one in HBM, where the best plan swaps them."""
    tables = (make_table("hot", 2000, 16, 40.0), make_table("cold", 2000, 16, 0.5))
    need = sum(t.weight_bytes for t in tables)
    return Instance("trade", tables, Topology(1, 1, 76_800, host_memory_bytes=4 * need), Workload(batch_size=64),
                    sharding_types=("table_wise",)).validate()


def _option(candidates: Candidates, table: int, kernel: str, load_factor: float | None = None) -> int:
    return next(int(o) for o in candidates.by_table[table] if candidates.options.options[o].kernel == kernel
                and candidates.options.options[o].load_factor == load_factor)


def test_a_trade_of_hbm_improves_where_no_single_option_change_fits():
    candidates = Candidates.build(_trade_instance(), get_oracle("analytic"))
    assembly = Assembly(candidates)
    smallest = min(candidates.options.options[o].load_factor for o in candidates.by_table[0]
                   if candidates.options.options[o].kernel == FUSED_UVM_CACHING)
    assembly.put(_option(candidates, 0, FUSED_UVM_CACHING, smallest), np.array([0]))
    assembly.put(_option(candidates, 1, FUSED), np.array([0]))
    assert assembly.free[0, HBM] == 0
    before = assembly.objective()
    search = _Search(assembly, changes=True)
    for table in (0, 1):  # no single option change fits and lowers the device
        value, _ = search.best_option_change(table)
        assert value >= before
    step = search.best_step()
    assert step is not None and step[0] == "trade"
    search.apply(step)
    assert assembly.objective() < before / 2
    assert (assembly.free >= 0).all()
    assert candidates.options.options[int(assembly.chosen[0])].kernel == FUSED
    assert candidates.options.options[int(assembly.chosen[1])].kernel == FUSED_UVM_CACHING
    assert assembly.plan().validate(candidates.instance)


def test_the_search_on_a_tiered_task_is_a_function_of_its_seed():
    candidates = _tiered_candidates()

    def searched(seed: int):
        start = split_greedy(candidates)
        stats = improve(start, np.inf, seed, max_rounds=30, changes=True)
        assert stats["kicks"] == 30  # every round runs without a deadline (then one re-tiering descent)
        return start.snapshot()

    first, again = searched(3), searched(3)
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])


@examples(4)
@given(st.integers(0, 2**16))
def test_an_option_change_screened_by_its_floor_is_the_best_change_fitting_every_option_finds(seed):
    search = _Search(split_greedy(_tiered_candidates()), changes=True)
    search.kick(np.random.default_rng(seed), 12)
    a = search.a
    fits, fitted = a.fit, [0, 0]  # fits by the screened change, and by brute force

    def counted(option):
        fitted[0] += 1
        return fits(option)

    for table in range(a.chosen.size):
        a.fit = counted
        value, trial = search.best_option_change(table)
        a.fit = fits
        old, devices = a.take(table)
        found = []  # brute force: every other option fitted, in order
        for option in search.options[table]:
            each = a.fit(int(option)) if option != old else None
            fitted[1] += option != old
            if isinstance(each, Trial):
                found.append((float(each.costs[np.union1d(devices, each.devices)].max()), int(option)))
        a.put(old, devices)
        if not found:
            assert trial is None
            continue
        least = min(v for v, _ in found)
        assert value == pytest.approx(least, rel=COST_NOISE)
        assert trial.option == next(o for v, o in found if v <= least * (1 + COST_NOISE))
    assert fitted[0] < fitted[1]  # the floor spared fits


def _one_device(rows: list[int], poolings: list[float]) -> Assembly:
    """Tables on one device with host memory for all of them, each placed in its leanest option."""
    tables = tuple(make_table(f"t{i}", r, 16, p) for i, (r, p) in enumerate(zip(rows, poolings)))
    need = sum(t.weight_bytes for t in tables)
    instance = Instance("retier", tables, Topology(1, 1, 4 * need, host_memory_bytes=8 * need), Workload(batch_size=64),
                        sharding_types=("table_wise",)).validate()
    assembly = Assembly(Candidates.build(instance, get_oracle("analytic")))
    for table, ids in enumerate(assembly.c.by_table):
        assembly.put(int(ids[np.argmin(assembly.c.total_storage[ids, HBM])]), np.array([0]))
    return assembly


@examples(60)
@given(st.lists(st.tuples(st.integers(200, 3000), st.floats(0.5, 40.0)), min_size=1, max_size=3),
       st.floats(0.0, 1.0))
def test_a_devices_re_tiering_is_the_cheapest_choice_that_fits(specs, share):
    assembly = _one_device([r for r, _ in specs], [p for _, p in specs])
    retier = Retier(assembly)
    tables = list(range(len(specs)))
    free = assembly.free[0] + retier.need[assembly.chosen].sum(axis=0)
    budget = int(share * free[HBM])
    limit = free.copy()
    limit[HBM] = budget
    found = retier.pick(retier.front(tables, budget), limit)
    variants = [retier.variants[int(assembly.c.layout[int(assembly.chosen[t])])] for t in tables]
    fitting = [sum(retier.cost[o] for o in combo) for combo in itertools.product(*variants)
               if (retier.need[list(combo)].sum(axis=0) <= limit).all()]
    if not fitting:
        assert found is None
        return
    assert found is not None and np.isclose(found[0], min(fitting), rtol=1e-12)
    assert [t for t, _ in found[1]] == tables
    assert np.isclose(sum(retier.cost[o] for _, o in found[1]), found[0], rtol=1e-12)
    assert (retier.need[[o for _, o in found[1]]].sum(axis=0) <= limit).all()


def test_a_re_tiering_step_lowers_the_busiest_device_where_plain_steps_cannot():
    # Under TorchRec's estimator, which prices host memory dearly, the first tiers task's local optimum of
    # plain steps still leaves a re-tiering step (under `analytic` the plain steps already get there).
    instance = sorted(load_instances("instances/sets/workloads-tiers-n40-k4-hbm0.5"), key=lambda i: i.id)[0]
    candidates = Candidates.build(instance, get_oracle("torchrec"))
    assembly = split_greedy(candidates)
    search = _Search(assembly, changes=True)
    search.descend(np.inf)
    assert search.best_step() is None  # a local optimum of moves, swaps, option changes and trades
    before = assembly.objective()
    found = search.retier.best_step(before)
    assert found is not None
    value, changes = found
    search.apply(("retier", changes, None))
    assert np.isclose(assembly.objective(), value, rtol=1e-9) or assembly.objective() < value
    assert assembly.objective() <= before and (assembly.free >= 0).all()
    assert assembly.plan().validate(candidates.instance)


def _past_deadline_plans(oracle: str):
    """split-greedy's plan past its deadline on the first HBM-0.25 tiers task, and its first three choices'
    plans (the two floors, then the first over every option), each unrefined."""
    instance = sorted(load_instances("instances/sets/workloads-tiers-n40-k4-hbm0.25"), key=lambda i: i.id)[0]
    candidates = Candidates.build(instance, get_oracle(oracle))
    found = split_greedy(candidates, deadline=time.monotonic())
    assert isinstance(found, Assembly) and found.plan().validate(instance)
    weight = option_weight(candidates)
    choices = _choices(candidates, True, weight)
    assert [c.allowed is None for c in choices[:3]] == [False, False, True]
    return found, [_at_share(candidates, True, time.monotonic(), weight, choice) for choice in choices[:3]]


def test_past_its_deadline_split_greedy_goes_past_a_dead_end_floor():
    # By TorchRec's storage count the HBM-only floor is a dead end at HBM a quarter of the need.
    found, plans = _past_deadline_plans("torchrec")
    assert isinstance(plans[0], Stuck) and all(isinstance(p, Assembly) for p in plans[1:])
    assert found.objective() <= min(p.objective() for p in plans[1:]) * (1 + 1e-12)


def test_past_its_deadline_split_greedy_builds_a_plan_over_every_option():
    # Under `analytic` both floors plan, and the first choice over every option is far better than either.
    found, plans = _past_deadline_plans("analytic")
    assert all(isinstance(p, Assembly) for p in plans)
    floors = min(p.objective() for p in plans[:2])
    assert found.objective() <= plans[2].objective() * (1 + 1e-12) < floors / 2


def _node_by_node(assembly: Assembly, members: np.ndarray, place):
    """A node option's fit the plain way, for a cross-check: every node in turn, its pieces where
    `place(node)` puts them (or why they find no room), the first node whose busiest touched device ends
    lowest among those with room, else why the first node short of room has none."""
    best, stuck = None, None
    need = assembly.memory[members]
    for node in range(assembly.k // assembly.per_node):
        devices = place(node)
        if isinstance(devices, Stuck):
            stuck = stuck or devices
            continue
        free = assembly.free.copy()
        np.subtract.at(free, devices, need)
        short = np.flatnonzero((free[devices] < 0).any(axis=1))
        if short.size:
            p = int(short[0])
            tier = int(np.argmax(assembly.free[devices[p]] < need[p]))
            stuck = stuck or Stuck(int(members[p]), int(need[p, tier]), int(assembly.free[devices[p], tier]), tier)
            continue
        costs = assembly.state.costs_with(members, devices)
        if best is None or costs[devices].max() < best[1][best[0]].max():
            best = (devices, costs)
    return best if best is not None else stuck


@examples(30)
@given(st.lists(st.tuples(st.integers(50, 3000), st.sampled_from([64, 128, 256]), st.floats(0.5, 30.0)),
                min_size=2, max_size=6), st.integers(2, 3), st.floats(0.3, 2.0), st.randoms(use_true_random=False))
def test_a_node_option_goes_where_the_node_by_node_search_puts_it(specs, nodes, room, rng):
    # The node options' fit is vectorised over nodes; the plain loop over nodes is its reference.
    tables = tuple(make_table(f"t{i}", rows, dim, pooling) for i, (rows, dim, pooling) in enumerate(specs))
    per_node = 2
    capacity = int(room * sum(t.weight_bytes for t in tables) / (nodes * per_node)) + 1
    instance = Instance("nodes", tables, Topology(nodes, per_node, capacity), Workload(batch_size=64),
                        sharding_types=("table_wise", "table_row_wise", "table_column_wise", "grid_shard")).validate()
    candidates = Candidates.build(instance, get_oracle("analytic"))
    assembly = Assembly(candidates)
    for table, ids in enumerate(candidates.by_table[1:], start=1):  # some placed whole: uneven loads and room
        whole = [int(o) for o in ids if candidates.placement(int(o)) == "free"]
        device = np.array([rng.randrange(assembly.k)])
        if whole and rng.random() < 0.5 and (assembly.free[device] >= assembly.memory[candidates.members(whole[0])]
                                             ).all():
            assembly.put(whole[0], device)
    checked = {"node": 0, "node_free": 0}
    for option in range(len(candidates.options.options)):
        placement = candidates.placement(option)
        if assembly.chosen[candidates.options.options[option].table] >= 0 or placement not in checked:
            continue
        members = candidates.members(option)
        plain = copy.deepcopy(assembly)  # a spread's add and undo may leave float noise in the state it runs on
        if placement == "node":
            local = candidates.options.pin[members]
            expected = _node_by_node(plain, members, lambda node: node * per_node + local)
        else:
            expected = _node_by_node(plain, members, lambda node: plain._spread(
                members, plain.memory[members], np.arange(node * per_node, (node + 1) * per_node)))
        found = assembly.fit(option)
        if isinstance(expected, Stuck):
            assert found == expected
        else:
            assert isinstance(found, Trial) and np.array_equal(found.devices, expected[0])
            assert np.array_equal(found.costs, expected[1])
        checked[placement] += 1
    assert checked["node"] and checked["node_free"]  # table 0 is never placed: its options are all checked
