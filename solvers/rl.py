"""Learned sharding policies on one MDP (AutoShard §4.3–4.5, DreamShard appendix B): tables are placed one
per step in descending order of predicted single-table cost; a step sees the table's representation and
the share of tables placed, and chooses among the devices that still have memory for it. Table
representations come from the neural cost model's table MLP (shared with it, frozen), and the cost model
also supplies each device's predicted costs. The final reward comes from an oracle: AutoShard's degree
of balance (min/max device cost), or DreamShard's negative cost relative to a perfect split; a plan that
overflows memory gets AutoShard's penalty −max_k (used_k − capacity_k) / capacity_k.

AutoShard's policy: a 2-layer LSTM (hidden 64) over the steps, a per-device action representation, a
policy head 128-128-64-1 over [state, action, state·action] and a value head, trained actor-critic with
V-trace targets (IMPALA). DreamShard's: per device [summed table representations; MLP of predicted
forward, backward and communication cost] → score, trained with REINFORCE on the estimated MDP (the cost
network as simulator), with periodic real-oracle rollouts that fine-tune the cost network."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from costmodels import Oracle
from costmodels.neural import (
    CostNet,
    NeuralOracle,
    TrainedModel,
    mlp,
    shipped_model_path,
)
from instances import Instance, Plan

from .base import Budget, Cause, MemoryTracker, NoPlan, SolveResult, Status, planned
from .candidates import Problem

ALGORITHMS = ("autoshard", "dreamshard")
ENTROPY_COST = 0.001
BASELINE_COST = 0.5
GRADIENT_CLIP = 40.0
SHIPPED_POLICIES = {"autoshard": "autoshard_policy.pt", "dreamshard": "dreamshard_policy.pt"}


# ---------------------------------------------------------------- the MDP


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
                legal = memory.free == memory.free.max()  # AutoShard lets it overflow, then penalises
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
        episode.overflow = float(max(0, -int(memory.free.min())) / capacity)
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


# ---------------------------------------------------------------- policies


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


def _policy(algorithm: str) -> nn.Module:
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


# ---------------------------------------------------------------- training


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
    policy = _policy(algorithm)
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


def plot_training(log: TrainingLog, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    rewards = np.array(log.mean_reward)
    window = max(1, len(rewards) // 20)
    smooth = np.convolve(rewards, np.ones(window) / window, mode="valid") if rewards.size else rewards
    ax.plot(log.episodes, rewards, alpha=0.3, color="tab:blue")
    ax.plot(log.episodes[window - 1:], smooth, color="tab:blue")
    ax.set_xlabel("episodes")
    ax.set_ylabel("mean episode reward (estimated MDP)")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- saving and solving


def save_policy(policy: nn.Module, algorithm: str, model: TrainedModel, path: Path, metadata: dict) -> None:
    """Saves the policy with the cost network it reads its features from (fine-tuned, for DreamShard)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"algorithm": algorithm, "policy": policy.state_dict(), "cost_kind": model.net.kind,
                "cost_state": model.net.state_dict(), "mean": model.mean.tolist(), "std": model.std.tolist(),
                "cost_metadata": model.metadata, "metadata": metadata}, path)


def load_policy(path: Path) -> tuple[str, nn.Module, TrainedModel, dict]:
    blob = torch.load(path, weights_only=True)
    policy = _policy(blob["algorithm"])
    policy.load_state_dict(blob["policy"])
    policy.eval()
    net = CostNet(blob["cost_kind"])
    net.load_state_dict(blob["cost_state"])
    net.eval()
    model = TrainedModel(net, np.array(blob["mean"]), np.array(blob["std"]), blob["cost_metadata"])
    return blob["algorithm"], policy, model, blob["metadata"]


def shipped_policy_path(algorithm: str) -> Path:
    return shipped_model_path("neural-autoshard").parent / SHIPPED_POLICIES[algorithm]


def policy_plan(instance: Instance, path: Path) -> SolveResult:
    algorithm, policy, model, _ = load_policy(path)
    episode = play(ShardingMDP(instance, model), policy, algorithm, None)
    if episode.overflow > 0:  # any byte over capacity makes this positive
        return SolveResult(Status.NO_PLAN, reason=f"the policy's plan overflows memory by {episode.overflow:.1%} on "
                                                 "its worst device (no legal device was left for a table)",
                           no_plan=NoPlan(Cause.OVERFLOW, plan=Plan.table_wise(instance, episode.assignment)))
    return planned(instance, episode.assignment)


def solve_with_policy(algorithm: str, polish: bool, problem: Problem, budget: Budget, seed: int) -> SolveResult:
    instance = problem.instance
    path = shipped_policy_path(algorithm)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no trained {algorithm} policy shipped; run `shardbench train policy`")
    started = time.monotonic()
    result = policy_plan(instance, path)
    if not polish or result.plan is None:
        return result
    from .assembly import Assembly
    from .search import improve, target_bound

    candidates = problem.whole_tables.candidates
    assembly = Assembly(candidates)
    for table, device in enumerate(result.plan.assignment):
        assembly.put(int(candidates.by_table[table][0]), np.array([device]))
    remaining = max(0.0, budget.time_limit - (time.monotonic() - started))
    stats = improve(assembly, time.monotonic() + remaining, seed, budget.max_rounds, False, target_bound(candidates))
    return SolveResult(Status.FEASIBLE, plan=assembly.plan(), stats=stats)
