"""Access curves (instances/access.py), the cache simulators that check them (benchmarks/cache_check.py) and
their TorchRec face (interop/cache_stats.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.cache_check import bin_counts, lfu_hits, lru_hits
from instances import Instance, InstanceError, RowDistribution, Table, Topology, Workload
from instances import access
from instances.access import access_curve, bin_count_ranges, distinct_per_batch, expected_distinct
from instances.rowdist import row_source

from conftest import examples

GRID = np.linspace(0.0, 1.0, 201)
bins_strategy = st.lists(st.floats(0.0, 1.0), min_size=17, max_size=17).filter(lambda b: sum(b) > 0.01)


def _table(rows: int, pooling: float = 5.0, bins=(1.0,) + (0.0,) * 16, dist=None) -> Table:
    bins = tuple(float(b) / (sum(bins) or 1.0) for b in bins)
    return Table(name="t", rows=rows, dim=8, dtype_bytes=4, pooling_factor=pooling, reuse_bins=bins,
                 row_distribution=dist)


def _empirical(probabilities, rows=None) -> Table:
    return _table(rows or len(probabilities), dist=RowDistribution("empirical", probabilities=tuple(probabilities)))


def _assert_curve_shape(curve) -> None:
    h = curve.hit_rate(GRID)
    assert h[0] == 0.0 and h[-1] == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.diff(h) >= -1e-12)
    slopes = np.diff(curve.shares) / np.diff(curve.fractions)
    assert np.all(np.diff(slopes) <= 1e-9 * np.maximum(1.0, slopes[:-1]))
    assert np.all(h >= GRID - 1e-12)  # the hottest rows serve at least their share of the rows
    assert all(0 < f < 1 for f in curve.bends()) and list(curve.bends()) == sorted(curve.bends())


@examples(60)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=300).filter(lambda p: sum(p) > 0),
       st.integers(0, 200))
def test_empirical_curve_is_the_sorted_cumulative_sum(probabilities, unlisted):
    curve = access_curve(_empirical(probabilities, len(probabilities) + unlisted))
    rows = len(probabilities) + unlisted
    p = np.sort(np.concatenate([probabilities, np.zeros(unlisted)]))[::-1]
    expected = np.concatenate([[0.0], np.cumsum(p) / p.sum()])
    k = np.arange(rows + 1)
    assert np.allclose(curve.hit_rate(k / rows), expected, atol=1e-12)
    _assert_curve_shape(curve)


@examples(40)
@given(bins_strategy, st.floats(0.01, 300.0), st.integers(1, 10**8))
def test_bins_curve_shape_and_saturation(bins, pooling, rows):
    table = _table(rows, pooling, bins)
    curve = access_curve(table)
    _assert_curve_shape(curve)
    touched = distinct_per_batch(table, access.REFERENCE_BATCH) / rows
    assert curve.hit_rate(min(1.0, touched)) == pytest.approx(1.0)


def test_bins_curve_by_hand():
    # Half the distinct rows read once, half 3 or 4 times (mean 3.5): 100 lookups over 100/2.25 rows.
    bins = (0.5, 0.0, 0.5) + (0.0,) * 14
    table = _table(rows=1000, pooling=100 / access.REFERENCE_BATCH, bins=bins)
    distinct = 100 / 2.25
    assert distinct_per_batch(table, access.REFERENCE_BATCH) == pytest.approx(distinct)
    curve = access_curve(table)
    hot = distinct / 2 / 1000
    assert curve.hit_rate(hot) == pytest.approx(3.5 / 4.5)
    assert curve.hit_rate(hot / 2) == pytest.approx(3.5 / 9)
    assert curve.hit_rate(2 * hot) == pytest.approx(1.0)
    assert curve.bends() == pytest.approx((hot, 2 * hot))


def test_bin_ranges_rescale_and_stay_at_one_access():
    low, high = bin_count_ranges()
    assert (low[0], high[0], low[1], high[1], low[16], high[16]) == (1, 1, 2, 2, 32769, 65536)
    low, high = bin_count_ranges(1 / 1024)
    assert low.min() == 1.0 and high[16] == 64.0


@examples(20)
@given(st.integers(2, 3000), st.floats(0.0, 2.0), st.floats(0.5, 50.0))
def test_power_law_curve_matches_its_rows(rows, alpha, pooling):
    table = _table(rows, min(pooling, rows - 0.5), dist=RowDistribution("power_law", alpha=alpha))
    curve = access_curve(table)
    p = row_source(table).probabilities()
    expected = np.concatenate([[0.0], np.cumsum(p) / p.sum()])
    assert np.allclose(curve.hit_rate(np.arange(rows + 1) / rows), expected, atol=1e-12)
    _assert_curve_shape(curve)


def test_large_power_law_on_its_grid_and_by_quadrature(monkeypatch):
    table = _table(10**6, 10.0, dist=RowDistribution("power_law", alpha=0.8))
    p = row_source(table).probabilities()
    exact = np.concatenate([[0.0], np.cumsum(p) / p.sum()])
    k = np.unique(np.geomspace(1, 10**6, 400).astype(int))
    assert len(access_curve(table).fractions) < 20_000
    assert np.max(np.abs(access_curve(table).hit_rate(k / 10**6) - exact[k])) < 1e-4
    monkeypatch.setattr(access, "CHUNK", 1000)  # the quadrature used past ~2·10^8 rows, here at 10^6
    curve = access._per_row_curve(row_source(table), table.rows)
    assert np.max(np.abs(curve.hit_rate(k / 10**6) - exact[k])) < 1e-4
    _assert_curve_shape(curve)
    values = np.random.default_rng(0).random(40_000) ** 3  # explicit rows are summed, never integrated
    empirical = access_curve(_empirical(values))
    exact = np.concatenate([[0.0], np.cumsum(np.sort(values)[::-1]) / values.sum()])
    k = np.unique(np.geomspace(1, values.size, 300).astype(int))
    assert np.max(np.abs(empirical.hit_rate(k / values.size) - exact[k])) < 1e-4


def test_uniform_and_empty_tables_get_the_diagonal():
    for table in (_table(50, 0.0, (0.0,) * 17), _table(10, 20.0, dist=RowDistribution("power_law", alpha=1.0))):
        assert np.allclose(access_curve(table).hit_rate(GRID), GRID)
        assert access_curve(table).bends() == ()


def test_hit_rate_refuses_fractions_outside_zero_one():
    curve = access_curve(_empirical([0.5, 0.1]))
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InstanceError, match="load_factor"):
            curve.hit_rate(bad)
    with pytest.raises(ValueError):
        curve.fractions[0] = 1.0  # immutable


def test_expected_distinct_per_row():
    table = _empirical([1.0, 0.5, 0.0])
    assert expected_distinct(table, 1) == pytest.approx(1.5)
    assert expected_distinct(table, 3) == pytest.approx(1 + (1 - 0.5**3))


# ---------------------------------------------------------------- simulators


def test_lru_by_hand():
    # capacity 2: 0 m, 1 m, 0 h, 2 m (evicts 1), 1 m (evicts 0), 2 h, 0 m
    assert lru_hits([0, 1, 0, 2, 1, 2, 0], 2).tolist() == [False, False, True, False, False, True, False]
    assert lru_hits([0, 1, 2], 2, warm=[2, 1, 0]).tolist() == [True, True, False]  # warm keeps 1, 0
    assert not lru_hits([0, 0], 0).any()


def test_lfu_by_hand():
    # capacity 1, no history: 0 m (enters), 1 m (count 1 = 0's count: stays out), 1 m (2 > 1: replaces 0),
    # 0 m (2 = 2: stays out), 1 h, 0 m (3 > 3? no), 0 m (4 > 3: replaces 1), 0 h
    trace = [0, 1, 1, 0, 1, 0, 0, 0]
    assert lfu_hits(trace, 1, [0, 0]).tolist() == [False, False, False, False, True, False, False, True]
    # prior counts: row 1 is cached and far ahead, row 0 never gets in
    assert lfu_hits([0, 0, 1], 1, [0, 9], warm=[1]).tolist() == [False, False, True]


def test_bin_counts_follow_the_bins():
    # 100 lookups over 100/2.25 ≈ 44 rows: 22 read once, 22 read 3 or 4 times
    table = _table(rows=1000, pooling=100 / access.REFERENCE_BATCH, bins=(0.5, 0.0, 0.5) + (0.0,) * 14)
    counts = bin_counts(table, np.random.default_rng(0))
    assert counts.size == 44 and (counts == 1).sum() == 22 and np.isin(counts[counts > 1], (3, 4)).all()


def _brute_force(trace, capacity, policy):
    """Reference simulators written the slow, obvious way."""
    cache, counts, last, hits = [], {}, {}, []
    for t, x in enumerate(trace):
        counts[x] = counts.get(x, 0) + 1
        hits.append(x in cache)
        if x not in cache and capacity > 0:
            if len(cache) < capacity:
                cache.append(x)
            elif policy == "lru":
                cache.remove(min(cache, key=lambda y: last[y]))
                cache.append(x)
            else:
                victim = min(cache, key=lambda y: (counts[y], y))
                if counts[x] > counts[victim]:
                    cache[cache.index(victim)] = x
        last[x] = t
    return hits


@examples(60)
@given(st.lists(st.integers(0, 7), max_size=80), st.integers(0, 5))
def test_simulators_match_brute_force(trace, capacity):
    assert lru_hits(trace, capacity).tolist() == _brute_force(trace, capacity, "lru")
    assert lfu_hits(trace, capacity, [0] * 8).tolist() == _brute_force(trace, capacity, "lfu")


# ---------------------------------------------------------------- TorchRec's CacheStatistics


def test_cache_statistics_are_the_curve():
    pytest.importorskip("torchrec")
    from torchrec.distributed.types import CacheParams, CacheStatistics

    from interop.cache_stats import cache_statistics

    tables = (_empirical([0.9, 0.3, 0.1, 0.05] + [0.01] * 96),
              Table(name="b", rows=10**6, dim=8, dtype_bytes=4, pooling_factor=20.0,
                    reuse_bins=(0.6, 0.2, 0.1, 0.1) + (0.0,) * 13))
    instance = Instance(id="i", tables=tables, topology=Topology(nodes=1, devices_per_node=4, memory_bytes=2**30),
                        workload=Workload(batch_size=512)).validate()
    for table in tables:
        stats = cache_statistics(instance, table)
        assert isinstance(stats, CacheStatistics)
        curve = access_curve(table)
        for f in (0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0):
            assert stats.expected_miss_rate(f) == pytest.approx(1 - curve.hit_rate(f), abs=1e-15)
        assert stats.expected_miss_rate(0.0) == 1.0 and stats.expected_miss_rate(1.0) == pytest.approx(0.0)
        assert stats.cacheability == pytest.approx(curve.miss_area())
        assert stats.expected_lookups == pytest.approx(expected_distinct(table, 512 * 4))
        assert CacheParams(load_factor=0.2, stats=stats).stats is stats
    assert 0 < cache_statistics(instance, tables[0]).cacheability < 0.5
    with pytest.raises(InstanceError, match="not a table"):
        cache_statistics(instance, _table(7))
