"""An analytic bandwidth model of a device's embedding time, per piece of a table, additive so that exact
solvers can use it: forward lookups and backward updates from bytes moved over memory bandwidth, and the
collectives each sharding type needs over the topology's links (nodes × devices per node; intra-node
links inside a node, inter-node links between nodes):
- every piece but a data-parallel replica first receives the ids of the lookups it serves from every
  device (all-to-all of 8-byte ids);
- table- and column-wise: the pieces' outputs go to every sample's device over all-to-all, and come back
  as gradients the same way;
- row-wise: each row shard computes partial pooled outputs for every sample of the global batch and
  reduce-scatters them over all devices (gradients: all-gather);
- table-row-wise: the partial outputs are reduce-scattered inside the node first, then each device sends
  its share of the samples to their devices; a grid's column blocks each do so on their own node;
- table-column-wise: as column-wise (its blocks on one node change none of the traffic);
- data-parallel: a replica computes only its own device's samples and all-reduces the table's gradient
  (within the node, then across nodes).
A table may serve several inputs (features): each pooled input gives every sample its own output vector (an
EmbeddingBagCollection's output holds one per sample and feature, empty bags included).
Weighted inputs send a 4-byte weight beside each 8-byte id and, backward, read each looked-up row again to
form the weights' gradients.

Memory tiers: a piece's rows are read where its kernel keeps them — `fused` in HBM; `fused_uvm` in host
memory, every lookup's row over the HBM↔host link (its gradient updates too); `fused_uvm_caching` from an
HBM cache of a share of its rows, which serves the lookups its access curve gives that share
(instances.access: the hottest rows), while each miss is fetched over the link into the cache and an
evicted, updated row is written back (two row transfers per miss); its updates land in the cache.

Defaults follow TorchRec's published planner constants (torchrec/distributed/planner/constants.py):
HBM 897 GB/s with a 1.5× factor for the fused TBE kernel, DDR 51 GB/s for CPU devices, backward = 2 ×
forward compute; link bandwidths, the host link's included, come from the instance's topology."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from instances import Instance
from instances.kernels import FUSED_UVM, FUSED_UVM_CACHING
from instances.model import DTYPE_BYTES
from instances.pieces import Pieces

from .base import AdditiveOracle

GB = 1024**3
ID_BYTES = 8  # lookups travel as int64 ids, as TorchRec's estimator counts them
WEIGHT_BYTES = 4  # a weighted input's fp32 weight per id


@dataclass(frozen=True)
class AnalyticConstants:
    hbm_bandwidth: float = 897 * GB
    ddr_bandwidth: float = 51 * GB
    fused_kernel_factor: float = 1.5
    backward_multiplier: float = 2.0


class AnalyticOracle(AdditiveOracle):
    name = "analytic"
    description = ("bandwidth model per piece: lookups/updates over memory bandwidth + each sharding type's "
                   "collectives over intra-/inter-node links (TorchRec constants)")
    unit = "s"
    has_breakdown = True
    prices_tiers = True

    def __init__(self, constants: AnalyticConstants = AnalyticConstants()):
        self.constants = constants

    def table_breakdown(self, instance: Instance) -> np.ndarray:
        """Per whole table: forward compute, backward compute, forward comm, backward comm (seconds)."""
        return self.piece_breakdown(instance, Pieces.table_wise(instance))

    def piece_breakdown(self, instance: Instance, pieces: Pieces) -> np.ndarray:
        """Per piece: forward compute, backward compute, forward comm, backward comm (seconds)."""
        c = self.constants
        topo, work = instance.topology, instance.workload
        k, per_node = instance.num_devices, topo.devices_per_node
        batch, global_batch = work.batch_size, work.batch_size * k
        out_bytes = DTYPE_BYTES[work.dtype]
        memory_bw = c.hbm_bandwidth * c.fused_kernel_factor if topo.device_kind != "cpu" else c.ddr_bandwidth
        tables = instance.tables
        pooling = np.array([t.pooling_factor for t in tables])[pieces.table]
        elem = np.array([t.dtype_bytes for t in tables], dtype=float)[pieces.table]
        pooled = np.array([t.pooled for t in tables])[pieces.table]
        outputs = np.array([len(t.inputs) for t in tables], dtype=float)[pieces.table]  # pooled vectors per sample
        weighted = np.array([t.weighted for t in tables])[pieces.table]
        width = pieces.width.astype(float)
        share = pieces.lookup_share(instance)
        kind = {name: pieces.is_kind(name) for name in ("row_wise", "table_row_wise", "data_parallel", "grid_shard")}
        node_rows = kind["table_row_wise"] | kind["grid_shard"]
        split_rows = kind["row_wise"] | node_rows
        replica = kind["data_parallel"]

        lookups = global_batch * pooling * share  # rows read by this piece in a step
        # Outputs written: pooled pieces one vector per sample they serve (row shards: partial sums for
        # every sample); sequence pieces one per lookup.
        samples = np.where(replica, batch, global_batch)
        written = np.where(pooled, samples * outputs, lookups) * width * out_bytes
        read = lookups * width * elem
        forward = (read + written) / memory_bw
        backward = c.backward_multiplier * forward + np.where(weighted, read / memory_bw, 0.0)
        uvm, cached = pieces.is_kernel(FUSED_UVM), pieces.is_kernel(FUSED_UVM_CACHING)
        if uvm.any() or cached.any():
            misses = read * (1.0 - pieces.hit_rates(instance))
            link = topo.host_link_bw
            forward = np.where(uvm, written / memory_bw + read / link,
                               np.where(cached, forward + 2 * misses / link, forward))
            backward = np.where(uvm, c.backward_multiplier * (written / memory_bw + read / link)
                                + np.where(weighted, read / link, 0.0), backward)

        def all_to_all(per_peer: np.ndarray) -> np.ndarray:
            """Each device sends `per_peer` bytes to every other device; of those peers, W-1 share its node.
            Both links run at once, so the slower share sets the time."""
            return np.maximum(per_peer * (per_node - 1) / topo.intra_node_a2a_bw,
                              per_peer * (k - per_node) / topo.inter_node_a2a_bw)

        # What one device's samples need from this piece: their pooled outputs (a row shard's partial
        # sums), or their lookups' outputs for sequence tables.
        per_peer = np.where(pooled, batch * outputs, batch * pooling * np.where(split_rows, share, 1.0)) * width * out_bytes
        comm = all_to_all(per_peer)
        # Table-row-wise: the partial sums meet inside the node first (reduce-scatter over the node's W
        # devices), then each device forwards its 1/W of the samples.
        node_reduce = np.where(pooled, global_batch * outputs * width * out_bytes * (per_node - 1) / per_node, 0.0)
        twrw = node_reduce / topo.intra_node_a2a_bw + all_to_all(np.where(pooled, per_peer / per_node, per_peer))
        comm = np.where(node_rows, twrw, comm)
        # Data-parallel: no all-to-all; the gradient of the whole table is all-reduced (ring inside the
        # node, then across nodes on the node's 1/W slice).
        gradient = (pieces.rows * width * elem).astype(float)
        allreduce = 2 * gradient * (per_node - 1) / per_node / topo.intra_node_a2a_bw
        if topo.nodes > 1:
            allreduce = allreduce + 2 * gradient / per_node * (topo.nodes - 1) / topo.nodes / topo.allreduce_cross_node_bw
        # Ids in: every other device sends the ids of its samples' lookups that this piece serves.
        ids = all_to_all(batch * pooling * share * np.where(weighted, ID_BYTES + WEIGHT_BYTES, ID_BYTES))
        forward_comm = np.where(replica, 0.0, comm + ids)
        backward_comm = np.where(replica, allreduce, comm)
        return np.stack([forward, backward, forward_comm, backward_comm], axis=1)
