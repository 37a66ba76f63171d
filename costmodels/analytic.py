"""An analytic bandwidth model of a device's embedding time: forward lookups and backward updates from
bytes moved over memory bandwidth, and the forward/backward all-to-all of pooled (or sequence) outputs over
the topology's intra- and inter-node links. Additive per table, so exact solvers can use it.

Defaults follow TorchRec's published planner constants (torchrec/distributed/planner/constants.py):
HBM 897 GB/s with a 1.5× factor for the fused TBE kernel, DDR 51 GB/s for CPU devices, backward = 2 ×
forward compute; the link bandwidths come from the instance's topology (TorchRec's own defaults there are
600 GB/s intra-node and 12.5 GB/s across nodes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from instances import Instance
from instances.model import DTYPE_BYTES

from .base import AdditiveOracle, DeviceCost

GB = 1024**3


@dataclass(frozen=True)
class AnalyticConstants:
    hbm_bandwidth: float = 897 * GB
    ddr_bandwidth: float = 51 * GB
    fused_kernel_factor: float = 1.5
    backward_multiplier: float = 2.0


class AnalyticOracle(AdditiveOracle):
    name = "analytic"
    description = "bandwidth model: lookups/updates over memory bandwidth + all-to-all over the topology (TorchRec constants)"
    unit = "s"
    has_breakdown = True

    def __init__(self, constants: AnalyticConstants = AnalyticConstants()):
        self.constants = constants

    def table_breakdown(self, instance: Instance) -> np.ndarray:
        """Per table: forward compute, backward compute, forward comm, backward comm (seconds)."""
        c = self.constants
        topo, work = instance.topology, instance.workload
        k = instance.num_devices
        global_batch = work.batch_size * k
        out_bytes = DTYPE_BYTES[work.dtype]
        memory_bw = (c.hbm_bandwidth * c.fused_kernel_factor if topo.device_kind != "cpu" else c.ddr_bandwidth)
        pooling = np.array([t.pooling_factor for t in instance.tables])
        dim = np.array([t.dim for t in instance.tables], dtype=float)
        elem = np.array([t.dtype_bytes for t in instance.tables], dtype=float)
        outputs_per_sample = np.where([t.pooled for t in instance.tables], 1.0, pooling)
        read = global_batch * pooling * dim * elem
        written = global_batch * outputs_per_sample * dim * out_bytes
        forward = (read + written) / memory_bw
        backward = c.backward_multiplier * forward
        # Each device ships the outputs of its tables for every other device's samples; of those peers,
        # (W-1) share its node. Both links run at once, so the slower share sets the time, and since both
        # shares are fixed fractions of the same bytes the result stays additive over tables.
        sent = work.batch_size * outputs_per_sample * dim * out_bytes
        intra_peers = topo.devices_per_node - 1
        inter_peers = k - topo.devices_per_node
        comm = np.maximum(sent * intra_peers / topo.intra_node_a2a_bw, sent * inter_peers / topo.inter_node_a2a_bw)
        return np.stack([forward, backward, comm, comm], axis=1)

    def table_costs(self, instance: Instance) -> np.ndarray:
        return self.table_breakdown(instance).sum(axis=1)

    def device_cost(self, instance: Instance, tables: Sequence[int]) -> DeviceCost:
        parts = self.table_breakdown(instance)[list(tables)].sum(axis=0)
        return DeviceCost.from_parts(*(float(x) for x in parts))

    def device_costs(self, instance: Instance, assignment: Sequence[int]) -> tuple[DeviceCost, ...]:
        breakdown = self.table_breakdown(instance)
        assignment = np.asarray(assignment, dtype=np.int64)
        per_device = [np.bincount(assignment, weights=breakdown[:, j], minlength=instance.num_devices) for j in range(4)]
        return tuple(DeviceCost.from_parts(*(float(per_device[j][d]) for j in range(4)))
                     for d in range(instance.num_devices))
