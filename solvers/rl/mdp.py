"""The sharding MDP: one task's tables in arrival order, the cost model's view of every device as they
arrive, and the final reward from an oracle: AutoShard's degree of balance (min/max device cost), or
DreamShard's negative cost relative to a perfect split; a plan that overflows memory gets AutoShard's
penalty −max_k (used_k − capacity_k) / capacity_k."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from costmodels.neural import NeuralOracle, TrainedModel
from instances import Instance
from instances.memory import HBM

from ..base import MemoryTracker


@dataclass
class Step:
    """What the policy saw and did at one step."""

    table: torch.Tensor        # [32] representation of the table being placed
    progress: float            # share of tables already placed
    devices: torch.Tensor      # [K, 32] summed representations per device
    costs: torch.Tensor        # [K, 3] log predicted forward/backward/comm per device with the table added
    legal: torch.Tensor        # [K] bool
    action: int = -1
    log_prob: float = 0.0


@dataclass
class Episode:
    steps: list[Step] = field(default_factory=list)
    assignment: tuple[int, ...] = ()
    reward: float = 0.0
    overflow: float = 0.0


class ShardingMDP:
    """One task: the order of its tables and the cost model's view of every device as tables arrive."""

    def __init__(self, instance: Instance, model: TrainedModel):
        self.instance = instance
        self.model = model
        self.embeddings = model.table_embeddings(instance.tables)
        self.simulator = NeuralOracle(model, "simulator")
        self.order = np.lexsort((np.arange(instance.num_tables), -self.simulator.single_table_costs(instance)))

    def device_totals(self, assignment: Sequence[int]) -> np.ndarray:
        """The cost network's total per device for a table-wise plan (an empty device costs nothing)."""
        k = self.instance.num_devices
        devices = torch.as_tensor(np.asarray(assignment, dtype=np.int64))
        sums = torch.zeros((k, self.embeddings.shape[1])).index_add_(0, devices, self.embeddings)
        used = np.bincount(np.asarray(assignment), minlength=k) > 0
        return np.where(used, self.simulator.totals_from_sums(sums), 0.0)

    def run(self, choose: Callable[[Step], int]) -> Episode:
        k = self.instance.num_devices
        sums = torch.zeros((k, self.embeddings.shape[1]))
        memory = MemoryTracker(self.instance)
        assignment = np.full(self.instance.num_tables, -1, dtype=np.int64)
        episode = Episode()
        for position, table in enumerate(self.order):
            table = int(table)
            legal = memory.fits(table)
            if not legal.any():
                free = memory.free[:, HBM]  # learned policies plan whole tables in HBM
                legal = free == free.max()  # AutoShard lets it overflow, then penalises
            with_table = sums + self.embeddings[table]
            with torch.no_grad():
                predicted = self.model.net.device_outputs(with_table)
            costs = torch.zeros((k, 3))
            costs[:, :predicted.shape[1]] = predicted
            step = Step(self.embeddings[table], position / self.instance.num_tables, sums.clone(), costs,
                        torch.as_tensor(legal))
            device = choose(step)
            step.action = device
            episode.steps.append(step)
            sums[device] += self.embeddings[table]
            memory.place(table, device)
            assignment[table] = device
        episode.assignment = tuple(int(d) for d in assignment)
        capacity = self.instance.topology.memory_bytes
        # Exact bytes decide whether it overflows; the penalty is the worst device's excess share.
        episode.overflow = float(max(0, -int(memory.free[:, HBM].min())) / capacity)
        return episode


def reward(mdp: ShardingMDP, episode: Episode, algorithm: str) -> float:
    """The final reward on the estimated MDP (the cost network judges the plan)."""
    if episode.overflow > 0:
        return -episode.overflow
    costs = mdp.device_totals(episode.assignment)
    if algorithm == "autoshard":
        return float(costs.min() / costs.max()) if costs.max() > 0 else 1.0
    perfect = costs.sum() / costs.size
    return float(-costs.max() / perfect) if perfect > 0 else 0.0
