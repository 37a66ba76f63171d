"""TorchRec in and out: import from its objects and from a spec, export a ShardingPlan cut by its rules
and read it back, its estimator as an oracle (equal to its own rating of its planner's plan), its
planner as a peer, and an exported plan run for real on 2 CPU processes over gloo."""
import json
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import benchmarks  # noqa: F401  (plugs the TorchRec adapters into the registries)
from benchmarks.cli import main
from costmodels import get_oracle
from instances import (
    Instance,
    Plan,
    PlanError,
    Shard,
    TableSharding,
    Topology,
    Workload,
    load_instance,
    save_instance,
)
from instances.sharding import plan_to_dict, row_cuts
from interop.torchrec import (
    STORAGE_RESERVE,
    from_torchrec,
    from_torchrec_plan,
    plan_with_torchrec,
    to_torchrec,
    torchrec_module,
)
from solvers import Budget, run_solver

warnings.filterwarnings("ignore")
SPEC = {"tables": [{"name": "user", "num_embeddings": 1000, "embedding_dim": 64, "data_type": "fp16",
                    "pooling_factors": [20.0]},
                   {"name": "item", "num_embeddings": 50, "embedding_dim": 32, "pooling_factors": [1.0],
                    "sharding_types": ["table_wise", "data_parallel"]},
                   {"name": "ctx", "num_embeddings": 2000, "embedding_dim": 16, "pooling_factors": [3.0, 2.0]}],
        "world_size": 4, "local_world_size": 2, "hbm_cap": 2**30, "batch_size": 256}


def _instance(types=("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel")):
    from conftest import make_table

    tables = tuple(make_table(f"t{i}", rows, dim, pooling) for i, (rows, dim, pooling) in
                   enumerate([(1000, 16, 4.0), (40, 8, 1.0), (300, 32, 12.0), (7, 16, 0.5), (500, 16, 2.0)]))
    return Instance("tr", tables, Topology(2, 2, 1 << 30), Workload(batch_size=128), sharding_types=types).validate()


def test_import_from_torchrec_objects():
    from torchrec import DataType, EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner import Topology as TorchRecTopology

    configs = [EmbeddingBagConfig(name="a", embedding_dim=32, num_embeddings=100, feature_names=["fa", "fb"],
                                  data_type=DataType.FP16),
               EmbeddingBagConfig(name="b", embedding_dim=8, num_embeddings=10, feature_names=["fc"])]
    import torch

    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    topology = TorchRecTopology(world_size=8, local_world_size=4, compute_device="cuda", hbm_cap=10 * 2**30)
    constraints = {"a": ParameterConstraints(pooling_factors=[2.0, 3.0], sharding_types=["row_wise", "table_wise"])}
    instance = from_torchrec(ebc, topology, constraints, batch_size=64)
    a, b = instance.tables
    assert (a.rows, a.dim, a.dtype_bytes, a.pooling_factor, a.sharding_types) == (100, 32, 2, 5.0, ("row_wise", "table_wise"))
    assert (b.dtype_bytes, b.pooling_factor, b.sharding_types) == (4, 1.0, None)
    assert (instance.topology.nodes, instance.topology.devices_per_node) == (2, 4)
    assert instance.topology.memory_bytes == int(10 * 2**30 * (1 - STORAGE_RESERVE))
    assert instance.topology.inter_node_a2a_bw == pytest.approx(topology.inter_host_bw * 1000)
    assert instance.workload.batch_size == 64


def test_cli_imports_a_spec_and_rejects_bad_ones(tmp_path, capsys):
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    assert main(["instances", "import-torchrec", str(tmp_path / "spec.json"), "--out", str(tmp_path / "i.json")]) == 0
    instance = load_instance(tmp_path / "i.json")
    assert [t.name for t in instance.tables] == ["user", "item", "ctx"] and instance.tables[2].pooling_factor == 5.0
    toml = "\n".join(["world_size = 2", "hbm_cap = 1073741824", "batch_size = 8",
                      "[[tables]]", 'name = "x"', "num_embeddings = 10", "embedding_dim = 8"])
    (tmp_path / "spec.toml").write_text(toml)
    assert main(["instances", "import-torchrec", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "t.json")]) == 0
    for mutate, needle in [(lambda s: s["tables"][0].pop("num_embeddings"), "tables[0].num_embeddings: missing"),
                           (lambda s: s["tables"][1].update(embedding_dim=0), "tables[1].embedding_dim"),
                           (lambda s: s["tables"][1].update(sharding_types=["diagonal"]), "tables[1].sharding_types"),
                           (lambda s: s.update(world_size=-4), "world_size"),
                           (lambda s: s.update(local_world_size=3), "local_world_size"),
                           (lambda s: s.pop("hbm_cap"), "hbm_cap: missing"),
                           (lambda s: s.update(colour="red"), "colour: unknown field")]:
        spec = json.loads(json.dumps(SPEC))
        mutate(spec)
        (tmp_path / "bad.json").write_text(json.dumps(spec))
        capsys.readouterr()
        assert main(["instances", "import-torchrec", str(tmp_path / "bad.json"), "--out", str(tmp_path / "b.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
        assert not (tmp_path / "b.json").exists()


def _plans(instance):
    """A plan using every sharding type (table t takes the t-th type)."""
    t0, t1, t2, t3, t4 = instance.tables
    return Plan(instance.id, (
        TableSharding("table_wise", (Shard(3, (0, t0.rows), (0, t0.dim)),)),
        TableSharding("column_wise", (Shard(1, (0, t1.rows), (0, 4)), Shard(1, (0, t1.rows), (4, 8)))),
        TableSharding("row_wise", tuple(Shard(d, r, (0, t2.dim)) for d, r in enumerate(row_cuts(t2.rows, 4)))),
        TableSharding("table_row_wise", tuple(Shard(2 + i, r, (0, t3.dim)) for i, r in enumerate(row_cuts(t3.rows, 2)))),
        TableSharding("data_parallel", tuple(Shard(d, (0, t4.rows), (0, t4.dim)) for d in range(4)))))


def test_export_round_trips_every_sharding_type_and_keeps_table_names_and_sizes():
    instance = _instance()
    plan = _plans(instance).validate(instance)
    sharding_plan = to_torchrec(instance, plan)
    assert from_torchrec_plan(instance, sharding_plan) == plan
    module = torchrec_module(instance)
    sizes = {c.name: (c.num_embeddings, c.embedding_dim) for c in module.embedding_bag_configs()}
    assert sizes == {t.name: (t.rows, t.dim) for t in instance.tables}
    assert set(sharding_plan.plan[""]) == set(sizes)
    # The kernel exported is the kernel priced: "fused" for every model-parallel type (TorchRec's table_wise
    # and table_row_wise helpers fall back to "dense" unless told), "dense" for data-parallel.
    kernels = {name: sharding.compute_kernel for name, sharding in sharding_plan.plan[""].items()}
    assert kernels == {"t0": "fused", "t1": "fused", "t2": "fused", "t3": "fused", "t4": "dense"}


def test_a_plan_not_cut_the_torchrec_way_is_refused(tmp_path, capsys):
    instance = _instance()
    plan = _plans(instance)
    t2 = instance.tables[2]
    uneven = TableSharding("row_wise", tuple(Shard(d, r, (0, t2.dim)) for d, r in
                                             enumerate([(0, 100), (100, 200), (200, 250), (250, 300)])))
    odd = Plan(instance.id, plan.tables[:2] + (uneven,) + plan.tables[3:])
    with pytest.raises(PlanError, match="table t2: row_wise rows by device .* not TorchRec's cut"):
        odd.validate(instance)  # so export, show-plan and every oracle see TorchRec's cuts only
    save_instance(instance, tmp_path / "i.json")
    (tmp_path / "p.json").write_text(json.dumps(plan_to_dict(odd, instance)))
    assert main(["export-torchrec", str(tmp_path / "p.json"), "--instance", str(tmp_path / "i.json"), "-o",
                 str(tmp_path / "plan.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "table t2: row_wise rows by device" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i.json", "p.json"]


def test_the_torchrec_oracle_prices_torchrecs_plan_as_torchrec_does():
    instance = _instance()
    plan, totals = plan_with_torchrec(instance)
    oracle = get_oracle("torchrec")
    ours = [c.total for c in oracle.device_costs(instance, plan.validate(instance))]
    assert ours == pytest.approx(totals, rel=1e-9)
    peer = run_solver("torchrec-planner", instance, get_oracle("lookup"), Budget(5.0))
    assert peer.has_plan and peer.stats["torchrec_rating"] == pytest.approx(max(totals))
    ours_split = run_solver("local-search", instance, oracle, Budget(5.0, max_rounds=20))
    assert ours_split.objective <= max(totals) * (1 + 1e-9)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_exported_plan_runs_forward_and_backward_on_two_gloo_processes(tmp_path):
    """Every sharding type on 2 CPU ranks of one node (TorchRec 1.8 runs all five there)."""
    from conftest import make_table

    tables = tuple(make_table(f"t{i}", 20, 8, 1.0) for i in range(5))
    instance = Instance("gloo", tables, Topology(1, 2, 1 << 30), Workload(batch_size=4)).validate()
    plan = Plan(instance.id, (
        TableSharding("table_wise", (Shard(1, (0, 20), (0, 8)),)),
        TableSharding("column_wise", (Shard(0, (0, 20), (0, 4)), Shard(1, (0, 20), (4, 8)))),
        TableSharding("row_wise", tuple(Shard(d, r, (0, 8)) for d, r in enumerate(row_cuts(20, 2)))),
        TableSharding("table_row_wise", tuple(Shard(d, r, (0, 8)) for d, r in enumerate(row_cuts(20, 2)))),
        TableSharding("data_parallel", tuple(Shard(d, (0, 20), (0, 8)) for d in range(2))))).validate(instance)
    save_instance(instance, tmp_path / "i.json")
    from instances import save_plan

    save_plan(plan, instance, tmp_path / "p.json")
    assert main(["export-torchrec", str(tmp_path / "p.json"), "--instance", str(tmp_path / "i.json"), "-o",
                 str(tmp_path / "plan.pt"), "--device-type", "cpu"]) == 0
    readable = json.loads((tmp_path / "plan.sharding.json").read_text())
    assert {v["sharding_type"] for v in readable.values()} == {"table_wise", "column_wise", "row_wise",
                                                              "table_row_wise", "data_parallel"}
    script = Path(__file__).with_name("gloo_worker.py")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "i.json"), str(tmp_path / "plan.pt"),
                           str(_free_port()), str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(2)]
    for result in results:
        assert result["ok"], result
        assert result["shape"] == [4, 40] and result["loss_finite"]
