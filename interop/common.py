"""TorchRec's side of the adapters, shared by import, export, oracle and peer: the constants and units at
the edge, and TorchRec's own objects (topology, module, sharder, constraints) for an instance. torchrec
loads only when one of these is called.

Units: TorchRec's bandwidths are bytes per millisecond and its perf milliseconds; instances keep bytes
per second, so bandwidths are converted here. Compute kernels and cache load factors are the plan's
(instances.kernels); an instance's host memory is TorchRec's `ddr_cap`, its host link TorchRec's
`hbm_to_ddr_mem_bw`."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from instances import Instance

STORAGE_RESERVE = 0.15  # TorchRec's default share of HBM kept back; the instance's capacity is the rest
MS = 1000.0             # TorchRec's bandwidths are per millisecond
DATA_TYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
IMPORTED_BINS = (1.0,) + (0.0,) * 16  # unknown reuse: every accessed index once (read by measured/neural only)


class _DataParallelSpecNoise:
    """TorchRec's planner warns on the root logger, once per table, that a data-parallel table has no
    sharding spec (it never has one): noise that would bury our output."""

    @staticmethod
    def filter(record) -> bool:
        return not str(record.msg).startswith("Sharding spec not found for")


def load_torchrec():
    warnings.filterwarnings("ignore", module="torchrec")
    warnings.filterwarnings("ignore", module="fbgemm_gpu")
    import logging

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    root = logging.getLogger()
    if not any(isinstance(f, _DataParallelSpecNoise) for f in root.filters):
        root.addFilter(_DataParallelSpecNoise())
    import torchrec

    return torchrec


def torchrec_topology(instance: Instance, compute_device: str = "cuda"):
    from torchrec.distributed.planner import Topology as TorchRecTopology

    topo = instance.topology
    host = {"ddr_cap": topo.host_memory_bytes} if topo.host_memory_bytes else {}  # TorchRec reserves HBM only
    return TorchRecTopology(world_size=instance.num_devices, local_world_size=topo.devices_per_node,
                            compute_device=compute_device, hbm_cap=int(topo.memory_bytes / (1 - STORAGE_RESERVE)),
                            intra_host_bw=topo.intra_node_a2a_bw / MS, inter_host_bw=topo.inter_node_a2a_bw / MS,
                            hbm_to_ddr_mem_bw=topo.host_link_bw / MS, **host)


@dataclass(frozen=True)
class ShardableModule:
    """A module of a model that a sharder shards: its path in the model (TorchRec's ShardingPlan key), the
    module, its sharder, and each of its table names with the instance table that stands for it."""

    path: str
    module: object
    sharder: object
    tables: tuple[tuple[str, str], ...]  # (the module's table name, the instance's table name)


# The module kinds an instance's tables live in, by (pooled, weighted): an EmbeddingBagCollection, one with
# weighted inputs (weighted features, or a feature processor, which TorchRec prices alike), and an
# EmbeddingCollection; each kind's module sits at this path when an instance has several kinds.
MODULE_KINDS = {(True, False): "ebc", (True, True): "weighted_ebc", (False, False): "ec"}


def feature_names(table) -> list[str]:
    """The features of a table's module: one per input, named as the table when it has one."""
    count = len(table.inputs)
    return [table.name] if count == 1 else [f"{table.name}_f{i}" for i in range(count)]


def torchrec_modules(instance: Instance, device: str = "meta", path: str = "") -> list[ShardableModule]:
    """The instance's tables as TorchRec modules, one per module kind (MODULE_KINDS) in the order the kinds'
    first tables come, each with its sharder: at `path` when there is one kind, else at `path`.<kind>."""
    torchrec = load_torchrec()
    import torch
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    types = {4: torchrec.DataType.FP32, 2: torchrec.DataType.FP16, 1: torchrec.DataType.INT8}
    kinds: dict[str, list] = {}
    for table in instance.tables:
        kinds.setdefault(MODULE_KINDS[table.pooled, table.weighted], []).append(table)
    out = []
    for kind, tables in kinds.items():
        config = torchrec.EmbeddingBagConfig if kind != "ec" else torchrec.EmbeddingConfig
        configs = [config(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=feature_names(t),
                          data_type=types[t.dtype_bytes]) for t in tables]
        if kind == "ec":
            module, sharder = torchrec.EmbeddingCollection(tables=configs, device=torch.device(device)), \
                EmbeddingCollectionSharder()
        else:
            module = torchrec.EmbeddingBagCollection(tables=configs, is_weighted=kind == "weighted_ebc",
                                                     device=torch.device(device))
            sharder = EmbeddingBagCollectionSharder()
        where = path if len(kinds) == 1 else ".".join(p for p in (path, kind) if p)
        out.append(ShardableModule(where, module, sharder, tuple((t.name, t.name) for t in tables)))
    return out


def torchrec_model(instance: Instance, device: str = "meta"):
    """The instance's tables as one TorchRec model: its only module, or a module holding one per kind."""
    from torch import nn

    modules = torchrec_modules(instance, device)
    if len(modules) == 1:
        return modules[0].module
    model = nn.Module()
    for entry in modules:
        model.add_module(entry.path, entry.module)
    return model


def torchrec_sharders() -> list:
    """The sharders of every module kind an instance's model may hold."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]


def torchrec_constraints(instance: Instance) -> dict:
    from torchrec.distributed.planner import ParameterConstraints

    return {t.name: ParameterConstraints(
        pooling_factors=list(t.inputs), sharding_types=list(instance.allowed_types(t)),
        compute_kernels=sorted({k for kind in instance.allowed_types(t) for k in instance.allowed_kernels(t, kind)}))
        for t in instance.tables}
