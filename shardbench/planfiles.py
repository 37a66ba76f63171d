"""TorchRec plan files: a ShardingPlan saved in a form torch loads under its safe default (weights_only),
written beside its readable JSON (both or neither), and loaded back. The CLI, the demo and the Python
API all write and read plan files here."""
from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

from instances import Instance, Plan
from instances.io import json_bytes, write_files_atomic
from instances.memory import HBM, HOST


def _plan_classes() -> dict:
    """The classes a TorchRec ShardingPlan is made of, by name: all that load_plan lets a file build."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torch.distributed.remote_device import _remote_device

    from interop.common import load_torchrec

    load_torchrec()
    from torchrec.distributed.types import CacheParams, EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    return {c.__name__: c for c in (ShardingPlan, EmbeddingModuleShardingPlan, ParameterSharding, CacheParams,
                                    EnumerableShardingSpec, ShardMetadata, _remote_device)}


def save_sharding_plan(sharding_plan, path: str | Path | BinaryIO) -> None:
    """torch.save of a TorchRec ShardingPlan in a form `load_plan` reads under weights_only: a module plan
    (a dict subclass, whose items the safe unpickler will not set) is stored as its class called on a
    plain dict."""
    import pickle
    import types

    import torch

    if isinstance(sharding_plan, Plan):
        raise TypeError("save_sharding_plan takes TorchRec's ShardingPlan (what ShardbenchPlanner.plan returns) or a "
                        "reshard delta, not a shardbench Plan; write that with `plan -o` and turn it into a "
                        "ShardingPlan with `shardbench export-torchrec`")
    module_plan = _plan_classes()["EmbeddingModuleShardingPlan"]

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if type(obj) is module_plan:
                return module_plan, (dict(obj),)
            return NotImplemented

    pickler = types.ModuleType("shardbench_plan_pickle")  # torch.save takes a pickle module
    pickler.Pickler = Pickler
    torch.save(sharding_plan, path, pickle_module=pickler)


def load_plan(path: str | Path):
    """A TorchRec ShardingPlan written by `export-torchrec`, `plan --torchrec-out` or `save_sharding_plan`,
    loaded under torch.load's safe default (weights_only), with only the classes a ShardingPlan is made of
    allowed. Plain `torch.load(path)` refuses such a file (torch >= 2.6); for a file you trust,
    `torch.load(path, weights_only=False)` works too."""
    import torch

    with torch.serialization.safe_globals(list(_plan_classes().values())):
        return torch.load(path, weights_only=True)


def sidecar_path(output: str | Path) -> str:
    """Where the readable JSON of a ShardingPlan written to `output` goes by default."""
    return str(Path(output).with_suffix(".sharding.json"))


def sidecar(sharding_plan, instance: Instance, plan: Plan) -> dict:
    """The readable JSON beside a ShardingPlan of `plan`: every table's ParameterSharding (its kernel and
    cache load factor included) and what each device holds in HBM and in host memory, in bytes."""
    from interop.export import readable

    used = plan.storage_per_device(instance)
    return {"tables": readable(sharding_plan),
            "devices": [{"rank": d, "hbm_bytes": int(used[d, HBM]), "host_bytes": int(used[d, HOST])}
                        for d in range(instance.num_devices)]}


def sharding_plan_bytes(sharding_plan) -> bytes:
    """A ShardingPlan as `save_sharding_plan` writes it, serialised in memory (torch reports a full disk as a
    RuntimeError, not an OSError, so nothing is written until every output is made)."""
    buffer = io.BytesIO()
    save_sharding_plan(sharding_plan, buffer)
    return buffer.getvalue()


def plan_files(sharding_plan, output: str | Path, readable_path: str | Path, instance: Instance,
               plan: Plan) -> dict[str, bytes]:
    """The ShardingPlan of `plan` for `output` and its readable JSON (`sidecar`) for `readable_path`, as bytes."""
    return {str(output): sharding_plan_bytes(sharding_plan),
            str(readable_path): json_bytes(sidecar(sharding_plan, instance, plan))}


def write_plan_files(sharding_plan, output: str | Path, readable_path: str | Path, instance: Instance,
                     plan: Plan) -> None:
    """`plan_files` written both or neither (instances.io.write_files_atomic)."""
    write_files_atomic(plan_files(sharding_plan, output, readable_path, instance, plan))
