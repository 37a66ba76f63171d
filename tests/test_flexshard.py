import itertools
import json
import math

import numpy as np
import pytest
from conftest import examples
from hypothesis import assume, given
from hypothesis import strategies as st

import solvers.flexshard as flexshard_module
from shardbench.cli import main
from costmodels.flexshard import (
    FlexParams,
    breakpoint,
    breakpoints,
    per_row_line,
    strategy_cost,
)
from instances import Instance, Table, Topology, Workload, save_instance
from instances.model import RowDistribution
from instances.rowdist import HEAD_ROWS, EmpiricalRows, PowerLawRows, power_sums, probabilities_from_ids
from solvers.flexshard import FlexShard, RowTable

PAPERLIKE = FlexParams(nodes=4, gpus_per_node=8, batch=4096, a2a_global=25e9, a2a_intra=300e9, ar_global=75e9,
                       ar_cross=75e9)

params_strategy = st.builds(
    FlexParams, nodes=st.integers(1, 8), gpus_per_node=st.integers(1, 8), batch=st.integers(1, 8192),
    a2a_global=st.floats(1e9, 1e11), a2a_intra=st.floats(1e9, 1e12), ar_global=st.floats(1e9, 1e11),
    ar_cross=st.floats(1e9, 1e11), dp_memory_multiplier=st.floats(1.0, 8.0))


@given(params_strategy, st.sampled_from(["RW", "CW", "DP", "Flex"]), st.sampled_from(["RW", "CW", "DP", "Flex"]),
       st.sampled_from(["memory", "communication"]), st.sampled_from([16, 256]))
def test_breakpoints_make_the_two_costs_equal(params, first, second, metric, dim):
    p = breakpoint(first, second, metric, params, dim, 4)
    assume(p is not None)
    one = getattr(strategy_cost(first, 1, dim, 4, p, params), metric)
    two = getattr(strategy_cost(second, 1, dim, 4, p, params), metric)
    assert abs(one - two) <= 1e-9 * max(abs(one), abs(two), 1e-300)


def test_paper_breakpoints_in_closed_form():
    bp = breakpoints(PAPERLIKE)
    assert bp.dp_memory == pytest.approx((6 - 1 / 32) / 4096)
    assert bp.dp_comm == pytest.approx(25e9 / (2 * 4096 * 75e9))
    assert bp.flex_memory is None  # Flex always needs more memory than RW: 6/W > 1/U


@given(params_strategy, st.lists(st.floats(0, 1), min_size=1, max_size=30), st.sampled_from(["RW", "CW", "DP", "Flex"]))
def test_a_table_costs_the_sum_of_its_rows(params, probabilities, strategy):
    table = strategy_cost(strategy, len(probabilities), 64, 2, sum(probabilities), params)
    for metric in ("memory", "communication"):
        a, b = per_row_line(strategy, metric, 64, 2, params)
        rows = sum(a + b * p for p in probabilities)
        assert rows == pytest.approx(getattr(table, metric), rel=1e-9, abs=1e-12)


@given(st.integers(1, 5000), st.floats(0.0, 2.5), st.floats(0.01, 1.0))
def test_power_law_rows_sum_to_length_and_stay_probabilities(rows, alpha, share):
    source = PowerLawRows(rows, alpha, share * rows)
    p = source.probabilities()
    assert p.sum() == pytest.approx(share * rows, rel=1e-9)
    assert p.max() <= 1.0 and p.min() >= 0 and np.all(np.diff(p) <= 1e-15)
    cut = rows // 2
    assert np.array_equal(PowerLawRows(rows, alpha, share * rows).segment(cut, rows), p[cut:])


alphas = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 1.05, 2.0, 100.0]), st.floats(0.0, 100.0))


@examples(60)
@given(st.integers(1, 300_000), alphas, st.floats(0.001, 1.0), st.data())
def test_power_law_sums_match_adding_the_rows(rows, alpha, share, data):
    """Sums past the first 2^16 rows come from Euler–Maclaurin: checked against adding every row exactly."""
    source = PowerLawRows(rows, alpha, share * rows)
    p = source.probabilities()
    cuts = sorted(data.draw(st.lists(st.integers(0, rows), min_size=2, max_size=6)))
    starts, stops = cuts[:-1], cuts[1:]
    expected = [math.fsum(p[a:b]) for a, b in zip(starts, stops)]
    assert source.mass(starts, stops) == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert source.mass([0], [rows])[0] == pytest.approx(share * rows, rel=1e-12)
    thresholds = [np.inf, 1.0, *p[data.draw(st.lists(st.integers(0, rows - 1), max_size=4))], p[-1] / 2, 0.0]
    counts, sums = source.at_least(thresholds)
    assert counts.tolist() == np.searchsorted(-p, -np.array(thresholds), side="right").tolist()
    assert sums == pytest.approx([math.fsum(p[:n]) for n in counts], rel=1e-12, abs=1e-300)


@examples(60)
@given(st.integers(1, 10**6), st.integers(1, 10**4), st.integers(1, 3000), alphas)
def test_power_sums_of_a_run_match_adding_its_terms(offset, step, count, alpha):
    first = HEAD_ROWS * step + offset  # where the error bound is stated
    terms = np.power(first + step * np.arange(count, dtype=np.float64), -alpha)
    assert power_sums([first], step, [count], alpha)[0] == pytest.approx(math.fsum(terms), rel=1e-12, abs=1e-300)


def test_a_power_law_table_of_2_to_the_40_rows_needs_no_per_row_array():
    source = PowerLawRows(2**40, 1.05, 500.0)
    cuts = [0, 10, 2**20, 2**39, 2**40]
    parts = source.mass(cuts[:-1], cuts[1:])
    assert parts.sum() == pytest.approx(500.0, rel=1e-12) and np.all(parts > 0)
    counts, _ = source.at_least([1.0, 1e-6, 0.0])
    assert counts[-1] == 2**40 and 0 < counts[0] <= counts[1] < 2**40


def test_an_empirical_list_shorter_than_its_table_holds_only_the_list():
    source = EmpiricalRows.of([0.25, 0.5], rows=2**40)
    assert source.rows == 2**40 and source.segment(0, 4).tolist() == [0.5, 0.25, 0.0, 0.0]
    assert source.mass([0, 1, 2], [2**40, 2**40, 2**40]).tolist() == [0.75, 0.25, 0.0]
    counts, sums = source.at_least([0.5, 0.1, 0.0])
    assert counts.tolist() == [1, 2, 2**40] and sums.tolist() == [0.5, 0.75, 0.75]


@pytest.mark.parametrize("alpha", [0.0, 0.8, 1.05, 60.0])  # 60: most rows' p underflows to 0
def test_narrowing_the_crossing_bracket_changes_no_tiering(alpha, monkeypatch):
    """The bracket a crossing lies in is narrowed by bisection once it holds more than BRACKET_ROWS rows
    (and rows of equal probability are taken by table, then row): the same tiers as sorting it whole."""
    tables = [RowTable("a", PowerLawRows(30_000, alpha, 900.0), 16, 4), RowTable("b", PowerLawRows(20_000, alpha, 50.0), 32, 4),
              RowTable("c", EmpiricalRows.of(np.random.default_rng(3).random(5000) ** 4), 16, 4)]
    params = FlexParams(nodes=2, gpus_per_node=4, batch=64, a2a_global=10e9, a2a_intra=100e9, ar_global=10e9,
                        ar_cross=10e9)
    whole = FlexShard(tables, params)
    monkeypatch.setattr(flexshard_module, "BRACKET_ROWS", 3)
    narrowed = FlexShard(tables, params)
    for mode in ("two_tier", "three_tier"):
        a, b = getattr(whole, mode)(), getattr(narrowed, mode)()
        assert (a.dp_rows, a.flex_rows) == (b.dp_rows, b.flex_rows)
    for extra in (0.0, 1e4, 1e6):
        assert whole.least_communication(extra).counts.tolist() == narrowed.least_communication(extra).counts.tolist()


def test_probabilities_from_an_id_sample_count_each_row_once_per_sample():
    # 4 samples: row 2 in all of them (twice in one), row 0 in one, row 4 in two.
    p = probabilities_from_ids([2, 2, 0, 2, 4, 2, 2, 4], [0, 3, 4, 6, 8], rows=5)
    assert list(p) == [0.25, 0.0, 1.0, 0.0, 0.5]


def _tables(draw_lists, dims):
    return [RowTable(f"t{i}", EmpiricalRows.of(ps), d, 4) for i, (ps, d) in enumerate(zip(draw_lists, dims))]


small_probabilities = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5)
tiny_params = st.builds(FlexParams, nodes=st.integers(1, 3), gpus_per_node=st.integers(1, 4), batch=st.integers(1, 64),
                        a2a_global=st.floats(1e9, 1e10), a2a_intra=st.floats(1e10, 1e11),
                        ar_global=st.floats(1e9, 1e11), ar_cross=st.floats(1e9, 1e11))


def _brute_force_least_comm(tables, params, extra):
    lines = FlexShard(tables, params).lines
    rows = [(t.dim, p) for t in tables for p in t.source.probabilities()]
    best = None
    for mask in itertools.product([False, True], repeat=len(rows)):
        memory = sum(d * (lines["DP:memory"][0] + lines["DP:memory"][1] * p) for (d, p), m in zip(rows, mask) if m)
        comm = sum(d * (lines["DP:communication"][0] + lines["DP:communication"][1] * p)
                   for (d, p), m in zip(rows, mask) if m)
        if memory <= extra * (1 + 1e-12) + 1e-9 and (best is None or comm < best):
            best = comm
    return best


@examples(40)
@given(st.lists(small_probabilities, min_size=1, max_size=2), tiny_params, st.floats(0.0, 5e4),
       st.sampled_from([16, 32]))
def test_budgeted_hybrid_matches_brute_force(probabilities, params, extra, dim):
    tables = _tables(probabilities, [dim] * len(probabilities))
    shard = FlexShard(tables, params)
    hybrid = shard.least_communication(extra)
    comm = shard.rows.weight(hybrid, shard.lines["DP:communication"])
    expected = _brute_force_least_comm(tables, params, extra)
    assert comm == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert shard.rows.weight(hybrid, shard.lines["DP:memory"]) <= extra * (1 + 1e-12) + 1e-9


@examples(30)
@given(st.lists(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40), min_size=1, max_size=3), tiny_params,
       st.lists(st.floats(0.0, 1e5), min_size=2, max_size=6))
def test_frontier_is_monotone_in_the_memory_budget(probabilities, params, budgets):
    shard = FlexShard(_tables(probabilities, [16] * len(probabilities)), params)
    comms = [shard.rows.weight(shard.least_communication(b), shard.lines["DP:communication"]) for b in sorted(budgets)]
    assert all(later <= earlier * (1 + 1e-12) + 1e-15 for earlier, later in zip(comms, comms[1:]))


@pytest.fixture(params=[4, 8192], ids=["tiny-grid", "default-grid"])
def grid(request, monkeypatch):
    monkeypatch.setattr(flexshard_module, "GRID_POINTS", request.param)
    return request.param


@examples(25, fixture_constant=True)  # grid is constant
@given(st.lists(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=300), min_size=1, max_size=3),
       st.integers(2, 64), st.sampled_from([0.6, 1.0, 1.4]))
def test_two_and_three_tier_invariants(grid, probabilities, batch, ratio):
    params = FlexParams(nodes=2, gpus_per_node=4, batch=batch, a2a_global=10e9, a2a_intra=100e9,
                        ar_global=10e9 * ratio, ar_cross=10e9 * ratio)
    tables = _tables(probabilities, [16, 32, 64][:len(probabilities)])
    shard = FlexShard(tables, params)
    two, three = shard.two_tier(), shard.three_tier()
    tolerance = 1e-9 * two.rw_memory_per_gpu
    assert two.memory_per_gpu <= two.rw_memory_per_gpu + tolerance
    assert three.memory_per_gpu <= three.rw_memory_per_gpu + tolerance
    if shard.bp.dp_comm <= shard.bp.dp_memory:
        # At B the replicated rows' access sum repays their memory, which then also repays their all-reduce.
        assert two.communication_seconds <= two.rw_communication_seconds * (1 + 1e-9)
    for result in (two, three):
        assert all(d + f + r == t.rows for d, f, r, t in zip(result.dp_rows, result.flex_rows, result.rw_rows, tables))
        # tiers follow descending frequency across the merged tables
        sorted_p = [t.source.probabilities() for t in tables]
        cuts = [(result.dp_rows[i], result.dp_rows[i] + result.flex_rows[i]) for i in range(len(tables))]
        for boundary in (0, 1):
            inside = [p[:c[boundary]] for p, c in zip(sorted_p, cuts)]
            outside = [p[c[boundary]:] for p, c in zip(sorted_p, cuts)]
            low_in = min((x.min() for x in inside if x.size), default=np.inf)
            high_out = max((x.max() for x in outside if x.size), default=-np.inf)
            assert low_in >= high_out


def test_merging_equals_tiering_the_concatenation_when_dims_agree(grid):
    rng = np.random.default_rng(1)
    parts = [rng.random(500) ** 6, rng.random(700) ** 3]
    together = FlexShard([RowTable("all", EmpiricalRows.of(np.concatenate(parts)), 16, 4)], PAPERLIKE)
    merged = FlexShard([RowTable(f"t{i}", EmpiricalRows.of(p), 16, 4) for i, p in enumerate(parts)], PAPERLIKE)
    for mode in ("two_tier", "three_tier"):
        a, b = getattr(together, mode)(), getattr(merged, mode)()
        assert sum(b.dp_rows) == a.dp_rows[0] and sum(b.flex_rows) == a.flex_rows[0]
        # RW's share is the whole minus the replicated prefix: compare on the scale of the whole
        assert b.global_a2a_bytes == pytest.approx(a.global_a2a_bytes, abs=1e-12 * a.rw_global_a2a_bytes)


def _rm_like(tmp_path, rows=200_000, alpha=1.0, name="rm-small"):
    table = Table(name="seq", rows=rows, dim=256, dtype_bytes=4, pooling_factor=200.0, reuse_bins=(1.0,) + (0.0,) * 16,
                  pooled=False, row_distribution=RowDistribution("power_law", alpha))
    instance = Instance(id=name, tables=(table,), topology=Topology(4, 8, 40 * 10**9, 300e9, 25e9, 75e9, 75e9),
                        workload=Workload(batch_size=4096, dtype="fp32"))
    path = tmp_path / f"{name}.json"
    save_instance(instance, path)
    return path


def test_cli_flexshard_end_to_end(tmp_path, capsys):
    path = _rm_like(tmp_path)
    out, plot = tmp_path / "tiers.json", tmp_path / "fig5.png"
    assert main(["flexshard", str(path), "--extra-memory", "1e8", "--plot", str(plot), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2-tier" in text and "3-tier" in text and "least-communication" in text
    plans = json.loads(out.read_text())["plans"]
    assert [p["mode"][:6] for p in plans] == ["2-tier", "3-tier", "least-"]
    assert plans[0]["memory_per_gpu"] <= 40 * 10**9 and plot.stat().st_size > 1000


def test_cli_flexshard_tiers_a_law_whose_tail_underflows_to_zero(tmp_path, capsys):
    assert main(["flexshard", str(_rm_like(tmp_path, rows=10**6, alpha=100.0))]) == 0
    assert "2-tier" in capsys.readouterr().out


def test_cli_flexshard_refuses_what_does_not_fit_or_cannot_be_tiered(tmp_path, capsys):
    pooled = Instance(id="pooled", tables=(Table("t", 10, 4, 4, 1.0, (1.0,) + (0.0,) * 16),),
                      topology=Topology(1, 2, 10**9), workload=Workload())
    save_instance(pooled, tmp_path / "pooled.json")
    assert main(["flexshard", str(tmp_path / "pooled.json")]) == 2
    assert "no sequence table" in capsys.readouterr().err
    tight = _rm_like(tmp_path, name="tight")
    data = json.loads(tight.read_text())
    data["topology"]["memory_bytes"] = 10**6
    tight.write_text(json.dumps(data))
    out = tmp_path / "tiers.json"
    assert main(["flexshard", str(tight), "-o", str(out)]) == 2
    assert "does not fit" in capsys.readouterr().out and not out.exists()
