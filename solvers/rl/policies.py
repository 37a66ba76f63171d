"""The two policies over the sharding MDP and how they play an episode. AutoShard's: a 2-layer LSTM
(hidden 64) over the steps, a per-device action representation, a policy head 128-128-64-1 over [state,
action, state·action] and a value head. DreamShard's: per device [summed table representations; MLP of
predicted forward, backward and communication cost] → score."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from costmodels.neural import mlp

from .mdp import Episode, ShardingMDP, Step

ALGORITHMS = ("autoshard", "dreamshard")


class AutoShardPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(input_size=33, hidden_size=64, num_layers=2, batch_first=True)
        self.action = mlp([32 + 3, 64, 64])
        self.policy = mlp([3 * 64, 128, 128, 64, 1])
        self.value = mlp([64, 64, 1])

    def forward(self, steps: Sequence[Step]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [T, K] (illegal devices at -inf) and values [T] for a whole episode."""
        inputs = torch.stack([torch.cat([s.table, torch.tensor([s.progress])]) for s in steps]).unsqueeze(0)
        states = self.lstm(inputs)[0].squeeze(0)  # [T, 64]
        actions = self.action(torch.cat([torch.stack([s.devices for s in steps]),
                                         torch.stack([s.costs for s in steps])], dim=-1))  # [T, K, 64]
        expanded = states.unsqueeze(1).expand_as(actions)
        logits = self.policy(torch.cat([expanded, actions, expanded * actions], dim=-1)).squeeze(-1)
        legal = torch.stack([s.legal for s in steps])
        return logits.masked_fill(~legal, float("-inf")), self.value(states).squeeze(-1)

    def step_logits(self, step: Step, memory) -> tuple[torch.Tensor, object]:
        inputs = torch.cat([step.table, torch.tensor([step.progress])]).view(1, 1, -1)
        out, memory = self.lstm(inputs, memory)
        state = out.view(-1)
        actions = self.action(torch.cat([step.devices, step.costs], dim=-1))
        expanded = state.expand_as(actions)
        logits = self.policy(torch.cat([expanded, actions, expanded * actions], dim=-1)).squeeze(-1)
        return logits.masked_fill(~step.legal, float("-inf")), memory


class DreamShardPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.costs = mlp([3, 32, 32])
        self.score = mlp([32 + 32 + 32, 64, 1])

    def logits(self, step: Step) -> torch.Tensor:
        device = step.devices + step.table  # the device as it would be with the table
        table = step.table.expand_as(step.devices)
        scores = self.score(torch.cat([device, table, self.costs(step.costs)], dim=-1)).squeeze(-1)
        return scores.masked_fill(~step.legal, float("-inf"))


def make_policy(algorithm: str) -> nn.Module:
    return AutoShardPolicy() if algorithm == "autoshard" else DreamShardPolicy()


def play(mdp: ShardingMDP, policy: nn.Module, algorithm: str, rng: np.random.Generator | None) -> Episode:
    """One episode: sampled from the policy with `rng`, or greedy (argmax) when rng is None."""
    memory = None

    def choose(step: Step) -> int:
        nonlocal memory
        with torch.no_grad():
            if algorithm == "autoshard":
                logits, memory = policy.step_logits(step, memory)
            else:
                logits = policy.logits(step)
            probs = torch.softmax(logits, dim=-1).numpy().astype(np.float64)
        action = int(np.argmax(probs)) if rng is None else int(rng.choice(probs.size, p=probs / probs.sum()))
        step.log_prob = float(np.log(max(probs[action], 1e-30)))
        return action

    return mdp.run(choose)
