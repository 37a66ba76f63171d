"""The row-level commands of the CLI: `shardbench flexshard` (FlexShard tiering of an instance's sequence
tables) and `shardbench buckets` (bucket ranges and resharding for a collision-free table)."""
from __future__ import annotations

import argparse
import io
from dataclasses import asdict

import numpy as np

from costmodels.flexshard import FlexParams
from instances import Instance, InstanceError, PlanError, load_instance
from instances.io import check_output_path, write_bytes_atomic, write_json_atomic
from instances.memory import format_bytes
from instances.model import BucketPlan, TieringPlan
from instances.rowdist import row_source
from solvers.buckets import (
    access_per_bucket,
    even_split,
    optimal_partition,
    range_loads,
    rehash_rows_moved,
    reshard,
    rows_per_bucket,
)
from solvers.flexshard import FlexShard, RowTable, Tiering

from .args import POSITIVE, examples, number


def flexshard_for(instance: Instance, dp_multiplier: float) -> FlexShard:
    tables = [RowTable(t.name, row_source(t), t.dim, t.dtype_bytes) for t in instance.tables
              if not t.pooled and t.row_distribution is not None]
    if not tables:
        raise InstanceError("tables", "no sequence table (pooled: false) with a row_distribution to tier")
    return FlexShard(tables, FlexParams.from_instance(instance, dp_multiplier))


def describe(t: Tiering) -> list[str]:
    lines = [f"{t.mode}: merged coverage DP {t.merged_coverage['DP']:.1%}, Flex {t.merged_coverage['Flex']:.1%}, "
             f"RW {t.merged_coverage['RW']:.1%}",
             f"  global all-to-all per GPU per direction: {format_bytes(t.global_a2a_bytes)} vs RW "
             f"{format_bytes(t.rw_global_a2a_bytes)} ({1 - t.global_a2a_bytes / t.rw_global_a2a_bytes:.1%} less); "
             f"intra-node {format_bytes(t.intra_a2a_bytes)}; all-reduce {format_bytes(t.allreduce_bytes)}",
             f"  memory per GPU {format_bytes(t.memory_per_gpu, 3)} vs RW {format_bytes(t.rw_memory_per_gpu, 3)}; "
             "communication "
             f"{t.communication_seconds * 1e3:.2f} ms vs RW {t.rw_communication_seconds * 1e3:.2f} ms"]
    for i, name in enumerate(t.tables):
        lines.append(f"  {name}: DP {t.dp_rows[i]} rows ({t.coverage['DP'][i]:.1%}), Flex {t.flex_rows[i]} "
                     f"({t.coverage['Flex'][i]:.1%}), RW {t.rw_rows[i]} ({t.coverage['RW'][i]:.1%})")
    return lines


def plot_frontier(shard: FlexShard, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    memory, comm = shard.frontier()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(comm * 1e3, memory / 2**30, color="tab:blue")
    for label, prefix in (("A", shard.point_a()), ("B", shard.dp_within(0.0)), ("C", shard.point_c()),
                          ("D", shard.rows.whole())):
        ax.plot(shard.rows.weight(prefix, shard.lines["DP:communication"]) * 1e3,
                shard.rows.weight(prefix, shard.lines["DP:memory"]) / 2**30, "o", color="tab:red")
        ax.annotate(label, (shard.rows.weight(prefix, shard.lines["DP:communication"]) * 1e3,
                            shard.rows.weight(prefix, shard.lines["DP:memory"]) / 2**30),
                    textcoords="offset points", xytext=(6, 6))
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_xlabel("marginal communication vs RW (ms per iteration per GPU)")
    ax.set_ylabel("marginal memory vs RW (GiB per GPU)")
    ax.set_title(title)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, image.getvalue())


def cmd_flexshard(args: argparse.Namespace) -> int:
    if args.output:
        check_output_path(args.output, "-o")
    if args.plot:
        check_output_path(args.plot, "--plot")
        if not args.plot.endswith(".png"):
            raise InstanceError("--plot", f"must name a .png file, got {args.plot!r}")
    instance = load_instance(args.instance)
    shard = flexshard_for(instance, args.dp_multiplier)
    results = [shard.two_tier(), shard.three_tier()]
    if args.extra_memory is not None:
        hybrid = shard.least_communication(args.extra_memory)
        results.append(shard.report(f"least-communication DP/RW within {format_bytes(args.extra_memory)} extra per GPU",
                                     hybrid, hybrid))
    plans = []
    for result in results:
        plan = TieringPlan(instance.id, result.tables, result.dp_rows, result.flex_rows)
        fits = True
        try:
            plan.validate(instance, result.memory_per_gpu)
        except PlanError as exc:  # a design that does not fit is shown, flagged, and never written
            fits = False
            print(f"note: {result.mode} does not fit: {exc}")
        plans.append((result, plan, fits))
    bp = results[0].breakpoints
    print(f"{instance.id}: {shard.rows.total_rows} rows in {len(shard.rows.tables)} sequence table(s); "
          f"breakpoints p: DP memory-neutral {bp['dp_memory']:.4g}, DP comm-neutral {bp['dp_comm']:.4g}, "
          f"Flex comm-neutral {bp['flex_comm'] if bp['flex_comm'] is None else format(bp['flex_comm'], '.4g')}")
    print("  Fig. 5 points (DP prefix rows): " + ", ".join(f"{k} {v}" for k, v in results[0].points.items()))
    for result, _, _ in plans:
        print("\n".join(describe(result)))
    if args.plot:
        plot_frontier(shard, args.plot, f"{instance.id}: replicate the top rows (DP) vs RW")
        print(f"frontier plot: {args.plot}")
    if args.output:
        chosen = [(r, p) for r, p, fits in plans if fits]
        if len(chosen) != len(plans):
            raise InstanceError(args.instance, "not every tiering fits the memory capacity; nothing written")
        write_json_atomic(args.output, {"schema_version": 1, "instance_id": instance.id, "plans": [
            {"kind": p.kind, "mode": r.mode, "tables": list(p.tables), "dp_rows": list(p.dp_rows),
             "flex_rows": list(p.flex_rows), "memory_per_gpu": r.memory_per_gpu,
             "global_a2a_bytes": r.global_a2a_bytes, "rw_global_a2a_bytes": r.rw_global_a2a_bytes,
             "coverage": r.merged_coverage} for r, p in chosen]})
        print(f"plans written to {args.output}")
    return 0


def cmd_buckets(args: argparse.Namespace) -> int:
    if args.output:
        check_output_path(args.output, "-o")
    instance = load_instance(args.instance)
    candidates = [t for t in instance.tables if t.buckets is not None and (args.table in (None, t.name))]
    if not candidates:
        raise InstanceError("tables", "no table with a bucket spec" + (f" named {args.table!r}" if args.table else ""))
    table = candidates[0]
    spec = table.buckets
    if args.balance == "access" and table.row_distribution is None:
        raise InstanceError(f"table {table.name}.row_distribution", "--balance access needs the table's row "
                            "distribution; this table has none")
    if spec.count > table.rows:
        raise InstanceError(f"table {table.name}.buckets.count", f"{spec.count} buckets for {table.rows} rows")
    rows = rows_per_bucket(table.rows, spec.count, spec.mapping)
    weights = {"rows": rows}
    if table.row_distribution is not None:
        weights["access"] = access_per_bucket(row_source(table), spec.count, spec.mapping)
    row_bytes = table.dim * table.dtype_bytes
    print(f"{instance.id} / {table.name}: {table.rows} rows in {spec.count} {spec.mapping} buckets, "
          f"{args.trainers} trainers")
    layouts = {}
    for name, load in weights.items():
        even = even_split(spec.count, args.trainers)
        best = optimal_partition(load, args.trainers)
        layouts[name] = best
        print(f"  balance by {name}: even split max {range_loads(load, even).max():.6g}, optimal ranges max "
              f"{range_loads(load, best).max():.6g} (perfect {load.sum() / args.trainers:.6g})")
    plan = BucketPlan(instance.id, table.name, tuple(int(b) for b in layouts[args.balance]),
                      tuple(range(args.trainers))).validate(instance)
    if args.reshard_to:
        old = np.array(plan.boundaries)
        target = even_split(spec.count, args.reshard_to) if args.balance == "rows" else \
            optimal_partition(weights[args.balance], args.reshard_to)
        moved = reshard(old, target, rows)
        naive = rehash_rows_moved(table.rows, args.trainers, args.reshard_to)
        print(f"  reshard {args.trainers} -> {args.reshard_to} trainers: {moved.rows_moved} rows "
              f"({format_bytes(moved.rows_moved * row_bytes)}, {moved.rows_moved / table.rows:.1%}) move, vs {naive} "
              "rows "
              f"({format_bytes(naive * row_bytes)}, {naive / table.rows:.1%}) when every id is re-hashed")
        plan = BucketPlan(instance.id, table.name, tuple(int(b) for b in target),
                          tuple(int(t) for t in moved.trainer_of_range)).validate(instance)
    if args.output:
        write_json_atomic(args.output, {"schema_version": 1, **{k: v for k, v in asdict(plan).items()}})
        print(f"plan written to {args.output}")
    return 0


def add_commands(sub) -> None:
    flex = sub.add_parser("flexshard", help="FlexShard row tiering of an instance's sequence tables",
                          epilog=examples("shardbench flexshard instance.json --plot frontier.png -o tiers.json"))
    flex.add_argument("instance", help="the instance JSON (its sequence tables are tiered)")
    flex.add_argument("--extra-memory", type=number(float, 0.0, what="bytes"), help="also the least-communication "
                      "DP/RW hybrid within this many extra bytes per GPU over RW (default: not computed)")
    flex.add_argument("--dp-multiplier", type=number(float, 0.0, low_open=True, what="multiplier"), default=6.0,
                      help="DP memory multiplier (the paper's)")
    flex.add_argument("--plot", help="write the memory/communication frontier (Fig. 5) as PNG (default: not drawn)")
    flex.add_argument("-o", "--output", help="write the tiering plans as JSON (default: not written)")
    flex.set_defaults(func=cmd_flexshard)
    buckets = sub.add_parser("buckets", help="bucket ranges per trainer and resharding for a collision-free table",
                             epilog=examples("shardbench buckets instance.json --trainers 8 --reshard-to 12 "
                                             "-o buckets.json"))
    buckets.add_argument("instance", help="the instance JSON")
    buckets.add_argument("--table", help="the table to plan (default: the first with a bucket spec)")
    buckets.add_argument("--trainers", type=POSITIVE, required=True, help="trainers the buckets are split over")
    buckets.add_argument("--reshard-to", type=POSITIVE, help="plan a resharding to this many trainers (default: none)")
    buckets.add_argument("--balance", choices=("rows", "access"), default="rows",
                         help="balance the trainers' rows or their accesses")
    buckets.add_argument("-o", "--output", help="write the bucket plan as JSON (default: not written)")
    buckets.set_defaults(func=cmd_buckets)
