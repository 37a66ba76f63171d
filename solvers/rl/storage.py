"""Saving and loading a policy with the cost network it reads its features from, and where the shipped
weights lie (next to the shipped cost models, in costmodels/data)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from costmodels.neural import CostNet, TrainedModel, shipped_model_path

from .policies import make_policy

SHIPPED_POLICIES = {"autoshard": "autoshard_policy.pt", "dreamshard": "dreamshard_policy.pt"}


def save_policy(policy: nn.Module, algorithm: str, model: TrainedModel, path: Path, metadata: dict) -> None:
    """Saves the policy with the cost network it reads its features from (fine-tuned, for DreamShard)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"algorithm": algorithm, "policy": policy.state_dict(), "cost_kind": model.net.kind,
                "cost_state": model.net.state_dict(), "mean": model.mean.tolist(), "std": model.std.tolist(),
                "cost_metadata": model.metadata, "metadata": metadata}, path)


def load_policy(path: Path) -> tuple[str, nn.Module, TrainedModel, dict]:
    blob = torch.load(path, weights_only=True)
    policy = make_policy(blob["algorithm"])
    policy.load_state_dict(blob["policy"])
    policy.eval()
    net = CostNet(blob["cost_kind"])
    net.load_state_dict(blob["cost_state"])
    net.eval()
    model = TrainedModel(net, np.array(blob["mean"]), np.array(blob["std"]), blob["cost_metadata"])
    return blob["algorithm"], policy, model, blob["metadata"]


def shipped_policy_path(algorithm: str) -> Path:
    return shipped_model_path("neural-autoshard").parent / SHIPPED_POLICIES[algorithm]
