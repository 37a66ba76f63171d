"""FlexShard's per-GPU cost equations (its Tables 2 and 3) for sequence tables under RW, CW, DP and Flex
sharding, per table and per row; and the breakpoints between strategies, solved in closed form.

Every cost is linear in the access rate L (a row: E = 1, L = p), so a per-row cost is `a + b·p` and two
strategies break even at p = (a_X − a_Y) / (b_Y − b_X). Memory is bytes per GPU, communication is
seconds per GPU per iteration (dynamic all-to-all runs in the forward and again in the backward pass;
static all-reduce only in the backward pass)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from instances import Instance

STRATEGIES = ("RW", "CW", "DP", "Flex")
METRICS = ("memory", "communication")


@dataclass(frozen=True)
class FlexParams:
    """N nodes × W GPUs, local batch B, bandwidths in bytes/s, and the DP memory multiplier (6 in the
    paper, from TorchRec: weights, optimizer state and replication overheads; it overestimates)."""

    nodes: int
    gpus_per_node: int
    batch: int
    a2a_global: float
    a2a_intra: float
    ar_global: float
    ar_cross: float
    dp_memory_multiplier: float = 6.0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_instance(cls, instance: Instance, dp_memory_multiplier: float = 6.0) -> "FlexParams":
        topo = instance.topology
        return cls(nodes=topo.nodes, gpus_per_node=topo.devices_per_node, batch=instance.workload.batch_size,
                   a2a_global=topo.inter_node_a2a_bw if topo.nodes > 1 else topo.intra_node_a2a_bw,
                   a2a_intra=topo.intra_node_a2a_bw, ar_global=topo.allreduce_global_bw,
                   ar_cross=topo.allreduce_cross_node_bw, dp_memory_multiplier=dp_memory_multiplier)


@dataclass(frozen=True)
class StrategyCost:
    """One table (or row) under one strategy, per GPU. Arrays broadcast when L is an array."""

    static_memory: np.ndarray | float
    dynamic_memory: np.ndarray | float
    input_distribution: np.ndarray | float  # ids received per GPU
    rows_accessed: np.ndarray | float       # embedding elements looked up per GPU
    dynamic_comm: np.ndarray | float        # seconds, forward and backward each
    static_comm: np.ndarray | float         # seconds, backward only

    @property
    def memory(self):
        return self.static_memory + self.dynamic_memory

    @property
    def communication(self):
        return 2 * self.dynamic_comm + self.static_comm


def strategy_cost(strategy: str, rows, dim: int, dtype_bytes: int, length, params: FlexParams) -> StrategyCost:
    """Tables 2 and 3 of FlexShard, with E = rows and L = length (mean distinct rows per sample)."""
    E, D, dt, L = rows, dim, dtype_bytes, length
    U, W, B, m = params.gpus, params.gpus_per_node, params.batch, params.dp_memory_multiplier
    activations = B * L * D * dt
    zero = 0.0 * L  # keeps every field the shape of L
    if strategy == "RW":
        return StrategyCost(E / U * D * dt + zero, 2 * activations, B * L, B * L * D,
                            activations / params.a2a_global, zero)
    if strategy == "CW":
        return StrategyCost(E * D / U * dt + zero, 2 * activations, U * B * L, B * L * D,
                            activations / params.a2a_global, zero)
    if strategy == "DP":
        return StrategyCost(m * E * D * dt + zero, activations, zero, B * L * D, zero,
                            E * D * dt / params.ar_global + zero)
    if strategy == "Flex":
        return StrategyCost(m * E / W * D * dt + zero, 2 * activations, B * L, B * L * D,
                            activations / params.a2a_intra, E / W * D * dt / params.ar_cross + zero)
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")


def per_row_line(strategy: str, metric: str, dim: int, dtype_bytes: int, params: FlexParams) -> tuple[float, float]:
    """(a, b) such that a row with access probability p costs a + b·p under `strategy`."""
    def value(p: float) -> float:
        return float(getattr(strategy_cost(strategy, 1, dim, dtype_bytes, p, params), metric))
    at_zero = value(0.0)
    return at_zero, value(1.0) - at_zero


def breakpoint(first: str, second: str, metric: str, params: FlexParams, dim: int = 1, dtype_bytes: int = 4
               ) -> float | None:
    """The row probability at which `first` and `second` cost the same `metric`; None when the two
    lines are parallel (one strategy is cheaper for every p). Independent of dim and dtype, which
    scale both lines alike."""
    a1, b1 = per_row_line(first, metric, dim, dtype_bytes, params)
    a2, b2 = per_row_line(second, metric, dim, dtype_bytes, params)
    if b1 == b2:
        return None
    return (a1 - a2) / (b2 - b1)


@dataclass(frozen=True)
class Breakpoints:
    dp_memory: float | None     # DP vs RW memory-neutral: rows above it save memory when replicated
    dp_comm: float | None       # DP vs RW communication-neutral
    flex_comm: float | None     # Flex vs RW communication-neutral
    flex_memory: float | None   # Flex vs RW memory-neutral (None: Flex always needs more memory than RW)


def breakpoints(params: FlexParams) -> Breakpoints:
    return Breakpoints(dp_memory=breakpoint("DP", "RW", "memory", params),
                       dp_comm=breakpoint("DP", "RW", "communication", params),
                       flex_comm=breakpoint("Flex", "RW", "communication", params),
                       flex_memory=breakpoint("Flex", "RW", "memory", params))


def marginal_lines(params: FlexParams, dtype_bytes: int) -> dict[str, tuple[float, float]]:
    """Per unit of dim, the (a, b) of the extra cost of a row under DP or Flex over RW, per metric:
    the quantities whose running sums draw FlexShard's Fig. 5."""
    out = {}
    for strategy in ("DP", "Flex"):
        for metric in METRICS:
            a, b = per_row_line(strategy, metric, 1, dtype_bytes, params)
            a_rw, b_rw = per_row_line("RW", metric, 1, dtype_bytes, params)
            out[f"{strategy}:{metric}"] = (a - a_rw, b - b_rw)
    return out
