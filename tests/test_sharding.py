"""Sharded plans: cutting rules, plan validation and JSON, options and their pieces, shard costs in the
oracles, split-aware solvers against brute force over the options, bounds, and the CLI."""
import dataclasses
import json

import numpy as np
import pytest
from conftest import examples, make_table
from hypothesis import given
from hypothesis import strategies as st

from shardbench.cli import main
from benchmarks.brute import brute_force_over_options
from costmodels import get_oracle
from instances import (
    SHARDING_TYPES,
    Instance,
    Plan,
    PlanError,
    Shard,
    TableSharding,
    Topology,
    Workload,
    save_instance,
)
from instances.model import column_counts
from instances.options import OptionPieces, enumerate_options, plan_from_choice
from instances.pieces import Pieces
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from instances.sharding import (
    compact,
    expand,
    plan_from_dict,
    plan_to_dict,
    row_cuts,
)
from solvers import (
    Budget,
    Candidates,
    Status,
    get_solver,
    lp_bound,
    option_bounds,
    run_solver,
    solver_names,
)
from solvers.base import OPTIMALITY_TOLERANCE, incompatibility

SPLITTING = [n for n in solver_names() if get_solver(n).splits]
ALL_PLACEMENT = [n for n in solver_names() if not n.endswith("-rl") and not n.endswith("-rl+ls")]
QUICK = Budget(10.0, max_rounds=10)


# ---------------------------------------------------------------- cutting rules


def test_row_and_column_cuts_follow_torchrec():
    assert [e - s for s, e in row_cuts(10, 4)] == [3, 3, 3, 1]
    assert [e - s for s, e in row_cuts(5, 4)] == [2, 2, 1, 0]
    assert row_cuts(100, 128)[99] == (99, 100) and row_cuts(100, 128)[100] == (100, 100)
    assert column_counts(32, 8) == (2, 4, 8) and column_counts(16, 8) == (2, 4) and column_counts(16, 2) == (2,)
    assert column_counts(12, 8) == () and column_counts(32, 1) == ()


@given(st.integers(1, 10**6), st.integers(1, 600))
def test_row_cuts_tile_the_rows(rows, parts):
    cuts = row_cuts(rows, parts)
    assert len(cuts) == parts and cuts[0][0] == 0 and cuts[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))


# ---------------------------------------------------------------- the plan


def _two_nodes(types=SHARDING_TYPES):
    tables = (make_table("a", 10, 16, 2.0), make_table("b", 7, 8, 1.0))
    return Instance("x", tables, Topology(2, 2, 10**6), Workload(batch_size=64), sharding_types=types).validate()


def _plan(instance, *shardings):
    return Plan(instance.id, tuple(shardings))


def _full(rows, dim, device):
    return Shard(device, (0, rows), (0, dim))


def test_valid_plans_of_every_type():
    inst = _two_nodes()
    b = TableSharding("table_wise", (_full(7, 8, 3),))
    for kind, shards in [
        ("table_wise", (_full(10, 16, 0),)),
        ("column_wise", (Shard(0, (0, 10), (0, 8)), Shard(0, (0, 10), (8, 16)))),  # a device may hold both
        ("row_wise", tuple(Shard(d, r, (0, 16)) for d, r in enumerate(row_cuts(10, 4)))),
        ("table_row_wise", (Shard(2, (0, 5), (0, 16)), Shard(3, (5, 10), (0, 16)))),
        ("data_parallel", tuple(_full(10, 16, d) for d in range(4))),
    ]:
        _plan(inst, TableSharding(kind, shards), b).validate(inst)


BAD_PLANS = [
    (TableSharding("row_wise", (Shard(0, (0, 6), (0, 16)), Shard(1, (5, 10), (0, 16)), Shard(2, (10, 10), (0, 16)),
                                Shard(3, (10, 10), (0, 16)))), "rows by device .* not TorchRec's cut"),
    (TableSharding("row_wise", (Shard(0, (0, 4), (0, 16)), Shard(1, (5, 10), (0, 16)), Shard(2, (10, 10), (0, 16)),
                                Shard(3, (10, 10), (0, 16)))), r"\[0, 4\), \[5, 10\).* not TorchRec's cut"),
    (TableSharding("table_wise", (_full(10, 16, 4),)), "device 4 is not in 0..3"),
    (TableSharding("column_wise", (Shard(0, (0, 10), (0, 6)), Shard(1, (0, 10), (6, 16)))), "not TorchRec's equal cut"),
    (TableSharding("column_wise", (Shard(0, (0, 10), (0, 8)), Shard(1, (0, 10), (4, 16)))), "not TorchRec's equal cut"),
    # TorchRec cuts columns into equal blocks only: 4, 4, 8 is no cut of its (export crashed on it).
    (TableSharding("column_wise", (Shard(0, (0, 10), (0, 4)), Shard(1, (0, 10), (4, 8)), Shard(2, (0, 10), (8, 16)))),
     "3 blocks are not such a cut"),
    (TableSharding("column_wise", tuple(Shard(d % 4, (0, 10), (2 * d, 2 * d + 2)) for d in range(8))),
     "8 blocks are not such a cut"),
    (TableSharding("table_row_wise", (Shard(2, (5, 10), (0, 16)), Shard(3, (0, 5), (0, 16)))), "not TorchRec's cut"),
    (TableSharding("data_parallel", tuple(_full(10, 16, d) for d in range(3))), "every device"),
    (TableSharding("row_wise", (Shard(0, (0, 10), (0, 16)),)), "every device"),
    (TableSharding("table_row_wise", (Shard(1, (0, 5), (0, 16)), Shard(2, (5, 10), (0, 16)))), "one node"),
    (TableSharding("table_wise", (Shard(0, (0, 11), (0, 16)),)), "not inside the table"),
    (TableSharding("diagonal", (_full(10, 16, 0),)), "unknown sharding type"),
]


@pytest.mark.parametrize("sharding,reason", BAD_PLANS, ids=[r for _, r in BAD_PLANS])
def test_malformed_plans_are_rejected_naming_the_table_and_reason(sharding, reason):
    inst = _two_nodes()
    with pytest.raises(PlanError, match=f"table a: .*{reason}"):
        _plan(inst, sharding, TableSharding("table_wise", (_full(7, 8, 0),))).validate(inst)


def test_a_type_the_instance_or_table_forbids_is_rejected():
    inst = _two_nodes(types=("table_wise", "row_wise"))
    column = TableSharding("column_wise", (Shard(0, (0, 10), (0, 8)), Shard(1, (0, 10), (8, 16))))
    with pytest.raises(PlanError, match="table a: sharding type column_wise is not allowed"):
        _plan(inst, column, TableSharding("table_wise", (_full(7, 8, 0),))).validate(inst)
    only_rows = dataclasses.replace(inst, tables=(dataclasses.replace(inst.tables[0], sharding_types=("row_wise",)),
                                                  inst.tables[1]))
    with pytest.raises(PlanError, match="table a: sharding type table_wise"):
        _plan(only_rows, TableSharding("table_wise", (_full(10, 16, 0),)),
              TableSharding("table_wise", (_full(7, 8, 0),))).validate(only_rows)


def test_memory_counts_every_replica_and_shard():
    inst = dataclasses.replace(_two_nodes(), topology=Topology(2, 2, 10 * 16 * 2 + 7 * 8 * 2 - 1))
    replicated = TableSharding("data_parallel", tuple(_full(10, 16, d) for d in range(4)))
    with pytest.raises(PlanError, match="memory capacity"):
        _plan(inst, replicated, TableSharding("table_wise", (_full(7, 8, 0),))).validate(inst)
    _plan(inst, replicated, TableSharding("row_wise", tuple(Shard(d, r, (0, 8)) for d, r in enumerate(row_cuts(7, 4))))
          ).validate(inst)


def test_plan_json_round_trip_and_version_one():
    inst = _two_nodes()
    plan = _plan(inst, TableSharding("table_row_wise", (Shard(2, (0, 5), (0, 16)), Shard(3, (5, 10), (0, 16)))),
                 TableSharding("table_wise", (_full(7, 8, 1),)))
    data = json.loads(json.dumps(plan_to_dict(plan, inst, {"solver": "x"})))
    assert plan_from_dict(data, inst) == plan
    data["tables"].reverse()  # tables by name, in any order
    assert plan_from_dict(data, inst) == plan
    v1 = {"schema_version": 1, "instance_id": "x", "assignment": [3, 1], "objective": 2.0}
    loaded = plan_from_dict(v1, inst)
    assert loaded.is_table_wise and loaded.assignment == (3, 1)
    assert expand(compact(plan, inst), inst) == plan


# ---------------------------------------------------------------- options and pieces


def test_options_respect_the_allowed_types_and_tile_their_table():
    inst = _two_nodes()
    options = enumerate_options(inst)
    labels = [(o.table, o.label) for o in options]
    assert (0, "column_wise×2") in labels and (0, "column_wise×4") in labels and (1, "column_wise×2") in labels
    assert (1, "column_wise×4") not in labels  # width 2 is not a multiple of 4
    pieces = OptionPieces.build(inst, options)
    for o, option in enumerate(options):
        members = pieces.members(o)
        if option.placement == "free":
            devices = np.arange(members.size) % inst.num_devices
        elif option.placement == "node_free":  # every block on node 1's devices
            devices = pieces.devices(o, free_devices=2 + np.arange(members.size) % 2)
        elif option.placement == "node":
            devices = pieces.devices(o, node=1, per_node=2)
        elif option.placement == "grid":  # each block's node, block by block
            devices = pieces.devices(o, node=np.arange(members.size // 2) % 2, per_node=2)
        else:
            devices = pieces.devices(o)
        chosen = [o if option.table == 0 else next(i for i, x in enumerate(options) if x.table == 0),
                  o if option.table == 1 else next(i for i, x in enumerate(options) if x.table == 1)]
        device = np.full(len(pieces.pieces), -1)
        for c in chosen:
            device[pieces.members(c)] = (devices if c == o else np.zeros(pieces.members(c).size, dtype=int))
        plan_from_choice(inst, pieces, chosen, device).validate(inst)
    one = dataclasses.replace(inst, topology=Topology(1, 1, 10**6))
    assert {o.sharding_type for o in enumerate_options(one)} == {"table_wise"}


def test_a_piece_is_priced_as_the_table_it_is():
    inst = _two_nodes()
    options = enumerate_options(inst)
    pieces = OptionPieces.build(inst, options).pieces
    for name in ("lookup", "size", "dim"):
        costs = get_oracle(name).bind(inst, pieces).costs
        tw = get_oracle(name).table_costs(inst)
        for o, option in enumerate(options):
            members = OptionPieces.build(inst, options).members(o)
            total = costs[members].sum()
            if name == "lookup" or (name == "size" and option.sharding_type != "data_parallel"):
                factor = inst.num_devices if option.sharding_type == "data_parallel" and name == "size" else 1
                assert total == pytest.approx(tw[option.table] * factor)  # lookups and rows are conserved
    tables = Pieces.table_wise(inst).as_tables(inst)
    assert [(t.rows, t.dim, t.pooling_factor) for t in tables] == [(t.rows, t.dim, t.pooling_factor) for t in inst.tables]


def test_analytic_prices_each_collective_on_its_links():
    oracle = get_oracle("analytic")
    inst = _two_nodes()
    options = enumerate_options(inst)
    op = OptionPieces.build(inst, options)
    parts = oracle.bind(inst, op.pieces).breakdown
    by = {o.label: parts[op.members(i)] for i, o in enumerate(options) if o.table == 0}
    tw = by["table_wise"][0]
    assert by["column_wise×2"][:, 0].sum() == pytest.approx(tw[0])  # same lookups, half the columns each
    assert np.allclose(by["data_parallel"][:, 2], 0.0) and np.all(by["data_parallel"][:, 3] > 0)  # all-reduce only
    # Row shards split the reads but each writes partial sums for every sample: less per device, more in all.
    assert by["row_wise"][:, 0].max() < tw[0] < by["row_wise"][:, 0].sum()
    # Table-row-wise keeps the partial sums inside the node: less inter-node traffic than row-wise.
    flat = dataclasses.replace(inst, topology=Topology(1, 4, 10**6))
    flat_parts = oracle.bind(flat, OptionPieces.build(flat, enumerate_options(flat)).pieces).breakdown
    assert flat_parts.sum() < parts.sum()  # one fast node beats two nodes over the slow link


# ---------------------------------------------------------------- solvers on tiny instances


@st.composite
def tiny_split_instances(draw):
    n = draw(st.integers(1, 3))
    nodes, per_node = draw(st.sampled_from([(1, 2), (1, 3), (2, 2)]))
    tables = tuple(make_table(f"t{i}", draw(st.integers(1, 40)), draw(st.sampled_from([4, 8])),
                              draw(st.floats(0.0, 20.0))) for i in range(n))
    total = sum(t.weight_bytes for t in tables)
    capacity = max(1, int(total * draw(st.floats(0.4, 3.0))))
    return Instance("tiny", tables, Topology(nodes, per_node, capacity), Workload(batch_size=16)).validate()


@examples(25)
@given(tiny_split_instances(), st.sampled_from(["lookup", "analytic", "size-lookup"]))
def test_exact_split_optimum_matches_brute_force_and_beats_every_heuristic(instance, oracle_name):
    oracle = get_oracle(oracle_name)
    optimum = brute_force_over_options(instance, oracle)
    whole = brute_force_over_options(instance.restricted_to(("table_wise",)), oracle)
    candidates = Candidates.build(instance, oracle)
    if optimum is None:
        assert all(not run_solver(n, instance, oracle, QUICK, 0).has_plan for n in ("cpsat", "split-greedy"))
        return
    for bound in (*option_bounds(candidates).values(), lp_bound(candidates)):
        assert bound <= optimum * (1 + 1e-6) + 1e-12
    for name in ("cpsat", "milp-highs", "milp-cbc"):
        result = run_solver(name, instance, oracle, QUICK, 0)
        assert result.status == Status.OPTIMAL, (name, result.reason, result.stats)
        assert result.objective == pytest.approx(optimum, rel=OPTIMALITY_TOLERANCE, abs=1e-12)
        if whole is not None:
            assert result.objective <= whole * (1 + 1e-9)
    for name in ("split-greedy", "local-search", "best-greedy", "lpt"):
        result = run_solver(name, instance, oracle, QUICK, 0)
        if result.has_plan:
            assert optimum <= result.objective * (1 + 1e-9)


@examples(30)
@given(tiny_split_instances(), st.sampled_from(["lookup", "analytic", "dim"]))
def test_every_plan_of_every_solver_tiles_every_table_and_fits_memory(instance, oracle_name):
    oracle = get_oracle(oracle_name)
    for name in ALL_PLACEMENT:
        info = get_solver(name)
        if incompatibility(info, oracle.additive, oracle.prices_tiers, instance.uses_host_memory):
            continue
        result = run_solver(name, instance, oracle, QUICK, 0)
        if not result.has_plan:
            continue
        plan = result.plan
        assert plan.validate(instance) is plan
        for table, sharding in zip(instance.tables, plan.tables):
            cells = sum(s.num_rows * s.width for s in sharding.shards)
            copies = instance.num_devices if sharding.sharding_type == "data_parallel" else 1
            assert cells == copies * table.rows * table.dim
        assert (plan.storage_per_device(instance) <= instance.topology.capacity.as_array()).all()
        assert plan.is_table_wise or info.splits


def test_dominance_pruning_keeps_the_optimum():
    instance = sample_tasks(TaskSpec("autoshard", 20, count=1, num_devices=4, nodes=2))[0]
    for name in ("analytic", "lookup"):
        candidates = Candidates.build(instance, get_oracle(name))
        assert candidates.pruned["dominated"] > 0
        for ids in candidates.by_table:
            assert ids.size >= 1


def test_seeded_split_search_is_deterministic_and_splits_where_it_pays():
    instance = sample_tasks(TaskSpec("autoshard", 80, count=1, memory=MemorySpec(tightness=1.5)))[0]
    oracle = get_oracle("analytic")
    budget = Budget(60.0, max_rounds=5)
    first = run_solver("local-search", instance, oracle, budget, 3)
    assert first.plan == run_solver("local-search", instance, oracle, budget, 3).plan
    whole = run_solver("local-search", instance.restricted_to(("table_wise",)), oracle, budget, 3)
    assert first.objective < whole.objective and not first.plan.is_table_wise


def test_whole_table_solvers_say_why_they_cannot_plan_a_table_that_must_split():
    instance = dataclasses.replace(_two_nodes(), tables=(dataclasses.replace(_two_nodes().tables[0],
                                                                             sharding_types=("row_wise",)),
                                                         _two_nodes().tables[1]))
    lookup = get_oracle("lookup")
    result = run_solver("lpt", instance, lookup, QUICK)
    assert result.status == Status.NO_PLAN and "does not allow table_wise" in result.reason
    assert run_solver("split-greedy", instance, lookup, QUICK).plan.tables[0].sharding_type == "row_wise"


def test_scaled_sampler_goes_beyond_the_pool_deterministically():
    spec = TaskSpec("scaled", 1500, count=1, num_devices=32, nodes=4)
    first, again = sample_tasks(spec)[0], sample_tasks(spec)[0]
    assert first == again and first.num_tables == 1500 and first.topology.nodes == 4
    assert len({t.name for t in first.tables}) == 1500


# ---------------------------------------------------------------- CLI


def test_cli_solves_with_sharding_types_and_shows_the_plan(tmp_path, capsys):
    instance = sample_tasks(TaskSpec("autoshard", 30, count=1, num_devices=4))[0]
    save_instance(instance, tmp_path / "i.json")
    plan = tmp_path / "p.json"
    assert main(["solve", str(tmp_path / "i.json"), "--solver", "split-greedy", "--oracle", "analytic",
                 "--sharding-types", "table_wise,data_parallel", "-o", str(plan)]) == 0
    data = json.loads(plan.read_text())
    assert {t["sharding_type"] for t in data["tables"]} <= {"table_wise", "data_parallel"}
    assert main(["show-plan", str(plan), "--instance", str(tmp_path / "i.json"), "--oracle", "analytic"]) == 0
    out = capsys.readouterr().out
    assert "device 3: cost" in out and "shards" in out
    assert main(["solve", str(tmp_path / "i.json"), "--solver", "lpt", "--oracle", "lookup",
                 "--sharding-types", "row_wise,diagonal"]) == 2
    assert "--sharding-types" in capsys.readouterr().err


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d["tables"][0]["shards"].append(dict(d["tables"][0]["shards"][0])), "one shard of the whole table"),
    (lambda d: d["tables"][0]["shards"][0].update(device=99), "device 99"),
    (lambda d: d["tables"][0].update(sharding_type="column_wise", shards=[
        {"device": 0, "rows": [0, 10], "cols": [0, 6]}, {"device": 1, "rows": [0, 10], "cols": [6, 16]}]), "not TorchRec's equal cut"),
    (lambda d: d["tables"][0].update(sharding_type="row_wise", shards=[
        {"device": d, "rows": r, "cols": [0, 16]} for d, r in enumerate([[0, 3], [4, 6], [6, 8], [8, 10]])]), "not TorchRec's cut"),
    (lambda d: d["tables"].pop(), "has no sharding"),
    (lambda d: d.update(schema_version=4), "schema_version"),
    (lambda d: d["tables"][0].update(compute_kernel="dense"), "tables[0].compute_kernel: compute kernel dense cannot serve"),
    (lambda d: d["tables"][0].update(compute_kernel="fused_uvm_caching", cache_load_factor=1.5),
     "tables[0].cache_load_factor: cache load factor must be in (0, 1]"),
    (lambda d: d["tables"][0].update(compute_kernel="fused_uvm"), "the devices have no host memory"),
])
def test_cli_rejects_malformed_v2_plans(tmp_path, capsys, mutate, needle):
    inst = _two_nodes()
    save_instance(inst, tmp_path / "i.json")
    data = plan_to_dict(_plan(inst, TableSharding("table_wise", (_full(10, 16, 0),)),
                              TableSharding("table_wise", (_full(7, 8, 1),))), inst)
    mutate(data)
    (tmp_path / "p.json").write_text(json.dumps(data))
    assert main(["show-plan", str(tmp_path / "p.json"), "--instance", str(tmp_path / "i.json"),
                 "--oracle", "analytic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i.json", "p.json"]


@st.composite
def tiny_node_instances(draw):
    """Tables that may only go table-column-wise or as a grid (each with table-wise beside it): TorchRec's
    node-bound types alone, so that no option dominates them away."""
    kind = draw(st.sampled_from(["table_column_wise", "grid_shard"]))
    n = draw(st.integers(1, 2))
    # A grid needs TorchRec's column cut (blocks of 128 and up) to give two blocks: tables 256 wide.
    dim = 256 if kind == "grid_shard" else draw(st.sampled_from([8, 16]))
    tables = tuple(make_table(f"t{i}", draw(st.integers(2, 30)), dim, draw(st.floats(0.5, 20.0))) for i in range(n))
    total = sum(t.weight_bytes for t in tables)
    capacity = max(1, int(total * draw(st.floats(0.3, 2.0))))
    return Instance("nodes", tables, Topology(2, 2, capacity), Workload(batch_size=16),
                    sharding_types=("table_wise", kind)).validate()


@examples(20)
@given(tiny_node_instances(), st.sampled_from(["lookup", "analytic"]))
def test_node_bound_types_are_solved_exactly_and_by_every_splitting_solver(instance, oracle_name):
    oracle = get_oracle(oracle_name)
    optimum = brute_force_over_options(instance, oracle)
    if optimum is None:
        assert not run_solver("cpsat", instance, oracle, QUICK, 0).has_plan
        return
    for name in ("cpsat", "milp-highs"):
        result = run_solver(name, instance, oracle, QUICK, 0)
        assert result.status == Status.OPTIMAL, (name, result.reason, result.stats)
        assert result.objective == pytest.approx(optimum, rel=OPTIMALITY_TOLERANCE, abs=1e-12)
    for name in ("split-greedy", "local-search", "global-lf"):
        result = run_solver(name, instance, oracle, QUICK, 0)
        if result.has_plan:
            result.plan.validate(instance)
            assert optimum <= result.objective * (1 + 1e-9)
