"""The training curve of a learned policy (`shardbench train policy`): mean episode reward per update."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from solvers.rl.training import TrainingLog


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
