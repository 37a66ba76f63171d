"""Oracle fidelity on held-out measurements: for the test split of a measured cost dataset (combinations
of tables unseen in training), how well each oracle predicts the measured device time (MAE, MAPE, R²) and
ranks it (Kendall τ); how far the multi-table cost is from the sum of single-table costs (AutoShard Fig. 4
right, DreamShard Fig. 12); and the measured repeat spread."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from costmodels.analytic import AnalyticOracle
from costmodels.dataset import combination_tables, load_dataset
from costmodels.neural import TrainedModel, accuracy, predict_total, shipped_model_path
from instances import Instance, Topology, Workload

from .pages import plot_line


def analytic_compute_seconds(record: dict) -> float:
    tables = tuple(combination_tables(record))
    instance = Instance("fidelity", tables, Topology(1, 1, 1 << 50, device_kind="cpu"),
                       Workload(batch_size=record["batch"]))
    return float(AnalyticOracle().table_breakdown(instance)[:, :2].sum())


def report(dataset: Path, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = load_dataset(dataset)
    test = [r for r in records if r["split"] == "test"]
    actual = np.array([r["total_s"] for r in test])
    predictions = {
        "single-table sum (measured)": np.array([sum(r["single_total_s"]) for r in test]),
        "analytic (CPU DDR constants)": np.array([analytic_compute_seconds(r) for r in test]),
        "lookup heuristic (Σ dim × pooling, rank only)": np.array(
            [sum(f[0] * f[2] for f in r["features"]) for r in test]),
    }
    for name in ("neural-autoshard", "neural-dreamshard"):
        path = shipped_model_path(name)
        if path.exists():
            predictions[name] = predict_total(TrainedModel.load(path), test)
    lines = [f"Held-out measurements: {len(test)} combinations of 1–{max(len(r['dims']) for r in records)} tables "
             f"from the unseen half of the pool ({len(records) - len(test)} training combinations), measured on "
             f"{records[0]['device']} at batch {records[0]['batch']}.", "",
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
    left.set_title("fusion: multi-table vs single-table sum")
    for name, predicted in predictions.items():
        if "rank only" not in name:
            right.scatter(actual * 1e3, predicted * 1e3, s=6, alpha=0.5, label=name)
    right.plot([0, actual.max() * 1e3], [0, actual.max() * 1e3], color="grey", lw=0.8)
    right.set_xlabel("measured (ms)")
    right.set_ylabel("predicted (ms)")
    right.set_title("held-out combinations")
    right.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "fidelity.png", dpi=110)
    plt.close(fig)
    lines += ["", plot_line(out / "fidelity.md", out / "fidelity.png",
                            "left: multi-table cost against the sum of single-table costs; right: each oracle "
                            "against the measured cost on held-out combinations")]
    text = "\n".join(lines) + "\n"
    (out / "fidelity.md").write_text(text)
    return text


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", default="costmodels/data/cpu_costs.jsonl")
    parser.add_argument("--out", default="docs/results/oracles", help="the page's folder (default: %(default)s)")
    args = parser.parse_args(argv)
    print(report(Path(args.dataset), Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
