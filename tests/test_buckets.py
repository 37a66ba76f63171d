import itertools
import json
from unittest import mock

import numpy as np
import pytest
from conftest import examples
from hypothesis import given
from hypothesis import strategies as st

from shardbench.cli import main
from instances import Instance, Table, Topology, Workload, save_instance
from instances.model import BucketSpec, RowDistribution
import solvers.buckets as buckets_module
from instances.rowdist import EmpiricalRows, PowerLawRows
from solvers.buckets import (
    access_per_bucket,
    bucket_of,
    even_split,
    load_per_bucket,
    optimal_partition,
    range_loads,
    rehash_rows_moved,
    reshard,
    rows_per_bucket,
)


@given(st.integers(1, 5000), st.integers(1, 300), st.sampled_from(["interleave", "chunk"]))
def test_rows_per_bucket_matches_mapping_every_id(rows, buckets, mapping):
    counted = np.bincount(bucket_of(np.arange(rows), buckets, rows, mapping), minlength=buckets)
    assert counted.size == buckets
    assert np.array_equal(rows_per_bucket(rows, buckets, mapping), counted)


@examples(40)
@given(st.integers(1, 200_000), st.integers(1, 3000), st.sampled_from(["interleave", "chunk"]),
       st.one_of(st.sampled_from([0.0, 1.0, 1.05, 3.0]), st.floats(0.0, 100.0)), st.floats(0.001, 0.05))
def test_access_per_bucket_matches_adding_every_row(rows, buckets, mapping, alpha, share):
    """Past the first rows (here 64 per bucket, 4 × the capped rows), interleaved buckets take their rows'
    sum in closed form."""
    source = PowerLawRows(rows, alpha, share * rows)
    expected = load_per_bucket(source.probabilities(), buckets, mapping)
    with mock.patch.object(buckets_module, "INTERLEAVE_HEAD_ROWS", 4 * (int(share * rows) + 2)):
        loads = access_per_bucket(source, buckets, mapping)
        empirical = access_per_bucket(EmpiricalRows.of(source.probabilities()), buckets, mapping)
    assert loads == pytest.approx(expected, rel=1e-11, abs=1e-300)
    assert empirical == pytest.approx(expected, rel=1e-11, abs=1e-300)


def test_mappings_follow_the_rfc():
    assert list(bucket_of([0, 1, 5, 9], 4, 10, "interleave")) == [0, 1, 1, 1]
    assert list(bucket_of([0, 2, 3, 9], 4, 10, "chunk")) == [0, 0, 1, 3]  # 10 rows / 4 buckets = 2.5 per bucket
    assert load_per_bucket(np.array([0.5, 0.25, 0.25, 0.0]), 2, "interleave").tolist() == [0.75, 0.25]


def _brute_force_partition(loads, parts):
    n = len(loads)
    best = None
    for cuts in itertools.combinations_with_replacement(range(n + 1), parts - 1):
        bounds = np.array((0, *cuts, n))
        value = range_loads(np.asarray(loads), bounds).max()
        best = value if best is None else min(best, value)
    return best


@examples(80)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=9), st.integers(1, 4))
def test_optimal_partition_matches_brute_force_on_integers(loads, parts):
    loads = np.array(loads, dtype=np.int64)
    bounds = optimal_partition(loads, parts)
    assert bounds[0] == 0 and bounds[-1] == loads.size and np.all(np.diff(bounds) >= 0) and bounds.size == parts + 1
    assert range_loads(loads, bounds).max() == _brute_force_partition(loads, parts)


@examples(60)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=9), st.integers(1, 4))
def test_optimal_partition_matches_brute_force_on_reals(loads, parts):
    loads = np.array(loads)
    bounds = optimal_partition(loads, parts)
    assert range_loads(loads, bounds).max() == pytest.approx(_brute_force_partition(loads, parts), rel=1e-9, abs=1e-12)


@given(st.integers(1, 1000), st.integers(1, 50))
def test_even_split_differs_by_at_most_one_bucket(buckets, parts):
    sizes = np.diff(even_split(buckets, parts))
    assert sizes.sum() == buckets and sizes.max() - sizes.min() <= 1


@examples(60)
@given(st.lists(st.integers(0, 20), min_size=2, max_size=12), st.integers(1, 4), st.integers(1, 4))
def test_resharding_moves_the_minimum(rows, old, new):
    rows = np.array(rows)
    old_bounds, new_bounds = even_split(rows.size, old), even_split(rows.size, new)
    result = reshard(old_bounds, new_bounds, rows)
    prefix = np.concatenate([[0], np.cumsum(rows)])

    def kept(trainers):
        total = 0
        for j, t in enumerate(trainers):
            if t < old:
                lo, hi = max(new_bounds[j], old_bounds[t]), min(new_bounds[j + 1], old_bounds[t + 1])
                total += max(0, prefix[hi] - prefix[lo]) if hi > lo else 0
        return total

    best = max(kept(p) for p in itertools.permutations(range(max(old, new)), new))
    assert result.rows_moved == rows.sum() - best
    assert result.rows_moved == rows.sum() - kept(result.trainer_of_range)
    assert sorted(result.trainer_of_range) == sorted(set(result.trainer_of_range))


@given(st.integers(1, 3000), st.integers(1, 40), st.integers(1, 40))
def test_rehash_count_matches_every_id(rows, old, new):
    ids = np.arange(rows)
    assert rehash_rows_moved(rows, old, new) == int(np.count_nonzero(ids % old != ids % new))


def _bucketed_instance(tmp_path, mapping="chunk"):
    table = Table("ids", rows=100_000, dim=64, dtype_bytes=4, pooling_factor=20.0, reuse_bins=(1.0,) + (0.0,) * 16,
                  pooled=False, row_distribution=RowDistribution("power_law", 1.1),
                  buckets=BucketSpec(count=1000, mapping=mapping))
    instance = Instance("cf", (table,), Topology(1, 8, 10**9), Workload())
    save_instance(instance, tmp_path / "cf.json")
    return tmp_path / "cf.json"


def test_cli_buckets_balances_and_reshards(tmp_path, capsys):
    path = _bucketed_instance(tmp_path)
    out = tmp_path / "plan.json"
    assert main(["buckets", str(path), "--trainers", "8", "--reshard-to", "12", "--balance", "access", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "balance by access" in text and "when every id is re-hashed" in text
    plan = json.loads(out.read_text())
    assert plan["boundaries"][0] == 0 and plan["boundaries"][-1] == 1000 and len(plan["trainer_of_range"]) == 12


def test_cli_buckets_errors(tmp_path, capsys):
    path = _bucketed_instance(tmp_path)
    out = tmp_path / "plan.json"
    assert main(["buckets", str(path), "--trainers", "0", "-o", str(out)]) == 2
    assert "trainers" in capsys.readouterr().err and not out.exists()
    assert main(["buckets", str(path), "--table", "nope", "--trainers", "4", "-o", str(out)]) == 2
    assert "no table with a bucket spec" in capsys.readouterr().err and not out.exists()
