"""The bound over every cache load factor in (0, 1]: the lowering it rests on stays under any convex curve, the
bound lies under every plan brute force finds with load factors on a fine grid and under the plans of the peers
that size caches their own way, never above the bound over the grid, and `plan` reports it from Python and the
command line alike."""
import dataclasses
import json

import numpy as np
import pytest
from conftest import examples, make_table
from test_tiers import tiny_tiered_instances
from hypothesis import given
from hypothesis import strategies as st

import shardbench
from costmodels import get_oracle
from instances import Instance, Topology, Workload, save_instance
from instances.kernels import FUSED, FUSED_UVM, FUSED_UVM_CACHING, KERNEL_CODE
from instances.pieces import KIND_CODE, Pieces

from shardbench.cli import main
from solvers import Budget, run_solver
from solvers.bounds import lp_bound
from solvers.cache_bound import every_load_factor_bound, guided_load_factors, load_factor_points, lowered
from solvers.candidates import Candidates

TOLERANCE = 1e-9
FINE = np.round(np.arange(1, 401) / 400, 6)  # brute force's load factors: every 0.0025


@st.composite
def convex_curves(draw):
    """A convex function on [0, 1] as TorchRec's cost is one (terms a + b / (c + d·x), c and c + d positive,
    b ≥ 0), or as a count of bytes (the larger of two affine functions), and the points it is sampled at."""
    terms = draw(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10), st.floats(0.01, 5), st.floats(-0.009, 50)),
                          min_size=1, max_size=3))
    kink = draw(st.tuples(st.floats(0, 5), st.floats(-5, 5), st.floats(0, 5), st.floats(-5, 5)))

    def curve(x):
        x = np.asarray(x, dtype=float)
        value = sum(a + b / (c + d * x) for a, b, c, d in terms)
        return value + np.maximum(kink[0] + kink[1] * x, kink[2] + kink[3] * x)

    inner = draw(st.lists(st.floats(0.001, 0.999), min_size=1, max_size=40, unique=True))
    points = np.unique(np.r_[0.0, inner, 1.0])
    return curve, points


@examples(200)
@given(convex_curves())
def test_the_lines_between_lowered_points_stay_under_a_convex_curve(sampled):
    curve, x = sampled
    low = lowered(x, curve(x)[:, None])[:, 0]
    dense = np.unique(np.r_[np.linspace(0, 1, 4001), x])
    between = np.interp(dense, x, low)
    assert (between <= curve(dense) + 1e-9 * (1 + np.abs(curve(dense)))).all()
    assert (low <= curve(x) + 1e-12).all()


def test_the_lowering_loses_less_the_finer_the_points_and_nothing_on_a_line():
    def cost(x):
        return 1.0 + 5.0 / (1 + 27 * x)

    dense = np.linspace(0, 1, 20001)
    losses = []
    for n in (16, 64, 256):
        x = load_factor_points(n)
        losses.append(float(np.max(cost(dense) - np.interp(dense, x, lowered(x, cost(x)[:, None])[:, 0]))))
    assert losses[0] > 8 * losses[1] > 64 * losses[2] > 0
    x = load_factor_points(16)
    assert lowered(x, (3 + 2 * x)[:, None])[:, 0] == pytest.approx(3 + 2 * x, abs=1e-12)


def _instance(hbm_share: float, devices: int, pooling: tuple[float, ...], rows=(3000, 7000)) -> Instance:
    tables = tuple(make_table(f"t{i}", rows[i], 16, p) for i, p in enumerate(pooling))
    need = sum(t.weight_bytes for t in tables)
    return Instance("every-lf", tables, Topology(1, devices, max(1, int(hbm_share * need)), host_memory_bytes=4 * need),
                    Workload(batch_size=64), sharding_types=("table_wise",)).validate()


def _brute_force(instance: Instance, oracle) -> float | None:
    """The least max device cost over every table-wise plan with each table fused, in host memory, or cached at
    a load factor on FINE, on any device, fitting both tiers by the oracle's count and the instance's."""
    choices = [(FUSED, 0.0), (FUSED_UVM, 0.0)] + [(FUSED_UVM_CACHING, f) for f in FINE]
    n, k = instance.num_tables, instance.num_devices
    cost, stored = [], []
    for t, table in enumerate(instance.tables):
        m = len(choices)
        pieces = Pieces.of(np.full(m, t), np.full(m, KIND_CODE["table_wise"]), np.zeros(m), np.full(m, table.rows),
                           np.zeros(m), np.full(m, table.dim), kernel=[KERNEL_CODE[kernel] for kernel, _ in choices],
                           load_factor=[f for _, f in choices])
        priced = oracle.bind(instance, pieces)
        cost.append(np.asarray(priced.costs, dtype=float))
        stored.append(np.maximum(priced.storage, pieces.storage(instance)))
    capacity = instance.topology.capacity.as_array()
    best = np.inf
    for devices in np.ndindex(*([k] * n)):
        load = np.zeros((len(choices),) * n + (k,))
        used = np.zeros((len(choices),) * n + (k, 2))
        for t, d in enumerate(devices):
            shape = [1] * n
            shape[t] = len(choices)
            load[..., d] += cost[t].reshape(shape)
            used[..., d, :] += stored[t].reshape(shape + [2])
        fits = (used <= capacity).all(axis=(-1, -2))
        if fits.any():
            best = min(best, float(load.max(axis=-1)[fits].min()))
    return None if best == np.inf else best


@pytest.mark.parametrize("hbm_share, devices, pooling", [(0.3, 1, (2.0, 9.0)), (0.55, 1, (5.0, 5.0)),
                                                         (0.2, 2, (3.0, 12.0)), (0.45, 2, (8.0, 1.0))])
def test_no_plan_brute_force_finds_over_fine_load_factors_lies_below_the_bound(hbm_share, devices, pooling):
    oracle = get_oracle("torchrec")
    instance = _instance(hbm_share, devices, pooling)
    candidates = Candidates.build(instance, oracle)
    bound = every_load_factor_bound(candidates, oracle)
    optimum = _brute_force(instance, oracle)
    assert bound is not None and optimum is not None
    assert bound <= optimum * (1 + TOLERANCE)
    assert bound <= lp_bound(candidates) * (1 + 1e-7)
    # Not a bound that cannot fail: it is within a few per cent of the fine optimum.
    assert bound >= 0.9 * optimum


def test_the_plans_of_peers_and_of_plan_lie_above_the_bound_where_the_bound_over_the_grid_may_not_hold():
    from test_tiers_peers import _tight

    oracle = get_oracle("torchrec")
    instance = _tight()
    bound = every_load_factor_bound(Candidates.build(instance, oracle), oracle)
    for name in ("torchrec-offload", "torchrec-planner", "global-lf"):
        result = run_solver(name, instance, oracle, Budget(5.0), 0)
        assert result.has_plan, (name, result.reason)
        assert oracle.plan_cost(instance, result.plan) >= bound * (1 - TOLERANCE), name
    planned = shardbench.plan(instance, "torchrec", budget=2.0, solvers=["cpsat"])
    assert planned.every_lf_bound == pytest.approx(bound)
    assert planned.objective >= bound and planned.every_lf_gap >= 0


def test_plan_reports_the_bound_over_every_load_factor_from_python_and_the_command_line(tmp_path, capsys):
    from test_cache_sizes import _short_of_hbm

    instance = _short_of_hbm()
    result = shardbench.plan(instance, "torchrec", budget=2.0, solvers=["cpsat"])
    # The re-sized plan lies below the bound over the grid; the bound over every load factor holds it.
    assert result.grid_objective is not None
    assert result.every_lf_bound is not None and result.every_lf_bound <= result.objective
    assert result.every_lf_bound <= result.bound * (1 + 1e-7) and result.every_lf_why is None
    path, out = tmp_path / "short.json", tmp_path / "plan.json"
    save_instance(instance, path)
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "2", "--solvers", "cpsat", "-o", str(out)]) == 0
    assert "over every cache load factor in (0, 1]: gap" in capsys.readouterr().out
    record = json.loads(out.read_text())
    report = record.get("report", record)
    assert report["every_load_factor_bound"] == pytest.approx(result.every_lf_bound)
    assert report["every_load_factor_gap"] >= 0


def test_an_oracle_that_does_not_promise_convexity_gets_no_bound_and_says_why():
    from test_cache_sizes import _short_of_hbm

    result = shardbench.plan(_short_of_hbm(), "analytic", budget=2.0, solvers=["cpsat"])
    assert any(t.compute_kernel == FUSED_UVM_CACHING for t in result.plan.tables)
    assert result.every_lf_bound is None and "does not promise" in result.every_lf_why
    assert "no bound" in result.every_lf_line


def test_a_plan_without_an_open_cache_reports_nothing_over_load_factors():
    instance = _instance(4.0, 1, (2.0, 3.0))
    result = shardbench.plan(instance, "torchrec", budget=2.0, solvers=["cpsat"])
    assert result.plan is not None and result.every_lf_line is None


@examples(6)
@given(tiny_tiered_instances())
def test_the_bound_lies_under_brute_force_over_fine_load_factors_and_under_the_grid_bound(drawn):
    instance = dataclasses.replace(drawn, sharding_types=("table_wise",)).validate()
    oracle = get_oracle("torchrec")
    candidates = Candidates.build(instance, oracle)
    bound = every_load_factor_bound(candidates, oracle)
    optimum = _brute_force(instance, oracle)
    if optimum is None:
        assert bound is None or lp_bound(candidates) is None or bound <= lp_bound(candidates) * (1 + 1e-7)
        return
    assert bound is not None and bound <= optimum * (1 + TOLERANCE)
    assert bound <= lp_bound(candidates) * (1 + 1e-7)


def test_plan_offers_the_load_factors_the_bound_caches_tables_at_and_certifies_over_them(tmp_path, capsys):
    from test_tiers_peers import _tight

    instance = _tight()
    oracle = get_oracle("torchrec")
    wanted = guided_load_factors(Candidates.build(instance, oracle), oracle).load_factors
    assert wanted and all(0 < f < 1 for factors in wanted.values() for f in factors)
    result = shardbench.plan(instance, "torchrec", budget=3.0, solvers=["cpsat"])
    assert result.guided == sum(map(len, wanted.values()))
    assert result.bound <= (result.grid_objective or result.objective) * (1 + 1e-9)
    assert result.every_lf_bound <= min(result.bound * (1 + 1e-7), result.objective)
    # Without them (asked to keep the grid) the plan is on the grid's options alone.
    kept = shardbench.plan(instance, "torchrec", budget=3.0, solvers=["cpsat"], resize_caches=False)
    assert kept.guided == 0 and Candidates.build(instance, oracle).outside(kept.plan) is None
    path, out = tmp_path / "tight.json", tmp_path / "plan.json"
    save_instance(instance, path)
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "3", "--solvers", "cpsat", "-o", str(out)]) == 0
    assert "cache load factors beside the grid's" in capsys.readouterr().out
    report = json.loads(out.read_text()).get("report")
    assert report["guided_load_factors"] == result.guided


def test_generating_columns_reaches_the_lp_over_all_of_them_and_never_exceeds_it():
    from solvers.bounds import LPColumns, lp_over
    from solvers.cache_bound import curve_columns, open_caches
    from test_tiers_peers import _tight

    oracle = get_oracle("torchrec")
    for hbm in (40 * 2**10, 60 * 2**10, 90 * 2**10):
        candidates = Candidates.build(_tight(hbm), oracle)
        families = open_caches(candidates)
        cached = np.zeros(len(candidates.options.options), dtype=bool)
        for ids in families.values():
            cached[ids] = True
        grid = LPColumns.of(candidates, np.flatnonzero(candidates.live & ~cached))
        curves = curve_columns(candidates, oracle, [ids[0] for ids in families.values()], load_factor_points())
        curve, factor = curves.columns, curves.factor
        columns = grid + curve
        full = lp_over(candidates, columns, safe=True)
        for first in (np.zeros(factor.size, dtype=bool), factor == 0.0, np.ones(factor.size, dtype=bool)):
            generated = lp_over(candidates, columns, safe=True, start=np.r_[np.ones(grid.table.size, dtype=bool), first])
            assert generated <= full * (1 + 1e-9) and generated >= full * (1 - 1e-5)
