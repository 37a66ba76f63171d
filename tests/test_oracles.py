import gzip
import json
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import examples, make_instance
from hypothesis import given
from hypothesis import strategies as st

import costmodels.measured as measured_module
from shardbench.cli import main
from costmodels.analytic import AnalyticOracle
from costmodels.dataset import combinations, load_dataset, measured_records, table_features
from costmodels.measured import (
    Job,
    MeasuredOracle,
    MeasurementCache,
    Placement,
    Protocol,
    cache_key,
    group_lookups,
    measure,
    measure_many,
    piece_placements,
    synthesize_indices,
    synthesize_inputs,
)
from costmodels.neural import CostNet, NeuralOracle, TrainedModel, train
from instances import Instance, InstanceError, Plan, Shard, TableSharding, Topology, Workload
from instances.kernels import FUSED_UVM, FUSED_UVM_CACHING
from instances.pieces import Pieces
from instances.dlrm_loader import reuse_bins
from instances.pool import dlrm_pool

TINY = Protocol(warmups=1, runs=5, trim=1, batch=64, max_rows=1000)


def _pool_instance(indices, dims, devices=2, nodes=1):
    pool = dlrm_pool()
    tables = tuple(pool[i].as_table(d, 2) for i, d in zip(indices, dims))
    return Instance("p", tables, Topology(nodes, devices, 1 << 40), Workload(batch_size=512))


# ---------------------------------------------------------------- analytic


def test_analytic_grows_with_dims_and_pooling_and_is_additive():
    oracle = AnalyticOracle()
    base = make_instance([(1000, 16, 4.0)], 4, 1 << 30)
    wider = make_instance([(1000, 32, 4.0)], 4, 1 << 30)
    busier = make_instance([(1000, 16, 8.0)], 4, 1 << 30)
    c = lambda i: oracle.device_cost(i, [0])
    assert c(wider).forward_compute > c(base).forward_compute and c(wider).forward_comm > c(base).forward_comm
    assert c(busier).forward_compute > c(base).forward_compute and c(busier).backward_compute > c(base).backward_compute
    instance = make_instance([(100, 8, 1.0), (200, 16, 3.0), (50, 32, 0.5)], 2, 1 << 30)
    both = oracle.device_cost(instance, [0, 1, 2])
    assert both.total == pytest.approx(sum(oracle.table_costs(instance)))
    assert both.backward_compute == pytest.approx(2 * both.forward_compute)


def test_analytic_communication_depends_on_the_sum_of_dims_on_a_device():
    oracle = AnalyticOracle()
    instance = make_instance([(10, 16, 1.0), (10**6, 16, 50.0), (500, 32, 3.0)], 4, 1 << 40)
    two_small = oracle.device_cost(instance, [0, 1])
    one_wide = oracle.device_cost(instance, [2])
    assert two_small.backward_comm == pytest.approx(one_wide.backward_comm)  # outputs: Σ dims
    assert two_small.forward_compute != pytest.approx(one_wide.forward_compute)
    # Forward also brings in the lookups' ids: 8 bytes per lookup from every other device.
    ids = lambda i, t: (oracle.device_cost(i, [t]).forward_comm - oracle.device_cost(i, [t]).backward_comm)
    assert ids(instance, 1) == pytest.approx(50.0 / 3.0 * ids(instance, 2))
    single = make_instance([(10, 16, 1.0)], 1, 1 << 40)
    assert oracle.device_cost(single, [0]).forward_comm == 0.0
    flat = Instance("flat", instance.tables, Topology(1, 8, 1 << 40), instance.workload)
    racks = Instance("racks", instance.tables, Topology(2, 4, 1 << 40), instance.workload)
    assert oracle.device_cost(racks, [2]).forward_comm > oracle.device_cost(flat, [2]).forward_comm


# ---------------------------------------------------------------- measured


def test_synthetic_inputs_reproduce_pooling_and_reuse_bins():
    pool = dlrm_pool()
    table = pool[0].as_table(16, 2)
    rng = np.random.default_rng(0)
    indices, lengths = synthesize_indices(table, 65536, table.rows, rng)
    assert lengths.sum() == round(65536 * table.pooling_factor) == indices.size
    got = np.array(reuse_bins(np.unique(indices, return_counts=True)[1]))
    assert 0.5 * np.abs(got - np.array(table.reuse_bins)).sum() < 0.15  # total variation distance
    assert indices.min() >= 0 and indices.max() < table.rows


def test_measured_oracle_runs_a_real_fbgemm_forward_and_backward_on_cpu(tmp_path):
    instance = _pool_instance([0, 5, 9], [16, 32, 16])
    oracle = MeasuredOracle(TINY, MeasurementCache(tmp_path))
    cost = oracle.device_cost(instance, [0, 1])
    assert cost.forward_compute > 0 and cost.backward_compute > 0 and cost.forward_comm > 0
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert len(record["forward_runs"]) == 5 and record["device"].startswith("cpu:")
    assert "analytic" in record["communication"]
    assert oracle.device_cost(instance, []).total == 0.0


def test_cached_measurements_are_reused_only_for_identical_sets_and_versions(tmp_path, monkeypatch):
    calls = []
    real = measured_module.measure

    def counting(tables, batch, protocol, **where):
        calls.append(len(tables))
        return real(tables, batch, protocol, **where)

    monkeypatch.setattr(measured_module, "measure", counting)
    cache = MeasurementCache(tmp_path)
    pool = dlrm_pool()
    a, b, c = pool[1].as_table(16, 2), pool[2].as_table(32, 2), pool[3].as_table(16, 2)
    first = cache.get_or_measure([a, b], 64, TINY)
    assert cache.get_or_measure([b, a], 64, TINY) == first  # same set, other order: reused
    assert len(calls) == 1
    cache.get_or_measure([a, c], 64, TINY)
    cache.get_or_measure([a, b], 128, TINY)
    assert len(calls) == 3
    device, versions = measured_module.environment()
    monkeypatch.setattr(measured_module, "environment", lambda: (device, {**versions, "fbgemm_gpu": "0.0-other"}))
    cache.get_or_measure([a, b], 64, TINY)
    assert len(calls) == 4


def test_measure_reports_spread_and_trimmed_means():
    pool = dlrm_pool()
    result = measure([pool[4].as_table(16, 2)], 64, TINY)
    ordered = sorted(result.forward_runs)
    assert result.forward_s == pytest.approx(np.mean(ordered[1:-1]))
    assert result.spread >= 0
    assert result.exposed == 0  # only a GPU run hides its launches behind a spin


def test_measure_many_times_the_inputs_measure_would_build_in_order(monkeypatch):
    pool = dlrm_pool()
    jobs = [Job(k, (pool[k].as_table(16, 2), pool[k + 7].as_table(32, 2)), 64, replace(TINY, seed=k))
            for k in range(4)]
    seen = []

    def recording(tables, batch, protocol, placements=None, inputs=None):
        seen.append(inputs)
        return real(tables, batch, protocol, placements, inputs)

    real = measured_module.measure
    monkeypatch.setattr(measured_module, "measure", recording)
    results = list(measure_many(jobs, workers=1, lookahead=2))
    assert [job.tag for job, _ in results] == [0, 1, 2, 3]
    for job, inputs in zip(jobs, seen):  # built in a worker process, from the job's seed alone
        expected = synthesize_inputs(job.tables, 64, job.protocol, cuda=False)
        assert np.array_equal(inputs.indices, expected.indices) and np.array_equal(inputs.offsets, expected.offsets)
    assert all(len(m.forward_runs) == TINY.runs and m.total_s > 0 for _, m in results)


def test_measured_records_are_complete_and_stop_at_the_deadline():
    combos = list(combinations(3, 3, seed=1))
    records = list(measured_records(combos, 64, TINY))
    assert [r["id"] for r in records] == [c["id"] for c in combos]
    assert all(len(r["single_total_s"]) == len(r["dims"]) == len(r["single_spread"]) for r in records)
    assert list(measured_records(combos, 64, TINY, deadline=time.monotonic() - 1)) == []


def test_placements_key_the_cache_apart_and_are_checked(tmp_path):
    pool = dlrm_pool()
    table = pool[3].as_table(16, 2)
    device, versions = measured_module.environment()
    plain = cache_key([table], 64, TINY, device, versions)
    assert cache_key([table], 64, TINY, device, versions, [Placement()]) == plain
    cached = cache_key([table], 64, TINY, device, versions, [Placement(FUSED_UVM_CACHING, 0.2)])
    other = cache_key([table], 64, TINY, device, versions, [Placement(FUSED_UVM_CACHING, 0.3)])
    uvm = cache_key([table], 64, TINY, device, versions, [Placement(FUSED_UVM)])
    assert len({plain, cached, other, uvm}) == 4
    with pytest.raises(ValueError, match="load factor"):
        Placement(FUSED_UVM_CACHING, 0.0)
    with pytest.raises(ValueError, match="unknown kernel"):
        Placement("hbm")
    # On a CPU every table is on the host: a cached placement is timed, not refused.
    assert measure([table], 64, TINY, [Placement(FUSED_UVM_CACHING, 0.2)]).total_s > 0


def test_measured_oracle_reads_each_pieces_kernel_and_load_factor(tmp_path, monkeypatch):
    instance = _pool_instance([0, 5], [16, 32])
    plan = Plan("p", (TableSharding("table_wise", (Shard(0, (0, instance.tables[0].rows), (0, 16)),),
                                    FUSED_UVM_CACHING, 0.3),
                      TableSharding("table_wise", (Shard(1, (0, instance.tables[1].rows), (0, 32)),))))
    pieces, _ = Pieces.of_plan(instance, plan)
    assert piece_placements(pieces) == [Placement(FUSED_UVM_CACHING, 0.3), Placement()]
    oracle = MeasuredOracle(TINY, MeasurementCache(tmp_path))
    asked = []
    monkeypatch.setattr(oracle.cache, "get_or_measure",
                        lambda tables, batch, protocol, placements=None: asked.append(placements) or
                        measure(tables, batch, protocol))
    oracle.bind(instance, pieces).device_cost([0, 1])
    assert asked == [[Placement(FUSED_UVM_CACHING, 0.3), Placement()]]


def test_grouped_lookups_rebuild_each_tables_batch():
    pool = dlrm_pool()
    tables = [pool[i].as_table(16, 2) for i in (1, 2, 3)]
    inputs = synthesize_inputs(tables, 64, TINY, cuda=False)
    alone = [group_lookups(inputs, 64, [i]) for i in range(3)]
    indices, offsets, rows = group_lookups(inputs, 64, [2, 0])
    assert np.array_equal(indices, np.concatenate([alone[2][0], alone[0][0]]))
    assert np.array_equal(np.diff(offsets), np.concatenate([np.diff(alone[2][1]), np.diff(alone[0][1])]))
    assert offsets.size == 2 * 64 + 1 and offsets[-1] == indices.size
    assert np.array_equal(rows, np.repeat([inputs.rows[2], inputs.rows[0]], [alone[2][0].size, alone[0][0].size]))
    everything = group_lookups(inputs, 64, [0, 1, 2])  # one TBE, as on a CPU: the batch as it was built
    assert np.array_equal(everything[0], inputs.indices) and np.array_equal(everything[1], inputs.offsets)


def test_measure_many_times_nothing_after_its_deadline(monkeypatch):
    ticks = iter(range(1000))
    monkeypatch.setattr(measured_module.time, "monotonic", lambda: next(ticks))
    pool = dlrm_pool()
    jobs = [Job(k, (pool[k].as_table(16, 2),), 64, TINY) for k in range(5)]
    assert [job.tag for job, _ in measure_many(jobs, deadline=1.5)] == [0, 1]  # clock 0, 1; 2 is past it


def test_a_deadline_between_a_combinations_singles_drops_it(monkeypatch):
    combos = list(combinations(2, 3, seed=1))
    first = len(set(zip(combos[0]["pool_indices"], combos[0]["dims"])))
    assert set(zip(combos[1]["pool_indices"], combos[1]["dims"])) - set(zip(combos[0]["pool_indices"], combos[0]["dims"]))
    ticks = iter(range(1000))
    monkeypatch.setattr(measured_module.time, "monotonic", lambda: next(ticks))
    # the first combination and its singles, then the second one together, then the deadline
    records = list(measured_records(combos, 64, TINY, deadline=first + 1.5))
    assert [r["id"] for r in records] == [combos[0]["id"]]


def test_a_gzipped_dataset_reads_as_its_text_and_a_broken_one_is_named(tmp_path):
    records = _records(4)
    path = tmp_path / "costs.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(json.dumps(r) for r in records) + "\n").encode()))
    assert [r["id"] for r in load_dataset(path)] == [r["id"] for r in records]
    path.write_bytes(b"not gzip at all")
    with pytest.raises(InstanceError, match="not a gzip file"):
        load_dataset(path)


# ---------------------------------------------------------------- neural


def _records(count=60, seed=0):
    """A synthetic dataset with a known sub-additive cost, in the measured dataset's format."""
    out = []
    pool = dlrm_pool()
    for combo in combinations(count, 6, seed, unseen_share=0.3):
        tables = [pool[i].as_table(d, 2) for i, d in zip(combo["pool_indices"], combo["dims"])]
        work = np.array([t.dim * (t.pooling_factor + 0.1) for t in tables])
        total = 1e-4 * work.sum() ** 0.8 + 1e-4
        out.append({**combo, "features": [table_features(t) for t in tables], "batch": 2048, "total_s": total,
                    "forward_s": total / 3, "backward_s": 2 * total / 3, "device": "synthetic"})
    return out


@pytest.mark.parametrize("kind", ["autoshard", "dreamshard"])
def test_neural_cost_is_invariant_to_table_order_and_survives_save_load(kind, tmp_path):
    torch.manual_seed(0)
    model = TrainedModel(CostNet(kind), np.zeros(21), np.ones(21), {"device": "x", "batch": 1})
    oracle = NeuralOracle(model, f"neural-{kind}")
    instance = _pool_instance([0, 1, 2, 3, 4], [16, 32, 16, 32, 16])
    assert oracle.device_cost(instance, [0, 3, 4]).total == pytest.approx(oracle.device_cost(instance, [4, 0, 3]).total)
    model.save(tmp_path / "m.pt")
    loaded = NeuralOracle(TrainedModel.load(tmp_path / "m.pt"), "again")
    for tables in ([0], [1, 2], [0, 1, 2, 3, 4]):
        assert loaded.device_cost(instance, tables).total == oracle.device_cost(instance, tables).total


@examples(20)
@given(st.lists(st.integers(0, 2), min_size=5, max_size=5), st.sampled_from(["autoshard", "dreamshard"]))
def test_neural_device_state_adds_and_subtracts_embeddings(assignment, kind):
    torch.manual_seed(1)
    oracle = NeuralOracle(TrainedModel(CostNet(kind), np.zeros(21), np.ones(21), {}), "n")
    instance = _pool_instance([10, 11, 12, 13, 14], [16, 16, 32, 32, 16], devices=3)
    state = oracle.new_state(instance)
    for t, d in enumerate(assignment):
        state.add(t, d)
    expected = [c.total for c in oracle.device_costs(instance, Plan.table_wise(instance, assignment))]
    assert state.costs() == pytest.approx(expected, rel=1e-5)
    state.remove(0, assignment[0])
    rest = [t for t in range(1, 5) if assignment[t] == assignment[0]]
    assert state.cost(assignment[0]) == pytest.approx(oracle.device_cost(instance, rest).total, rel=1e-5)


def test_training_learns_a_known_cost_and_reports_unseen_table_metrics():
    records = _records(400)
    model, metrics = train(records, "autoshard", epochs=300, seed=0)
    test = metrics["test_unseen_tables"]
    assert set(test) == {"mae_s", "mape", "r2", "kendall_tau", "count"}
    assert test["count"] == sum(r["split"] == "test" for r in records)
    untrained = TrainedModel(CostNet("autoshard"), model.mean, model.std, {})
    from costmodels.neural import accuracy, predict_total
    test_set = [r for r in records if r["split"] == "test"]
    actual = np.array([r["total_s"] for r in test_set])
    before = accuracy(predict_total(untrained, test_set), actual)
    assert test["mae_s"] < 0.5 * before["mae_s"] and test["kendall_tau"] > 0.6
    again, _ = train(records, "autoshard", epochs=300, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.net.state_dict().values(), again.net.state_dict().values()))


def test_cli_measure_and_train(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHARDBENCH_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "costs.jsonl"
    assert main(["measure", "--combos", "2", "--max-tables", "2", "--batch", "64", "--max-rows", "1000",
                 "--out", str(data)]) == 0
    lines = [json.loads(x) for x in data.read_text().splitlines()]
    assert len(lines) == 2 and all(len(r["single_total_s"]) == len(r["dims"]) for r in lines)
    synthetic = tmp_path / "synthetic.jsonl"
    synthetic.write_text("\n".join(json.dumps(r) for r in _records(80)) + "\n")
    out = tmp_path / "model.pt"
    assert main(["train", "costmodel", "--dataset", str(synthetic), "--model", "dreamshard", "--epochs", "5",
                 "--out", str(out)]) == 0
    assert "test_unseen_tables" in capsys.readouterr().out and out.exists()
    assert TrainedModel.load(out).net.kind == "dreamshard"
