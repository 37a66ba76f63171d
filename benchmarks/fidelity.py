"""Oracle fidelity on held-out measurements, one section per measured dataset (CPU, GPU).

For the test split (combinations of tables unseen in training): how well each oracle predicts the measured
device time (MAE, MAPE, R²) and ranks it (Kendall τ); how far the multi-table cost is from the sum of
single-table costs (AutoShard Fig. 4 right, DreamShard Fig. 12); and the measured repeat spread."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costmodels.analytic import AnalyticOracle
from costmodels.dataset import combination_tables, load_dataset
from costmodels.neural import TrainedModel, accuracy, predict_total, shipped_model_path
from costmodels.base import DeviceCost, Oracle
from instances import Instance, Table, Topology, Workload
from instances.pieces import Pieces

from .pages import plot_line


@dataclass(frozen=True)
class Dataset:
    label: str              # the section's title and the plot's name
    path: str
    networks: tuple[str, ...]  # neural oracles trained on this dataset
    device_kind: str        # the analytic oracle's constants ("cpu" or "gpu")
    torchrec: bool          # TorchRec's estimator predicts GPU time; it has nothing to say about a CPU


DATASETS = (
    Dataset("CPU", "costmodels/data/cpu_costs.jsonl", ("neural-autoshard", "neural-dreamshard"), "cpu", False),
    Dataset("GPU", "costmodels/data/h200_costs.jsonl.gz", ("neural-autoshard-h200", "neural-dreamshard-h200"),
            "gpu", True),
)


def one_device(tables: tuple[Table, ...], batch: int, device_kind: str = "gpu") -> Instance:
    """Tables that were timed together, as the one device of an instance: how an oracle prices the set."""
    return Instance("fidelity", tables, Topology(1, 1, 1 << 50, device_kind=device_kind), Workload(batch_size=batch))


def compute_seconds(cost: DeviceCost, oracle: Oracle) -> float:
    """A device's forward and backward compute in seconds, what a timing measures (an oracle without a
    breakdown gives its total: AutoShard's network predicts compute alone)."""
    compute = cost.forward_compute + cost.backward_compute if oracle.has_breakdown else cost.total
    return compute * {"ms": 1e-3, "s": 1.0}[oracle.unit]


def _one_device(record: dict, device_kind: str) -> Instance:
    return one_device(tuple(combination_tables(record)), record["batch"], device_kind)


def analytic_compute_seconds(record: dict, device_kind: str) -> float:
    return float(AnalyticOracle().table_breakdown(_one_device(record, device_kind))[:, :2].sum())


def torchrec_compute_seconds(records: list[dict]) -> np.ndarray:
    """TorchRec's estimator's forward+backward compute of each combination on one GPU, at its own
    constants (its default HBM bandwidth), in seconds."""
    from costmodels import get_oracle

    oracle = get_oracle("torchrec")
    out = []
    for record in records:
        instance = _one_device(record, "gpu")
        cost = oracle.bind(instance, Pieces.table_wise(instance)).device_cost(list(range(instance.num_tables)))
        out.append(compute_seconds(cost, oracle))
    return np.array(out)


def section(dataset: Dataset, out: Path, page: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = load_dataset(Path(dataset.path))
    test = [r for r in records if r["split"] == "test"]
    actual = np.array([r["total_s"] for r in test])
    predictions = {
        "single-table sum (measured)": np.array([sum(r["single_total_s"]) for r in test]),
        f"analytic ({dataset.device_kind.upper()} constants)": np.array(
            [analytic_compute_seconds(r, dataset.device_kind) for r in test]),
        "lookup heuristic (Σ dim × pooling, rank only)": np.array(
            [sum(f[0] * f[2] for f in r["features"]) for r in test]),
    }
    if dataset.torchrec:
        predictions["TorchRec's estimator (its default constants)"] = torchrec_compute_seconds(test)
    for name in dataset.networks:
        path = shipped_model_path(name)
        if path.exists():
            predictions[name] = predict_total(TrainedModel.load(path), test)
    lines = [f"## {dataset.label}: {records[0]['device']}", "",
             f"`{dataset.path}`: {len(records)} combinations of 1–{max(len(r['dims']) for r in records)} tables at "
             f"batch {records[0]['batch']:,} ({', '.join(f'{k} {v}' for k, v in records[0]['versions'].items())}). "
             f"Held out: {len(test)} combinations from the unseen half of the pool ({len(records) - len(test)} "
             "training combinations).", "",
             "| oracle | MAE (ms) | MAPE | R² | Kendall τ |", "|---|---|---|---|---|"]
    for name, predicted in predictions.items():
        m = accuracy(predicted, actual)
        absolute = "rank only" in name
        cells = ("—", "—", "—") if absolute else (f"{m['mae_s'] * 1e3:.3f}", f"{m['mape']:.1%}", f"{m['r2']:.4f}")
        lines.append(f"| {name} | {' | '.join(cells)} | {m['kendall_tau']:.4f} |")
    multi = [r for r in records if len(r["dims"]) >= 2]
    ratio = np.array([r["total_s"] / sum(r["single_total_s"]) for r in multi])
    ten = np.array([r["total_s"] / sum(r["single_total_s"]) for r in multi if len(r["dims"]) == 10])
    spread = np.array([r["spread"] for r in records])
    lines += ["", f"Multi-table cost / sum of single-table costs over {ratio.size} combinations of ≥ 2 tables: median "
              f"{np.median(ratio):.3f}, 10th–90th percentile {np.percentile(ratio, 10):.3f}–{np.percentile(ratio, 90):.3f}"
              + (f"; for exactly 10 tables median {np.median(ten):.3f} ({ten.size} combinations)" if ten.size else "")
              + ".",
              f"Repeat spread (coefficient of variation of the 10 timed forward+backward runs): median "
              f"{np.median(spread):.1%}, 90th percentile {np.percentile(spread, 90):.1%}, max {spread.max():.1%}."]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    sums = np.array([sum(r["single_total_s"]) for r in multi]) * 1e3
    left.scatter(sums, np.array([r["total_s"] for r in multi]) * 1e3, s=6, alpha=0.5)
    top = max(sums.max(), 1e-9)
    left.plot([0, top], [0, top], color="grey", lw=0.8)
    left.set_xlabel("sum of single-table costs (ms)")
    left.set_ylabel("multi-table cost (ms)")
    left.set_title(f"{dataset.label}: multi-table vs single-table sum")
    for name, predicted in predictions.items():
        if "rank only" not in name:
            right.scatter(actual * 1e3, predicted * 1e3, s=6, alpha=0.5, label=name)
    right.plot([0, actual.max() * 1e3], [0, actual.max() * 1e3], color="grey", lw=0.8)
    right.set_xlabel("measured (ms)")
    right.set_ylabel("predicted (ms)")
    right.set_title(f"{dataset.label}: held-out combinations")
    right.legend(fontsize=7)
    fig.tight_layout()
    plot = out / f"fidelity-{dataset.label.lower()}.png"
    fig.savefig(plot, dpi=110)
    plt.close(fig)
    return lines + ["", plot_line(page, plot, f"{dataset.label}: left, multi-table cost against the sum of "
                                  "single-table costs; right, each oracle against the measured cost on held-out "
                                  "combinations")]


def report(out: Path, datasets: tuple[Dataset, ...] = DATASETS) -> str:
    out.mkdir(parents=True, exist_ok=True)
    page = out / "fidelity.md"
    lines = ["# Oracle fidelity on held-out measurements", "", __doc__.split("\n\n")[1].replace("\n", " "), ""]
    for dataset in datasets:
        lines += section(dataset, out, page) + [""]
    text = "\n".join(lines)
    page.write_text(text)
    return text


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="docs/results/oracles", help="the page's folder (default: %(default)s)")
    args = parser.parse_args(argv)
    print(report(Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
