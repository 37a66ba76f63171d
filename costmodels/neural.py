"""Neural cost oracles trained on measured cost datasets. AutoShard's model: a shared MLP embeds each
table (21 features → 128 → 32), the device sums its tables' embeddings, a head maps the sum to the cost
(32 → 64 → 1). DreamShard's: the same shared table MLP, per-device heads for forward, backward and
communication time, and an overall head on the element-wise max over devices. Both are invariant to the
order of a device's tables, and their device state adds and subtracts table embeddings."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from instances import Instance, Table
from instances.pieces import Pieces

from .base import DeviceCost, DeviceState, Oracle, Priced
from .dataset import table_features

MODEL_KINDS = ("autoshard", "dreamshard")
REFERENCE_DEVICES = 8
WEIGHT_DECAY = 1e-4  # the communication head learns the all-to-all of an 8-GPU node at the dataset's batch


def transform(features: np.ndarray) -> np.ndarray:
    """Log-scales rows and size before standardisation. Pooling stays linear: lookup work is dim × pooling,
    and log-scaling it too cost 0.10 of held-out R² on the CPU dataset (0.71 against 0.81)."""
    out = np.array(features, dtype=np.float64, copy=True)
    out[..., 1] = np.log1p(out[..., 1])
    out[..., 3] = np.log1p(out[..., 3])
    return out


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class CostNet(nn.Module):
    """kind 'autoshard': one head (log of total compute time). kind 'dreamshard': forward, backward and
    communication heads per device (log seconds) plus the overall head over the max of device vectors."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.table = nn.Sequential(mlp([21, 128, 32]), nn.ReLU())
        heads = 1 if kind == "autoshard" else 3
        self.heads = nn.ModuleList(mlp([32, 64, 1]) for _ in range(heads))
        if kind == "dreamshard":
            self.overall = mlp([32 + 3, 64, 1])

    def embed(self, features: torch.Tensor) -> torch.Tensor:
        return self.table(features)

    def device_outputs(self, summed: torch.Tensor) -> torch.Tensor:
        """[..., heads] log-seconds from summed table embeddings [..., 32]."""
        return torch.cat([head(summed) for head in self.heads], dim=-1)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """features [batch, tables, 21], mask [batch, tables] → [batch, heads]."""
        summed = (self.embed(features) * mask.unsqueeze(-1)).sum(dim=1)
        return self.device_outputs(summed)

    def plan_output(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """DreamShard's overall head: features [plans, devices, tables, 21] → [plans] log-seconds."""
        summed = (self.embed(features) * mask.unsqueeze(-1)).sum(dim=2)
        device = torch.cat([summed, self.device_outputs(summed)], dim=-1)
        return self.overall(device.max(dim=1).values).squeeze(-1)


@dataclass
class TrainedModel:
    net: CostNet
    mean: np.ndarray
    std: np.ndarray
    metadata: dict

    def normalise(self, features: np.ndarray) -> torch.Tensor:
        return torch.as_tensor((transform(features) - self.mean) / self.std, dtype=torch.float32)

    def table_embeddings(self, tables: Sequence[Table]) -> torch.Tensor:
        with torch.no_grad():
            return self.net.embed(self.normalise(np.array([table_features(t) for t in tables])))

    def seconds_from_sum(self, summed: torch.Tensor) -> np.ndarray:
        """Per head, seconds; an empty device (zero sum) costs nothing."""
        with torch.no_grad():
            return np.exp(self.net.device_outputs(summed).numpy())

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"kind": self.net.kind, "state": self.net.state_dict(), "mean": self.mean.tolist(),
                    "std": self.std.tolist(), "metadata": self.metadata}, path)

    @classmethod
    def load(cls, path: Path) -> "TrainedModel":
        blob = torch.load(path, weights_only=True)
        net = CostNet(blob["kind"])
        net.load_state_dict(blob["state"])
        net.eval()
        return cls(net, np.array(blob["mean"]), np.array(blob["std"]), blob["metadata"])


def reference_comm_seconds(dims: Sequence[int], batch: int) -> float:
    """Output all-to-all time of a device holding tables of these dims in an 8-GPU node at `batch` per GPU
    (the analytic model's backward term, fp16 outputs): the target of DreamShard's communication head."""
    from instances import Topology, Workload

    from .analytic import AnalyticOracle

    tables = tuple(Table(f"t{i}", 100, int(d), 2, 1.0, (1.0,) + (0.0,) * 16) for i, d in enumerate(dims))
    instance = Instance("reference", tables, Topology(1, REFERENCE_DEVICES, 1 << 40), Workload(batch_size=batch))
    return float(AnalyticOracle().table_breakdown(instance)[:, 3].sum())


# ---------------------------------------------------------------- training


def _padded(records: list[dict], mean: np.ndarray, std: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r["features"]) for r in records)
    features = np.zeros((len(records), width, 21))
    mask = np.zeros((len(records), width))
    for i, r in enumerate(records):
        n = len(r["features"])
        features[i, :n] = (transform(np.array(r["features"])) - mean) / std
        mask[i, :n] = 1.0
    return torch.as_tensor(features, dtype=torch.float32), torch.as_tensor(mask, dtype=torch.float32)


def _targets(records: list[dict], kind: str) -> torch.Tensor:
    if kind == "autoshard":
        values = [[r["total_s"]] for r in records]
    else:
        values = [[r["forward_s"], r["backward_s"], reference_comm_seconds(r["dims"], r["batch"])] for r in records]
    return torch.log(torch.as_tensor(values, dtype=torch.float32))


def predict_total(model: TrainedModel, records: list[dict]) -> np.ndarray:
    """Compute-time predictions (forward + backward) comparable with `total_s` for either kind."""
    features, mask = _padded(records, model.mean, model.std)
    with torch.no_grad():
        out = np.exp(model.net(features, mask).numpy())
    return out[:, 0] if model.net.kind == "autoshard" else out[:, 0] + out[:, 1]


def accuracy(predicted: np.ndarray, actual: np.ndarray) -> dict:
    from scipy.stats import kendalltau

    residual = predicted - actual
    return {"mae_s": float(np.abs(residual).mean()), "mape": float(np.mean(np.abs(residual) / actual)),
            "r2": float(1 - (residual ** 2).sum() / ((actual - actual.mean()) ** 2).sum()),
            "kendall_tau": float(kendalltau(predicted, actual).statistic), "count": int(actual.size)}


def train(records: list[dict], kind: str, epochs: int = 400, seed: int = 0, batch_size: int = 64,
          learning_rate: float = 1e-3, progress=None) -> tuple[TrainedModel, dict]:
    """Trains on the 'train' split (first half of the pool) and reports accuracy on the 'test' split
    (combinations of unseen tables only). On one thread: the same seed then gives the same weights on every
    machine (summation order changes with the thread count), and these small networks gain nothing from more."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"model must be one of {MODEL_KINDS}, got {kind!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(records, kind, epochs, seed, batch_size, learning_rate, progress)
    finally:
        torch.set_num_threads(threads)


def _train(records: list[dict], kind: str, epochs: int, seed: int, batch_size: int, learning_rate: float,
           progress) -> tuple[TrainedModel, dict]:
    train_set = [r for r in records if r["split"] == "train"]
    test_set = [r for r in records if r["split"] == "test"]
    if not train_set or not test_set:
        raise ValueError("the dataset needs combinations in both the train and the test split")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    # A tenth of the training combinations decides when to stop: the test split stays untouched.
    shuffled = [train_set[i] for i in rng.permutation(len(train_set))]
    held = max(1, len(shuffled) // 10)
    fit_set, check_set = shuffled[held:], shuffled[:held]
    stacked = transform(np.concatenate([np.array(r["features"]) for r in fit_set]))
    mean, std = stacked.mean(axis=0), stacked.std(axis=0)
    std[std == 0] = 1.0
    net = CostNet(kind)
    optimiser = torch.optim.Adam(net.parameters(), lr=learning_rate, weight_decay=WEIGHT_DECAY)
    features, mask = _padded(fit_set, mean, std)
    targets = _targets(fit_set, kind)
    check_features, check_mask = _padded(check_set, mean, std)
    check_targets = _targets(check_set, kind)
    best_loss, best_state = np.inf, None
    for epoch in range(epochs):
        net.train()
        order = torch.as_tensor(rng.permutation(len(fit_set)))
        for start in range(0, len(fit_set), batch_size):
            idx = order[start:start + batch_size]
            optimiser.zero_grad()
            loss = ((net(features[idx], mask[idx]) - targets[idx]) ** 2).mean()
            if kind == "dreamshard":
                loss = loss + _plan_loss(net, features, mask, targets, rng, batch_size)
            loss.backward()
            optimiser.step()
        with torch.no_grad():
            check_loss = float(((net(check_features, check_mask) - check_targets) ** 2).mean())
        if check_loss < best_loss:
            best_loss, best_state = check_loss, {k: v.clone() for k, v in net.state_dict().items()}
        if progress:
            progress(epoch + 1)
    if best_state is None:
        raise ValueError("training found no finite loss on the held-back combinations: the dataset's times or "
                         "features are out of any learnable range")
    net.load_state_dict(best_state)
    net.eval()
    model = TrainedModel(net, mean, std, {"kind": kind, "epochs": epochs, "seed": seed,
                                          "train_combinations": len(train_set),
                                          "device": records[0].get("device"), "batch": records[0].get("batch"),
                                          "dataset_sha256": _records_hash(records)})
    metrics = {"train": accuracy(predict_total(model, train_set), np.array([r["total_s"] for r in train_set])),
               "test_unseen_tables": accuracy(predict_total(model, test_set), np.array([r["total_s"] for r in test_set]))}
    model.metadata["metrics"] = metrics
    return model, metrics


def _plan_loss(net: CostNet, features, mask, targets, rng, plans: int) -> torch.Tensor:
    """DreamShard's overall head on synthetic plans: groups of measured devices, whose plan cost is the
    slowest device's forward + backward + communication."""
    devices = REFERENCE_DEVICES
    pick = torch.as_tensor(rng.integers(0, features.shape[0], size=(plans, devices)))
    device_seconds = torch.exp(targets[pick]).sum(dim=-1)  # [plans, devices]
    target = torch.log(device_seconds.max(dim=1).values)
    return ((net.plan_output(features[pick], mask[pick]) - target) ** 2).mean()


def _records_hash(records: list[dict]) -> str:
    digest = hashlib.sha256()
    for r in records:
        digest.update(repr((r["pool_indices"], r["dims"], r["total_s"])).encode())
    return digest.hexdigest()


# ---------------------------------------------------------------- oracle


class NeuralDeviceState(DeviceState):
    """Per device, the sum of its pieces' embeddings; costs come from the head on that sum."""

    def __init__(self, priced: "NeuralPriced"):
        self.oracle = priced.oracle
        self.embeddings = priced.embeddings
        self.sums = torch.zeros((priced.num_devices, self.embeddings.shape[1]))
        self.counts = np.zeros(priced.num_devices, dtype=np.int64)

    @property
    def num_devices(self) -> int:
        return self.counts.size

    def add(self, piece: int, device: int) -> None:
        self.sums[device] += self.embeddings[piece]
        self.counts[device] += 1

    def remove(self, piece: int, device: int) -> None:
        self.sums[device] -= self.embeddings[piece]
        self.counts[device] -= 1

    def _total(self, summed: torch.Tensor, count: int) -> float:
        return self.oracle.total_from_sum(summed) if count > 0 else 0.0

    def cost(self, device: int) -> float:
        return self._total(self.sums[device], int(self.counts[device]))

    def cost_if_added(self, piece: int, device: int) -> float:
        return self._total(self.sums[device] + self.embeddings[piece], 1)

    def cost_if_exchanged(self, device: int, out_piece: int | None, in_piece: int | None) -> float:
        summed, count = self.sums[device].clone(), int(self.counts[device])
        if out_piece is not None:
            summed -= self.embeddings[out_piece]
            count -= 1
        if in_piece is not None:
            summed += self.embeddings[in_piece]
            count += 1
        return self._total(summed, count)

    def costs_if_added(self, piece: int, devices: np.ndarray) -> np.ndarray:
        return self.oracle.totals_from_sums(self.sums[torch.as_tensor(devices)] + self.embeddings[piece])


class NeuralOracle(Oracle):
    """A piece is embedded through the features of the table it is to its device (its rows, columns and
    share of the lookups); a device's cost comes from the sum of its pieces' embeddings."""

    unit = "s"
    costly = True

    def __init__(self, model: TrainedModel, name: str):
        self.model = model
        self.name = name
        kind = model.net.kind
        self.has_breakdown = kind == "dreamshard"
        self.description = (f"{kind} cost network trained on {model.metadata.get('device')} measurements at batch "
                            f"{model.metadata.get('batch')}" + (" (compute only)" if kind == "autoshard" else
                                                                 " (forward, backward, 8-GPU all-to-all)"))

    def totals_from_sums(self, sums: torch.Tensor) -> np.ndarray:
        return self.model.seconds_from_sum(sums).sum(axis=-1)

    def total_from_sum(self, summed: torch.Tensor) -> float:
        return float(self.totals_from_sums(summed.unsqueeze(0))[0])

    def cost_from_sum(self, summed: torch.Tensor) -> DeviceCost:
        parts = self.model.seconds_from_sum(summed.unsqueeze(0))[0]
        if self.model.net.kind == "autoshard":
            return DeviceCost(total=float(parts[0]))
        return DeviceCost.from_parts(float(parts[0]), float(parts[1]), float(parts[2]) / 2, float(parts[2]) / 2)

    def bind(self, instance: Instance, pieces: Pieces) -> Priced:
        return NeuralPriced(self, instance, pieces)

    def price_device(self, instance: Instance, pieces: Pieces, members: Sequence[int]) -> DeviceCost:
        return self.bind(instance, pieces).device_cost(members)


class NeuralPriced(Priced):
    def __init__(self, oracle: NeuralOracle, instance: Instance, pieces: Pieces):
        super().__init__(instance, pieces)
        self.oracle = oracle
        self.embeddings = oracle.model.table_embeddings(pieces.as_tables(instance))

    def device_cost(self, members: Sequence[int]) -> DeviceCost:
        members = list(members)
        if not members:
            return DeviceCost.from_parts(0.0, 0.0, 0.0, 0.0)
        return self.oracle.cost_from_sum(self.embeddings[members].sum(dim=0))

    def new_state(self) -> DeviceState:
        return NeuralDeviceState(self)


# Weights shipped, by the data they were trained on: the CPU dataset (AMD EPYC, batch 2,048) and the GPU one
# (NVIDIA H200, batch 16,384); benchmarks/fidelity.py reports each on its own held-out combinations.
SHIPPED = {"neural-autoshard": "autoshard_cpu.pt", "neural-dreamshard": "dreamshard_cpu.pt",
           "neural-autoshard-h200": "autoshard_h200.pt", "neural-dreamshard-h200": "dreamshard_h200.pt"}


def shipped_model_path(name: str) -> Path:
    return Path(__file__).parent / "data" / SHIPPED[name]


def load_shipped(name: str) -> NeuralOracle:
    path = shipped_model_path(name)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no trained weights shipped for {name}; train them with "
                                f"`shardbench train costmodel`")
    return NeuralOracle(TrainedModel.load(path), name)
