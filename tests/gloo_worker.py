"""Runs an exported ShardingPlan for real: 2 CPU processes over gloo shard the instance's
EmbeddingBagCollection with TorchRec's DistributedModelParallel, then run a forward and a backward.
Usage: gloo_worker.py INSTANCE PLAN.pt PORT OUT (each rank writes OUT.<rank> as JSON)."""
import json
import math
import os
import sys
import traceback
import warnings


def worker(rank: int, world: int, instance_path: str, plan_path: str, port: str, out: str) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = {"ok": False}
    try:
        from torchrec import KeyedJaggedTensor
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.types import ShardingEnv

        from instances import load_instance
        from interop.common import torchrec_module, torchrec_sharder

        instance = load_instance(instance_path)
        module = torchrec_module(instance)
        plan = torch.load(plan_path, weights_only=False)
        model = DistributedModelParallel(module, device=torch.device("cpu"), plan=plan,
                                         env=ShardingEnv.from_process_group(dist.group.WORLD),
                                         sharders=[torchrec_sharder(module)])
        batch = instance.workload.batch_size
        keys = [t.name for t in instance.tables]
        lengths = torch.ones(len(keys) * batch, dtype=torch.int64)
        values = torch.randint(0, min(t.rows for t in instance.tables), (len(keys) * batch,), generator=torch.Generator().manual_seed(rank))
        pooled = model(KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths))
        loss = pooled.values().sum()
        loss.backward()
        result = {"ok": True, "shape": list(pooled.values().shape), "loss_finite": math.isfinite(float(loss))}
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
        result = {"ok": False, "error": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]}
    finally:
        with open(f"{out}.{rank}", "w") as handle:
            json.dump(result, handle)
        dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.start_processes(worker, args=(2, *sys.argv[1:5]), nprocs=2, start_method="spawn")
