"""TorchRec's shard estimators as the `torchrec` oracle: its perf per shard, summed per rank as its
planner rates plans, and its storage estimate per shard (HBM, DDR) as the shard's storage."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodels.base import AdditiveOracle, AdditivePriced, Priced
from instances import Instance, InstanceError, Table
from instances.kernels import FUSED_UVM_CACHING, KERNELS
from instances.model import SHARDING_TYPES, is_column_cut
from instances.sharding import column_cuts, row_cuts
from instances.pieces import Pieces

from . import formulas
from .common import load_torchrec, torchrec_constraints, torchrec_model, torchrec_sharders, torchrec_topology


@dataclass
class _Estimates:
    """TorchRec's estimators for an instance with the sharder data they read, each table's table-wise
    option (from TorchRec's enumerator) as the template every other option is made from, and the numbers
    the array formulas read from them."""

    estimators: list
    sharder_data: Any
    templates: dict  # table name -> table-wise ShardingOption
    setting: formulas.Setting
    tables: formulas.Tables

    def estimate(self, options: list) -> None:
        for estimator in self.estimators:
            estimator.estimate(options, sharder_data_map=self.sharder_data)

    def covered(self, pieces: Pieces) -> np.ndarray:
        """Per piece, whether the array formulas restate TorchRec for it (its kernel, table and the
        perf config all within what they cover)."""
        if self.setting.problem is not None:
            return np.zeros(len(pieces), dtype=bool)
        tables = np.array([problem is None for problem in self.tables.problem])
        kernels = np.array([kernel in formulas.COVERED_KERNELS for kernel in KERNELS])
        return tables[pieces.table] & kernels[pieces.kernel]


def _torchrec_cuts(instance: Instance, table: Table, kind: str, width: int) -> set[tuple[int, int, int, int]] | None:
    """TorchRec's cuts of `table` as `kind` (column blocks of `width`) as (row start, row end, col start,
    col end), by instances.sharding's rules; None when TorchRec does not cut it so."""
    whole_rows, whole_cols = (0, table.rows), (0, table.dim)
    if kind in ("table_wise", "data_parallel"):
        return {(*whole_rows, *whole_cols)}
    blocks = table.dim // width if width else 0
    if kind in ("column_wise", "table_column_wise", "grid_shard"):
        if blocks * width != table.dim or not is_column_cut(table.dim, blocks):
            return None
        if kind != "grid_shard":
            return {(*whole_rows, *cols) for cols in column_cuts(table.dim, blocks)}
        return {(*rows, *cols) for cols in column_cuts(table.dim, blocks)
                for rows in row_cuts(table.rows, instance.topology.devices_per_node)}
    parts = instance.num_devices if kind == "row_wise" else instance.topology.devices_per_node
    return {(*rows, *whole_cols) for rows in row_cuts(table.rows, parts)}


def _check_cuts(instance: Instance, pieces: Pieces) -> None:
    """Refuses a piece that is not one of TorchRec's cuts of its table (whole tables for table-wise and
    data-parallel, equal column blocks, row blocks over all devices or a node's)."""
    groups, inverse = np.unique(np.stack([pieces.table, pieces.kind, pieces.width], axis=1), axis=0,
                                return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(groups)))
    shards = np.stack([pieces.row_start, pieces.row_end, pieces.col_start, pieces.col_end], axis=1)
    for (t, kind, width), members in zip(groups.tolist(), np.split(order, starts[1:])):
        cuts = _torchrec_cuts(instance, instance.tables[t], SHARDING_TYPES[kind], width)
        bad = [p for p, shard in zip(members.tolist(), map(tuple, shards[members].tolist()))
               if cuts is None or shard not in cuts]
        if bad:
            p = bad[0]
            raise InstanceError(f"table {instance.tables[t].name}",
                                f"a {SHARDING_TYPES[kind]} shard at rows {shards[p, 0]}..{shards[p, 1]}, cols "
                                f"{shards[p, 2]}..{shards[p, 3]} is not one TorchRec cuts: the torchrec oracle prices "
                                "TorchRec's own cuts")


class TorchRecOracle(AdditiveOracle):
    """Each shard priced as TorchRec's EmbeddingPerfEstimator prices it (its `perf.total`, ms) and stored as
    its EmbeddingStorageEstimator says (HBM bytes, input and output buffers included); a device's cost is
    the sum over its shards, as TorchRec's planner rates a plan. Shards must be TorchRec's cuts. The
    estimates come from interop.formulas (TorchRec's formulas over arrays, equal to its estimators); pieces
    they do not cover are estimated by TorchRec itself, one option per table, kind, width and kernel, equal
    shards once."""

    name = "torchrec"
    description = "TorchRec 1.8's shard perf and storage estimators, per-rank sum (ms; its HBM and DDR estimates as storage)"
    unit = "ms"
    has_breakdown = True
    own_memory = True
    prices_tiers = True
    costly = True
    shape_priced = True  # TorchRec's estimators read a shard's size, never its offset

    def __init__(self):
        # Loading torchrec (seconds) is part of building the oracle, before any budget's clock starts.
        load_torchrec()
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
            # The enumerator estimates what it enumerates (with TorchRec's perf estimator when given none);
            # the templates need no estimates, so it gets the cheap storage estimator.
            enumerator = EmbeddingEnumerator(topology=topology, batch_size=instance.workload.batch_size,
                                             constraints=templates_only, estimator=estimators[1])
            sharders = torchrec_sharders()
            options = enumerator.enumerate(torchrec_model(instance), sharders)
            sharder_data = build_sharder_data_map({sharder_name(s.module_type): s for s in sharders})
            config = estimators[0]._estimator.config  # the perf config TorchRec's factory chose
            by_name = {o.name: o for o in options}
            templates = [by_name[t.name] for t in instance.tables]  # in the instance's order, whatever the modules'
            tables = formulas.tables(templates, topology, config, constraints, sharder_data)
            self._cache = (instance, _Estimates(estimators, sharder_data, by_name,
                                                formulas.setting(topology, config), tables))
        return self._cache[1]

    def _option(self, instance: Instance, table: Table, kind: str, width: int, kernel: str, load_factor: float | None):
        """TorchRec's option for its cut of `table` as `kind` (column blocks of `width`) served by `kernel`
        (with a cache of `load_factor` of its rows), with one shard per distinct shard size."""
        from torchrec.distributed.planner.enumerators import get_partition_by_type
        from torchrec.distributed.planner.types import Shard as TorchRecShard
        from torchrec.distributed.types import CacheParams

        k, per_node = instance.num_devices, instance.topology.devices_per_node
        if kind in ("column_wise", "table_column_wise"):
            cuts = [((0, table.rows), c) for c in column_cuts(table.dim, table.dim // width)]
        elif kind == "grid_shard":
            cuts = [(r, c) for c in column_cuts(table.dim, table.dim // width) for r in row_cuts(table.rows, per_node)]
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
        return option

    def bind(self, instance: Instance, pieces: Pieces) -> Priced:
        _check_cuts(instance, pieces)
        estimates = self._estimates(instance)
        breakdown = np.zeros((len(pieces), 4))
        storage = np.zeros((len(pieces), 2), dtype=np.int64)
        covered = estimates.covered(pieces)
        done = np.flatnonzero(covered)
        if done.size:
            part = pieces if done.size == len(pieces) else Pieces.of(
                *(getattr(pieces, f)[done] for f in ("table", "kind", "row_start", "row_end", "col_start", "col_end",
                                                     "kernel", "load_factor")))
            breakdown[done] = formulas.perf(estimates.setting, estimates.tables, part)
            storage[done] = formulas.storage(estimates.setting, estimates.tables, part)
        if not covered.all():
            self._estimate_with_torchrec(instance, pieces, np.flatnonzero(~covered), breakdown, storage)
        return AdditivePriced(instance, pieces, breakdown=breakdown, storage=storage)

    def _estimate_with_torchrec(self, instance: Instance, pieces: Pieces, members: np.ndarray,
                                breakdown: np.ndarray, storage: np.ndarray) -> None:
        """TorchRec's estimators for the pieces the formulas do not cover, one option per table, kind,
        width, kernel and load factor."""
        groups: dict[tuple, list[int]] = {}
        for p in members.tolist():
            key = (int(pieces.table[p]), int(pieces.kind[p]), int(pieces.width[p]), int(pieces.kernel[p]),
                   float(pieces.load_factor[p]))
            groups.setdefault(key, []).append(p)
        options = {key: self._option(instance, instance.tables[key[0]], SHARDING_TYPES[key[1]], key[2],
                                     KERNELS[key[3]], key[4] or None) for key in groups}
        self._estimates(instance).estimate(list(options.values()))
        for key, group in groups.items():
            by_size = {tuple(s.size): (s.perf, (s.storage.hbm, s.storage.ddr)) for s in options[key].shards}
            for p in group:
                perf, stored = by_size[(int(pieces.rows[p]), key[2])]
                breakdown[p] = (perf.fwd_compute, perf.bwd_compute + perf.prefetch_compute, perf.fwd_comms,
                                perf.bwd_comms)
                storage[p] = stored

    def convex_in_load_factor(self, instance: Instance) -> bool:
        """TorchRec's formulas price a cached piece a + b / bw(lf) with b ≥ 0 — every compute and copy term is
        bytes over the kernel's bandwidth, and bw(lf) = lf · HBM bandwidth + (1 − lf) · HBM-to-DDR bandwidth is
        positive and affine — which is convex, and non-increasing where HBM is the faster; they store an affine
        function of lf rounded to bytes. Pieces TorchRec's own estimators price (inputs the formulas do not
        cover, such as cache statistics) promise nothing."""
        estimates = self._estimates(instance)
        if estimates.setting.problem is not None or any(p is not None for p in estimates.tables.problem) \
                or FUSED_UVM_CACHING not in formulas.COVERED_KERNELS:
            return False
        leanest, fullest = (estimates.setting.device_bw(FUSED_UVM_CACHING, f) for f in (0.0, 1.0))
        return 0 < leanest <= fullest

    def piece_breakdown(self, instance: Instance, pieces: Pieces) -> np.ndarray:
        return self.bind(instance, pieces).breakdown
