"""Task samplers reproducing the papers' protocols on the DLRM pool: AutoShard (N tables on N/10
devices, dim from {16, 32}, 90 train / 10 test tasks), DreamShard (pool halved by seed, dim 16, 4
devices, 50 / 50 tasks) and AutoShard's unseen-tables ratio (train on the first half of the pool); and
`scaled`, for tasks larger than the 856-table pool: tables drawn with replacement from the whole pool,
each perturbed (rows and pooling factor times a log-normal factor of σ = 0.25, reuse bins kept), dim
from {16, 32}, so that 5,000 tables on 512 devices can be benchmarked. Topologies are one node of K
devices, or `nodes` × `devices_per_node`."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .memory import HBM, storage
from .model import (
    DTYPE_BYTES,
    LEGACY_SHARDING_TYPES,
    MAX_ROWS,
    SHARDING_TYPES,
    Instance,
    InstanceError,
    Topology,
    Workload,
)
from .pool import PoolTable, dlrm_pool

PROTOCOLS = ("autoshard", "dreamshard", "unseen", "scaled")
SCALED_SIGMA = 0.25   # log-normal spread of the scaled protocol's perturbation of rows and pooling
SCALED_TASKS = 3      # test tasks the scaled protocol draws (no train split: nothing is trained on them)
SPLITS = ("train", "test")
DEFAULT_MEMORY_BYTES = 10 * 2**30  # AutoShard's tasks were sized to run on GPUs with ~10 GB


@dataclass(frozen=True)
class MemorySpec:
    """Per-device capacity: absolute bytes, or `tightness` × the average per-device load of the task."""

    capacity_bytes: int | None = None
    tightness: float | None = None
    host_memory_bytes: int | None = None  # per device; None: no host memory

    def capacity_for(self, total_bytes: int, num_devices: int) -> int:
        if self.tightness is not None:
            return max(1, int(np.ceil(self.tightness * total_bytes / num_devices)))
        return self.capacity_bytes if self.capacity_bytes is not None else DEFAULT_MEMORY_BYTES

    def validate(self) -> None:
        if self.capacity_bytes is not None and self.tightness is not None:
            raise InstanceError("memory", "give either an absolute capacity or a tightness factor, not both")
        if self.capacity_bytes is not None and self.capacity_bytes <= 0:
            raise InstanceError("memory.capacity_bytes", f"must be > 0, got {self.capacity_bytes}")
        if self.tightness is not None and not self.tightness > 0:
            raise InstanceError("memory.tightness", f"must be > 0, got {self.tightness}")
        if self.host_memory_bytes is not None and not (isinstance(self.host_memory_bytes, int)
                                                       and self.host_memory_bytes > 0):
            raise InstanceError("memory.host_memory_bytes", f"must be a positive number of bytes, got "
                                f"{self.host_memory_bytes!r}")


@dataclass(frozen=True)
class TaskSpec:
    protocol: str
    num_tables: int
    split: str = "test"
    seed: int = 0
    num_devices: int | None = None
    count: int | None = None
    unseen_ratio: float = 1.0
    memory: MemorySpec = MemorySpec()
    dtype: str = "fp16"
    workload: Workload = Workload()
    nodes: int = 1
    sharding_types: tuple[str, ...] = LEGACY_SHARDING_TYPES  # the five the committed task sets were sampled with
    intra_node_bw: float = Topology.intra_node_a2a_bw
    inter_node_bw: float = Topology.inter_node_a2a_bw

    def validate(self, pool_size: int) -> None:
        if self.protocol not in PROTOCOLS:
            raise InstanceError("protocol", f"must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.split not in SPLITS:
            raise InstanceError("split", f"must be one of {SPLITS}, got {self.split!r}")
        if self.dtype not in DTYPE_BYTES:
            raise InstanceError("dtype", f"must be one of {tuple(DTYPE_BYTES)}, got {self.dtype!r}")
        limit = {"autoshard": pool_size, "scaled": 100_000}.get(self.protocol, pool_size // 2)
        if not 0 < self.num_tables <= limit:
            raise InstanceError("num_tables", f"must be in 1..{limit} for protocol {self.protocol}, got {self.num_tables}")
        if self.num_devices is not None and self.num_devices <= 0:
            raise InstanceError("num_devices", f"must be > 0, got {self.num_devices}")
        if self.nodes <= 0 or _devices(self) % self.nodes:
            raise InstanceError("nodes", f"must be > 0 and divide the {_devices(self)} devices, got {self.nodes}")
        bad = [t for t in self.sharding_types if t not in SHARDING_TYPES]
        if not self.sharding_types or bad:
            raise InstanceError("sharding_types", f"must be a non-empty list of {SHARDING_TYPES}, got {list(self.sharding_types)}")
        if self.count is not None and self.count <= 0:
            raise InstanceError("count", f"must be > 0, got {self.count}")
        if not 0.0 <= self.unseen_ratio <= 1.0:
            raise InstanceError("unseen_ratio", f"must be in [0, 1], got {self.unseen_ratio}")
        self.memory.validate()


# (train tasks, test tasks) per protocol, as in the papers.
TASK_COUNTS = {"autoshard": (90, 10), "dreamshard": (50, 50), "unseen": (90, 10), "scaled": (0, SCALED_TASKS)}


def _devices(spec: TaskSpec) -> int:
    if spec.num_devices is not None:
        return spec.num_devices
    if spec.protocol == "dreamshard":
        return 4
    return max(1, spec.num_tables // 10)


def _make_instance(spec: TaskSpec, task_id: str, entries: list[PoolTable], dims: np.ndarray) -> Instance:
    dtype_bytes = DTYPE_BYTES[spec.dtype]
    tables = tuple(e.as_table(int(d), dtype_bytes) for e, d in zip(entries, dims))
    if len({t.name for t in tables}) != len(tables):  # drawn with replacement: name each draw apart
        tables = tuple(replace(t, name=f"{t.name}_{i}") for i, t in enumerate(tables))
    workload = spec.workload
    num_devices = _devices(spec)
    total = int(storage([t.rows for t in tables], [t.dim for t in tables], [t.dtype_bytes for t in tables],
                        workload.optimizer)[:, HBM].sum())
    topology = Topology(nodes=spec.nodes, devices_per_node=num_devices // spec.nodes,
                        memory_bytes=spec.memory.capacity_for(total, num_devices), intra_node_a2a_bw=spec.intra_node_bw,
                        host_memory_bytes=spec.memory.host_memory_bytes or 0,
                        inter_node_a2a_bw=spec.inter_node_bw)
    provenance = (f"dlrm_t856 pool, protocol={spec.protocol}, split={spec.split}, seed={spec.seed}, "
                  f"tables={spec.num_tables}, devices={num_devices}"
                  + (f" ({spec.nodes} nodes)" if spec.nodes > 1 else "")
                  + (f", unseen_ratio={spec.unseen_ratio}" if spec.protocol == "unseen" else "")
                  + (f", perturbed draws with replacement (sigma {SCALED_SIGMA})" if spec.protocol == "scaled" else ""))
    return Instance(id=task_id, tables=tables, topology=topology, workload=workload, provenance=provenance,
                    sharding_types=tuple(spec.sharding_types)).validate()


def _perturbed(entry: PoolTable, rng: np.random.Generator) -> PoolTable:
    rows = int(np.clip(round(entry.rows * rng.lognormal(0.0, SCALED_SIGMA)), 100, MAX_ROWS))
    return replace(entry, rows=rows, pooling_factor=float(entry.pooling_factor * rng.lognormal(0.0, SCALED_SIGMA)))


def sample_tasks(spec: TaskSpec, pool: tuple[PoolTable, ...] | None = None) -> list[Instance]:
    """The protocol's tasks of one split, deterministic in (protocol, sizes, seed, pool)."""
    pool = pool if pool is not None else dlrm_pool()
    spec.validate(len(pool))
    n = spec.num_tables
    rng = np.random.default_rng([spec.seed, n, PROTOCOLS.index(spec.protocol)])
    n_train, n_test = TASK_COUNTS[spec.protocol]
    half = len(pool) // 2
    if spec.protocol == "dreamshard":
        order = rng.permutation(len(pool))
        pools = {"train": order[:half], "test": order[half:]}
    tasks: list[Instance] = []
    for k in range(n_train + n_test):
        split = "train" if k < n_train else "test"
        if spec.protocol == "scaled":
            chosen = rng.choice(len(pool), size=n, replace=True)
            dims = rng.choice([16, 32], size=n)
            entries = [_perturbed(pool[i], rng) for i in chosen]
        elif spec.protocol == "autoshard":
            chosen = rng.choice(len(pool), size=n, replace=False)
            dims = rng.choice([16, 32], size=n)
        elif spec.protocol == "dreamshard":
            chosen = rng.choice(pools[split], size=n, replace=False)
            dims = np.full(n, 16)
        else:
            n_unseen = int(round(spec.unseen_ratio * n)) if split == "test" else 0
            seen = rng.choice(half, size=n - n_unseen, replace=False)
            unseen = half + rng.choice(len(pool) - half, size=n_unseen, replace=False)
            chosen = np.concatenate([seen, unseen])
            dims = rng.choice([16, 32], size=n)
        if split != spec.split:
            continue
        task_id = (f"{spec.protocol}-n{n}-k{_devices(spec)}-s{spec.seed}-{split}-{k:03d}"
                   + (f"-u{spec.unseen_ratio:g}" if spec.protocol == "unseen" else ""))
        if spec.protocol != "scaled":
            entries = [pool[i] for i in chosen]
        tasks.append(_make_instance(spec, task_id, entries, dims))
    return tasks[: spec.count] if spec.count is not None else tasks
