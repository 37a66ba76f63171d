import numpy as np
import pytest
import torch

from costmodels.neural import CostNet, TrainedModel
from instances import Workload
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from solvers.rl.mdp import ShardingMDP
from solvers.rl.policies import AutoShardPolicy, DreamShardPolicy, play
from solvers.rl.storage import load_policy, save_policy
from solvers.rl.training import train_policy, vtrace_targets


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _model(kind="autoshard"):
    torch.manual_seed(3)
    return TrainedModel(CostNet(kind), np.zeros(21), np.ones(21), {})


def _tasks(count=3, tables=12, tightness=None):
    return sample_tasks(TaskSpec("autoshard", tables, split="train", count=count, num_devices=3,
                                 memory=MemorySpec(tightness=tightness), workload=Workload(batch_size=2048)))


@pytest.mark.parametrize("algorithm", ["autoshard", "dreamshard"])
def test_masks_are_respected_under_tight_memory(algorithm):
    torch.manual_seed(0)
    policy = AutoShardPolicy() if algorithm == "autoshard" else DreamShardPolicy()
    for task in _tasks(tightness=1.3):
        episode = play(ShardingMDP(task, _model()), policy, algorithm, np.random.default_rng(0))
        assert all(bool(step.legal[step.action]) for step in episode.steps)
        if episode.overflow == 0:
            used = np.bincount(episode.assignment, weights=task.table_storage()[:, 0], minlength=task.num_devices)
            assert used.max() <= task.topology.memory_bytes


@pytest.mark.parametrize("algorithm", ["autoshard", "dreamshard"])
def test_greedy_inference_is_deterministic_and_survives_save_load(algorithm, tmp_path):
    model = _model()
    policy, _ = train_policy(algorithm, _tasks(), model, time_budget=60, seed=1, max_updates=3, episodes_per_update=2)
    task = _tasks(count=1)[0]
    first = play(ShardingMDP(task, model), policy, algorithm, None).assignment
    assert play(ShardingMDP(task, model), policy, algorithm, None).assignment == first
    save_policy(policy, algorithm, model, tmp_path / "p.pt", {})
    _, loaded, loaded_model, _ = load_policy(tmp_path / "p.pt")
    assert play(ShardingMDP(task, loaded_model), loaded, algorithm, None).assignment == first


def test_vtrace_on_policy_with_a_final_reward_targets_that_reward():
    values = torch.tensor([0.1, 0.5, -0.2, 0.3])
    same = torch.zeros(4)
    targets, advantages = vtrace_targets(same, same, values, final_reward=0.8)
    assert torch.allclose(targets, torch.full((4,), 0.8))
    assert torch.allclose(advantages, 0.8 - values)
    clipped, _ = vtrace_targets(same, torch.full((4,), 5.0), values, final_reward=0.8)  # ratios clipped at 1
    assert torch.allclose(clipped, targets)


@pytest.mark.parametrize("algorithm", ["autoshard", "dreamshard"])
def test_training_with_a_fixed_seed_raises_the_mean_reward(algorithm):
    model = _model()
    tasks = _tasks(count=1, tables=10)
    _, log = train_policy(algorithm, tasks, model, time_budget=600, seed=0, max_updates=60, episodes_per_update=8,
                          learning_rate=3e-3)
    assert np.mean(log.mean_reward[-10:]) > np.mean(log.mean_reward[:10])
