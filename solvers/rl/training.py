"""Training the policies on the estimated MDP (the cost network as simulator): AutoShard actor-critic with
V-trace targets (IMPALA), DreamShard REINFORCE with periodic real-oracle rollouts that fine-tune the cost
network."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import nn

from costmodels import Oracle
from costmodels.neural import TrainedModel
from instances import Instance

from .mdp import Episode, ShardingMDP, reward
from .policies import ALGORITHMS, AutoShardPolicy, DreamShardPolicy, make_policy, play

ENTROPY_COST = 0.001
BASELINE_COST = 0.5
GRADIENT_CLIP = 40.0


def vtrace_targets(behaviour_log_probs: torch.Tensor, target_log_probs: torch.Tensor, values: torch.Tensor,
                   final_reward: float, rho_bar: float = 1.0, c_bar: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """IMPALA's V-trace with discount 1 and a reward only at the end: (value targets v_s, advantages
    ρ_s (r_s + v_{s+1} − V(x_s)) for the policy gradient)."""
    ratios = torch.exp(target_log_probs - behaviour_log_probs)
    rhos, cs = torch.clamp(ratios, max=rho_bar), torch.clamp(ratios, max=c_bar)
    steps = values.shape[0]
    rewards = torch.zeros(steps)
    rewards[-1] = final_reward
    next_values = torch.cat([values[1:], torch.zeros(1)])
    deltas = rhos * (rewards + next_values - values)
    corrections = torch.zeros(steps)
    running = torch.tensor(0.0)
    for t in reversed(range(steps)):
        running = deltas[t] + cs[t] * running
        corrections[t] = running
    targets = values + corrections
    next_targets = torch.cat([targets[1:], torch.zeros(1)])
    return targets, rhos * (rewards + next_targets - values)


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()
    return -(torch.where(p > 0, p * log_p, torch.zeros_like(p))).sum(dim=-1)


def _autoshard_loss(policy: AutoShardPolicy, episode: Episode) -> torch.Tensor:
    logits, values = policy(episode.steps)
    log_probs = torch.log_softmax(logits, dim=-1)
    actions = torch.tensor([s.action for s in episode.steps])
    taken = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)
    behaviour = torch.tensor([s.log_prob for s in episode.steps])
    targets, advantages = vtrace_targets(behaviour, taken.detach(), values.detach(), episode.reward)
    policy_loss = -(taken * advantages).sum()
    baseline_loss = BASELINE_COST * ((targets - values) ** 2).sum()
    return policy_loss + baseline_loss - ENTROPY_COST * _entropy(logits).sum()


def _dreamshard_loss(policy: DreamShardPolicy, episodes: list[Episode]) -> torch.Tensor:
    baseline = float(np.mean([e.reward for e in episodes]))
    total = torch.tensor(0.0)
    for episode in episodes:
        logits = torch.stack([policy.logits(s) for s in episode.steps])
        log_probs = torch.log_softmax(logits, dim=-1)
        taken = log_probs.gather(1, torch.tensor([s.action for s in episode.steps]).unsqueeze(1)).squeeze(1)
        total = total - (episode.reward - baseline) * taken.sum() - ENTROPY_COST * _entropy(logits).sum()
    return total / len(episodes)


@dataclass
class TrainingLog:
    seconds: list[float] = field(default_factory=list)
    episodes: list[int] = field(default_factory=list)
    mean_reward: list[float] = field(default_factory=list)
    real_rollouts: int = 0


def train_policy(algorithm: str, tasks: Sequence[Instance], model: TrainedModel, time_budget: float, seed: int,
                 episodes_per_update: int = 8, max_updates: int | None = None, learning_rate: float = 1e-3,
                 real_oracle: Oracle | None = None, real_every: int = 25, progress=None) -> tuple[nn.Module, TrainingLog]:
    """Trains on the estimated MDP (the cost network judges every episode). DreamShard also runs the greedy
    plan of a random task on `real_oracle` every `real_every` updates and fine-tunes the cost network on
    those device measurements (appendix B.4)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    policy = make_policy(algorithm)
    optimiser = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    mdps = [ShardingMDP(task, model) for task in tasks]
    log = TrainingLog()
    start = time.monotonic()
    update = 0
    while time.monotonic() - start < time_budget and (max_updates is None or update < max_updates):
        batch = []
        for _ in range(episodes_per_update):
            index = int(rng.integers(len(mdps)))
            episode = play(mdps[index], policy, algorithm, rng)
            episode.reward = reward(mdps[index], episode, algorithm)
            batch.append(episode)
        optimiser.zero_grad()
        if algorithm == "autoshard":
            loss = sum(_autoshard_loss(policy, e) for e in batch) / len(batch)
        else:
            loss = _dreamshard_loss(policy, batch)
        loss.backward()
        nn.utils.clip_grad_norm_(policy.parameters(), GRADIENT_CLIP)
        optimiser.step()
        update += 1
        if algorithm == "dreamshard" and real_oracle is not None and update % real_every == 0:
            index = int(rng.integers(len(mdps)))
            _real_rollout(tasks[index], mdps[index], policy, model, real_oracle)
            log.real_rollouts += 1
        log.seconds.append(time.monotonic() - start)
        log.episodes.append(update * episodes_per_update)
        log.mean_reward.append(float(np.mean([e.reward for e in batch])))
        if progress:
            progress(log)
    policy.eval()
    return policy, log


def _real_rollout(task: Instance, mdp: ShardingMDP, policy: nn.Module, model: TrainedModel, real: Oracle) -> None:
    """Measures the greedy plan's devices on the real oracle and takes a few gradient steps of the cost
    network on them (its forward/backward heads for DreamShard's network, total otherwise)."""
    from costmodels.dataset import table_features
    from costmodels.neural import _padded

    episode = play(mdp, policy, "dreamshard", None)
    groups = [[t for t, d in enumerate(episode.assignment) if d == device] for device in range(task.num_devices)]
    records, targets = [], []
    for tables in groups:
        if not tables:
            continue
        cost = real.device_cost(task, tables)
        records.append({"features": [table_features(task.tables[t]) for t in tables]})
        targets.append([cost.forward_compute or cost.total, cost.backward_compute or cost.total])
    features, mask = _padded(records, model.mean, model.std)
    target = torch.log(torch.as_tensor(targets, dtype=torch.float32).clamp_min(1e-9))
    heads = min(2, len(model.net.heads))
    optimiser = torch.optim.Adam(model.net.parameters(), lr=1e-4)
    model.net.train()
    for _ in range(5):
        optimiser.zero_grad()
        loss = ((model.net(features, mask)[:, :heads] - target[:, :heads]) ** 2).mean()
        loss.backward()
        optimiser.step()
    model.net.eval()
    mdp.embeddings = model.table_embeddings(task.tables)
