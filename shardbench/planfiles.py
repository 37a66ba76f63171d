"""TorchRec plan files: a ShardingPlan saved in a form torch loads under its safe default (weights_only),
written atomically beside its readable per-table JSON, and loaded back. The CLI, the demo and the Python
API all write and read plan files here."""
from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

from instances.io import write_bytes_atomic, write_json_atomic


def _plan_classes() -> dict:
    """The classes a TorchRec ShardingPlan is made of, by name: all that load_plan lets a file build."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torch.distributed.remote_device import _remote_device

    from interop.common import load_torchrec

    load_torchrec()
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    return {c.__name__: c for c in (ShardingPlan, EmbeddingModuleShardingPlan, ParameterSharding,
                                    EnumerableShardingSpec, ShardMetadata, _remote_device)}


def save_sharding_plan(sharding_plan, path: str | Path | BinaryIO) -> None:
    """torch.save of a TorchRec ShardingPlan in a form `load_plan` reads under weights_only: a module plan
    (a dict subclass, whose items the safe unpickler will not set) is stored as its class called on a
    plain dict."""
    import pickle
    import types

    import torch

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


def write_plan_files(sharding_plan, output: str | Path, sidecar: str | Path) -> None:
    """The ShardingPlan at `output` and its readable per-table ParameterSharding at `sidecar`, each written
    atomically (into memory first: torch reports a full disk as a RuntimeError, not an OSError)."""
    from interop.export import readable

    buffer = io.BytesIO()
    save_sharding_plan(sharding_plan, buffer)
    write_bytes_atomic(output, buffer.getvalue())
    write_json_atomic(sidecar, readable(sharding_plan))
