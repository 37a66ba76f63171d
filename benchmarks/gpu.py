"""Measurements on a GPU, in one device run: each rank's shard set of TorchRec's plan and of ours on the
vs-torchrec-80x8 tasks, shards and host-memory placements of heavy pool tables, then a cost dataset of pool
table combinations until a deadline. `prepare` (here) writes what is timed and what the estimators predict
for it; `run` (on the GPU; numpy, torch and fbgemm-gpu only) times it."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from costmodels.dataset import combinations, measured_records
from costmodels.measured import Job, Placement, Protocol, environment, measure_many
from instances import Table
from instances.kernels import FUSED_UVM, FUSED_UVM_CACHING

PLANS_SUITE = "benchmarks/suites/vs-torchrec-80x8.toml"
OUR_SOLVERS = ("split-greedy", "local-search", "cpsat", "best-greedy", "lpt")
HEAVY_TABLES = 6
HEAVY_DIM = 64
SHARD_BATCH = 65536
LOAD_FACTORS = (0.05, 0.1, 0.2, 0.5)


def table_spec(table: Table, placement: Placement) -> dict:
    return {"name": table.name, "rows": table.rows, "dim": table.dim, "dtype_bytes": table.dtype_bytes,
            "pooling_factor": table.pooling_factor, "reuse_bins": list(table.reuse_bins),
            "kernel": placement.kernel, "load_factor": placement.load_factor}


def spec_table(spec: dict) -> tuple[Table, Placement]:
    table = Table(spec["name"], spec["rows"], spec["dim"], spec["dtype_bytes"], spec["pooling_factor"],
                  tuple(spec["reuse_bins"]))
    return table, Placement(spec["kernel"], spec["load_factor"])


# ---------------------------------------------------------------- prepare (here)


def _compute(cost) -> float:
    return cost.forward_compute + cost.backward_compute


def plan_sets() -> list[dict]:
    """For each task, TorchRec's planner's plan and our best stored plan at 10 s, each cut into its ranks'
    shard sets, with each rank's compute as TorchRec's estimator and `analytic` predict it."""
    from benchmarks.store import read_records
    from benchmarks.suite import load_suites
    from costmodels import get_oracle
    from costmodels.measured import piece_placements
    from instances import load_instances
    from instances.pieces import Pieces
    from instances.sharding import expand

    suite = load_suites(PLANS_SUITE)[0]
    instances = {i.id: i for i in load_instances(suite.instances)}
    latest: dict[tuple[str, str], dict] = {}
    for r in read_records(suite.results):
        if r["status"] in ("feasible", "optimal") and r.get("sharding") == "instance" and r.get("plan"):
            latest[(r["instance"], r["solver"])] = r
    oracles = {name: get_oracle(name) for name in ("torchrec", "analytic")}
    out = []
    for task in sorted(instances):
        ours = [latest[(task, s)] for s in OUR_SOLVERS if (task, s) in latest]
        theirs = latest.get((task, "torchrec-planner"))
        if not ours or theirs is None:
            continue
        instance = instances[task]
        for label, record in (("torchrec-planner", theirs), ("ours", min(ours, key=lambda r: r["objective"]))):
            pieces, devices = Pieces.of_plan(instance, expand(record["plan"], instance))
            tables, placements = pieces.as_tables(instance), piece_placements(pieces)
            priced = {name: oracle.bind(instance, pieces) for name, oracle in oracles.items()}
            for rank in range(instance.topology.num_devices):
                members = [int(m) for m in (devices == rank).nonzero()[0]]
                out.append({"task": task, "plan": label, "solver": record["solver"], "rank": rank,
                            "objective": record["objective"], "batch": instance.workload.batch_size,
                            "tables": [table_spec(tables[m], placements[m]) for m in members],
                            "predicted_compute_s": {name: _compute(p.device_cost(members)) if members else 0.0
                                                    for name, p in priced.items()}})
    return out


def shard_sets() -> list[dict]:
    """The heaviest pool tables (rows × pooling) at dim 64, whole in HBM, cut into column and row shards,
    and in host memory: read over UVM, or cached in HBM at several load factors."""
    from instances.pool import dlrm_pool

    pool = dlrm_pool()
    heavy = sorted(range(len(pool)), key=lambda i: -pool[i].rows * pool[i].pooling_factor)[:HEAVY_TABLES]
    out = []
    for index in heavy:
        table = pool[index].as_table(HEAVY_DIM, 2)
        variants = [("whole", table, Placement())]
        variants += [(f"columns/{k}", replace(table, dim=table.dim // k), Placement()) for k in (2, 4)]
        variants += [(f"rows/{k}", replace(table, rows=table.rows // k, pooling_factor=table.pooling_factor / k),
                      Placement()) for k in (2, 4, 8)]
        variants += [("uvm", table, Placement(FUSED_UVM))]
        variants += [(f"cached@{lf}", table, Placement(FUSED_UVM_CACHING, lf)) for lf in LOAD_FACTORS]
        out += [{"pool_index": index, "variant": name, "batch": SHARD_BATCH, "tables": [table_spec(t, p)]}
                for name, t, p in variants]
    return out


def prepare(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"plans": plan_sets(), "shards": shard_sets()}) + "\n")


# ---------------------------------------------------------------- run (on the GPU)


def _timed(record: dict, measurement) -> dict:
    return {**{k: v for k, v in record.items() if k != "tables"}, "tables": len(record["tables"]),
            "forward_s": measurement.forward_s, "backward_s": measurement.backward_s,
            "total_s": measurement.total_s, "spread": measurement.spread,
            "forward_runs": list(measurement.forward_runs), "backward_runs": list(measurement.backward_runs),
            "device": measurement.device, "versions": measurement.versions}


def _time_sets(sets: list[dict], protocol: Protocol, workers: int, out: Path, deadline: float) -> int:
    def jobs():
        for number, record in enumerate(sets):
            pairs = [spec_table(s) for s in record["tables"]]
            if pairs:
                yield Job(number, tuple(t for t, _ in pairs), record["batch"], protocol, tuple(p for _, p in pairs))
    done = 0
    with out.open("a") as handle:
        for job, measurement in measure_many(jobs(), workers):
            handle.write(json.dumps(_timed(sets[job.tag], measurement)) + "\n")
            handle.flush()
            done += 1
            if time.monotonic() > deadline:
                break
    return done


def probe() -> dict:
    import torch

    device, versions = environment()
    properties = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout if properties else ""
    return {"device": device, "versions": versions, "python": sys.version.split()[0],
            "multiprocessors": getattr(properties, "multi_processor_count", None),
            "l2_bytes": getattr(properties, "L2_cache_size", None),
            "memory_bytes": getattr(properties, "total_memory", None), "nvidia_smi": smi}


def run(spec_path: Path, out: Path, seconds: float, workers: int, batch: int, combos: int, seed: int) -> None:
    start = time.monotonic()
    deadline = start + seconds
    out.mkdir(parents=True, exist_ok=True)
    spec = json.loads(spec_path.read_text())
    protocol = Protocol()
    (out / "env.json").write_text(json.dumps(probe(), indent=1) + "\n")
    for name in ("plans", "shards"):
        count = _time_sets(spec[name], protocol, workers, out / f"{name}.jsonl", deadline)
        print(f"{name}: {count}/{len(spec[name])} sets timed at {time.monotonic() - start:.0f} s", flush=True)
    written = 0
    with (out / "costs.jsonl").open("a") as handle:
        for record in measured_records(combinations(combos, 15, seed), batch, replace(protocol, batch=batch),
                                       workers, deadline):
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            written += 1
            if written % 100 == 0:
                print(f"dataset: {written} combinations at {time.monotonic() - start:.0f} s", flush=True)
    print(f"dataset: {written} combinations at {time.monotonic() - start:.0f} s", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the sets to time, with the estimators' predictions")
    p.add_argument("-o", "--output", type=Path, required=True)
    r = sub.add_parser("run", help="time the prepared sets, then a cost dataset until the deadline")
    r.add_argument("spec", type=Path)
    r.add_argument("-o", "--output", type=Path, required=True, help="folder for env.json and the .jsonl files")
    r.add_argument("--seconds", type=float, default=420.0, help="time after which nothing new is started")
    r.add_argument("--workers", type=int, default=12, help="processes that build inputs ahead")
    r.add_argument("--batch", type=int, default=16384, help="batch of the dataset's combinations")
    r.add_argument("--combos", type=int, default=6000, help="combinations drawn (the deadline may stop sooner)")
    r.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.output)
    else:
        run(args.spec, args.output, args.seconds, args.workers, args.batch, args.combos, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
