"""The measured oracle: a device's forward and backward time, timed on a real FBGEMM table-batched
embedding operator built from its tables.

fbgemm-gpu on CUDA (fp16, each kernel where TorchRec puts it), fbgemm-gpu-cpu on CPU (fp32, every table on
the host), with inputs synthesised to match each table's pooling factor and reuse bins. Timing follows
AutoShard Alg. 2/3: 5 warm-ups, 10 timed runs, each after a cache flush (a write larger than the last-level
cache or the GPU's L2), CUDA events on a GPU, the mean of the runs left after dropping the 2 highest and 2
lowest. On a GPU each run is queued behind a spin kernel that lasts longer than the host takes to launch it,
so the events time the kernels back to back, not the host's launch latency. Communication is the analytic
term (one process sees no network); the cached record says so. Measurements are cached on disk by table
set, placement, device and versions."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from instances import Instance, Table
from instances.access import REFERENCE_BATCH, bin_count_ranges
from instances.kernels import FUSED, FUSED_UVM, FUSED_UVM_CACHING, KERNELS
from instances.pieces import Pieces

from .analytic import AnalyticOracle
from .base import DeviceCost, Oracle, Priced

CPU_FLUSH_BYTES = 64 << 20   # larger than this machine's 32 MiB L3; see flush()
CUDA_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (an H200 has 60 MB)
# Bump when a protocol changes, so old cache entries are not reused: the CPU's has not changed since 2; on
# CUDA, 3 brought CUDA events and placements, 4 the spin kernel that hides the launches.
CPU_PROTOCOL_VERSION = 2
CUDA_PROTOCOL_VERSION = 4
FIRST_HOLD_S = 1e-3  # the spin before the first run; later runs spin 1.5 times the longest launch seen
HOLD_MARGIN = 1.5
MAX_HOLD_S = 0.05


class MeasurementUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Protocol:
    warmups: int = 5
    runs: int = 10
    trim: int = 2
    threads: int = 1            # CPU: fixed so that timings do not depend on what else runs
    max_rows: int | None = 1 << 18  # CPU: rows beyond this are not allocated (8–32 MiB: the size of the LLC)
    batch: int | None = None    # default: the instance's batch size per device
    seed: int = 0


@dataclass(frozen=True)
class Placement:
    """Where a timed table's rows live, by TorchRec's kernel names: `fused` in HBM, `fused_uvm` in host
    memory read over UVM, `fused_uvm_caching` in host memory with an HBM cache of `load_factor` of its rows.
    Data-parallel (`dense`) tables are timed as `fused`. On a CPU every table is on the host."""
    kernel: str = FUSED
    load_factor: float = 0.0

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}")
        if self.kernel == FUSED_UVM_CACHING and not 0 < self.load_factor <= 1:
            raise ValueError(f"a cached table needs a load factor in (0, 1], got {self.load_factor}")


HBM = Placement()


@dataclass(frozen=True)
class Measurement:
    forward_s: float
    backward_s: float
    forward_runs: tuple[float, ...]
    backward_runs: tuple[float, ...]
    device: str
    versions: dict
    communication: str = "analytic (single process: no all-to-all to time)"
    exposed: int = 0  # timed runs whose launch outlasted the spin ahead of it: they include host time

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def spread(self) -> float:
        """Coefficient of variation of the timed forward+backward runs."""
        totals = np.array(self.forward_runs) + np.array(self.backward_runs)
        return float(totals.std() / totals.mean()) if totals.mean() > 0 else 0.0


@dataclass(frozen=True, eq=False)
class Inputs:
    """One batch of lookups for a table set, table-major (all of table 0's samples, then table 1's, ...), as
    TBE takes them, over the rows each table is given."""
    rows: tuple[int, ...]
    indices: np.ndarray
    offsets: np.ndarray


def _fbgemm():
    try:
        import fbgemm_gpu  # noqa: F401
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except ImportError as exc:
        raise MeasurementUnavailable("the measured oracle needs fbgemm-gpu (CUDA) or fbgemm-gpu-cpu (CPU): "
                                     f"{exc}") from exc
    return EmbOptimType, SparseType, EmbeddingLocation, PoolingMode, ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen


def environment() -> tuple[str, dict]:
    """The device timings are taken on, and the versions they depend on (both part of the cache key)."""
    import fbgemm_gpu
    import torch

    versions = {"torch": torch.__version__, "fbgemm_gpu": fbgemm_gpu.__version__}
    if not torch.cuda.is_available():
        return f"cpu:{cpu_model()}", {**versions, "protocol": CPU_PROTOCOL_VERSION}
    return f"cuda:{torch.cuda.get_device_name(0)}", {**versions, "protocol": CUDA_PROTOCOL_VERSION,
                                                      "cuda": torch.version.cuda, "driver": gpu_driver()}


@lru_cache(maxsize=1)
def gpu_driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name (Linux reports it in /proc/cpuinfo; elsewhere the machine type)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def synthesize_indices(table: Table, batch: int, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(indices, lengths) for one table over `batch` samples: exactly round(batch × pooling) lookups, over
    distinct indices whose access counts are drawn from the ranges of the table's reuse bins."""
    lookups = int(round(batch * table.pooling_factor))
    lengths = np.full(batch, lookups // batch, dtype=np.int64)
    lengths[rng.permutation(batch)[: lookups % batch]] += 1
    if lookups == 0:
        return np.zeros(0, dtype=np.int64), lengths
    bins = np.asarray(table.reuse_bins, dtype=float)
    low, high = bin_count_ranges(batch / REFERENCE_BATCH)
    mean_count = float(np.dot(bins, (low + high) / 2))
    distinct = int(np.clip(round(lookups / mean_count), 1, min(rows, lookups)))
    bin_of_slot = rng.choice(bins.size, size=distinct, p=bins / bins.sum())
    counts = np.maximum(1, np.round(rng.uniform(low[bin_of_slot], high[bin_of_slot]))).astype(np.int64)
    _match_total(counts, lookups)
    slots = np.repeat(np.arange(distinct), counts)
    row_of_slot = rng.choice(rows, size=distinct, replace=False)
    return row_of_slot[rng.permutation(slots)].astype(np.int64), lengths


def _match_total(counts: np.ndarray, total: int) -> None:
    """Makes counts sum to `total` by changing the hottest slots, whose bins are the widest, in place."""
    diff = total - int(counts.sum())
    order = np.argsort(-counts, kind="stable")
    if diff > 0:
        share, rest = divmod(diff, max(1, min(order.size, 16)))
        top = order[: min(order.size, 16)]
        counts[top] += share
        counts[top[:rest]] += 1
    else:
        for slot in order:
            if diff == 0:
                break
            take = min(counts[slot] - 1, -diff)
            counts[slot] -= take
            diff += take


def allocated_rows(tables: Sequence[Table], protocol: Protocol, cuda: bool) -> tuple[int, ...]:
    """Rows each table is given: all of them on a GPU; on a CPU at most `max_rows` (a larger table only
    adds cache misses, which the flush already causes)."""
    cap = None if cuda else protocol.max_rows
    return tuple(t.rows if cap is None else min(t.rows, cap) for t in tables)


def synthesize_inputs(tables: Sequence[Table], batch: int, protocol: Protocol, cuda: bool) -> Inputs:
    """The batch `measure` times, from the protocol's seed alone (numpy only: worker processes can build
    it while the device times another set)."""
    rng = np.random.default_rng(protocol.seed)
    rows = allocated_rows(tables, protocol, cuda)
    per_table = [synthesize_indices(t, batch, r, rng) for t, r in zip(tables, rows)]
    lengths = np.concatenate([ln for _, ln in per_table])
    return Inputs(rows, np.concatenate([ix for ix, _ in per_table]),
                  np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def where_timed(placements: Sequence[Placement] | None, count: int, cuda: bool) -> list[Placement]:
    """Where each of `count` tables is timed: in its placement on a GPU; on a CPU every table on the host,
    wherever its kernel would put it (so placements do not tell CPU timings apart)."""
    if placements is not None and len(placements) != count:
        raise ValueError(f"{len(placements)} placements for {count} tables")
    return list(placements) if cuda and placements is not None else [HBM] * count


def group_lookups(inputs: Inputs, batch: int, members: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lookups of the tables `members` (in that order) as one TBE takes them: indices, offsets, and the
    rows of the table each lookup reads."""
    bounds = inputs.offsets[np.arange(len(inputs.rows) + 1) * batch]
    lengths = np.diff(inputs.offsets)
    indices = np.concatenate([inputs.indices[bounds[i]:bounds[i + 1]] for i in members])
    member_lengths = np.concatenate([lengths[i * batch:(i + 1) * batch] for i in members])
    offsets = np.concatenate([[0], np.cumsum(member_lengths)]).astype(np.int64)
    rows = np.repeat([inputs.rows[i] for i in members], [bounds[i + 1] - bounds[i] for i in members])
    return indices, offsets, rows


def measure(tables: Sequence[Table], batch: int, protocol: Protocol = Protocol(),
            placements: Sequence[Placement] | None = None, inputs: Inputs | None = None) -> Measurement:
    """Times forward and backward (with the fused SGD update) of `tables`: one TBE per placement, as
    TorchRec groups tables by kernel and load factor (on a CPU one TBE on the host)."""
    import torch

    EmbOptimType, SparseType, EmbeddingLocation, PoolingMode, ComputeDevice, TBE = _fbgemm()
    if any(not t.pooled for t in tables):
        raise MeasurementUnavailable("the measured oracle times pooled tables; use the analytic oracle for "
                                     "sequence tables")
    cuda = torch.cuda.is_available()
    placements = where_timed(placements, len(tables), cuda)
    device_name, versions = environment()
    if inputs is None:
        inputs = synthesize_inputs(tables, batch, protocol, cuda)
    location = {FUSED: EmbeddingLocation.DEVICE, FUSED_UVM: EmbeddingLocation.MANAGED,
                FUSED_UVM_CACHING: EmbeddingLocation.MANAGED_CACHING}
    previous_threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(protocol.threads)
    try:
        torch.manual_seed(protocol.seed)
        target = torch.device("cuda") if cuda else torch.device("cpu")
        groups: dict[Placement, list[int]] = {}
        for i, placement in enumerate(placements):
            groups.setdefault(placement, []).append(i)
        # A cache would otherwise hold exactly the rows a repeated batch reads from the second run on: each
        # run reads the same pattern moved to other rows (seeded), so only reuse within a batch hits.
        moves = any(p.kernel == FUSED_UVM_CACHING for p in groups)
        shifts = np.random.default_rng(protocol.seed + 1).integers(0, 1 << 40, protocol.warmups + protocol.runs)
        ops, group_inputs = [], []
        for placement, members in groups.items():
            where = location.get(placement.kernel, EmbeddingLocation.DEVICE) if cuda else EmbeddingLocation.HOST
            specs = [(inputs.rows[i], tables[i].dim, where, ComputeDevice.CUDA if cuda else ComputeDevice.CPU)
                     for i in members]
            extra = {"cache_load_factor": placement.load_factor} if placement.kernel == FUSED_UVM_CACHING else {}
            ops.append(TBE(embedding_specs=specs, optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.01,
                           pooling_mode=PoolingMode.SUM,
                           weights_precision=SparseType.FP16 if cuda else SparseType.FP32, **extra))
            indices, offsets, rows = group_lookups(inputs, batch, members)
            group_inputs.append((torch.from_numpy(indices).to(target), torch.from_numpy(offsets).to(target),
                                 torch.from_numpy(rows).to(target) if moves else None,
                                 sum(tables[i].dim for i in members)))
        flush_buffer = torch.zeros((CUDA_FLUSH_BYTES if cuda else CPU_FLUSH_BYTES) // 4, device=target)
        grads = [torch.ones((batch, width), device=target) for *_, width in group_inputs]
        forward_runs, backward_runs = [], []
        hold_s, exposed = (FIRST_HOLD_S if cuda else 0.0), 0
        for run in range(protocol.warmups + protocol.runs):
            batch_inputs = [((ix + int(shifts[run])) % rows if moves else ix, off)
                            for ix, off, rows, _ in group_inputs]
            flush_buffer.add_(1.0)  # writes every line: evicts the tables' rows from the caches
            forward_s, backward_s, launch_s = _timed_step(ops, batch_inputs, grads, cuda, hold_s)
            if run >= protocol.warmups:
                forward_runs.append(forward_s)
                backward_runs.append(backward_s)
                exposed += cuda and launch_s > hold_s
            if cuda:
                hold_s = min(MAX_HOLD_S, max(hold_s, HOLD_MARGIN * launch_s))
    finally:
        torch.set_num_threads(previous_threads)
    return Measurement(forward_s=trimmed_mean(forward_runs, protocol.trim),
                       backward_s=trimmed_mean(backward_runs, protocol.trim),
                       forward_runs=tuple(forward_runs), backward_runs=tuple(backward_runs),
                       device=device_name, versions=versions, exposed=int(exposed))


def _timed_step(ops, batch_inputs, grads, cuda: bool, hold_s: float = 0.0) -> tuple[float, float, float]:
    """One forward and one backward of every op: seconds each, and the host's seconds to launch them. On a
    GPU by CUDA events, queued behind a spin of `hold_s` so that the host has launched everything before the
    GPU reaches the first mark (no launch gaps in between: a host sync inside an op would show as a launch
    longer than the hold); on a CPU by the host clock."""
    import torch

    if cuda:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        torch.cuda.synchronize()
        if hold_s > 0:
            torch.cuda._sleep(int(hold_s * _spin_cycles_per_second()))
        launch = time.perf_counter()
        marks[0].record()
        outs = [op(ix, off) for op, (ix, off) in zip(ops, batch_inputs)]
        marks[1].record()
        torch.autograd.backward(outs, grads)
        marks[2].record()
        launch = time.perf_counter() - launch
        torch.cuda.synchronize()
        return marks[0].elapsed_time(marks[1]) / 1e3, marks[1].elapsed_time(marks[2]) / 1e3, launch
    start = time.perf_counter()
    outs = [op(ix, off) for op, (ix, off) in zip(ops, batch_inputs)]
    middle = time.perf_counter()
    torch.autograd.backward(outs, grads)
    end = time.perf_counter()
    return middle - start, end - middle, end - start


@lru_cache(maxsize=1)
def _spin_cycles_per_second() -> float:
    """The rate of `torch.cuda._sleep`'s cycles, timed once per process by CUDA events."""
    import torch

    cycles = 1 << 24
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # the first call may load the kernel
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


@dataclass(frozen=True)
class Job:
    """One table set to time, in its places, with a tag the caller reads back."""
    tag: object
    tables: tuple[Table, ...]
    batch: int
    protocol: Protocol
    placements: tuple[Placement, ...] | None = None


def measure_many(jobs: Iterable[Job], workers: int = 0, lookahead: int = 32,
                 deadline: float | None = None) -> Iterator[tuple[Job, Measurement]]:
    """Times the jobs in order, one at a time on this process's device, while `workers` processes build
    the next jobs' inputs (the device never waits on numpy). Measurements are identical to `measure`'s:
    the inputs come from the same seed. No job is timed after `deadline` (time.monotonic())."""
    import torch

    def expired() -> bool:
        return deadline is not None and time.monotonic() > deadline

    cuda = torch.cuda.is_available()
    if workers <= 0:
        for job in jobs:
            if expired():
                return
            yield job, measure(job.tables, job.batch, job.protocol, job.placements)
        return
    if expired():
        return
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    def submit(job: Job):
        return pool.submit(synthesize_inputs, job.tables, job.batch, job.protocol, cuda)

    # spawn, not fork: a forked child of a process that has touched CUDA cannot use it, nor should it try.
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        pending: deque = deque()
        queued = iter(jobs)
        for job in queued:
            pending.append((job, submit(job)))
            if len(pending) >= lookahead:
                break
        while pending and not expired():
            job, future = pending.popleft()
            inputs = future.result()
            following = next(queued, None)
            if following is not None:
                pending.append((following, submit(following)))
            yield job, measure(job.tables, job.batch, job.protocol, job.placements, inputs)
    finally:  # a caller that stops early does not wait for inputs it will not time
        pool.shutdown(wait=False, cancel_futures=True)


def trimmed_mean(values: Sequence[float], trim: int) -> float:
    ordered = sorted(values)
    kept = ordered[trim:len(ordered) - trim] if len(ordered) > 2 * trim else ordered
    return float(np.mean(kept))


def default_cache_dir() -> Path:
    return Path(os.environ.get("SHARDBENCH_CACHE", Path.home() / ".cache" / "shardbench" / "measurements"))


def cache_key(tables: Sequence[Table], batch: int, protocol: Protocol, device: str, versions: dict,
              placements: Sequence[Placement] | None = None) -> str:
    """Identical table sets (order does not matter) in the same places, batch, protocol, device and versions
    share a key (a set all in HBM keys as it did before placements)."""
    placements = list(placements) if placements is not None else [HBM] * len(tables)
    described = sorted(json.dumps([t.rows, t.dim, t.dtype_bytes, t.pooling_factor, list(t.reuse_bins), t.pooled]
                                  + ([] if p == HBM else [p.kernel, p.load_factor]))
                       for t, p in zip(tables, placements))
    payload = json.dumps({"tables": described, "batch": batch, "protocol": asdict(protocol), "device": device,
                          "versions": versions}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


class MeasurementCache:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder is not None else default_cache_dir()

    def get_or_measure(self, tables: Sequence[Table], batch: int, protocol: Protocol,
                       placements: Sequence[Placement] | None = None, inputs: Inputs | None = None) -> Measurement:
        device, versions = environment()
        placements = where_timed(placements, len(tables), device.startswith("cuda:"))
        path = self.folder / f"{cache_key(tables, batch, protocol, device, versions, placements)}.json"
        if path.exists():
            return Measurement(**{k: tuple(v) if k.endswith("_runs") else v for k, v in json.loads(path.read_text()).items()})
        result = measure(tables, batch, protocol, placements=placements, inputs=inputs)
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(result)))
        temporary.replace(path)
        return result


def piece_placements(pieces: Pieces) -> list[Placement]:
    """Each piece's placement: its kernel, and its cache's load factor when it has one."""
    return [Placement(kernel, load_factor or 0.0) for kernel, load_factor in pieces.kernel_names()]


class MeasuredOracle(Oracle):
    """A piece is timed as the table it is to its device (its rows, its columns, its share of the
    lookups); communication is the analytic model's for the piece's sharding type."""

    name = "measured"
    description = "FBGEMM TBE forward+backward timed per device (CUDA or CPU) + analytic all-to-all; cached on disk"
    unit = "s"
    has_breakdown = True
    costly = True

    def __init__(self, protocol: Protocol = Protocol(), cache: MeasurementCache | None = None):
        self.protocol = protocol
        self.cache = cache or MeasurementCache()
        self.analytic = AnalyticOracle()

    def bind(self, instance: Instance, pieces: Pieces) -> Priced:
        return MeasuredPriced(self, instance, pieces)

    def price_device(self, instance: Instance, pieces: Pieces, members: Sequence[int]) -> DeviceCost:
        return self.bind(instance, pieces).device_cost(members)


class MeasuredPriced(Priced):
    def __init__(self, oracle: MeasuredOracle, instance: Instance, pieces: Pieces):
        super().__init__(instance, pieces)
        self.oracle = oracle
        self.tables = pieces.as_tables(instance)
        self.placements = piece_placements(pieces)
        self.comm = oracle.analytic.piece_breakdown(instance, pieces)[:, 2:]

    def device_cost(self, members: Sequence[int]) -> DeviceCost:
        members = sorted(int(m) for m in members)
        if not members:
            return DeviceCost.from_parts(0.0, 0.0, 0.0, 0.0)
        batch = self.oracle.protocol.batch or self.instance.workload.batch_size
        result = self.oracle.cache.get_or_measure([self.tables[m] for m in members], batch, self.oracle.protocol,
                                                  [self.placements[m] for m in members])
        comm = self.comm[members].sum(axis=0)
        return DeviceCost.from_parts(result.forward_s, result.backward_s, float(comm[0]), float(comm[1]))
