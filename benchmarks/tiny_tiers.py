"""Tiny tiered instances (2–4 tables, 2–4 devices, HBM short, host memory beside it) planned by `plan` at a
2 s budget and held to their optimum: found by brute force where the plans are few enough, else proven by
the exact model; and every plan checked against TorchRec's own storage estimate, as export checks it.
Run: `.venv/bin/python -m benchmarks.tiny_tiers [--count N]` (writes the store and the page)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

import shardbench
from costmodels import get_oracle
from instances import Instance, Table, Topology, Workload
from instances.io import write_text_atomic
from instances.options import OptionPieces, enumerate_options
from solvers import Budget, run_solver

from .brute import brute_force_over_options, placements
from .environment import provenance
from .suite import PAGES, STORES

BUDGET = 2.0
ORACLES = ("analytic", "torchrec")
BRUTE_FORCE_PLANS = 200_000  # beyond this many plans the exact model's proof stands in for brute force
WITHIN = 0.01
STORE = STORES / "tiny-tiers.jsonl"
PAGE = PAGES / "tiny-tiers.md"


def tiny_instance(seed: int) -> Instance:
    """2–4 tables on 2–4 devices with HBM short of what they need (15–120 %) and host memory beside it;
    every shard's input and output buffers counted, as for a model imported from TorchRec."""
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 5)), int(rng.choice([2, 3, 4]))
    tables = tuple(Table(f"t{j}", int(rng.integers(100, 5000)), int(rng.choice([8, 16, 32])), 2,
                         float(rng.uniform(0.5, 20.0)), (1.0,) + (0.0,) * 16) for j in range(n))
    need = sum(t.weight_bytes for t in tables)
    hbm = max(1 << 20, int(need * rng.uniform(0.15, 1.2) / k))
    host = max(1 << 20, int(need * rng.uniform(0.5, 2.0)))
    types = ("table_wise", "column_wise", "row_wise", "data_parallel") if rng.random() < 0.5 else ("table_wise",)
    return Instance(f"tiny-tiers-{seed}", tables, Topology(1, k, hbm, host_memory_bytes=host),
                    Workload(batch_size=64, io_buffers=True), sharding_types=types).validate()


def plan_count(instance: Instance) -> int:
    """How many plans brute force would look at."""
    options = enumerate_options(instance)
    pieces = OptionPieces.build(instance, options)
    per_table = [0] * instance.num_tables
    for o, option in enumerate(options):
        per_table[option.table] += len(placements(pieces, o, instance))
    return int(np.prod(per_table, dtype=float))


def reference(instance: Instance, oracle_name: str) -> tuple[float | None, str]:
    """The optimum over the enumerated options (None: no plan fits) and how it is known."""
    oracle = get_oracle(oracle_name)
    if plan_count(instance) <= BRUTE_FORCE_PLANS:
        return brute_force_over_options(instance, oracle), "brute force"
    exact = run_solver("cpsat", instance, oracle, Budget(60.0), 0)
    if exact.status.value == "optimal":
        return exact.objective, "exact model (proven)"
    if exact.status.value == "infeasible":
        return None, "exact model (proven infeasible)"
    raise RuntimeError(f"{instance.id}: the exact model proved nothing in 60 s ({exact.status.value})")


def measure(seed: int, oracle_name: str) -> dict:
    from interop.oracle import TorchRecOracle

    instance = tiny_instance(seed)
    optimum, how = reference(instance, oracle_name)
    result = shardbench.plan(instance, oracle_name, BUDGET, resize_caches=False)  # against the grid's optimum
    record = {"instance": instance.id, "oracle": oracle_name, "budget": BUDGET, "optimum": optimum,
              "reference": how, "objective": result.objective, "solver": result.solver, "wall_s": result.wall_s,
              "no_plan_reason": result.no_plan_reason, **provenance()}
    if result.plan is not None:
        used = TorchRecOracle().storage_per_device(instance, result.plan)[:, 0].max()
        record["torchrec_hbm_peak"] = int(used)
        record["hbm_capacity"] = instance.topology.memory_bytes
    return record


def page(records: list[dict]) -> str:
    lines = ["# Tiny tiered instances: `plan` at 2 s against the optimum", "",
             "2–4 tables on 2–4 devices, HBM at 15–120 % of what the tables need, host memory beside it, each "
             "shard's input and output buffers counted (`benchmarks/tiny_tiers.py`); the optimum over the "
             "enumerated options by brute force where at most "
             f"{BRUTE_FORCE_PLANS:,} plans, else proven by the exact model (CP-SAT, 60 s). Every plan `plan` "
             "returned is checked against TorchRec's own storage estimate.", "",
             "| oracle | instances | feasible | `plan` found a plan | within 1 % of the optimum | median ratio | worst "
             "ratio | above HBM by TorchRec's estimate | optimum by brute force |", "|---|---|---|---|---|---|---|---|---|"]
    for oracle in ORACLES:
        rows = [r for r in records if r["oracle"] == oracle]
        feasible = [r for r in rows if r["optimum"] is not None]
        found = [r for r in feasible if r["objective"] is not None]
        ratios = [r["objective"] / r["optimum"] if r["optimum"] > 0 else 1.0 for r in found]
        within = sum(ratio <= 1 + WITHIN for ratio in ratios)
        over = sum(r.get("torchrec_hbm_peak", 0) > r.get("hbm_capacity", 0) for r in rows if "hbm_capacity" in r)
        brute = sum(r["reference"] == "brute force" for r in rows)
        lines.append(f"| `{oracle}` | {len(rows)} | {len(feasible)} | {len(found)}/{len(feasible)} | "
                     f"{within}/{len(feasible)} | {statistics.median(ratios) if ratios else float('nan'):.4f} | "
                     f"{max(ratios, default=float('nan')):.4f} | {over} | {brute}/{len(rows)} |")
    wrongly = [r for r in records if r["optimum"] is not None and r["objective"] is None]
    if wrongly:
        lines += ["", "No plan where one fits:", *(f"- {r['instance']} ({r['oracle']}): {r['no_plan_reason']}"
                                                  for r in wrongly)]
    lines += ["", f"Numbers from revision {records[0]['revision']}." if records else ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=40, help="instances (seeds 0..count-1)")
    args = parser.parse_args()
    records = []
    for seed in range(args.count):
        for oracle in ORACLES:
            records.append(measure(seed, oracle))
            print(json.dumps({k: records[-1][k] for k in ("instance", "oracle", "optimum", "objective", "solver")}),
                  flush=True)
    write_text_atomic(STORE, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    write_text_atomic(PAGE, page(records))
    print(page(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
