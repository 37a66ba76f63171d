import itertools
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import make_instance
from hypothesis import given, settings
from hypothesis import strategies as st

from shardbench.cli import main
from benchmarks.environment import LIBRARIES, environment, revision
from benchmarks.leaderboard import leaderboard_markdown, leaderboard_rows
from benchmarks.metrics import degree_of_balance, gap_to_bound, speedup_over_random
from benchmarks.pages import short_revision
from benchmarks.runner import run_suite
from benchmarks.store import SCHEMA_VERSION, StoreError, read_records
from benchmarks.suite import SuiteError, load_suite, load_suites
from instances import load_instance, load_plan, save_instance, save_instance_set
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from instances.sharding import expand
from solvers.base import _REGISTRY, planned, register


# Misbehaving solvers: the runner must turn each into one error row and go on.
def _raises(problem, budget, seed):
    raise RuntimeError("boom")


def _hangs(problem, budget, seed):
    time.sleep(3600)


def _dies(problem, budget, seed):
    os._exit(9)


def _cheats(problem, budget, seed):
    return planned(problem.instance, (0,) * problem.instance.num_tables)


@pytest.fixture
def misbehaving_solvers():
    names = {"test-raises": _raises, "test-hangs": _hangs, "test-dies": _dies, "test-cheats": _cheats}
    for name, fn in names.items():
        register(name, "misbehaves on purpose")(fn)
    yield list(names)
    for name in names:
        _REGISTRY.pop(name)


def test_metrics():
    assert degree_of_balance([2.0, 4.0]) == 0.5
    assert degree_of_balance([0.0, 0.0]) == 1.0
    assert speedup_over_random([4.0, 6.0], 2.0) == 2.5
    assert gap_to_bound(101.0, 100.0) == pytest.approx(0.01)


def _write_suite(tmp_path, solvers, time_limit=2, instances_folder="set", seeds=(0,), random_seeds=(0, 1)):
    suite = tmp_path / "suite.toml"
    suite.write_text(
        f'name = "t"\ninstances = "{instances_folder}"\nresults = "out/t.jsonl"\noracles = ["lookup"]\n'
        f"solvers = {json.dumps(solvers)}\ntime_limits = [{time_limit}]\nseeds = {list(seeds)}\n"
        f"random_seeds = {list(random_seeds)}\nworkers = 2\n")
    return suite


@pytest.fixture
def small_set(tmp_path):
    tasks = sample_tasks(TaskSpec("autoshard", 20, count=2, memory=MemorySpec(tightness=1.5)))
    save_instance_set(tasks, tmp_path / "set", {"protocol": "autoshard"})
    return tasks


def test_runner_isolates_crashes_hangs_and_invalid_plans(tmp_path, small_set, monkeypatch, misbehaving_solvers):
    # Long enough that a cell that dies or cheats gets to do so on a loaded machine; the hanging ones wait it out.
    monkeypatch.setattr("benchmarks.cells.kill_deadline", lambda limit: 10.0)
    suite = load_suite(_write_suite(tmp_path, ["lpt", *misbehaving_solvers]))
    start = time.monotonic()
    records = run_suite(suite, quiet=True)
    assert time.monotonic() - start < 60
    by_solver = {}
    for r in records:
        by_solver.setdefault(r["solver"], []).append(r)
    assert len(records) == 2 * (2 + 5)  # random with 2 seeds plus five solvers, on 2 instances
    assert all(r["status"] == "feasible" for r in by_solver["lpt"] + by_solver["random"])
    assert all(r["status"] == "error" and "boom" in r["error"] for r in by_solver["test-raises"])
    assert all(r["status"] == "timeout" and "killed" in r["error"] for r in by_solver["test-hangs"])
    assert all(r["status"] == "error" and "exit code 9" in r["error"] for r in by_solver["test-dies"])
    assert all(r["status"] == "error" and "PlanError" in r["error"] for r in by_solver["test-cheats"])
    rows = {row.solver: row for row in leaderboard_rows(records)}
    assert rows["test-raises"].errors == 2 and rows["test-raises"].with_plan == 0
    markdown = leaderboard_markdown(records, "t")
    assert "| test-hangs | 0/2 | 0 | 0 | 0 | 0 | 2 | n/a |" in markdown
    # Error and timeout rows as well as solved ones say where and from which code they were produced.
    assert all(r["env"] == environment() and r["revision"] == revision() and r["schema_version"] == 2
               for r in records)


def test_runner_resumes_and_skips_finished_cells(tmp_path, small_set):
    suite = load_suite(_write_suite(tmp_path, ["lpt", "lookup-greedy"]))
    first = run_suite(suite, quiet=True)
    stored = read_records(suite.results)
    assert len(stored) == len(first) == 8
    lines = suite.results.read_text().splitlines()
    suite.results.write_text("\n".join(lines[:5]) + "\n" + lines[5][:10])  # a sweep killed mid-write
    second = run_suite(suite, quiet=True)
    assert len(second) == 8 and len(read_records(suite.results)) == 8
    assert [r["plan"] for r in second if r["solver"] == "lpt"] == [r["plan"] for r in first if r["solver"] == "lpt"]
    third = run_suite(suite, quiet=True)
    assert len(read_records(suite.results)) == 8 and len(third) == 8


def test_records_carry_machine_versions_and_revision_and_stores_without_them_still_read(tmp_path, small_set):
    suite = load_suite(_write_suite(tmp_path, ["lpt"]))
    records = run_suite(suite, quiet=True)
    env = records[0]["env"]
    assert set(env) == {"machine", "python", *LIBRARIES}
    assert env["machine"]["cores"] >= 1 and env["machine"]["cpu"] and env["python"].startswith("3.")
    assert env["numpy"] == np.__version__
    assert all(r["schema_version"] == SCHEMA_VERSION == 2 for r in records)
    assert all(isinstance(r["revision"], str) and r["revision"] == revision() for r in records)
    # A store written before records carried their environment and revision (version 1, as the committed
    # ones were) reads, and its leaderboard is the same as with the fields.
    lines = suite.results.read_text().splitlines()
    old = [json.loads(line) for line in lines]
    for record in old:
        for field in ("env", "schema_version", "revision"):
            record.pop(field)
    suite.results.write_text("".join(json.dumps(r) + "\n" for r in old))
    assert read_records(suite.results) == old
    assert leaderboard_markdown(old, "t") == leaderboard_markdown(records, "t")
    old[0]["env"] = "linux"
    suite.results.write_text("".join(json.dumps(r) + "\n" for r in old))
    with pytest.raises(StoreError, match="env: wrong type"):
        read_records(suite.results)


def test_leaderboard_counts_infeasible_cells(tmp_path):
    infeasible = make_instance([(1000, 16, 1.0)], 2, 100)
    feasible = make_instance([(10, 8, 1.0), (10, 8, 2.0)], 2, 10**6, instance_id="ok")
    save_instance_set([infeasible, feasible], tmp_path / "set", {})
    suite = load_suite(_write_suite(tmp_path, ["lpt"]))
    records = run_suite(suite, quiet=True)
    rows = {row.solver: row for row in leaderboard_rows(records)}
    assert rows["lpt"].infeasible == 1 and rows["lpt"].with_plan == 1 and rows["lpt"].cells == 2
    assert rows["random"].infeasible == 2


def test_suite_errors_name_the_field(tmp_path, small_set):
    with pytest.raises(SuiteError, match="instances"):
        load_suite(_write_suite(tmp_path, ["lpt"], instances_folder="nowhere"))
    bad = _write_suite(tmp_path, ["lpt"])
    bad.write_text(bad.read_text().replace("time_limits = [2]", "time_limits = [-1]"))
    with pytest.raises(SuiteError, match="time_limits"):
        load_suite(bad)
    with pytest.raises(KeyError, match="unknown solver"):
        load_suite(_write_suite(tmp_path, ["no-such-solver"]))


_GRID_SUITE = ('name = "g-{n}"\ndescription = "{n} tables"\ninstances = "set-{n}"\nresults = "out/g-{n}.jsonl"\n'
               'oracles = ["lookup"]\nsolvers = ["lpt"]\ntime_limits = [1]\nrandom_seeds = [0]\nworkers = 2\n\n'
               '[grid]\nn = [20, 30]\n')


@pytest.fixture
def grid_suite(tmp_path):
    for size in (20, 30):
        tasks = sample_tasks(TaskSpec("autoshard", size, count=1, memory=MemorySpec(tightness=1.5)))
        save_instance_set(tasks, tmp_path / f"set-{size}", {"protocol": "autoshard"})
    path = tmp_path / "grid.toml"
    path.write_text(_GRID_SUITE)
    return path


def test_a_grid_runs_one_suite_per_instance_set_each_with_its_store(grid_suite, capsys):
    suites = load_suites(grid_suite)
    assert [s.name for s in suites] == ["g-20", "g-30"] and suites[1].description == "30 tables"
    with pytest.raises(SuiteError, match="grid: describes 2 suites"):
        load_suite(grid_suite)
    assert main(["bench", str(grid_suite)]) == 0
    out = grid_suite.parent / "out"
    for n in (20, 30):
        records = read_records(out / f"g-{n}.jsonl")
        assert len(records) == 2 and {r["solver"] for r in records} == {"lpt", "random"}
        assert all(r["instance_set"] == f"set-{n}" and r["num_tables"] == n for r in records)
        assert f"Suite `g-{n}`: {n} tables" in (out / f"g-{n}.md").read_text()
    capsys.readouterr()
    assert main(["summarize", str(grid_suite)]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| g-20", "| g-30"]


@pytest.mark.parametrize("old, new, message", [
    ('name = "g-{n}"', 'name = "g"', "name: the grid gives g to several suites"),
    ('results = "out/g-{n}.jsonl"', 'results = "out/g.jsonl"', "results: the grid gives .*g.jsonl to several"),
    ('results = "out/g-{n}.jsonl"', 'results = "out/g-{m}.jsonl"', "results: {m} is not a grid parameter"),
    ("n = [20, 30]", "n = [20, 20]", "grid.n: lists a value twice"),
    ("n = [20, 30]", "n = []", "grid.n: must be a non-empty list"),
    ("n = [20, 30]", "n = [true]", "grid.n: must be a non-empty list"),
    ("[grid]\nn = [20, 30]", "grid = 3", "grid: must be a table"),
    ('instances = "set-{n}"', 'instances = "set-{n}-x"', "instances: .*set-20-x does not exist"),
])
def test_grid_errors_name_the_field(grid_suite, capsys, old, new, message):
    grid_suite.write_text(_GRID_SUITE.replace(old, new))
    with pytest.raises(SuiteError, match=message):
        load_suites(grid_suite)
    assert main(["bench", str(grid_suite)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (grid_suite.parent / "out").exists()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 99), min_size=1, max_size=3, unique=True), min_size=1, max_size=3))
def test_a_grid_gives_every_combination_once_in_order(tmp_path_factory, values):
    folder = tmp_path_factory.mktemp("grid")
    (folder / "set").mkdir()
    names = [f"p{i}" for i in range(len(values))]
    placeholders = "-".join("{" + name + "}" for name in names)
    grid = "".join(f"{name} = {listed}\n" for name, listed in zip(names, values))
    (folder / "s.toml").write_text(f'name = "s-{placeholders}"\ninstances = "set"\nresults = "r-{placeholders}.jsonl"\n'
                                   f'oracles = ["lookup"]\nsolvers = ["lpt"]\n\n[grid]\n{grid}')
    suites = load_suites(folder / "s.toml")
    expected = ["s-" + "-".join(str(v) for v in combination) for combination in itertools.product(*values)]
    assert [s.name for s in suites] == expected
    assert [s.results.name for s in suites] == [f"r{name[1:]}.jsonl" for name in expected]


# ---------------------------------------------------------------- CLI end to end


def test_cli_sample_validate_show_solve(tmp_path, capsys):
    out = tmp_path / "set"
    assert main(["instances", "sample", "--protocol", "autoshard", "--tables", "30", "--count", "2",
                 "--tightness", "1.5", "--out", str(out)]) == 0
    files = sorted(out.glob("autoshard*.json"))
    assert len(files) == 2
    assert main(["instances", "validate", str(out), str(files[0])]) == 0
    assert main(["instances", "show", str(files[0])]) == 0
    assert "30 tables" in capsys.readouterr().out
    plan = tmp_path / "plan.json"
    assert main(["solve", str(files[0]), "--solver", "lpt", "--oracle", "lookup", "-o", str(plan)]) == 0
    written = json.loads(plan.read_text())
    instance = load_instance(files[0])
    assert written["report"]["status"] in ("feasible", "optimal") and len(written["tables"]) == 30
    assert load_plan(plan, instance).is_table_wise
    assert max(written["report"]["memory_per_device"]) <= instance.topology.memory_bytes


def test_cli_errors_exit_nonzero_without_output(tmp_path, capsys):
    instance = make_instance([(1000, 16, 1.0)], 2, 100)
    save_instance(instance, tmp_path / "inf.json")
    plan = tmp_path / "plan.json"
    assert main(["solve", str(tmp_path / "inf.json"), "--solver", "lpt", "--oracle", "lookup", "-o", str(plan)]) != 0
    assert "infeasible" in capsys.readouterr().out and not plan.exists()
    assert main(["solve", str(tmp_path / "inf.json"), "--solver", "nope", "--oracle", "lookup", "-o", str(plan)]) == 2
    assert "unknown solver" in capsys.readouterr().err and not plan.exists()
    assert main(["solve", str(tmp_path / "missing.json"), "--solver", "lpt", "--oracle", "lookup",
                 "-o", str(plan)]) == 2
    assert "cannot read" in capsys.readouterr().err and not plan.exists()
    assert main(["solve", str(tmp_path / "inf.json"), "--solver", "lpt", "--oracle", "zzz", "-o", str(plan)]) == 2
    assert "unknown oracle" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": 1, "id": "x", "tables": [],
                                                   "topology": {"nodes": 1, "devices_per_node": 1, "memory_bytes": 1}}))
    assert main(["instances", "validate", str(tmp_path / "bad.json")]) == 2
    assert "tables: must hold at least one table" in capsys.readouterr().err
    assert main(["instances", "sample", "--tables", "0", "--out", str(tmp_path / "s")]) == 2
    assert "--tables: must be >= 1" in capsys.readouterr().err and not (tmp_path / "s").exists()
    assert main(["instances", "sample", "--tables", "900", "--out", str(tmp_path / "s")]) == 2
    assert "num_tables" in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_cli_import_raw_then_sample_from_that_pool(tmp_path):
    import torch
    lengths = torch.tensor([[1, 2], [3, 0]])
    indices = torch.tensor([5, 6, 6, 1, 2, 3])
    offsets = torch.tensor([0, 1, 3, 6, 6])
    torch.save((indices, offsets, lengths), tmp_path / "raw.pt")
    assert main(["instances", "import-raw", str(tmp_path / "raw.pt"), "--out", str(tmp_path / "pool.json")]) == 0
    pool = json.loads((tmp_path / "pool.json").read_text())
    assert pool[0]["pooling_factor"] == 1.5 and pool[0]["bin_0"] == 0.5 and pool[0]["bin_1"] == 0.5
    assert main(["instances", "sample", "--tables", "2", "--devices", "1", "--count", "1", "--pool",
                 str(tmp_path / "pool.json"), "--out", str(tmp_path / "set")]) == 0


def test_cli_bench_writes_leaderboard_and_plot(tmp_path, small_set, capsys, monkeypatch):
    suite = _write_suite(tmp_path, ["lpt", "size-greedy"])
    assert main(["bench", str(suite)]) == 0
    out = tmp_path / "out"
    store, page, plot = out / "t.jsonl", out / "t.md", out / "t.png"
    assert "| lpt | 2/2 |" in page.read_text() and plot.stat().st_size > 1000
    assert "](t.png)\n" in page.read_text() and f"`{short_revision(revision())}` (8 records)" in page.read_text()
    stored = store.read_bytes()
    page.unlink()
    plot.unlink()

    def no_solver_runs(*args, **kwargs):
        raise AssertionError("--render-only ran the suite")

    monkeypatch.setattr("benchmarks.runner.run_suite", no_solver_runs)
    assert main(["bench", str(suite), "--render-only"]) == 0
    assert "| lpt | 2/2 |" in page.read_text() and plot.stat().st_size > 1000 and store.read_bytes() == stored
    capsys.readouterr()
    assert main(["bench", str(suite), "--render-only", "-o", str(tmp_path / "empty")]) == 2
    assert "has no results yet" in capsys.readouterr().err and not (tmp_path / "empty").exists()
    assert main(["bench", str(suite), "--render-only", "--fresh"]) == 2
    assert "--render-only" in capsys.readouterr().err and store.read_bytes() == stored


def test_cli_bench_output_leaves_the_suites_store_and_pages_alone(tmp_path, small_set):
    suite = _write_suite(tmp_path, ["lpt"])
    elsewhere = tmp_path / "scratch"
    assert main(["bench", str(suite), "--fresh", "-o", str(elsewhere)]) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == ["t.jsonl", "t.md", "t.png"]
    assert not (tmp_path / "out").exists()


def test_committed_stores_publish_their_pages_under_docs_results():
    from benchmarks.suite import PAGES, STORES, page_path
    assert page_path(STORES / "sweeps" / "x.jsonl", ".md") == PAGES / "sweeps" / "x.md"
    assert page_path(Path("/elsewhere/x.jsonl"), ".png") == Path("/elsewhere/x.png")
    suites = sorted((Path(__file__).parent.parent / "benchmarks" / "suites").glob("*.toml"))
    published = [suite for path in suites for suite in load_suites(path) if suite.results.exists()]
    assert published
    for suite in published:
        assert suite.leaderboard_path.is_relative_to(PAGES) and suite.leaderboard_path.exists(), suite.name
        assert suite.plot_path.is_relative_to(PAGES) and suite.plot_path.exists(), suite.name


def test_a_bound_above_a_valid_plan_is_reported_not_used():
    base = {"oracle": "lookup", "time_limit": 1.0, "seed": 0, "instance": "i", "status": "feasible",
            "solve_time": 0.1, "balance": 1.0, "instance_bound": 90.0}
    records = [{**base, "solver": "random", "objective": 200.0, "lower_bound": None},
               {**base, "solver": "good", "objective": 100.0, "lower_bound": 95.0},
               {**base, "solver": "liar", "objective": 104.0, "lower_bound": 103.0}]
    rows = {row.solver: row for row in leaderboard_rows(records)}
    assert rows["good"].gap[0] == pytest.approx(100 / 95 - 1)
    markdown = leaderboard_markdown(records, "t")
    assert "liar (1 s, table_wise) claims bound 103" in markdown


def test_a_judge_prices_plans_that_other_oracles_guided(tmp_path, small_set):
    suite_path = _write_suite(tmp_path, ["lpt", "oracle-greedy"])
    suite_path.write_text(suite_path.read_text().replace('oracles = ["lookup"]', 'oracles = ["lookup", "dim"]\njudge = "size"'))
    suite = load_suite(suite_path)
    records = run_suite(suite, quiet=True)
    from costmodels import get_oracle
    from instances import load_instance_set
    instances = {i.id: i for i in load_instance_set(tmp_path / "set")[1]}
    size = get_oracle("size")
    assert {r["judge"] for r in records} == {"size"}
    assert {r["oracle"] for r in records if r["solver"] == "random"} == {"size"}
    for r in records:
        instance = instances[r["instance"]]
        assert r["objective"] == pytest.approx(size.plan_cost(instance, expand(r["plan"], instance)))
        if r["oracle"] != "size":
            assert r["lower_bound"] is None
    rows = {row.solver for row in leaderboard_rows(records)}
    assert {"lpt ← lookup", "lpt ← dim", "oracle-greedy ← dim", "random"} <= rows
    assert "judged by `size`" in leaderboard_markdown(records, "t")


def test_cli_summarize_tabulates_a_sweep(tmp_path, small_set, capsys):
    suite = _write_suite(tmp_path, ["lpt", "size-greedy"])
    assert main(["summarize", str(suite)]) == 2  # no results yet: a clear error, nothing written
    assert "no results yet" in capsys.readouterr().err
    assert main(["bench", str(suite)]) == 0
    capsys.readouterr()
    out = tmp_path / "sweep.md"
    assert main(["summarize", str(suite), str(suite), "--metric", "gap", "--title", "### sweep", "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "### sweep" and lines[2] == "| suite | lpt | size-greedy | random |"
    assert len(lines) == 8 and all(line.startswith("| t | ") and line.count(" % ") == 3 for line in lines[4:6])
    assert lines[7] == f"Numbers from revision `{short_revision(revision())}` (16 records)."  # the suite twice


def test_cli_bench_rerun_runs_only_the_named_solvers_again(tmp_path, small_set, capsys):
    suite = _write_suite(tmp_path, ["lpt", "size-greedy"])
    assert main(["bench", str(suite)]) == 0
    store = tmp_path / "out" / "t.jsonl"
    before = [json.loads(line) for line in store.read_text().splitlines()]
    assert main(["bench", str(suite), "--rerun", "lpt"]) == 0
    after = [json.loads(line) for line in store.read_text().splitlines()]
    assert "dropped 2 stored records of lpt" in capsys.readouterr().out
    assert len(after) == len(before)
    assert [r for r in after if r["solver"] != "lpt"] == [r for r in before if r["solver"] != "lpt"]
    assert sorted(r["instance"] for r in after[-2:]) == sorted(r["instance"] for r in before if r["solver"] == "lpt")
    assert all(r["solver"] == "lpt" for r in after[-2:])
    for argv, needle in ((["--rerun", "nope"], "unknown solver"), (["--rerun", "lpt", "--fresh"], "--rerun"),
                         (["--rerun", "lpt", "--render-only"], "--render-only")):
        assert main(["bench", str(suite), *argv]) == 2
        assert needle in capsys.readouterr().err
    assert [json.loads(line) for line in store.read_text().splitlines()] == after
