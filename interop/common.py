"""TorchRec's side of the adapters, shared by import, export, oracle and peer: the constants and units at
the edge, and TorchRec's own objects (topology, module, sharder, constraints) for an instance. torchrec
loads only when one of these is called.

Units: TorchRec's bandwidths are bytes per millisecond and its perf milliseconds; instances keep bytes
per second, so bandwidths are converted here. Compute kernels and cache load factors are the plan's
(instances.kernels); an instance's host memory is TorchRec's `ddr_cap`, its host link TorchRec's
`hbm_to_ddr_mem_bw`."""
from __future__ import annotations

import warnings

from instances import Instance, InstanceError

STORAGE_RESERVE = 0.15  # TorchRec's default share of HBM kept back; the instance's capacity is the rest
MS = 1000.0             # TorchRec's bandwidths are per millisecond
DATA_TYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
TORCHREC_DEFAULT_LOAD_FACTOR = 0.2  # its planner's UVM_CACHING_RATIO: the cache when nothing sizes it
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


def torchrec_module(instance: Instance, device: str = "meta"):
    """The EmbeddingBagCollection (pooled tables) or EmbeddingCollection (sequence tables) of the instance,
    one feature per table, named like the table."""
    torchrec = load_torchrec()
    import torch

    pooled = {t.pooled for t in instance.tables}
    if len(pooled) > 1:
        raise InstanceError("tables", "the TorchRec adapter takes all-pooled or all-sequence tables, not a mix")
    types = {4: torchrec.DataType.FP32, 2: torchrec.DataType.FP16, 1: torchrec.DataType.INT8}
    if pooled == {True}:
        configs = [torchrec.EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                               feature_names=[t.name], data_type=types[t.dtype_bytes])
                   for t in instance.tables]
        return torchrec.EmbeddingBagCollection(tables=configs, device=torch.device(device))
    configs = [torchrec.EmbeddingConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name],
                                        data_type=types[t.dtype_bytes]) for t in instance.tables]
    return torchrec.EmbeddingCollection(tables=configs, device=torch.device(device))


def torchrec_sharder(module):
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return EmbeddingBagCollectionSharder() if isinstance(module, EmbeddingBagCollection) else EmbeddingCollectionSharder()


def torchrec_constraints(instance: Instance) -> dict:
    from torchrec.distributed.planner import ParameterConstraints

    return {t.name: ParameterConstraints(
        pooling_factors=[t.pooling_factor], sharding_types=list(instance.allowed_types(t)),
        compute_kernels=sorted({k for kind in instance.allowed_types(t) for k in instance.allowed_kernels(t, kind)}))
        for t in instance.tables}
