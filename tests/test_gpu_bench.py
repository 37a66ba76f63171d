"""The GPU session's harness (benchmarks/gpu.py), on this CPU: what it prepares, that a run writes each
phase and keeps its deadline, and that the page's verdict follows from the committed measurements."""
import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from benchmarks.gpu import RESULTS, plan_sets, report, run, shard_sets, spec_table, table_spec
from benchmarks.store import SCHEMA_VERSION
from costmodels.measured import Placement
from instances.kernels import FUSED_UVM_CACHING
from instances.pool import dlrm_pool


@pytest.fixture(scope="module")
def sets():
    return plan_sets()


def test_each_plan_is_cut_into_all_its_ranks_with_both_estimates(sets):
    by = defaultdict(list)
    for record in sets:
        by[(record["task"], record["plan"])].append(record)
    assert len({task for task, _ in by}) == 10 and {plan for _, plan in by} == {"torchrec-planner", "ours"}
    for records in by.values():
        assert sorted(r["rank"] for r in records) == list(range(8))
        assert all(set(r["predicted_compute_s"]) == {"torchrec", "analytic"} for r in records)
        assert sum(len(r["tables"]) for r in records) >= 80  # every table has a piece somewhere


def test_a_table_and_its_place_survive_the_spec():
    table = dlrm_pool()[7].as_table(32, 2)
    placement = Placement(FUSED_UVM_CACHING, 0.2)
    again, where = spec_table(table_spec(table, placement))
    assert where == placement
    assert (again.rows, again.dim, again.pooling_factor, again.reuse_bins) == \
        (table.rows, table.dim, table.pooling_factor, table.reuse_bins)


def test_shard_sets_cover_every_variant_of_each_heavy_table():
    variants = defaultdict(set)
    for record in shard_sets():
        variants[record["pool_index"]].add(record["variant"])
    assert len(variants) == 6 and all({"whole", "columns/2", "rows/8", "uvm", "cached@0.2"} <= v
                                      for v in variants.values())


def _spec(tmp_path) -> Path:
    pool = dlrm_pool()
    small = [table_spec(pool[i].as_table(16, 2), Placement()) for i in (3, 4)]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "revision": "0123abc",
        "plans": [{"task": "t", "plan": p, "rank": 0, "batch": 64, "tables": small} for p in ("a", "b")],
        "shards": [{"pool_index": 3, "variant": "whole", "batch": 64, "tables": small[:1]}]}))
    return spec


def _lines(out: Path) -> list[int]:
    with gzip.open(out / "costs.jsonl.gz", "rt") as handle:
        costs = handle.read().splitlines()
    return [len((out / name).read_text().splitlines()) for name in ("plans.jsonl", "shards.jsonl")] + [len(costs)]


def test_a_run_writes_each_phase_with_its_revision(tmp_path):
    out = tmp_path / "out"
    run(_spec(tmp_path), out, seconds=600, workers=0, batch=64, combos=1, seed=0)
    assert _lines(out) == [2, 1, 1]
    timed = json.loads((out / "plans.jsonl").read_text().splitlines()[0])
    assert timed["tables"] == 2 and timed["total_s"] > 0 and timed["device"].startswith("cpu:")
    assert timed["revision"] == "0123abc" and timed["schema_version"] == SCHEMA_VERSION
    env = json.loads((out / "env.json").read_text())
    assert env["device"].startswith("cpu:") and env["revision"] == "0123abc" and env["workers"] == 0


def test_a_continued_run_times_only_the_dataset_from_where_the_first_stopped(tmp_path):
    out = tmp_path / "out"
    run(_spec(tmp_path), out, seconds=600, workers=0, batch=64, combos=3, seed=0, first=2, dataset_only=True)
    with gzip.open(out / "costs.jsonl.gz", "rt") as handle:
        assert [json.loads(line)["id"] for line in handle] == [2]
    assert not (out / "plans.jsonl").exists() and not (out / "shards.jsonl").exists()


def test_a_run_past_its_deadline_times_nothing(tmp_path):
    out = tmp_path / "out"
    run(_spec(tmp_path), out, seconds=0, workers=0, batch=64, combos=2, seed=0)
    assert _lines(out) == [0, 0, 0]


def test_the_page_counts_wins_from_the_measurements(tmp_path, sets):
    plans = [json.loads(x) for x in (RESULTS / "gpu-h200-plans.jsonl").read_text().splitlines()]
    worst = defaultdict(float)
    for r in plans:
        worst[(r["task"], r["plan"])] = max(worst[(r["task"], r["plan"])], r["total_s"])
    tasks = {task for task, _ in worst}
    wins = sum(worst[(t, "ours")] <= worst[(t, "torchrec-planner")] for t in tasks)
    page = tmp_path / "gpu.md"
    text = report(RESULTS / "gpu-h200-plans.jsonl", RESULTS / "gpu-h200-shards.jsonl", RESULTS / "gpu-h200-env.json",
                  page=page, sets=sets)
    verdict = "met" if wins >= 9 else "not met"
    assert f"on **{wins}/{len(tasks)}** tasks (target 90% of them: {verdict})" in text
    assert page.with_suffix(".png").exists()
