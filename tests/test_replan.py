"""Replanning after a workload shift: the moved-bytes rule, solvers within a move budget (checked against
brute force), the pipeline's replan, the CLI, the frontier, and the delta a running TorchRec job reshards
with (for real, on two gloo processes)."""
import itertools
import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
from conftest import examples, make_instance, make_table
from hypothesis import assume, given
from hypothesis import strategies as st

import shardbench
from costmodels import get_oracle
from instances import InstanceError, Plan, PlanError, Shard, TableSharding, save_instance, save_plan
from instances.memory import OPTIMIZER_STATE, stored_bytes
from instances.model import SHARDING_TYPES
from instances.moves import check_replan, plan_moved_bytes, previous_plan, shard_moves
from instances.sharding import column_cuts, row_cuts
from shardbench.cli import main
from solvers import Budget, Problem, Status, option_bounds, run_solver

warnings.filterwarnings("ignore")
REPLANNERS = ("split-greedy", "local-search", "cpsat", "milp-highs")


def _tables(instance, plan):
    return {t.name: s for t, s in zip(instance.tables, plan.tables)}


def _sharding(kind: str, rows: int, dim: int, devices: list[int], k: int) -> TableSharding:
    """A table's sharding of `kind` (column-wise: two blocks) on `devices` (the free shards' devices)."""
    if kind == "table_wise":
        return TableSharding(kind, (Shard(devices[0], (0, rows), (0, dim)),))
    if kind == "column_wise":
        return TableSharding(kind, tuple(Shard(d, (0, rows), c) for d, c in zip(devices, column_cuts(dim, 2))))
    if kind == "row_wise":
        return TableSharding(kind, tuple(Shard(d, r, (0, dim)) for d, r in enumerate(row_cuts(rows, k))))
    return TableSharding(kind, tuple(Shard(d, (0, rows), (0, dim)) for d in range(k)))


@st.composite
def _replans(draw):
    """An instance of every type, an old plan of it, and a new plan keeping every table's type."""
    k = draw(st.integers(2, 4))
    optimizer = draw(st.sampled_from(tuple(OPTIMIZER_STATE)))
    specs = [(draw(st.integers(1, 300)), draw(st.sampled_from([8, 16, 32])), 1.0)
             for _ in range(draw(st.integers(1, 6)))]
    base = make_instance(specs, k, 10**9, types=SHARDING_TYPES)
    instance = replace(base, workload=replace(base.workload, optimizer=optimizer))
    kinds = [draw(st.sampled_from(("table_wise", "column_wise", "row_wise", "data_parallel"))) for _ in specs]

    def plan():
        return Plan(instance.id, tuple(_sharding(kind, t.rows, t.dim, draw(st.lists(st.integers(0, k - 1), min_size=2,
                                                                                    max_size=2)), k)
                                       for kind, t in zip(kinds, instance.tables)))
    return instance, plan(), plan()


@examples(60)
@given(_replans())
def test_a_reshard_moves_each_shard_whose_device_changes_with_its_optimizer_state(case):
    instance, old, new = case
    previous = previous_plan(instance, _tables(instance, old))
    expected = sum(stored_bytes(s.num_rows, s.width, t.dtype_bytes, instance.workload.optimizer)
                   for t, before, after in zip(instance.tables, old.tables, new.tables)
                   for s, was in zip(after.shards, before.shards) if s.device != was.device)
    assert plan_moved_bytes(instance, previous, new) == expected
    assert plan_moved_bytes(instance, previous, old) == 0
    assert check_replan(instance, replace(previous, budget=expected), new) == expected
    if expected:
        with pytest.raises(PlanError, match="more than the move budget"):
            check_replan(instance, replace(previous, budget=expected - 1), new)


def test_type_changes_move_what_the_new_shards_device_did_not_hold():
    instance = make_instance([(100, 16, 1.0), (50, 8, 2.0), (30, 8, 1.0)], 4, 10**6, types=SHARDING_TYPES)
    old = Plan(instance.id, (_sharding("column_wise", 100, 16, [0, 1], 4), _sharding("table_wise", 50, 8, [2], 4),
                             _sharding("data_parallel", 30, 8, [], 4)))
    previous = previous_plan(instance, _tables(instance, old), keep_types=False)
    new = Plan(instance.id, (_sharding("table_wise", 100, 16, [0], 4), _sharding("row_wise", 50, 8, [], 4),
                             _sharding("table_wise", 30, 8, [1], 4)))
    # The whole table on device 0 lacks the column block that was on 1 (100 × 8 × 2 B); the row shards off
    # device 2 move (13, 13 and 11 rows × 8 × 2 B); the replica on device 1 was already there.
    assert shard_moves(instance, previous, new).tolist() == [1600, (13 + 13 + 11) * 16, 0]
    with pytest.raises(PlanError, match="table t0: changes from column_wise × 2"):
        check_replan(instance, replace(previous, keep_types=True), new)


def test_the_previous_plan_must_fit_the_new_instance_and_tables_are_matched_by_name():
    instance = make_instance([(100, 16, 1.0), (50, 8, 2.0)], 2, 10**6, types=SHARDING_TYPES)
    old = {"t0": _sharding("table_wise", 100, 16, [1], 2), "gone": _sharding("table_wise", 10, 8, [0], 2)}
    previous = previous_plan(instance, {"t0": old["t0"]}, budget=5, dropped=("gone",))
    assert previous.shardings[1] is None and previous.added == 1 and not previous.same_tables
    with pytest.raises(InstanceError, match="^previous_plan: does not fit instance 't'.*table t0"):
        previous_plan(instance, {"t0": _sharding("table_wise", 99, 16, [1], 2)})
    with pytest.raises(InstanceError, match="^move_budget: must be a non-negative number of bytes"):
        previous_plan(instance, {"t0": old["t0"]}, budget=-1)
    narrowed = replace(instance, sharding_types=("table_wise",))
    cut = _sharding("column_wise", 100, 16, [0, 1], 2)
    with pytest.raises(InstanceError, match="its column_wise × 2 \\(fused\\) is no longer allowed"):
        previous_plan(narrowed, {"t0": cut})
    assert previous_plan(narrowed, {"t0": cut}, keep_types=False).shardings[0] == cut


# ---------------------------------------------------------------- solvers within the budget


@st.composite
def _whole_tables(draw):
    k = draw(st.integers(2, 3))
    specs = [(draw(st.integers(1, 400)), draw(st.sampled_from([4, 8, 16])), draw(st.floats(0.1, 20.0)))
             for _ in range(draw(st.integers(2, 4)))]
    total = sum(r * d * 2 for r, d, _ in specs)
    capacity = max(max(r * d * 2 for r, d, _ in specs), int(total / k * draw(st.floats(1.0, 2.0))))
    instance = make_instance(specs, k, capacity)
    old = [draw(st.integers(0, k - 1)) for _ in specs]
    assume(np.bincount(old, weights=instance.table_storage()[:, 0], minlength=k).max() <= capacity)  # it ran
    budgets = sorted(draw(st.lists(st.integers(0, total), min_size=2, max_size=2)))
    return instance, old, budgets


def _brute_force(instance, old, budget, costs):
    """The least max device cost over every memory-feasible assignment moving at most `budget` bytes."""
    memory = instance.table_storage()[:, 0]
    best = None
    for assignment in itertools.product(range(instance.num_devices), repeat=instance.num_tables):
        a = np.array(assignment)
        if memory[a != np.array(old)].sum() > budget or \
                np.bincount(a, weights=memory, minlength=instance.num_devices).max() > instance.topology.memory_bytes:
            continue
        value = np.bincount(a, weights=costs, minlength=instance.num_devices).max()
        best = value if best is None else min(best, value)
    return best


@examples(25)
@given(_whole_tables())
def test_cpsat_within_a_move_budget_is_the_brute_force_optimum_above_the_move_bound_and_falls_as_the_budget_grows(case):
    instance, old, budgets = case
    oracle = get_oracle("lookup")
    plan = Plan.table_wise(instance, old)
    objectives = []
    for budget in budgets:
        previous = previous_plan(instance, _tables(instance, plan), budget=budget)
        problem = Problem(instance, oracle, previous=previous)
        result = run_solver("cpsat", instance, oracle, Budget(2.0), problem=problem)
        best = _brute_force(instance, old, budget, oracle.table_costs(instance))
        assert option_bounds(problem.candidates)["moves"] <= best * (1 + 1e-12)
        assert result.status == Status.OPTIMAL
        assert result.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert result.stats["moved_bytes"] <= budget
        objectives.append(result.objective)
    assert objectives[1] <= objectives[0] * (1 + 1e-9)


def _drifted(instance, seed: int = 0, share: float = 0.4):
    """The instance with the pooling factors of a share of its tables scaled ×0.2 or ×5."""
    rng = np.random.default_rng(seed)
    tables = list(instance.tables)
    for i in rng.choice(len(tables), max(1, int(share * len(tables))), replace=False):
        tables[i] = replace(tables[i], pooling_factor=tables[i].pooling_factor * float(rng.choice([0.2, 5.0])))
    return replace(instance, tables=tuple(tables)).validate()


def _split_case():
    specs = [(2000, 32, 40.0), (1500, 16, 30.0)] + [(300 + 50 * i, 8 + 8 * (i % 3), 1.0 + i) for i in range(8)]
    old_instance = make_instance(specs, 4, 2 * 10**5, "drift", types=SHARDING_TYPES)
    old = run_solver("split-greedy", old_instance, get_oracle("lookup"), Budget(5.0)).plan
    return old_instance, old, _drifted(old_instance)


@pytest.mark.parametrize("keep_types", [True, False])
def test_every_replanning_solver_keeps_within_its_budget_and_a_zero_budget_keeps_the_old_plan(keep_types):
    old_instance, old, instance = _split_case()
    oracle = get_oracle("lookup")
    fresh = run_solver("split-greedy", instance, oracle, Budget(5.0)).plan
    unlimited = previous_plan(instance, _tables(old_instance, old), keep_types=False)
    moved_fresh = plan_moved_bytes(instance, unlimited, fresh)
    for budget in (0, moved_fresh // 10, moved_fresh // 3):
        previous = previous_plan(instance, _tables(old_instance, old), budget=budget, keep_types=keep_types)
        for name in REPLANNERS:
            result = run_solver(name, instance, oracle, Budget(1.0, max_rounds=5), problem=Problem(instance, oracle,
                                                                                                   previous=previous))
            assert result.plan is not None, (name, result.reason)
            assert check_replan(instance, previous, result.plan) == result.stats["moved_bytes"] <= budget
            if budget == 0 and keep_types:
                assert result.plan.tables == old.tables, name


def test_the_move_bound_proves_the_old_plan_optimal_when_nothing_may_move():
    # Every table on device 0 of 2, nothing may move: the old plan is the only plan, and the bound says so.
    instance = make_instance([(100, 8, 3.0), (80, 8, 2.0), (60, 8, 1.0)], 2, 10**6)
    old = Plan.table_wise(instance, [0, 0, 0])
    oracle = get_oracle("lookup")
    previous = previous_plan(instance, _tables(instance, old), budget=0)
    problem = Problem(instance, oracle, previous=previous)
    result = run_solver("split-greedy", instance, oracle, Budget(1.0), problem=problem)
    assert result.plan == old and result.status == Status.OPTIMAL
    assert option_bounds(Problem(instance, oracle, previous=previous).candidates)["moves"] == pytest.approx(
        result.objective, rel=1e-9)


def test_solvers_that_plan_afresh_are_refused_a_replan():
    old_instance, old, instance = _split_case()
    oracle = get_oracle("lookup")
    previous = previous_plan(instance, _tables(old_instance, old), budget=0)
    with pytest.raises(Exception, match="plans afresh; a replan needs one that starts from the previous plan"):
        run_solver("best-greedy", instance, oracle, Budget(1.0), problem=Problem(instance, oracle, previous=previous))


# ---------------------------------------------------------------- the pipeline and the Python API


def test_replan_keeps_the_old_plan_at_zero_and_reaches_a_fresh_plan_when_unlimited():
    old_instance, old, instance = _split_case()
    kept = shardbench.replan(instance, old, 0, oracle="lookup", budget=2.0, previous_instance=old_instance)
    assert kept.plan.tables == old.tables and kept.moved_bytes == 0
    # split-greedy ends long before 30 s; at 2 s a busy machine could cut one run short and not the other.
    fresh = shardbench.plan(instance, oracle="lookup", budget=30.0, solvers=["split-greedy"])
    free = shardbench.replan(instance, old, "unlimited", oracle="lookup", budget=30.0, solvers=["split-greedy"],
                             allow_type_changes=True, previous_instance=old_instance)
    # With no budget to keep, the fresh greedy's plan is one of the replan's.
    assert free.objective <= fresh.objective * (1 + 1e-12) < kept.objective
    some = shardbench.replan(instance, old, "1KiB", oracle="lookup", budget=2.0, previous_instance=old_instance)
    assert some.moved_bytes <= 1024 and some.objective <= kept.objective


def test_new_tables_are_placed_and_dropped_ones_free_their_memory_moving_nothing():
    old_instance, old, instance = _split_case()
    grown = replace(instance, tables=instance.tables[1:] + (make_table("new", 500, 16, 9.0),)).validate()
    result = shardbench.replan(grown, old, 0, oracle="lookup", budget=1.0, previous_instance=old_instance)
    assert result.moved_bytes == 0
    assert result.plan.tables[:-1] == old.tables[1:]
    with pytest.raises(InstanceError, match="previous_instance: give the instance the previous plan was made for"):
        shardbench.replan(grown, old, 0, oracle="lookup")


def test_a_table_column_wise_table_is_refused_where_types_are_kept_and_changes_type_where_they_may():
    old_instance = make_instance([(2000, 32, 40.0), (300, 8, 2.0), (400, 16, 3.0)], 4, 10**6, "twcw",
                                 types=("table_wise", "table_column_wise"))
    only_twcw = replace(old_instance.tables[0], sharding_types=("table_column_wise",))
    old = run_solver("split-greedy", replace(old_instance, tables=(only_twcw, *old_instance.tables[1:])).validate(),
                     get_oracle("lookup"), Budget(2.0)).plan
    assert old.tables[0].sharding_type == "table_column_wise"
    with pytest.raises(InstanceError, match="table t0: its table_column_wise × .* cannot be kept, as TorchRec's reshard"):
        previous_plan(old_instance, _tables(old_instance, old))
    result = shardbench.replan(old_instance, old, None, oracle="lookup", budget=1.0, allow_type_changes=True,
                               previous_instance=old_instance)
    assert "table_column_wise" not in result.plan.sharding_types()
    with pytest.raises(InstanceError, match="sharding_types: table t0 allows only table_column_wise, grid_shard"):
        previous_plan(replace(old_instance, tables=(only_twcw, *old_instance.tables[1:])).validate(),
                      _tables(old_instance, old), keep_types=False)


# ---------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replan")
    old_instance, old, instance = _split_case()
    # HBM for TorchRec's storage estimate too (its IO buffers alone outgrow the tight instances above), since
    # a plan goes out as a ShardingPlan only where TorchRec would take it.
    old_instance, instance = (replace(i, topology=replace(i.topology, memory_bytes=2**30)).validate()
                              for i in (old_instance, instance))
    save_instance(old_instance, folder / "old.json")
    save_instance(instance, folder / "new.json")
    save_plan(old, old_instance, folder / "old-plan.json")
    return folder


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["--move-budget", "5XB"], "argument --move-budget: must be a number of bytes or a number with a unit"),
    ([], "--move-budget: is required"),
    (["--frontier", "--move-budget", "1GiB"], "--move-budget: --frontier spans every move budget"),
    (["--frontier"], "-o: with --frontier, names the results page to write (a .md file)"),
])
def test_bad_replan_arguments_are_one_line_and_write_nothing(capsys, files, argv, message):
    out = files / "bad.json"
    code, _, err = _run(capsys, "replan", files / "new.json", "--from", files / "old-plan.json", "-o", out, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_an_old_plan_that_is_no_plan_of_these_tables_is_refused_in_one_line(capsys, files, tmp_path):
    code, _, err = _run(capsys, "replan", files / "new.json", "--from", files / "old.json", "--move-budget", "0",
                        "-o", tmp_path / "p.json")
    assert code == 2 and "topology: this file is an instance, not a plan" in err
    plan = json.loads((files / "old-plan.json").read_text())
    plan["tables"][0]["shards"][0]["rows"][1] -= 1
    (tmp_path / "cut.json").write_text(json.dumps(plan))
    code, _, err = _run(capsys, "replan", files / "new.json", "--from", tmp_path / "cut.json", "--move-budget", "0",
                        "-o", tmp_path / "p.json")
    assert code == 2 and "--from: does not fit instance 'drift'" in err and not (tmp_path / "p.json").exists()


def test_replan_writes_the_plan_with_its_moved_bytes_the_torchrec_plan_and_the_reshard_delta(capsys, files, tmp_path):
    from torchrec.distributed.sharding.dynamic_sharding import output_sharding_plans_delta

    code, out, _ = _run(capsys, "replan", files / "new.json", "--from", files / "old-plan.json", "--move-budget",
                        "200KB", "--oracle", "lookup", "--budget", "2", "-o", tmp_path / "new-plan.json",
                        "--torchrec-out", tmp_path / "new.pt", "--module-path", "ebc")
    assert code == 0 and "moves " in out and "within a budget of 195.31 KiB" in out
    report = json.loads((tmp_path / "new-plan.json").read_text())["report"]
    assert report["move_budget"] == 200000 and 0 < report["moved_bytes"] <= 200000 and report["keep_types"]
    instance = shardbench_instance(files / "new.json")
    moved = shard_moves(instance, previous_plan(instance, _tables(instance, _plan(files / "old-plan.json", instance))),
                        _plan(tmp_path / "new-plan.json", instance))
    delta = shardbench.load_plan(tmp_path / "new.reshard.pt")
    assert set(delta["ebc"][1]) == {t.name for t, m in zip(instance.tables, moved) if m > 0}
    # The delta is TorchRec's own, from the old plan (exported as the job runs it) to the new one.
    code, _, _ = _run(capsys, "export-torchrec", files / "old-plan.json", "--instance", files / "old.json", "-o",
                      tmp_path / "old.pt", "--module-path", "ebc")
    theirs = output_sharding_plans_delta(shardbench.load_plan(tmp_path / "old.pt").plan,
                                         shardbench.load_plan(tmp_path / "new.pt").plan, True)
    assert code == 0 and theirs.keys() == delta.keys() and theirs["ebc"][0] == delta["ebc"][0]
    assert {k: v.ranks for k, v in theirs["ebc"][1].items()} == {k: v.ranks for k, v in delta["ebc"][1].items()}
    # A TorchRec ShardingPlan is an old plan too (its module path is the new plan's).
    code, out, _ = _run(capsys, "replan", files / "new.json", "--from", tmp_path / "old.pt", "--move-budget", "0",
                        "--oracle", "lookup", "--budget", "1", "-o", tmp_path / "kept.json", "--torchrec-out",
                        tmp_path / "kept.pt")
    assert code == 0 and "moves 0 B from the previous plan" in out
    assert list(shardbench.load_plan(tmp_path / "kept.pt").plan) == ["ebc"]
    assert shardbench.load_plan(tmp_path / "kept.reshard.pt")["ebc"][1] == {}


def shardbench_instance(path):
    from instances import load_instance

    return load_instance(path)


def _plan(path, instance):
    from instances import load_plan

    return load_plan(path, instance)


def test_the_frontier_falls_from_the_old_plan_to_a_fresh_one_with_a_bound_at_each_budget(capsys, files, tmp_path):
    page = tmp_path / "front.md"
    code, _, _ = _run(capsys, "replan", files / "new.json", "--from", files / "old-plan.json", "--frontier",
                      "--oracle", "lookup", "--budget", "0.5", "--solvers", "split-greedy", "-o", page)
    assert code == 0 and page.exists() and page.with_suffix(".png").exists()
    points = json.loads(page.with_suffix(".json").read_text())
    rows = points["points"]
    assert rows[0]["moved_bytes"] == 0 and rows[0]["budget_bytes"] == 0
    for before, after in zip(rows, rows[1:]):
        assert after["objective"] <= before["objective"] and after["bound"] <= before["bound"]
    assert all(r["moved_bytes"] <= r["budget_bytes"] and r["bound"] <= r["objective"] for r in rows)
    assert "](front.png)" in page.read_text()


# ---------------------------------------------------------------- a running job reshards


def test_a_running_dmp_reshards_with_the_replans_delta_and_trains_on(tmp_path):
    from gloo_worker import cpu_topology, reshard_sharder, run_on_two_gloo_processes, small_dlrm
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan

    path = "sparse_arch.embedding_bag_collection"
    # Every table on rank 0 (one of them cut into two column blocks, both there): a replan spreads them.
    generators = {f"t{i}": table_wise(rank=0, compute_kernel="fused") for i in range(3)}
    generators["t3"] = column_wise(ranks=[0, 0], compute_kernel="fused")
    old = ShardingPlan({path: construct_module_sharding_plan(
        small_dlrm().sparse_arch.embedding_bag_collection, generators, sharder=reshard_sharder(), local_size=2,
        world_size=2, device_type="cpu")})
    planner = shardbench.ShardbenchPlanner(cpu_topology(), batch_size=4, budget=2.0, solvers=["split-greedy"],
                                           previous_plan=old, move_budget="unlimited")
    new = planner.plan(small_dlrm(dense_device="meta"), [reshard_sharder()])
    delta = planner.reshard_delta
    moved = {name for name, sharding in new.plan[path].items() if sharding.ranks != old.plan[path][name].ranks}
    assert moved and set(delta[path][1]) == moved and planner.result.moved_bytes > 0
    assert all(new.plan[path][n].sharding_type == old.plan[path][n].sharding_type for n in generators)
    shardbench.save_sharding_plan(old, tmp_path / "old.pt")
    shardbench.save_sharding_plan(delta, tmp_path / "delta.pt")
    ranks = run_on_two_gloo_processes("--reshard", str(tmp_path / "old.pt"), str(tmp_path / "delta.pt"),
                                      out=str(tmp_path / "out"))
    for result in ranks:
        assert result["ok"], result
        assert result["losses_finite"]
        # Every shard arrived whole, weights and row-wise Adagrad state, where the new plan puts it.
        assert result["after"] == result["before"]
        assert result["ranks"] == {name: list(sharding.ranks) for name, sharding in new.plan[path].items()}
        assert result["volume"] == pytest.approx(delta[path][0])


def test_the_drift_benchmark_shifts_a_task_and_records_each_replan_within_its_budget(tmp_path):
    from benchmarks.drift import SCALE, drifted, measure, publish, read_store

    instance = _split_case()[0]
    new = drifted(instance, 3)
    assert new == drifted(instance, 3) and new.num_tables > instance.num_tables
    factors = [n.pooling_factor / o.pooling_factor for o, n in zip(instance.tables, new.tables)]
    assert any(f != 1 for f in factors) and all(SCALE[0] <= f <= SCALE[1] for f in factors)
    record = measure("tiny", instance, "lookup", 0.5, 0)
    # Which plan is better at half a second depends on the machine's load; that the fresh plan's bound
    # holds for every plan of the shifted task, the old one kept and each replan included, does not.
    assert record["status"] == "plan" and all(r["status"] == "plan" for r in record["replans"])
    objectives = [record["kept_objective"], record["fresh_objective"]] + [r["objective"] for r in record["replans"]]
    assert 0 < record["fresh_bound"] <= min(objectives) + 1e-9 * max(objectives)
    assert all(r["budget_bytes"] is None or r["moved_bytes"] <= r["budget_bytes"] for r in record["replans"])
    assert [r["share"] for r in record["replans"]].count(None) == 2  # unlimited, types kept and not
    store = tmp_path / "drift.jsonl"
    store.write_text(json.dumps(record) + "\n")
    publish(read_store(store), "the command", tmp_path / "drift.md")
    text = (tmp_path / "drift.md").read_text()
    assert "| tiny | lookup | kept (reshard) | 1/1 |" in text and "](drift.png)" in text
    assert "| tiny | lookup | " in text.split("With an unlimited budget")[1]
