"""Runs an exported ShardingPlan for real: 2 CPU processes over gloo shard a model with TorchRec's
DistributedModelParallel, then run a forward and a backward. The model is the instance's
EmbeddingBagCollection, or with `--dlrm` a small TorchRec DLRM (`small_dlrm`) whose plan ShardbenchPlanner
made; then each rank also plans it with `collective_plan` and reports that plan. With `--quickstart` each
rank runs README's quickstart as written — `ShardbenchPlanner(...).plan(model, sharders)`, then DMP — with
a portfolio that differs per rank, so that only planning once and broadcasting gives both the same plan.
With `--zoo MODELS` (comma-separated, in INSTANCE's place) each rank does the same with each zoo model, tiny on cpu.
With `--reshard` the small DLRM trains a step under an old plan (INSTANCE is its .pt), is resharded by
DistributedModelParallel.reshard with a replan's delta (PLAN is the .reshard.pt) and trains on; each rank
reports every table's weights and optimizer state before and after.
Usage: gloo_worker.py [--dlrm | --quickstart | --zoo | --reshard] INSTANCE PLAN.pt PORT OUT (each rank writes
OUT.<rank>)."""
import datetime
import json
import math
import os
import sys
import traceback
import warnings


DLRM_ROWS = (40, 60, 25, 80)  # one table per feature, all of DLRM_DIM columns (DLRM's interaction needs one dim)
DLRM_DIM = 8
DLRM_DENSE = 4
ZOO_BATCH = 8  # samples per rank, for planning and for the step


def small_dlrm(embedding_device: str = "meta", dense_device: str = "cpu"):
    """A small torchrec.models.dlrm.DLRM (its EBC at sparse_arch.embedding_bag_collection)."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM

    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=DLRM_DIM, num_embeddings=rows, feature_names=[f"f{i}"])
              for i, rows in enumerate(DLRM_ROWS)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device(embedding_device))
    return DLRM(embedding_bag_collection=ebc, dense_in_features=DLRM_DENSE, dense_arch_layer_sizes=[16, DLRM_DIM],
                over_arch_layer_sizes=[8, 1], dense_device=torch.device(dense_device))


def cpu_topology(world: int = 2):
    from torchrec.distributed.planner import Topology

    return Topology(world_size=world, local_world_size=world, compute_device="cpu")


def _run_dlrm(rank: int, plan_path: str) -> dict:
    import torch
    import torch.distributed as dist
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    import shardbench
    from interop.export import readable

    sharders = [EmbeddingBagCollectionSharder()]
    model = DistributedModelParallel(small_dlrm(), device=torch.device("cpu"), plan=shardbench.load_plan(plan_path),
                                     env=ShardingEnv.from_process_group(dist.group.WORLD), sharders=sharders)
    batch = 4
    keys = [f"f{i}" for i in range(len(DLRM_ROWS))]
    generator = torch.Generator().manual_seed(rank)
    lengths = torch.ones(len(keys) * batch, dtype=torch.int64)
    values = torch.randint(0, min(DLRM_ROWS), (len(keys) * batch,), generator=generator)
    logits = model(torch.rand(batch, DLRM_DENSE, generator=generator),
                   KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths))
    loss = logits.sum()
    loss.backward()
    planner = shardbench.ShardbenchPlanner(cpu_topology(), batch_size=batch, budget=2.0, solvers=["best-greedy"])
    collective = planner.collective_plan(small_dlrm(), sharders)
    return {"ok": True, "shape": list(logits.shape), "loss_finite": math.isfinite(float(loss)),
            "collective": readable(collective), "planned_here": planner.result is not None}


def _run_quickstart(rank: int) -> dict:
    import torch
    import torch.distributed as dist
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    import shardbench
    from interop.export import readable

    from torchrec.distributed.planner import ParameterConstraints

    sharders = [EmbeddingBagCollectionSharder()]
    # Rank 1 alone would plan otherwise (its own constraints, its own clock): the plan must be rank 0's.
    constraints = [{}, {"t0": ParameterConstraints(sharding_types=["column_wise"])}][rank]
    planner = shardbench.ShardbenchPlanner(cpu_topology(), batch_size=4, budget=1.0, constraints=constraints)
    plan = planner.plan(small_dlrm(dense_device="meta"), sharders)
    model = DistributedModelParallel(small_dlrm(), device=torch.device("cpu"), plan=plan,
                                     env=ShardingEnv.from_process_group(dist.group.WORLD), sharders=sharders)
    batch, keys = 4, [f"f{i}" for i in range(len(DLRM_ROWS))]
    generator = torch.Generator().manual_seed(rank)
    values = torch.randint(0, min(DLRM_ROWS), (len(keys) * batch,), generator=generator)
    logits = model(torch.rand(batch, DLRM_DENSE, generator=generator), KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=values, lengths=torch.ones(len(keys) * batch, dtype=torch.int64)))
    logits.sum().backward()
    alone = shardbench.ShardbenchPlanner(cpu_topology(), batch_size=4, budget=1.0, constraints=constraints)
    return {"ok": True, "plan": readable(plan), "planned_here": planner.result is not None,
            "alone": readable(alone._plan_here(small_dlrm(dense_device="meta"), sharders))}


def _run_zoo(rank: int, names: str) -> dict:
    """Per zoo model: planned by every rank with plan() (rank 0 plans, every rank gets its plan), sharded by
    DMP with the model's sharders, one forward and backward; its plan and sharding types, or the stage it
    failed at with the error and the function that raised it."""
    from collections import Counter

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    import shardbench
    from benchmarks import zoo
    from interop.export import readable

    models = {}
    for name in names.split(","):
        report, stage = {}, "build"
        try:
            model = zoo.MODELS[name](tiny=True, device="cpu")
            stage = "plan"
            planner = shardbench.ShardbenchPlanner(cpu_topology(), batch_size=ZOO_BATCH, budget=1.0,
                                                   constraints=model.constraints)
            plan = planner.plan(model.model, list(model.sharders))
            report = {"plan": readable(plan), "planned_here": planner.result is not None,
                      "sharding_types": dict(Counter(p.sharding_type for module_plan in plan.plan.values()
                                                     for p in module_plan.values()))}
            stage = "shard"
            sharded = DistributedModelParallel(model.model, device=torch.device("cpu"), plan=plan,
                                               env=ShardingEnv.from_process_group(dist.group.WORLD),
                                               sharders=list(model.sharders))
            stage = "forward"
            output = sharded(*model.batch(ZOO_BATCH, rank))
            if isinstance(output, tuple):  # TorchRec's test models in training: (loss, prediction)
                loss = output[0]
            else:  # a DLRM's logits, scored against random clicks
                clicks = torch.randint(0, 2, output.shape, generator=torch.Generator().manual_seed(rank))
                loss = F.binary_cross_entropy_with_logits(output, clicks.float())
            stage = "backward"
            loss.backward()
            models[name] = {"ok": True, "loss_finite": math.isfinite(float(loss)), **report}
        except Exception as exc:  # noqa: BLE001 - the model's row: the test decides whose failure it is
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            models[name] = {"ok": False, "stage": stage, "error": f"{type(exc).__name__}: {exc}",
                            "raised_in": f"{frame.filename}:{frame.name}", **report}
    return {"ok": True, "models": models}


RESHARD_LEARNING_RATE = 0.1


def reshard_sharder():
    """The EBC sharder of the reshard run: fused row-wise Adagrad, so that each shard has optimizer state."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                       "learning_rate": RESHARD_LEARNING_RATE})


def _tables_everywhere(model) -> dict:
    """Every table's shards, gathered from every rank: by table (and `TABLE#state` for its row-wise optimizer
    state), each shard as [its offsets, its values], sorted."""
    import torch.distributed as dist

    local = []
    for key, value in model.state_dict().items():
        if ".embedding_bags." in key and hasattr(value, "local_shards"):
            name = key.split(".embedding_bags.")[1].split(".")[0]
            local += [(name, list(s.metadata.shard_offsets), s.tensor.tolist()) for s in value.local_shards()]
    for key, state in model.fused_optimizer.state_dict()["state"].items():
        name = key.split(".embedding_bags.")[1].split(".")[0]
        for sharded in state.values():
            if hasattr(sharded, "local_shards"):
                local += [(f"{name}#state", list(s.metadata.shard_offsets), s.tensor.tolist())
                          for s in sharded.local_shards()]
    everywhere: list = [None] * dist.get_world_size()
    dist.all_gather_object(everywhere, local)
    tables: dict = {}
    for name, offsets, rows in (entry for part in everywhere for entry in part):
        tables.setdefault(name, []).append([offsets, rows])
    return {name: sorted(shards) for name, shards in tables.items()}


def _run_reshard(rank: int, old_path: str, delta_path: str) -> dict:
    import torch
    import torch.distributed as dist
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    import shardbench

    model = DistributedModelParallel(small_dlrm(), device=torch.device("cpu"), plan=shardbench.load_plan(old_path),
                                     env=ShardingEnv.from_process_group(dist.group.WORLD), sharders=[reshard_sharder()])
    keys, batch = [f"f{i}" for i in range(len(DLRM_ROWS))], 4
    generator = torch.Generator().manual_seed(rank)

    def step() -> float:
        values = torch.randint(0, min(DLRM_ROWS), (len(keys) * batch,), generator=generator)
        logits = model(torch.rand(batch, DLRM_DENSE, generator=generator), KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=values, lengths=torch.ones(len(keys) * batch, dtype=torch.int64)))
        loss = logits.sum()
        loss.backward()
        return float(loss)

    first = step()
    before = _tables_everywhere(model)
    delta = shardbench.load_plan(delta_path)
    volume = model.reshard(delta, sharded_module_fqn=next(iter(delta)))
    after = _tables_everywhere(model)
    ranks = {name: list(sharding.ranks) for path, module_plan in model.plan.plan.items()
             for name, sharding in module_plan.items()}
    losses = [first] + [step() for _ in range(2)]
    return {"ok": True, "volume": volume, "ranks": ranks, "before": before, "after": after,
            "losses_finite": all(math.isfinite(x) for x in losses)}


def _run_instance(rank: int, instance_path: str, plan_path: str) -> dict:
    import torch
    import torch.distributed as dist
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from instances import load_instance
    from interop.common import torchrec_model, torchrec_sharders

    instance = load_instance(instance_path)
    plan = torch.load(plan_path, weights_only=False)
    model = DistributedModelParallel(torchrec_model(instance), device=torch.device("cpu"), plan=plan,
                                     env=ShardingEnv.from_process_group(dist.group.WORLD), sharders=torchrec_sharders())
    batch = instance.workload.batch_size
    keys = [t.name for t in instance.tables]
    lengths = torch.ones(len(keys) * batch, dtype=torch.int64)
    values = torch.randint(0, min(t.rows for t in instance.tables), (len(keys) * batch,), generator=torch.Generator().manual_seed(rank))
    pooled = model(KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths))
    loss = pooled.values().sum()
    loss.backward()
    return {"ok": True, "shape": list(pooled.values().shape), "loss_finite": math.isfinite(float(loss))}


def worker(rank: int, world: int, mode: str, instance_path: str, plan_path: str, port: str, out: str) -> None:
    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    result = {"ok": False}
    try:
        if mode == "--dlrm":
            result = _run_dlrm(rank, plan_path)
        elif mode == "--quickstart":
            result = _run_quickstart(rank)
        elif mode == "--zoo":
            result = _run_zoo(rank, instance_path)
        elif mode == "--reshard":
            result = _run_reshard(rank, instance_path, plan_path)
        else:
            result = _run_instance(rank, instance_path, plan_path)
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
        result = {"ok": False, "error": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]}
    finally:
        with open(f"{out}.{rank}", "w") as handle:
            json.dump(result, handle)
        # Neither rank tears its groups down while the other's gloo threads may still be sending to it: a
        # rank that did once aborted in C++ ("terminate called without an active exception").
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def run_on_two_gloo_processes(*arguments: str, out: str) -> list[dict]:
    """This script on 2 gloo processes with `arguments` (before PORT OUT), importing the checkout it lives
    in; each rank's JSON result."""
    import socket
    import subprocess
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = str(Path(__file__).resolve().parent.parent)
    # TorchRec's reshard tags each point-to-point message with Python's hash() of the table's name; gloo
    # matches tags (NCCL ignores them), so every rank must hash alike.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]), "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, __file__, *arguments, str(port), out], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mode = sys.argv[1] if sys.argv[1].startswith("--") else ""
    arguments = sys.argv[2:6] if mode else sys.argv[1:5]
    mp.start_processes(worker, args=(2, mode, *arguments), nprocs=2, start_method="spawn")
