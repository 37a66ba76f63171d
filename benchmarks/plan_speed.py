"""`plan` against TorchRec's planner, both judged by TorchRec's estimator: on every instance of a set, our
portfolio at a small budget and TorchRec's EmbeddingShardingPlanner, side by side in one process (torchrec
imported once beforehand; neither side's time includes it), with each side's planning time and plan cost.
Writes the records (JSON lines) and a page.

    python -m benchmarks.plan_speed instances/sets/autoshard-n80-k8-torchrec-test --budget 1
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from costmodels import get_oracle
from instances import load_instances
from instances import InstanceError
from instances.io import check_output_path, write_text_atomic
from interop.common import load_torchrec
from interop.peer import plan_with_torchrec
from shardbench.api import plan as shardbench_plan
from shardbench.args import EXIT_ERROR, POSITIVE, TIME_LIMIT, Parser, gap_fraction
from solvers.base import wall_limit

from .environment import provenance
from .pages import revisions_line
from .suite import PAGES, STORES

def measure(instance, budget: float, gap: float = 0.0) -> dict:
    """One instance: TorchRec's planner, then `plan` at `budget` (stopping once certified within `gap`),
    each rated by the torchrec oracle."""
    judge = get_oracle("torchrec")
    started = time.monotonic()
    theirs, _ = plan_with_torchrec(instance)
    their_seconds = time.monotonic() - started
    started = time.monotonic()
    ours = shardbench_plan(instance, oracle="torchrec", budget=budget, gap=gap)
    our_seconds = time.monotonic() - started
    if ours.plan is None:
        return {"instance": instance.id, "budget": budget, "gap_target": gap, "status": "no_plan",
                "reason": ours.no_plan_reason,
                "torchrec_seconds": their_seconds, "seconds": our_seconds, **provenance()}
    return {"instance": instance.id, "budget": budget, "gap_target": gap, "status": "plan", "solver": ours.solver,
            "objective": judge.plan_cost(instance, ours.plan), "grid_objective": ours.grid_objective,
            "bound": ours.bound, "gap": ours.gap,
            "pricing_seconds": ours.pricing_s, "seconds": our_seconds,
            "torchrec_objective": judge.plan_cost(instance, theirs), "torchrec_seconds": their_seconds,
            **provenance()}


def page(records: list[dict], source: str) -> str:
    budget, gap = records[0]["budget"], records[0].get("gap_target", 0.0)
    planned = [r for r in records if r["status"] == "plan"]
    flags = f"--budget {budget:g}" + (f" --gap {gap:g}" if gap else "")
    lines = [f"#### `plan {flags}` against TorchRec's planner ({source})", "",
             "Both judged by TorchRec 1.8's estimator (max over ranks of Σ shard perf, ms), run one after the other "
             "in one process with torchrec imported beforehand. `plan` time: wall of the whole portfolio (pricing "
             "the options, every member, re-rating the plan); TorchRec: its `plan()` call. The gap is the plan's on the "
             "options' grid of load factors, before `plan` re-sized its caches (the bound holds over that grid).", "",
             "| instance | ours (ms) | TorchRec (ms) | TorchRec / ours | gap to bound | ours (s) | TorchRec (s) "
             "| time ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["status"] != "plan":
            lines.append(f"| {r['instance']} | **no plan**: {r['reason']} | | | | {r['seconds']:.2f} "
                         f"| {r['torchrec_seconds']:.2f} | |")
            continue
        gap = "n/a" if r["gap"] is None else f"{r['gap']:.3%}"
        lines.append(f"| {r['instance']} | {r['objective']:.4f} | {r['torchrec_objective']:.4f} "
                     f"| {r['torchrec_objective'] / r['objective']:.4f}× | {gap} | {r['seconds']:.2f} "
                     f"| {r['torchrec_seconds']:.2f} | {r['seconds'] / r['torchrec_seconds']:.3f} |")
    if planned:
        ratio = np.array([r["torchrec_objective"] / r["objective"] for r in planned])
        times = np.array([r["seconds"] / r["torchrec_seconds"] for r in planned])
        over = sum(r["seconds"] > wall_limit(budget) for r in records)
        lines += ["", f"Plans: {len(planned)}/{len(records)}. Ours no worse than TorchRec's on "
                      f"{int((ratio >= 1 - 1e-9).sum())}/{len(records)}; TorchRec's plan / ours median "
                      f"{np.median(ratio):.4f}× (min {ratio.min():.4f}×). Our time / TorchRec's: median "
                      f"{np.median(times):.3f} (max {times.max():.3f}); past 1.1 × budget + 2 s: {over}/{len(records)}."]
    lines += ["", revisions_line(records)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.plan_speed", description=__doc__.splitlines()[0])
    parser.add_argument("instances", help="an instance set folder")
    parser.add_argument("--budget", type=TIME_LIMIT, default=1.0, help="plan's budget, seconds")
    parser.add_argument("--gap", type=gap_fraction, default=0.0,
                        help="plan's --gap: a fraction of the bound, or a percentage")
    parser.add_argument("--limit", type=POSITIVE, default=None, help="only the first N instances (default: all)")
    parser.add_argument("--store", type=Path, help="records written here (default: "
                        "benchmarks/results/plan-speed-SET.jsonl, SET the folder's name)")
    parser.add_argument("-o", "--output", type=Path, help="the page (default: docs/results/plan-speed-SET.md)")
    args = parser.parse_args(argv)
    name = Path(args.instances).name
    store = args.store or STORES / f"plan-speed-{name}.jsonl"
    output = args.output or PAGES / f"plan-speed-{name}.md"
    try:
        instances = load_instances(args.instances)[:args.limit]
        for path in (store, output):
            check_output_path(path, "--store" if path == store else "--output")
    except (InstanceError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    load_torchrec()
    records = [measure(instance, args.budget, args.gap) for instance in instances]
    write_text_atomic(store, "".join(json.dumps(r) + "\n" for r in records))
    write_text_atomic(output, page(records, args.instances))
    print(page(records, args.instances))
    return 0


if __name__ == "__main__":
    sys.exit(main())
