"""Local search's moves over memory tiers: the options its changes and kicks try (each table's lower convex
hull of (HBM, work) per cut), and the trades of HBM between two tables that no single option change can
make."""
import numpy as np
from conftest import examples, make_table
from hypothesis import given
from hypothesis import strategies as st

from costmodels import get_oracle
from instances import Instance, Topology, Workload, load_instances
from instances.kernels import FUSED, FUSED_UVM_CACHING
from instances.memory import HBM
from solvers.assembly import Assembly
from solvers.candidates import Candidates
from solvers.choice import on_lower_hull, option_weight
from solvers.search import _Search, improve, split_greedy


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
        improve(start, np.inf, seed, max_rounds=30, changes=True)
        return start.snapshot()

    first, again = searched(3), searched(3)
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
