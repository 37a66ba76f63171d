import dataclasses
import gzip
import json

import numpy as np
import pytest
import torch
from conftest import examples, make_instance, small_instances
from hypothesis import given
from hypothesis import strategies as st

from instances import (
    InstanceError,
    Plan,
    PlanError,
    instance_from_dict,
    instance_to_dict,
    load_instance,
    load_instance_set,
    save_instance,
    save_instance_set,
)
from instances.dlrm_loader import load_raw_tables, reuse_bins
from instances.model import BucketSpec, RowDistribution
from instances.pool import dlrm_pool
from instances.sampler import MemorySpec, TaskSpec, sample_tasks


def test_pool_matches_published_statistics():
    pool = dlrm_pool()
    assert len(pool) == 856
    rows = np.array([t.rows for t in pool])
    pooling = np.array([t.pooling_factor for t in pool])
    assert rows.max() == 12_543_670 and rows.min() == 100
    assert abs(rows.mean() - 4_107_472) < 1
    assert abs(pooling.mean() - 15.81) < 0.005 and abs(np.median(pooling) - 4.57) < 0.005
    assert sum(p == 0 for p in pooling) == 36


@examples(40)
@given(small_instances())
def test_json_round_trip_is_identity(instance):
    once = instance_from_dict(json.loads(json.dumps(instance_to_dict(instance))))
    assert once == instance
    assert instance_to_dict(once) == instance_to_dict(instance)


def test_round_trip_with_optional_fields(tmp_path):
    base = make_instance([(100, 8, 1.5)], 2, 10**6)
    table = dataclasses.replace(base.tables[0], pooled=False,
                                row_distribution=RowDistribution("power_law", alpha=1.1),
                                buckets=BucketSpec(64, "chunk", rows_per_bucket=2))
    instance = dataclasses.replace(base, tables=(table,))
    save_instance(instance, tmp_path / "i.json")
    assert load_instance(tmp_path / "i.json") == instance
    empirical = dataclasses.replace(table, row_distribution=RowDistribution("empirical", probabilities=(0.5, 0.25)))
    again = dataclasses.replace(base, tables=(empirical,))
    assert instance_from_dict(instance_to_dict(again)) == again


def _good() -> dict:
    return instance_to_dict(make_instance([(100, 8, 1.5), (50, 4, 0.0)], 2, 10**6))


BAD_FIELDS = [
    (lambda d: d["tables"][0].update(rows=-5), "tables[0].rows"),
    (lambda d: d["tables"][0].update(rows=2.5), "tables[0].rows"),
    (lambda d: d["tables"][0].update(dim=0), "tables[0].dim"),
    (lambda d: d["tables"][0].update(dtype_bytes=3), "tables[0].dtype_bytes"),
    (lambda d: d["tables"][0].update(pooling_factor=float("nan")), "tables[0].pooling_factor"),
    (lambda d: d["tables"][0].update(pooling_factor=-1.0), "tables[0].pooling_factor"),
    (lambda d: d["tables"][0].update(reuse_bins=[0.5] + [0.0] * 16), "tables[0].reuse_bins"),
    (lambda d: d["tables"][0].update(reuse_bins=[1.0] * 3), "tables[0].reuse_bins"),
    (lambda d: d["tables"][0]["reuse_bins"].__setitem__(1, -0.1), "tables[0].reuse_bins[1]"),
    (lambda d: d["tables"][0].update(name=""), "tables[0].name"),
    (lambda d: d["tables"][1].update(name=d["tables"][0]["name"]), "tables[1].name"),
    (lambda d: d["tables"][0].update(pooled="yes"), "tables[0].pooled"),
    (lambda d: d["tables"][0].update(colour="red"), "tables[0].colour"),
    (lambda d: d["tables"][0].pop("dim"), "tables[0].dim"),
    (lambda d: d["tables"][0].update(buckets={"count": 0, "mapping": "chunk"}), "tables[0].buckets.count"),
    (lambda d: d["tables"][0].update(buckets={"count": 4, "mapping": "modulo"}), "tables[0].buckets.mapping"),
    (lambda d: d["tables"][0].update(row_distribution={"kind": "zipf"}), "tables[0].row_distribution.kind"),
    (lambda d: d["tables"][0].update(row_distribution={"kind": "power_law", "alpha": -1}),
     "tables[0].row_distribution.alpha"),
    (lambda d: d["tables"][0].update(row_distribution={"kind": "empirical", "probabilities": [1.5]}),
     "tables[0].row_distribution.probabilities[0]"),
    (lambda d: d.update(tables=[]), "tables"),
    (lambda d: d["topology"].update(nodes=0), "topology.nodes"),
    (lambda d: d["topology"].update(devices_per_node=-1), "topology.devices_per_node"),
    (lambda d: d["topology"].update(memory_bytes=0), "topology.memory_bytes"),
    (lambda d: d["topology"].update(inter_node_a2a_bw=0.0), "topology.inter_node_a2a_bw"),
    (lambda d: d["topology"].pop("memory_bytes"), "topology.memory_bytes"),
    (lambda d: d["workload"].update(batch_size=0), "workload.batch_size"),
    (lambda d: d["workload"].update(optimizer="lion"), "workload.optimizer"),
    (lambda d: d["workload"].update(dtype="fp8"), "workload.dtype"),
    (lambda d: d.update(schema_version=99), "schema_version"),
    (lambda d: d.pop("id"), "id"),
    (lambda d: d.update(id=""), "id"),
]


@pytest.mark.parametrize("mutate,field", BAD_FIELDS, ids=[f for _, f in BAD_FIELDS])
def test_validator_names_the_bad_field(mutate, field):
    data = _good()
    mutate(data)
    with pytest.raises(InstanceError) as caught:
        instance_from_dict(data)
    assert caught.value.field == field


def test_empty_table_may_have_all_zero_bins_but_a_used_one_may_not():
    data = _good()
    data["tables"][1]["reuse_bins"] = [0.0] * 17
    instance_from_dict(data)
    data["tables"][0]["reuse_bins"] = [0.0] * 17
    with pytest.raises(InstanceError, match="tables\\[0\\].reuse_bins"):
        instance_from_dict(data)


def test_unreadable_and_non_json_files_are_named(tmp_path):
    with pytest.raises(InstanceError, match="cannot read"):
        load_instance(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InstanceError, match="not valid JSON"):
        load_instance(tmp_path / "bad.json")


def test_plan_validation_catches_each_defect():
    instance = make_instance([(100, 8, 1.0), (100, 8, 1.0), (100, 8, 1.0)], 2, 100 * 8 * 2 * 2)
    plan = lambda assignment: Plan.table_wise(instance, assignment)
    plan((0, 1, 0)).validate(instance)
    with pytest.raises(PlanError, match="covers 2 tables"):
        Plan("t", plan((0, 1, 0)).tables[:2]).validate(instance)
    with pytest.raises(PlanError, match="table t1: device 2 is not in 0..1"):
        plan((0, 2, 1)).validate(instance)
    with pytest.raises(PlanError, match="memory capacity"):
        plan((0, 0, 0)).validate(instance)
    with pytest.raises(PlanError, match="instance"):
        dataclasses.replace(plan((0, 1, 0)), instance_id="other").validate(instance)


def test_optimizer_state_counts_in_memory():
    instance = make_instance([(1000, 16, 1.0)], 1, 10**9)
    from instances import Workload

    def stored(optimizer: str) -> list[int]:
        return dataclasses.replace(instance, workload=Workload(optimizer=optimizer)).table_storage()[0].tolist()

    # (HBM, host): every byte in HBM, the weights plus the optimizer's fp32 state
    assert stored("sgd") == [1000 * 16 * 2, 0]
    assert stored("rowwise_adagrad") == [1000 * 16 * 2 + 1000 * 4, 0]
    assert stored("adagrad") == [1000 * 16 * 2 + 1000 * 16 * 4, 0]
    assert stored("adam") == [1000 * 16 * 2 + 1000 * 16 * 8, 0]


def test_autoshard_protocol():
    test_tasks = sample_tasks(TaskSpec("autoshard", 80, split="test", seed=0))
    train_tasks = sample_tasks(TaskSpec("autoshard", 80, split="train", seed=0))
    assert len(test_tasks) == 10 and len(train_tasks) == 90
    assert len({t.id for t in test_tasks + train_tasks}) == 100
    for task in test_tasks:
        assert task.num_devices == 8 and task.num_tables == 80
        assert {t.dim for t in task.tables} <= {16, 32}
        assert all(t.dtype_bytes == 2 for t in task.tables)
        assert len({t.name for t in task.tables}) == 80
    again = sample_tasks(TaskSpec("autoshard", 80, split="test", seed=0))
    assert again == test_tasks
    assert sample_tasks(TaskSpec("autoshard", 80, split="test", seed=1)) != test_tasks


def test_dreamshard_protocol_splits_the_pool_in_two_disjoint_halves():
    train = sample_tasks(TaskSpec("dreamshard", 50, split="train", seed=3))
    test = sample_tasks(TaskSpec("dreamshard", 50, split="test", seed=3))
    assert len(train) == 50 and len(test) == 50
    train_names = {t.name for task in train for t in task.tables}
    test_names = {t.name for task in test for t in task.tables}
    assert not train_names & test_names
    assert len(train_names) <= 428 and len(test_names) <= 428
    assert all(task.num_devices == 4 and {t.dim for t in task.tables} == {16} for task in test)


@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0])
def test_unseen_ratio_protocol(ratio):
    tasks = sample_tasks(TaskSpec("unseen", 40, split="test", unseen_ratio=ratio))
    for task in tasks:
        unseen = sum(int(t.name[4:]) >= 428 for t in task.tables)
        assert unseen == round(ratio * 40)
    for task in sample_tasks(TaskSpec("unseen", 40, split="train", unseen_ratio=ratio)):
        assert all(int(t.name[4:]) < 428 for t in task.tables)


def test_memory_capacity_absolute_and_tightness():
    task = sample_tasks(TaskSpec("autoshard", 20, count=1, memory=MemorySpec(capacity_bytes=123456789)))[0]
    assert task.topology.memory_bytes == 123456789
    task = sample_tasks(TaskSpec("autoshard", 20, count=1, memory=MemorySpec(tightness=1.1)))[0]
    average = task.table_storage()[:, 0].sum() / task.num_devices
    assert 1.1 * average <= task.topology.memory_bytes <= 1.1 * average + 1
    with pytest.raises(InstanceError, match="memory"):
        sample_tasks(TaskSpec("autoshard", 20, memory=MemorySpec(capacity_bytes=1, tightness=1.0)))
    with pytest.raises(InstanceError, match="num_tables"):
        sample_tasks(TaskSpec("dreamshard", 500))


def test_instance_set_folder_round_trip_and_no_partial_output(tmp_path):
    tasks = sample_tasks(TaskSpec("autoshard", 20, count=3))
    folder = save_instance_set(tasks, tmp_path / "set", {"protocol": "autoshard"})
    manifest, loaded = load_instance_set(folder)
    assert loaded == tuple(tasks) and manifest["protocol"] == "autoshard"
    with pytest.raises(FileExistsError):
        save_instance_set(tasks, folder, {})
    broken = [tasks[0], dataclasses.replace(tasks[1], id="")]
    with pytest.raises(InstanceError):
        save_instance_set(broken, tmp_path / "broken", {})
    assert not (tmp_path / "broken").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["set"]


# ---------------------------------------------------------------- raw dlrm_datasets loader


def _write_raw(path, per_table, batch):
    """per_table: list (one per table) of lists (one per sample) of indices."""
    lengths = torch.tensor([[len(s) for s in table] for table in per_table], dtype=torch.int64)
    flat = [i for table in per_table for sample in table for i in sample]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths.reshape(-1), 0)])
    data = (torch.tensor(flat, dtype=torch.int64), offsets, lengths)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as handle:
            torch.save(data, handle)
    else:
        torch.save(data, path)


@pytest.mark.parametrize("suffix", [".pt", ".pt.gz"])
def test_raw_loader_reproduces_known_features(tmp_path, suffix):
    # Table 0: index 7 seen 5 times, index 3 twice, index 250 once, over 4 samples.
    # Table 1: no lookups at all.  Table 2: index 0 seen 40000 times (the open-ended last bin).
    table0 = [[7, 7, 3], [7, 250], [7, 3], [7]]
    table1 = [[], [], [], []]
    table2 = [[0] * 10000 for _ in range(4)]
    path = tmp_path / f"raw{suffix}"
    _write_raw(path, [table0, table1, table2], batch=4)
    t0, t1, t2 = load_raw_tables(path)
    assert t0.rows == 251 and t0.pooling_factor == 8 / 4
    expected = [0.0] * 17
    expected[0], expected[1], expected[3] = 1 / 3, 1 / 3, 1 / 3  # counts 1, 2 and 5 -> (0,1], (1,2], (4,8]
    assert t0.reuse_bins == pytest.approx(tuple(expected))
    assert t1.rows == 100 and t1.pooling_factor == 0.0 and t1.reuse_bins == (0.0,) * 17
    assert t2.rows == 100 and t2.pooling_factor == 10000.0 and t2.reuse_bins[16] == 1.0


@given(st.lists(st.integers(1, 70000), min_size=1, max_size=50))
def test_reuse_bins_match_the_papers_bin_edges(counts):
    edges = [0, 1] + [2 ** b for b in range(1, 16)] + [float("inf")]  # (0,1], (1,2], (2,4], …, (32768, inf)
    expected = np.zeros(17)
    for c in counts:
        expected[next(b for b in range(17) if edges[b] < c <= edges[b + 1])] += 1
    assert reuse_bins(np.array(counts)) == pytest.approx(tuple(expected / len(counts)))


def test_raw_loader_rejects_inconsistent_files(tmp_path):
    torch.save((torch.arange(5), torch.tensor([0, 2, 9]), torch.tensor([[2, 3]])), tmp_path / "bad.pt")
    with pytest.raises(InstanceError, match="offsets"):
        load_raw_tables(tmp_path / "bad.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a tensor file")
    with pytest.raises(InstanceError, match="cannot load"):
        load_raw_tables(tmp_path / "junk.pt")
