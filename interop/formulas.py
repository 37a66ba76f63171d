"""TorchRec 1.8's per-shard perf and storage estimates restated over arrays of pieces, for the inputs the
torchrec oracle builds (interop.common's topology, module, sharder and constraints), so that thousands of
candidate shards are priced at once instead of one ShardingOption at a time. `config_problem`,
`table_problem` and `COVERED_KERNELS` say which inputs they do not cover (the oracle hands those to
TorchRec's own estimators).

What is restated, from torchrec.distributed.planner (estimator/estimator.py, estimator/types.py,
shard_estimators.py): the default evaluator of each sharding type (table-wise, column-wise, row-wise,
table-row-wise, data-parallel) for training, with the default HardwarePerfConfig, and
`calculate_shard_storages` without a pipeline. Bandwidths, coefficients, multipliers, block penalties and
the optimizer's multiplier are asked of TorchRec's objects and functions when the formulas are built;
only the arithmetic is ours. `Perf.total` sums forward and backward compute and comms and prefetch (not
the input distribution), so those are what is computed. Prefetch is zero for our inputs: TorchRec estimates
it only from cache statistics, which the oracle's options do not carry (its `problem` refuses any that do).
Units are TorchRec's: milliseconds and bytes."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from instances.kernels import KERNELS
from instances.model import SHARDING_TYPES
from instances.pieces import KIND_CODE, Pieces

TABLE_WISE, COLUMN_WISE, ROW_WISE, TABLE_ROW_WISE, DATA_PARALLEL, TABLE_COLUMN_WISE, GRID_SHARD = (
    KIND_CODE[k] for k in SHARDING_TYPES)
# TorchRec's evaluators: column- and table-column-wise are its table-wise one on their blocks; a grid is its
# table-row-wise one on each block.
WHOLE_ROWS = (TABLE_WISE, COLUMN_WISE, TABLE_COLUMN_WISE)
NODE_ROWS = (TABLE_ROW_WISE, GRID_SHARD)
COVERED_KERNELS = frozenset({"fused", "fused_uvm", "fused_uvm_caching", "dense"})
MIN_LOOKUP_DIM = 32  # TorchRec's table-wise evaluator reads at least 32 columns per lookup (a literal there)
# Bytes per row of a cached table's auxiliary state and per cache slot (literals in TorchRec's
# `_calculate_cache_aux_state_sizes`: an int32 index map per row, int64 cache state and LRU stamp per slot).
CACHE_MAP_BYTES, CACHE_SLOT_BYTES = 4, 16
_ANNOTATED = ("get_forward_compute", "get_backward_compute", "get_fwd_comms", "get_bwd_comms", "get_output_write_size")
_CONFIG_FLAGS = ("_use_min_dim_for_lookup", "_use_block_usage_penalty", "_use_bytes_for_input_read_size",
                 "_input_data_type_size")


def config_problem(config, topology) -> str | None:
    """Why TorchRec's perf config or topology asks for more than these formulas restate, or None."""
    from torchrec.distributed.planner.estimator import annotations
    from torchrec.distributed.planner.estimator.types import HardwarePerfConfig

    if topology.compute_device != "cuda":
        return f"compute device {topology.compute_device} (the formulas restate cuda)"
    for kind in SHARDING_TYPES:
        for getter in _ANNOTATED:
            if getattr(annotations, getter)(config, kind) is not None:
                return f"a custom {getter[4:]} method for {kind}"
        if config.get_coefficients_for_sharding(kind).bwd is not None:
            return f"backward coefficients for {kind}"
    if config.coefficients.by_kernel:
        return "per-kernel coefficients"
    if annotations.get_prefetch_compute(config) is not None:
        return "a custom prefetch_compute method"
    flags = [flag for flag in _CONFIG_FLAGS if getattr(config, flag, None) is not None]
    if flags:
        return f"config flags {', '.join(flags)}"
    if type(config).post_process_perfs is not HardwarePerfConfig.post_process_perfs:
        return "a post-processing of shard perfs"
    return None


def table_problem(context, template, sharder_data, constraint) -> str | None:
    """Why one table's TorchRec inputs ask for more than these formulas restate, or None."""
    from torchrec.distributed.types import StorageUsageType

    if context.is_weighted or context.has_feature_processor:
        return "weighted features"
    if template.cache_params is not None:
        return "cache params on the table"
    for key in ("prefetch_pipeline", "cache_load_factor", "multipass_prefetch_config"):
        if sharder_data.fused_params.get(key):
            return f"the sharder's fused param {key}"
    if sharder_data.storage_usage_type != StorageUsageType.BASE:
        return f"storage usage type {sharder_data.storage_usage_type}"
    if constraint is not None and (constraint.key_value_params or constraint.use_virtual_table):
        return "key-value or virtual tables"
    return None


@dataclass(frozen=True)
class Tables:
    """Per table, the numbers TorchRec's estimators read from its ShardingOption (as its own contexts
    compute them): size, element and communication sizes, lookups and outputs per batch, optimizer state."""

    rows: np.ndarray
    dim: np.ndarray
    element: np.ndarray          # table element bytes
    output_element: np.ndarray   # bytes of an output element, as the storage estimator reads it
    fwd_a2a: np.ndarray          # bytes per element of the collectives
    bwd_a2a: np.ndarray
    fwd_sr: np.ndarray
    bwd_sr: np.ndarray
    batch_inputs: np.ndarray     # ids looked up per batch and rank
    batch_outputs: np.ndarray    # embeddings produced per batch and rank
    pooled: np.ndarray
    optimizer: np.ndarray        # optimizer state bytes per weight byte
    problem: tuple               # per table: why the formulas do not cover it, or None


@dataclass(frozen=True)
class Setting:
    """The cluster-wide numbers: ranks, TorchRec's bandwidth of each collective it prices, its constants."""

    world: int
    local: int
    group: int                   # the table-row-wise group (TorchRec's intra_group_size)
    input_bytes: float           # bytes per looked-up id
    bwd_multiplier: float
    fwd_coefficients: tuple      # per sharding type: (input read, lookup, output, hash size) multipliers
    block_penalty: object        # TorchRec's block usage penalty, a function of the shard's width
    device_bw: object            # TorchRec's device bandwidth, a function of (kernel, load factor)
    in_hbm: np.ndarray           # per kernel (instances.kernels order): whether its weights live in HBM
    cached: np.ndarray           # per kernel: whether it is one TorchRec sizes as a cache of the weights
    a2a_bw: float                # world-wide all-to-all
    reduce_scatter_bw: float     # row-wise, world-wide
    all_gather_bw: float
    group_reduce_scatter_bw: float  # table-row-wise, within its group
    group_all_gather_bw: float
    groups_a2a_bw: float         # table-row-wise, across groups
    all_reduce_bw: float
    batched_copy: float
    dp_elementwise: float
    problem: str | None


def setting(topology, config) -> Setting:
    """The cluster-wide numbers of a TorchRec topology under a perf config, asked of TorchRec."""
    from torchrec.distributed.planner import constants
    from torchrec.distributed.planner.estimator.estimator import compute_block_usage_penalty
    from torchrec.distributed.planner.shard_estimators import _is_table_cached
    from torchrec.distributed.planner.types import CollectiveType
    from torchrec.distributed.types import StorageUsageType, compute_storage_usage
    import torch

    world, local, group = topology.world_size, topology.local_world_size, topology.intra_group_size
    bw = topology.comms_bandwidths.get_bw
    groups = max(1, world // group)
    coefficients = []
    for kind in SHARDING_TYPES:
        c = config.get_coefficients_for_sharding(kind).fwd
        coefficients.append((c.input_read_size_multiplier, c.lookup_size_multiplier, c.embedding_output_multiplier,
                             c.hash_size_multiplier))

    def device_bw(kernel: str, load_factor: float | None) -> float:
        return config.get_device_bw(topology.compute_device, kernel, topology.hbm_mem_bw, topology.ddr_mem_bw,
                                    topology.ssd_mem_bw, topology.hbm_to_ddr_mem_bw, load_factor, False)

    probe = torch.empty((1, 1), device="meta")
    in_hbm = [set(compute_storage_usage(probe, topology.compute_device, k, StorageUsageType.BASE)) == {"hbm"}
              for k in KERNELS]
    return Setting(
        world=world, local=local, group=group, input_bytes=constants.BIGINT_DTYPE,
        bwd_multiplier=config.get_bwd_compute_multiplier(topology.bwd_compute_multiplier),
        fwd_coefficients=tuple(coefficients), block_penalty=compute_block_usage_penalty, device_bw=device_bw,
        in_hbm=np.array(in_hbm), cached=np.array([_is_table_cached(k) for k in KERNELS]),
        a2a_bw=bw(local_world_size=local, world_size=world, collective_type=CollectiveType.ALL_TO_ALL),
        reduce_scatter_bw=bw(local_world_size=local, world_size=world, collective_type=CollectiveType.REDUCE_SCATTER),
        all_gather_bw=bw(local_world_size=local, world_size=world, collective_type=CollectiveType.ALL_GATHER),
        group_reduce_scatter_bw=bw(local_world_size=min(group, local), world_size=group,
                                   collective_type=CollectiveType.REDUCE_SCATTER),
        group_all_gather_bw=bw(local_world_size=min(group, local), world_size=group,
                               collective_type=CollectiveType.ALL_GATHER),
        groups_a2a_bw=bw(local_world_size=1, world_size=groups, collective_type=CollectiveType.ALL_TO_ALL),
        all_reduce_bw=bw(local_world_size=local, world_size=world, collective_type=CollectiveType.ALL_REDUCE),
        batched_copy=constants.BATCHED_COPY_PERF_FACTOR, dp_elementwise=constants.DP_ELEMENTWISE_KERNELS_PERF_FACTOR,
        problem=config_problem(config, topology))


def tables(templates: list, topology, config, constraints: dict, sharder_data: dict) -> Tables:
    """Per table, from its TorchRec ShardingOption (any option of it: these numbers do not depend on the
    cut or kernel) and its module's sharder data (`sharder_data` by module type), what the estimators read,
    through TorchRec's own context builder."""
    from torchrec.distributed.planner.estimator.types import ShardPerfContext
    from torchrec.distributed.planner.shard_estimators import _get_optimizer_multipler
    from torchrec.modules.embedding_configs import DATA_TYPE_NUM_BITS

    rows = []
    for option in templates:
        ctx = ShardPerfContext.build_shard_perf_contexts(
            config=config, shard_sizes=[option.shards[0].size], sharding_option=option, topology=topology,
            constraints=constraints, sharder_data=sharder_data[option.module_type_key])[0]
        shape = option.tensor.shape
        output = DATA_TYPE_NUM_BITS[option.output_dtype] / 8 if option.output_dtype else option.tensor.element_size()
        optimizer = _get_optimizer_multipler(getattr(option.tensor, "_optimizer_classes", [None])[0], shape)
        rows.append((shape[0], shape[1], ctx.table_data_type_size, output, ctx.fwd_a2a_comm_data_type_size,
                     ctx.bwd_a2a_comm_data_type_size, ctx.fwd_sr_comm_data_type_size, ctx.bwd_sr_comm_data_type_size,
                     ctx.batch_inputs, ctx.batch_outputs, ctx.is_pooled, optimizer,
                     table_problem(ctx, option, sharder_data[option.module_type_key], constraints.get(option.name))))
    columns = list(zip(*rows))
    ints = [np.array(c, dtype=np.int64) for c in columns[:2]]
    floats = [np.array(c, dtype=float) for c in columns[2:10]]
    return Tables(*ints, *floats, np.array(columns[10], dtype=bool), np.array(columns[11], dtype=float),
                  tuple(columns[12]))


# ------------------------------------------------------------------ perf


def _sizes(kind: int, s: Setting, t: Tables, table: np.ndarray, width: np.ndarray):
    """Per shard of one sharding type: the bytes of ids read, of embedding rows looked up, and of outputs
    written forward and backward (each evaluator's own getters)."""
    w, bi, bo, e = s.world, t.batch_inputs[table], t.batch_outputs[table], t.element[table]
    pooled = t.pooled[table]
    if kind in WHOLE_ROWS:
        read = np.ceil(bi * w * s.input_bytes)
        lookup = bi * w * np.maximum(width, MIN_LOOKUP_DIM) * e
        return read, lookup, bo * w * width * t.fwd_a2a[table], bo * w * width * t.bwd_a2a[table]
    if kind == DATA_PARALLEL:
        out = bo * width * e
        return np.ceil(bi * s.input_bytes), bi * width * e, out, out
    divisor = s.world if kind == ROW_WISE else s.group
    read = np.ceil(bi / divisor * w * s.input_bytes)
    lookup = bi / divisor * w * width * e
    outputs = np.where(pooled, bo * w, bo / divisor * w) * width
    if kind == ROW_WISE:
        fwd, bwd = np.where(pooled, t.fwd_sr[table], t.fwd_a2a[table]), np.where(pooled, t.bwd_sr[table], t.bwd_a2a[table])
    else:
        fwd, bwd = t.fwd_sr[table], t.bwd_sr[table]
    return read, lookup, outputs * fwd, outputs * bwd


def _comms(kind: int, s: Setting, t: Tables, table, rows, width, out_fwd, out_bwd, device_bw):
    """Per shard of one sharding type: forward and backward communication (ms)."""
    if kind in WHOLE_ROWS:
        return out_fwd / s.a2a_bw, out_bwd / s.a2a_bw
    if kind == ROW_WISE:
        return out_fwd / s.reduce_scatter_bw, out_bwd / s.all_gather_bw + out_bwd * s.batched_copy / device_bw
    if kind in NODE_ROWS:
        groups = max(1, s.world // s.group)
        across_fwd = across_bwd = 0.0
        if groups > 1:
            outputs = t.batch_outputs[table] * groups * width
            across_fwd = outputs * t.fwd_a2a[table] / s.groups_a2a_bw
            across_bwd = outputs * t.bwd_a2a[table] / s.groups_a2a_bw
        return (out_fwd / s.group_reduce_scatter_bw + across_fwd,
                across_bwd + out_bwd / s.group_all_gather_bw + out_bwd * s.batched_copy / device_bw)
    weights = rows * width * t.element[table]
    nodes = min(s.world / s.local, 2)
    all_reduce = weights * (2 * nodes - 1) / nodes / s.all_reduce_bw if s.all_reduce_bw > 0 else np.zeros(len(table))
    if s.world > 2 * s.local:
        all_reduce = all_reduce * 2
    return np.zeros(len(table)), all_reduce + weights * s.dp_elementwise / device_bw


def perf(s: Setting, t: Tables, pieces: Pieces) -> np.ndarray:
    """Per piece, TorchRec's (fwd_compute, bwd_compute + prefetch_compute, fwd_comms, bwd_comms) in ms."""
    out = np.zeros((len(pieces), 4))
    device_bw = _device_bw(s, pieces)
    table, kind, rows, width = pieces.table, pieces.kind, pieces.rows, pieces.width
    for k in np.unique(kind):
        m = np.flatnonzero(kind == k)
        tm, hm, wm, bw = table[m], rows[m], width[m], device_bw[m]
        read, lookup, out_fwd, out_bwd = _sizes(int(k), s, t, tm, wm)
        a_read, a_lookup, a_out, a_hash = s.fwd_coefficients[k]
        penalty = _penalty(s, wm) if k in WHOLE_ROWS else 1.0
        fwd = (a_read * read + a_lookup * lookup + a_out * out_fwd + a_hash * hm) * penalty / bw
        out[m, 0], out[m, 1] = fwd, fwd * s.bwd_multiplier
        out[m, 2], out[m, 3] = _comms(int(k), s, t, tm, hm, wm, out_fwd, out_bwd, bw)
    return out


def _device_bw(s: Setting, pieces: Pieces) -> np.ndarray:
    """TorchRec's bandwidth of each piece's kernel (a cached kernel's depends on its load factor)."""
    factor = np.where(s.cached[pieces.kernel], pieces.load_factor, -1.0)
    first, inverse = _distinct(pieces.kernel, factor)
    values = [s.device_bw(KERNELS[k], f if f >= 0 else None) for k, f in zip(pieces.kernel[first].tolist(),
                                                                               factor[first].tolist())]
    return np.array(values)[inverse]


def _distinct(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first index of each distinct row of the columns, and each row's distinct row."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        values, inverse = np.unique(column, return_inverse=True)
        # Renumbered densely after each column, a code stays below the row count: no product can overflow.
        code = np.unique(code * len(values) + inverse.reshape(-1), return_inverse=True)[1].reshape(-1)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _penalty(s: Setting, width: np.ndarray) -> np.ndarray:
    """TorchRec's block usage penalty of each width."""
    widths, inverse = np.unique(width, return_inverse=True)
    return np.array([s.block_penalty(int(d)) for d in widths])[inverse]


# ------------------------------------------------------------------ storage


def _io(kind: int, s: Setting, t: Tables, table, rows, width):
    """Per shard of one sharding type: the bytes of its input ids and of its outputs per batch."""
    w, bi, bo, size = s.world, t.batch_inputs[table], t.batch_outputs[table], t.output_element[table]
    if kind == DATA_PARALLEL:
        return np.ceil(bi * s.input_bytes), np.ceil(bo * t.dim[table] * size)
    if kind in WHOLE_ROWS:
        cols = t.dim[table] if kind == TABLE_WISE else width
        return np.ceil(bi * w * s.input_bytes), np.ceil(bo * w * cols * size)
    bi = bi / (s.world if kind == ROW_WISE else s.group)
    bo = np.where(t.pooled[table], bo, bi)
    empty = rows * width == 0
    return (np.where(empty, 0, np.ceil(bi * w * s.input_bytes)),
            np.where(empty, 0, np.ceil(bo * w * width * size)))


def _share(stored: np.ndarray, rows, width, t: Tables, table, kind) -> np.ndarray:
    """Each shard's share of the bytes `stored` for its table, as TorchRec rounds it: ceil(stored * shard /
    table) with Python's correctly rounded division of exact integers. Where the whole table is stored
    that is the shard's own bytes, exactly; a cache's share is computed per distinct case, in Python."""
    share = stored.copy()
    split = kind != DATA_PARALLEL
    whole = split & (stored == t.rows[table] * t.dim[table] * t.element[table].astype(np.int64))
    share[whole] = rows[whole] * width[whole] * t.element[table[whole]].astype(np.int64)
    part = np.flatnonzero(split & ~whole & (stored != 0))
    if part.size:
        keys = (stored[part], rows[part] * width[part], t.rows[table[part]] * t.dim[table[part]])
        first, inverse = _distinct(*keys)
        values = [math.ceil(a * b / c) for a, b, c in zip(*(k[first].tolist() for k in keys))]
        share[part] = np.array(values, dtype=np.int64)[inverse]
    return share


def storage(s: Setting, t: Tables, pieces: Pieces) -> np.ndarray:
    """Per shard, TorchRec's (HBM, DDR) bytes: its weights' share in their tier (the cached share of them in
    HBM for a cached kernel, with the cache's bookkeeping), optimizer state, and its input and output
    buffers in HBM."""
    table, kind, rows, width, load_factor = pieces.table, pieces.kind, pieces.rows, pieces.width, pieces.load_factor
    weights = t.rows[table] * t.dim[table] * t.element[table].astype(np.int64)
    in_hbm, cached = s.in_hbm[pieces.kernel], s.cached[pieces.kernel]
    hbm_weights = np.where(in_hbm, weights, 0)
    ddr_weights = np.where(in_hbm, 0, weights)
    hbm_weights = np.where(cached, np.rint(ddr_weights * load_factor).astype(np.int64), hbm_weights)
    hbm_share = _share(hbm_weights, rows, width, t, table, kind)
    ddr_share = _share(ddr_weights, rows, width, t, table, kind)
    optimizer = t.optimizer[table]
    aux = np.where(cached, np.ceil(rows * (CACHE_MAP_BYTES + load_factor * CACHE_SLOT_BYTES)), 0).astype(np.int64)
    inputs, outputs = np.zeros(len(table), dtype=np.int64), np.zeros(len(table), dtype=np.int64)
    for k in np.unique(kind):
        m = np.flatnonzero(kind == k)
        i, o = _io(int(k), s, t, table[m], rows[m], width[m])
        inputs[m], outputs[m] = i, o
    hbm = aux + hbm_share + np.ceil(hbm_share * optimizer).astype(np.int64) + (inputs + outputs)
    ddr = ddr_share + np.ceil(ddr_share * optimizer).astype(np.int64)
    return np.stack([hbm, ddr], axis=1)
