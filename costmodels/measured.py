"""The measured oracle: a device's forward and backward time, timed on a real FBGEMM table-batched
embedding operator built from its tables (fbgemm-gpu on CUDA, fp16; fbgemm-gpu-cpu on CPU, fp32), with
inputs synthesised to match each table's pooling factor and reuse bins. Timing follows AutoShard Alg. 2/3:
5 warm-ups, 10 timed runs, each after a real cache flush, mean of the runs left after dropping the 2
highest and 2 lowest. Communication is the analytic term (one process sees no network); the cached record
says so. Measurements are cached on disk by table set, device and library versions."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from instances import Instance, Table
from instances.access import REFERENCE_BATCH, bin_count_ranges
from instances.pieces import Pieces

from .analytic import AnalyticOracle
from .base import DeviceCost, Oracle, Priced

CPU_FLUSH_BYTES = 64 << 20   # larger than this machine's 32 MiB L3; see flush()
CUDA_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2
MEASURE_VERSION = 2          # bump when the protocol changes, so old cache entries are not reused


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
class Measurement:
    forward_s: float
    backward_s: float
    forward_runs: tuple[float, ...]
    backward_runs: tuple[float, ...]
    device: str
    versions: dict
    communication: str = "analytic (single process: no all-to-all to time)"

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def spread(self) -> float:
        """Coefficient of variation of the timed forward+backward runs."""
        totals = np.array(self.forward_runs) + np.array(self.backward_runs)
        return float(totals.std() / totals.mean()) if totals.mean() > 0 else 0.0


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
    import fbgemm_gpu
    import torch

    if torch.cuda.is_available():
        device = f"cuda:{torch.cuda.get_device_name(0)}"
    else:
        device = f"cpu:{cpu_model()}"
    return device, {"torch": torch.__version__, "fbgemm_gpu": fbgemm_gpu.__version__, "protocol": MEASURE_VERSION}


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


def measure(tables: Sequence[Table], batch: int, protocol: Protocol = Protocol()) -> Measurement:
    """Times forward and backward (with the fused SGD update) of one TBE holding `tables`."""
    import torch

    EmbOptimType, SparseType, EmbeddingLocation, PoolingMode, ComputeDevice, TBE = _fbgemm()
    if any(not t.pooled for t in tables):
        raise MeasurementUnavailable("the measured oracle times pooled tables; use the analytic oracle for "
                                     "sequence tables")
    cuda = torch.cuda.is_available()
    device_name, versions = environment()
    rng = np.random.default_rng(protocol.seed)
    rows = [t.rows if cuda or protocol.max_rows is None else min(t.rows, protocol.max_rows) for t in tables]
    location, compute = ((EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if cuda
                         else (EmbeddingLocation.HOST, ComputeDevice.CPU))
    previous_threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(protocol.threads)
    try:
        torch.manual_seed(protocol.seed)
        op = TBE(embedding_specs=[(r, t.dim, location, compute) for r, t in zip(rows, tables)],
                 optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.01, pooling_mode=PoolingMode.SUM,
                 weights_precision=SparseType.FP16 if cuda else SparseType.FP32)
        per_table = [synthesize_indices(t, batch, r, rng) for t, r in zip(tables, rows)]
        # TBE takes lookups table-major: all of table 0's samples, then table 1's, ...
        indices = torch.from_numpy(np.concatenate([ix for ix, _ in per_table]))
        lengths = np.concatenate([ln for _, ln in per_table])
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        target = torch.device("cuda") if cuda else torch.device("cpu")
        indices, offsets = indices.to(target), offsets.to(target)
        flush_buffer = torch.zeros((CUDA_FLUSH_BYTES if cuda else CPU_FLUSH_BYTES) // 4, device=target)
        grad = torch.ones((batch, sum(t.dim for t in tables)), device=target)
        forward_runs, backward_runs = [], []
        for run in range(protocol.warmups + protocol.runs):
            flush_buffer.add_(1.0)  # writes every line: evicts the tables' rows from the caches
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = op(indices, offsets)
            if cuda:
                torch.cuda.synchronize()
            middle = time.perf_counter()
            out.backward(grad)
            if cuda:
                torch.cuda.synchronize()
            end = time.perf_counter()
            if run >= protocol.warmups:
                forward_runs.append(middle - start)
                backward_runs.append(end - middle)
    finally:
        torch.set_num_threads(previous_threads)
    return Measurement(forward_s=trimmed_mean(forward_runs, protocol.trim),
                       backward_s=trimmed_mean(backward_runs, protocol.trim),
                       forward_runs=tuple(forward_runs), backward_runs=tuple(backward_runs),
                       device=device_name, versions=versions)


def trimmed_mean(values: Sequence[float], trim: int) -> float:
    ordered = sorted(values)
    kept = ordered[trim:len(ordered) - trim] if len(ordered) > 2 * trim else ordered
    return float(np.mean(kept))


def default_cache_dir() -> Path:
    return Path(os.environ.get("SHARDBENCH_CACHE", Path.home() / ".cache" / "shardbench" / "measurements"))


def cache_key(tables: Sequence[Table], batch: int, protocol: Protocol, device: str, versions: dict) -> str:
    """Identical table sets (order does not matter), batch, protocol, device and versions share a key."""
    described = sorted(json.dumps([t.rows, t.dim, t.dtype_bytes, t.pooling_factor, list(t.reuse_bins), t.pooled])
                       for t in tables)
    payload = json.dumps({"tables": described, "batch": batch, "protocol": asdict(protocol), "device": device,
                          "versions": versions}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


class MeasurementCache:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder is not None else default_cache_dir()

    def get_or_measure(self, tables: Sequence[Table], batch: int, protocol: Protocol) -> Measurement:
        device, versions = environment()
        path = self.folder / f"{cache_key(tables, batch, protocol, device, versions)}.json"
        if path.exists():
            return Measurement(**{k: tuple(v) if k.endswith("_runs") else v for k, v in json.loads(path.read_text()).items()})
        result = measure(tables, batch, protocol)
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(result)))
        temporary.replace(path)
        return result


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
        self.comm = oracle.analytic.piece_breakdown(instance, pieces)[:, 2:]

    def device_cost(self, members: Sequence[int]) -> DeviceCost:
        members = sorted(int(m) for m in members)
        if not members:
            return DeviceCost.from_parts(0.0, 0.0, 0.0, 0.0)
        batch = self.oracle.protocol.batch or self.instance.workload.batch_size
        result = self.oracle.cache.get_or_measure([self.tables[m] for m in members], batch, self.oracle.protocol)
        comm = self.comm[members].sum(axis=0)
        return DeviceCost.from_parts(result.forward_s, result.backward_s, float(comm[0]), float(comm[1]))
