"""Memory as a vector over tiers — a device's HBM and its host memory (DDR) — and the one rule for what a
piece of a table stores where: its weights plus the optimizer state kept beside them, in HBM (`fused`,
`dense`), in host memory (`fused_uvm`), or in host memory with an HBM cache of a share of its rows
(`fused_uvm_caching`: the cached rows' weights plus FBGEMM's cache state); and, where the workload counts
them as TorchRec's storage estimator does, the input and output buffers of each shard in HBM. Every
capacity check, validation and solver reads these vectors; nothing else multiplies bytes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernels import FUSED_UVM, FUSED_UVM_CACHING, KERNEL_CODE

TIERS = ("hbm", "host")
HBM, HOST = 0, 1
TIER_NAMES = {"hbm": "HBM", "host": "host memory"}
# fp32 optimizer state beside the weights: (bytes per element, bytes per row). SGD keeps none, row-wise
# Adagrad one scalar per row, Adagrad one per element, Adam two per element.
OPTIMIZER_STATE = {"sgd": (0, 0), "rowwise_adagrad": (0, 4), "adagrad": (4, 0), "adam": (8, 0)}
# FBGEMM's UVM cache keeps, besides the cached rows' weights, an int32 map per row of the table and an
# int64 index and an int64 LRU stamp per cache slot (as TorchRec's storage estimator counts them); the
# optimizer state stays in host memory with the table.
CACHE_MAP_BYTES_PER_ROW = 4
CACHE_STATE_BYTES_PER_SLOT = 16
ID_BYTES = 8  # an input id, as TorchRec counts it (int64)


@dataclass(frozen=True)
class Storage:
    """Bytes in each tier (HBM, host memory)."""

    hbm: int = 0
    host: int = 0

    @classmethod
    def of(cls, vector) -> "Storage":
        return cls(int(vector[HBM]), int(vector[HOST]))

    def as_array(self) -> np.ndarray:
        return np.array([self.hbm, self.host], dtype=np.int64)

    def fits_in(self, capacity: "Storage") -> bool:
        return self.hbm <= capacity.hbm and self.host <= capacity.host

    def __add__(self, other: "Storage") -> "Storage":
        return Storage(self.hbm + other.hbm, self.host + other.host)


def stored_bytes(rows, width, dtype_bytes, optimizer: str):
    """Bytes of `rows` × `width` of a table with `dtype_bytes` weights and the optimizer's state beside
    them; works element-wise on integer arrays (every value fits int64: instances bound rows, dims and
    totals)."""
    per_element, per_row = OPTIMIZER_STATE[optimizer]
    return rows * (width * (dtype_bytes + per_element) + per_row)


def cache_rows(rows, load_factor):
    """Rows an HBM cache of `load_factor` of a piece's rows holds (at least one for a positive factor)."""
    return np.ceil(np.asarray(load_factor, dtype=float) * np.asarray(rows)).astype(np.int64)


def io_bytes(rows, width, inputs, outputs, pooled, element, reach, divisor) -> np.ndarray:
    """TorchRec's input and output buffers of each shard, in HBM (its storage estimator's
    `_calculate_shard_io_sizes` without a pipeline): a shard receives the ids of the lookups it serves for
    the samples of `reach` devices (`inputs` per device's batch, of which a row shard serves 1/`divisor`)
    and writes their outputs (`outputs` pooled vectors per batch, or one per lookup for a sequence table)
    of `width` elements of `element` bytes. A row shard without rows holds neither."""
    rows, width = np.asarray(rows, dtype=np.int64), np.asarray(width, dtype=np.int64)
    served = np.asarray(inputs, dtype=float) / divisor
    written = np.where(pooled, outputs, served)
    ids = np.ceil(served * reach * ID_BYTES)
    vectors = np.ceil(written * reach * width * element)
    return np.where(rows * width == 0, 0, ids + vectors).astype(np.int64)


def storage(rows, width, dtype_bytes, optimizer: str, kernel=None, load_factor=None, io=None) -> np.ndarray:
    """Storage vectors, shape (..., 2): what each piece keeps in HBM and in host memory under its kernel
    (codes of instances.kernels.KERNELS; None: every piece in HBM) and cache load factor (0 where the
    kernel keeps no cache), with its input and output buffers (`io`, bytes in HBM; None: none counted)."""
    rows, width = np.asarray(rows, dtype=np.int64), np.asarray(width, dtype=np.int64)
    dtype_bytes = np.asarray(dtype_bytes, dtype=np.int64)
    stored = np.asarray(stored_bytes(rows, width, dtype_bytes, optimizer), dtype=np.int64)
    buffers = 0 if io is None else np.asarray(io, dtype=np.int64)
    if kernel is None:
        return np.stack([stored + buffers, np.zeros_like(stored)], axis=-1)
    kernel = np.asarray(kernel)
    in_host = (kernel == KERNEL_CODE[FUSED_UVM]) | (kernel == KERNEL_CODE[FUSED_UVM_CACHING])
    cached = kernel == KERNEL_CODE[FUSED_UVM_CACHING]
    slots = np.where(cached, cache_rows(rows, np.where(cached, load_factor, 0.0)), 0)
    cache = slots * (width * dtype_bytes + CACHE_STATE_BYTES_PER_SLOT) + rows * CACHE_MAP_BYTES_PER_ROW
    hbm = np.where(in_host, np.where(cached, cache, 0), stored) + buffers
    return np.stack([hbm, np.where(in_host, stored, 0)], axis=-1).astype(np.int64)


def over_capacity(used: np.ndarray, capacity: np.ndarray) -> list[tuple[int, int]]:
    """(device, tier) pairs where per-device storage `used` (K × 2) exceeds the capacity vector."""
    return [(int(d), int(t)) for d, t in zip(*np.nonzero(np.asarray(used) > np.asarray(capacity)))]


def tier_label(tier: int) -> str:
    return TIER_NAMES[TIERS[tier]]


def shortfall(need: np.ndarray, free: np.ndarray) -> tuple[int, int]:
    """Why a piece needing `need` (2,) fits on none of the devices with `free` (m × 2) left: the tier it is
    short of, and the most free any device has there — among the devices with room in the other tier
    when every tier has some device with room (then each device is short of one tier or the other)."""
    free = np.asarray(free).reshape(-1, 2)
    for tier in (HBM, HOST):
        if free[:, tier].max(initial=-1) < need[tier]:
            return tier, int(free[:, tier].max(initial=0))
    roomy = free[free[:, HOST] >= need[HOST]]
    return HBM, int(roomy[:, HBM].max(initial=0))


def storage_fields(used: np.ndarray, capacity: Storage) -> dict:
    """A plan's per-device storage for reports and results records: HBM as `memory_per_device` (as records
    have always had it) and, where devices have host memory, `host_memory_per_device` beside it."""
    used = np.asarray(used).reshape(-1, 2)
    fields = {"memory_per_device": [int(x) for x in used[:, HBM]]}
    if capacity.host > 0:
        fields["host_memory_per_device"] = [int(x) for x in used[:, HOST]]
    return fields


def describe(used: np.ndarray, capacity: Storage) -> str:
    """One device's (or the peak) storage against its capacity, tier by tier, for people."""
    parts = []
    for t, (name, cap) in enumerate(zip(TIERS, (capacity.hbm, capacity.host))):
        if cap > 0:
            amount, limit = format_sizes(used[t], cap)
            parts.append(f"{TIER_NAMES[name]} {amount} of {limit}")
    return ", ".join(parts)


BYTE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(count, digits: int = 2) -> str:
    """A byte count for people — every message and report line shows sizes this way (machine-readable JSON
    keeps exact bytes): in TiB, GiB, MiB or KiB with up to `digits` decimals, in bytes below 1 KiB."""
    for unit, size in BYTE_UNITS:
        if abs(count) >= size:
            return f"{count / size:.{digits}f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{count:.4g} B" if isinstance(count, float) else f"{int(count)} B"


def format_sizes(*counts) -> tuple[str, ...]:
    """Byte counts one message compares (a need against a capacity), each as `format_bytes` writes it, with
    as many decimals as it takes for unequal counts to read unequal (exact bytes where none suffices): a
    need just over a capacity must not read as equal to it."""
    values = [int(c) for c in counts]
    for digits in range(2, 7):
        texts = tuple(format_bytes(v, digits) for v in values)
        if all(texts[i] != texts[j] for i in range(len(values)) for j in range(i) if values[i] != values[j]):
            return texts
    return tuple(f"{v} B" for v in values)
