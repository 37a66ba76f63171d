"""TorchRec's shard estimators as the `torchrec` oracle: its perf per shard, summed per rank as its
planner rates plans, and its storage estimate per shard (HBM, DDR) as the shard's storage."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodels.base import AdditiveOracle, AdditivePriced, Priced
from instances import Instance, InstanceError, Table
from instances.kernels import KERNELS
from instances.model import SHARDING_TYPES
from instances.pieces import Pieces

from .common import load_torchrec, torchrec_constraints, torchrec_module, torchrec_sharder, torchrec_topology


@dataclass
class _Estimates:
    """TorchRec's estimators for an instance with the sharder data they read, and each table's
    table-wise option (from TorchRec's enumerator) as the template every other option is made from."""

    estimators: list
    sharder_data: Any
    templates: dict  # table name -> table-wise ShardingOption

    def estimate(self, options: list) -> None:
        for estimator in self.estimators:
            estimator.estimate(options, sharder_data_map=self.sharder_data)


class TorchRecOracle(AdditiveOracle):
    """Each shard priced by TorchRec's EmbeddingPerfEstimator (its `perf.total`, ms) and stored as its
    EmbeddingStorageEstimator says (HBM bytes, input and output buffers included); a device's cost is the
    sum over its shards, as TorchRec's planner rates a plan. Shards must be TorchRec's cuts. TorchRec
    estimates a shard from its size alone, so equal shards of an option are estimated once."""

    name = "torchrec"
    description = "TorchRec 1.8's shard perf and storage estimators, per-rank sum (ms; its HBM and DDR estimates as storage)"
    unit = "ms"
    has_breakdown = True
    own_memory = True
    prices_tiers = True

    def __init__(self):
        self._cache: tuple[Instance, _Estimates] | None = None  # the last instance priced and its estimators

    def _estimates(self, instance: Instance) -> _Estimates:
        if self._cache is None or self._cache[0] is not instance:
            from torchrec.distributed.planner import ParameterConstraints
            from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
            from torchrec.distributed.planner.shard_estimators import (
                EmbeddingPerfEstimator,
                EmbeddingStorageEstimator,
            )
            from torchrec.distributed.planner.utils import (
                build_sharder_data_map,
                sharder_name,
            )

            load_torchrec()
            topology = torchrec_topology(instance)
            constraints = torchrec_constraints(instance)
            estimators = [EmbeddingPerfEstimator(topology, constraints), EmbeddingStorageEstimator(topology, constraints)]
            templates_only = {name: ParameterConstraints(pooling_factors=c.pooling_factors, sharding_types=["table_wise"],
                                                         compute_kernels=["fused"]) for name, c in constraints.items()}
            enumerator = EmbeddingEnumerator(topology=topology, batch_size=instance.workload.batch_size,
                                             constraints=templates_only, estimator=[])
            module = torchrec_module(instance)
            sharders = [torchrec_sharder(module)]
            options = enumerator.enumerate(module, sharders)
            sharder_data = build_sharder_data_map({sharder_name(s.module_type): s for s in sharders})
            self._cache = (instance, _Estimates(estimators, sharder_data, {o.name: o for o in options}))
        return self._cache[1]

    def _option(self, instance: Instance, table: Table, kind: str, width: int, kernel: str, load_factor: float | None):
        """TorchRec's option for its cut of `table` as `kind` (column blocks of `width`) served by `kernel`
        (with a cache of `load_factor` of its rows), with one shard per distinct shard size, and the offsets
        of every shard of the full cut."""
        from torchrec.distributed.planner.enumerators import get_partition_by_type
        from torchrec.distributed.planner.types import Shard as TorchRecShard
        from torchrec.distributed.types import CacheParams

        from instances.sharding import column_cuts, row_cuts

        k, per_node = instance.num_devices, instance.topology.devices_per_node
        if kind == "column_wise":
            cuts = [((0, table.rows), c) for c in column_cuts(table.dim, table.dim // width)]
        elif kind in ("row_wise", "table_row_wise"):
            cuts = [(r, (0, table.dim)) for r in row_cuts(table.rows, k if kind == "row_wise" else per_node)]
        else:
            cuts = [((0, table.rows), (0, table.dim))] * (k if kind == "data_parallel" else 1)
        sizes = {}
        for r, c in cuts:
            sizes.setdefault((r[1] - r[0], c[1] - c[0]), (r[0], c[0]))
        option = copy.copy(self._estimates(instance).templates[table.name])  # shallow: module and tensor shared
        option.sharding_type, option.compute_kernel = kind, kernel
        option.cache_params = CacheParams(load_factor=load_factor) if load_factor is not None else None
        option.partition_by = get_partition_by_type(kind)
        option.shards = [TorchRecShard(size=list(size), offset=list(offset)) for size, offset in sizes.items()]
        return option, {(r[0], c[0]) for r, c in cuts}

    def bind(self, instance: Instance, pieces: Pieces) -> Priced:
        rows, width = pieces.rows.tolist(), pieces.width.tolist()
        row_start, col_start = pieces.row_start.tolist(), pieces.col_start.tolist()
        groups: dict[tuple, list[int]] = {}
        for p, key in enumerate(zip(pieces.table.tolist(), pieces.kind.tolist(), width, pieces.kernel.tolist(),
                                    pieces.load_factor.tolist())):
            groups.setdefault(key, []).append(p)
        options = {key: self._option(instance, instance.tables[key[0]], SHARDING_TYPES[key[1]], key[2], KERNELS[key[3]],
                                     key[4] or None) for key in groups}
        self._estimates(instance).estimate([option for option, _ in options.values()])
        breakdown = np.zeros((len(pieces), 4))
        storage = np.zeros((len(pieces), 2), dtype=np.int64)
        for key, members in groups.items():
            table, kind = instance.tables[key[0]], SHARDING_TYPES[key[1]]
            option, offsets = options[key]
            by_size = {tuple(s.size): (s.perf, (s.storage.hbm, s.storage.ddr)) for s in option.shards}
            for p in members:
                if (row_start[p], col_start[p]) not in offsets:
                    raise InstanceError(f"table {table.name}", f"a {kind} shard at rows {row_start[p]}, cols "
                                        f"{col_start[p]} is not one TorchRec cuts: the torchrec oracle prices "
                                        "TorchRec's own cuts")
                perf, stored = by_size[(rows[p], width[p])]
                breakdown[p] = (perf.fwd_compute, perf.bwd_compute + perf.prefetch_compute, perf.fwd_comms,
                                perf.bwd_comms)
                storage[p] = stored
        return AdditivePriced(instance, pieces, breakdown=breakdown, storage=storage)

    def piece_breakdown(self, instance: Instance, pieces: Pieces) -> np.ndarray:
        return self.bind(instance, pieces).breakdown
