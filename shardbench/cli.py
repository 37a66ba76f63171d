"""The `shardbench` command line: sample and inspect instances, solve one, run a benchmark suite, list
solvers and oracles. Errors print one line naming the problem and exit non-zero, leaving no output file."""
from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # as a shell reports a command ended by SIGINT

# Ctrl-C while the command is still loading (its imports take a noticeable moment) ends it as Ctrl-C does
# anywhere else: one line, no traceback. The package's own __init__ imports nothing, so this comes first.
try:
    import argparse
    import contextlib
    import functools
    import signal
    import threading
    from pathlib import Path

    import numpy as np

    from costmodels import UnknownOracleError, get_oracle, oracle_names
    from instances import (
        InstanceError,
        PlanError,
        load_instance,
        load_instances,
        load_plan,
        save_instance,
        save_instance_set,
        save_plan,
    )
    from instances.dlrm_loader import load_raw_tables
    from instances.io import check_output_path, plan_file, write_files_atomic, write_json_atomic
    from instances.memory import HBM, describe, format_bytes, format_sizes, storage_fields
    from instances.model import DTYPE_BYTES, LEGACY_SHARDING_TYPES, OPTIMIZERS, Topology, Workload
    from instances.sampler import PROTOCOLS, SPLITS, MemorySpec, TaskSpec, sample_tasks
    from solvers import (
        Budget,
        BudgetError,
        Problem,
        SolverOracleMismatch,
        UnknownSolverError,
        get_solver,
        option_bounds,
        run_solver,
        solver_names,
    )
    from solvers.bounds import gap_to_bound

    from .args import (
        EXIT_ERROR,
        GAP_HELP,
        POSITIVE,
        SEED,
        TIME_LIMIT,
        Parser,
        compute_kernels,
        examples,
        gap_fraction,
        move_budget,
        number,
        sharding_types,
    )
    from .demo import add_command as add_demo_command
    from .planfiles import plan_files, sidecar_path, write_plan_files
    from .pipeline import (
        DEFAULT_ORACLE,
        FALLBACK_ORACLE,
        PlanRequest,
        admit,
        cannot_fit,
        default_oracle,
        narrow,
        plan_request,
        run,
    )
    from .recommend import RecommenderError
    from .rows_cli import add_commands as add_row_commands
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    raise SystemExit(EXIT_INTERRUPTED) from None

EXIT_NO_PLAN = 3
EXIT_TERMINATED = 143  # as a shell reports a command ended by SIGTERM


def _cmd_sample(args: argparse.Namespace) -> int:
    devices = args.devices
    if args.devices_per_node is not None:
        if devices is not None and devices != args.nodes * args.devices_per_node:
            raise InstanceError("--devices", f"{devices} is not --nodes × --devices-per-node = "
                                f"{args.nodes * args.devices_per_node}")
        devices = args.nodes * args.devices_per_node
    spec = TaskSpec(protocol=args.protocol, num_tables=args.tables, split=args.split, seed=args.seed,
                    num_devices=devices, count=args.count, unseen_ratio=args.unseen_ratio,
                    memory=MemorySpec(args.capacity_bytes, args.tightness, args.host_memory_bytes), dtype=args.dtype,
                    workload=Workload(batch_size=args.batch_size, optimizer=args.optimizer, dtype=args.dtype),
                    nodes=args.nodes, sharding_types=args.sharding_types, intra_node_bw=args.intra_node_bw,
                    inter_node_bw=args.inter_node_bw)
    pool = load_raw_pool(args.pool) if args.pool else None
    tasks = sample_tasks(spec, pool)
    description = {"protocol": spec.protocol, "split": spec.split, "seed": spec.seed, "num_tables": spec.num_tables,
                   "num_devices": tasks[0].num_devices, "memory_capacity_bytes": tasks[0].topology.memory_bytes
                   if spec.memory.tightness is None else None, "tightness": spec.memory.tightness,
                   "unseen_ratio": spec.unseen_ratio if spec.protocol == "unseen" else None,
                   "nodes": spec.nodes, "sharding_types": list(spec.sharding_types),
                   "batch_size": spec.workload.batch_size,
                   "pool": str(args.pool) if args.pool else "dlrm_t856 (embedded)"}
    folder = save_instance_set(tasks, args.output, description)
    print(f"wrote {len(tasks)} instances to {folder}")
    return 0


def load_raw_pool(path: str):
    from instances.io import read_json
    from instances.pool import pool_entry_from_record

    records = read_json(path)
    if not isinstance(records, list) or not records:
        raise InstanceError(str(path), "a pool file must be a non-empty JSON list of table records")
    return tuple(pool_entry_from_record(i, r, str(path)) for i, r in enumerate(records))


def _cmd_import_raw(args: argparse.Namespace) -> int:
    check_output_path(args.output, "-o")
    tables = load_raw_tables(args.file)
    records = [{"row": t.rows, "pooling_factor": t.pooling_factor,
                **{f"bin_{b}": share for b, share in enumerate(t.reuse_bins)}} for t in tables]
    write_json_atomic(args.output, records)
    print(f"wrote pool of {len(records)} tables to {args.output}")
    return 0


def _cmd_import_torchrec(args: argparse.Namespace) -> int:
    from interop.importer import instance_from_spec, load_spec

    check_output_path(args.output, "-o")
    spec = load_spec(args.spec)
    if isinstance(spec, dict) and "id" not in spec:  # the model's name, as the user named the file
        spec = {**spec, "id": Path(args.spec).stem}
    instance = instance_from_spec(spec)
    save_instance(instance, args.output)
    print(f"wrote {instance.id}: {instance.num_tables} tables on {instance.topology.nodes} node(s) × "
          f"{instance.topology.devices_per_node} devices to {args.output}")
    return 0


def module_path(text: str) -> str:
    """An argparse type: a module's path in a TorchRec model ("" for the model itself, else dotted names)."""
    if text and not all(part.isidentifier() for part in text.split(".")):
        raise argparse.ArgumentTypeError(f"must be a module path such as sparse_arch.embedding_bag_collection, got {text!r}")
    return text


ORACLE_DEFAULT = (f"default: {DEFAULT_ORACLE}, TorchRec's own estimator, or {FALLBACK_ORACLE} where TorchRec cannot "
                  "be imported")
MODULE_PATH_HELP = ("the path of the tables' module in the model, the ShardingPlan's key "
                    "(e.g. sparse_arch.embedding_bag_collection; default: \"\", the model itself)")


def _cmd_export_torchrec(args: argparse.Namespace) -> int:
    from interop.export import to_torchrec

    check_output_path(args.output, "-o")
    sidecar = args.json or sidecar_path(args.output)
    check_output_path(sidecar, "--json")
    if len({Path(p).resolve() for p in (args.plan, args.output, sidecar)}) < 3:
        raise InstanceError("-o", "the outputs must not overwrite the plan (or each other)")
    instance = load_instance(args.instance)
    plan = load_plan(args.plan, instance)
    write_plan_files(to_torchrec(instance, plan, device_type=args.device_type, path=args.module_path), args.output,
                     sidecar, instance, plan)
    print(f"TorchRec ShardingPlan for {instance.num_tables} tables ({', '.join(f'{k} {v}' for k, v in plan.sharding_types().items())}) "
          f"written to {args.output}; readable (each table's ParameterSharding, each device's memory) in {sidecar}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    failed = unfit = 0
    for path in args.paths:
        try:
            instances = load_instances(path)
        except InstanceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
            continue
        reasons = [(instance.id, why) for instance in instances if (why := cannot_fit(instance))]
        for instance_id, why in reasons:
            print(f"error: {path}: {instance_id} cannot fit: {why}", file=sys.stderr)
        unfit += bool(reasons)
        if not reasons:
            print(f"ok: {path} ({len(instances)} instance{'s' if len(instances) != 1 else ''})")
    return EXIT_ERROR if failed else EXIT_NO_PLAN if unfit else 0


def _cmd_show(args: argparse.Namespace) -> int:
    for instance in load_instances(args.path):
        memory = instance.table_storage()[:, HBM]
        rows = np.array([t.rows for t in instance.tables])
        pooling = np.array([t.pooling_factor for t in instance.tables])
        topo = instance.topology
        print(f"{instance.id}: {instance.num_tables} tables on {topo.nodes} node(s) × {topo.devices_per_node} "
              f"devices, {format_bytes(topo.memory_bytes)} of HBM each"
              + (f" and {format_bytes(topo.host_memory_bytes)} of host memory" if topo.host_memory_bytes else ""))
        print(f"  provenance: {instance.provenance or '-'}")
        print(f"  memory: {format_bytes(memory.sum())} in all, "
              f"{memory.sum() / topo.memory_bytes / instance.num_devices:.1%} of capacity; largest table "
              f"{format_bytes(memory.max())}")
        print(f"  rows min/median/max: {rows.min()} / {int(np.median(rows))} / {rows.max()}; "
              f"pooling mean {pooling.mean():.2f}, max {pooling.max():.2f}")
        print(f"  workload: batch {instance.workload.batch_size}, optimizer {instance.workload.optimizer}, "
              f"dtype {instance.workload.dtype}")
    return 0


CLI_NAMES = {"sharding_types": "--sharding-types", "compute_kernels": "--compute-kernels", "solvers": "--solvers",
             "budget": "--budget"}


def _request(args: argparse.Namespace) -> PlanRequest:
    """The planning request the command's arguments make (solve, recommend and plan narrow alike)."""
    return plan_request(load_instance(args.instance), args.oracle, budget=args.budget,
                        gap=getattr(args, "gap", 0.0), solvers=getattr(args, "solvers", None),
                        seed=getattr(args, "seed", 0), sharding_types=args.sharding_types,
                        compute_kernels=args.compute_kernels, rules=getattr(args, "rules", None), names=CLI_NAMES,
                        resize_caches=not getattr(args, "grid_caches", False))


def _say_notes(notes: tuple[str, ...]) -> None:
    for note in notes:
        print(f"note: {note}")


def _cmd_solve(args: argparse.Namespace) -> int:
    if args.output:
        check_output_path(args.output, "-o")
    request = _request(args)
    _say_notes(request.notes)
    instance = narrow(request)
    oracle = get_oracle(request.oracle)
    problem = Problem(instance, oracle)  # priced once: by the solver, then asked for the bounds printed below
    result = run_solver(args.solver, instance, oracle, Budget(args.budget, gap=args.gap), args.seed,
                        problem=problem)
    print(f"{args.solver} on {instance.id} under {oracle.name} ({', '.join(instance.sharding_types)}): "
          f"{result.status.value}")
    if result.reason:
        print(f"  {result.reason}")
    bounds = option_bounds(problem.candidates) if oracle.additive else {}
    if result.lower_bound is not None:
        bounds["best"] = result.lower_bound
    if bounds:
        print("  lower bounds: " + ", ".join(f"{k} {v:.6g}" for k, v in bounds.items()))
    if result.plan is None:
        return EXIT_NO_PLAN
    costs = [c.total for c in oracle.device_costs(instance, result.plan)]
    gap = gap_to_bound(result.objective, result.lower_bound) if result.lower_bound is not None else None
    print(f"  objective (max device cost): {result.objective:.6g} {oracle.unit}; balance "
          f"{min(costs) / max(costs) if max(costs) > 0 else 1.0:.3f}")
    print("  sharding types: " + ", ".join(f"{k} {v}" for k, v in result.plan.sharding_types().items()))
    if gap is not None:
        print(f"  gap to best lower bound: {100 * gap:.4f} %"
              + (" (over the enumerated options)" if result.stats.get("optimal_over") else ""))
    if args.output:
        plan = result.plan
        save_plan(plan, instance, args.output, report={
            "solver": args.solver, "oracle": oracle.name, "status": result.status.value, "seed": args.seed,
            "time_limit": args.budget, "sharding_types": list(instance.sharding_types),
            "objective": result.objective, "lower_bound": result.lower_bound, "gap": gap,
            "optimal_over": result.stats.get("optimal_over"), "device_costs": costs,
            **storage_fields(plan.storage_per_device(instance), instance.topology.capacity)})
        print(f"  plan written to {args.output}")
    return 0


def _cmd_recommend(args: argparse.Namespace) -> int:
    from .recommend import PORTFOLIO_SIZE, Rules
    from .workloads import workload_features

    request = _request(args)
    _say_notes(request.notes)
    admitted = admit(request, narrow(request))
    instance = admitted.instance
    if admitted.unfit:
        print(f"no plan: {instance.id} cannot fit: {admitted.unfit}", file=sys.stderr)
        return EXIT_NO_PLAN
    rules = Rules.load(args.rules) if args.rules else Rules.load()
    features = workload_features(instance, request.oracle, args.budget)
    ranking, source = rules.recommend(features)
    if not ranking:
        print(f"no evidence for a solver that applies to {instance.id} under {request.oracle}", file=sys.stderr)
        return EXIT_ERROR
    chosen = ranking[:PORTFOLIO_SIZE]
    print(f"{instance.id} under {request.oracle}, budget {args.budget:g} s: {features.tables} tables, "
          f"{features.devices} devices in {features.nodes} node(s), HBM tightness {features.tightness:.2f}"
          f"{' with host memory' if features.host_memory else ''}, heaviest table "
          f"{features.heaviest:.2f}× the balanced load, cost CV {features.cost_cv:.2f}, "
          f"{features.split_share:.0%} of tables worth splitting, {'additive' if features.additive else 'non-additive'} oracle")
    print(f"recommended: {chosen[0]['solver']}" + (f"; portfolio (side by side, as `shardbench plan` runs it): "
                                                   f"{' + '.join(r['solver'] for r in chosen)} + best-greedy"))
    print(f"  from {source}: expected regret (over the best plan of any solver) {chosen[0]['mean_regret']:.2%} mean, "
          f"{chosen[0]['max_regret']:.2%} worst; within 1 % on {chosen[0]['within']}/{chosen[0]['workloads']}; "
          f"mean time {chosen[0]['mean_time']:.2f} s")
    print("  candidates there: " + "; ".join(f"{r['solver']} {r['mean_regret']:.2%} ({r['mean_time']:.2f} s)"
                                              for r in ranking))
    print("  nearest workloads in the evidence:")
    for w in rules.nearest(features):
        ranked = sorted(w.results, key=w.regret)
        print(f"    {w.family} {w.instance} {w.oracle} {w.budget:g} s {w.setting}: "
              + ", ".join(f"{s} {'no plan' if w.regret(s) >= 1 else f'+{w.regret(s):.2%}'}" for s in ranked[:4]))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    check_output_path(args.output, "-o")
    if args.torchrec_out:
        check_output_path(args.torchrec_out, "--torchrec-out")
        outputs = {Path(p).resolve() for p in (args.output, args.torchrec_out, sidecar_path(args.torchrec_out))}
        if len(outputs) < 3 or Path(args.instance).resolve() in outputs:
            raise InstanceError("--torchrec-out", "the outputs must not overwrite the instance, the plan or each other")
    report = run(_request(args), echo=print)
    instance, result = report.instance, report.result
    if result.plan is None:
        print(f"no plan: {result.no_plan_reason}", file=sys.stderr)
        return EXIT_NO_PLAN
    # Every output is made in memory first (a plan TorchRec cannot take fails here), then written all or none.
    outputs = {args.output: plan_file(result.plan, instance, report.record)}
    if args.torchrec_out:
        from interop.export import to_torchrec

        sharding_plan = to_torchrec(instance, result.plan, path=args.module_path)
        outputs |= plan_files(sharding_plan, args.torchrec_out, sidecar_path(args.torchrec_out), instance, result.plan)
    write_files_atomic(outputs)
    print(f"plan written to {args.output}")
    if args.torchrec_out:
        print(f"TorchRec ShardingPlan written to {args.torchrec_out} (readable: {sidecar_path(args.torchrec_out)})")
    return 0


REPLAN_NAMES = {"previous_plan": "--from", "move_budget": "--move-budget"}


def _cmd_replan(args: argparse.Namespace) -> int:
    from .replanning import delta_path, frontier, read_old_plan, torchrec_plans, write_frontier

    check_output_path(args.output, "-o")
    if args.frontier:
        for given, flag in ((args.move_budget, "--move-budget"), (args.torchrec_out, "--torchrec-out")):
            if given is not None:
                raise InstanceError(flag, "--frontier spans every move budget from keeping the old plan to a fresh "
                                    "plan, and writes a results page (-o) only")
        _page_outputs(args)
    elif args.move_budget is None:
        raise InstanceError("--move-budget", "is required (a size such as 20GiB, 0 to keep the old plan, or "
                            "unlimited), unless --frontier")
    if args.torchrec_out:
        check_output_path(args.torchrec_out, "--torchrec-out")
        outputs = {Path(p).resolve() for p in (args.output, args.torchrec_out, sidecar_path(args.torchrec_out),
                                               delta_path(args.torchrec_out))}
        if len(outputs) < 4 or {Path(args.instance).resolve(), Path(args.previous).resolve()} & outputs:
            raise InstanceError("--torchrec-out", "the outputs must not overwrite the instance, the plans or each "
                                "other")
    elif Path(args.previous).resolve() == Path(args.output).resolve():
        raise InstanceError("-o", "must not overwrite the old plan (--from)")
    instance = load_instance(args.instance)
    old = read_old_plan(args.previous, instance)
    keep = not args.allow_type_changes
    oracle, notes = (args.oracle, ()) if args.oracle else default_oracle()
    _say_notes(notes)
    if args.frontier:
        front = frontier(instance, old, oracle, args.budget, args.seed, keep, args.solvers, args.gap, echo=print)
        command = " ".join(["shardbench replan", args.instance, "--from", args.previous, "--frontier", "--oracle",
                            oracle, "--budget", f"{args.budget:g}", "--seed", str(args.seed),
                            *(["--gap", f"{args.gap:g}"] if args.gap else []),
                            *(["--allow-type-changes"] if args.allow_type_changes else []), "-o", args.output])
        plot, points = write_frontier(front, args.output, command)
        print(f"frontier written to {args.output} (plot {plot}, points {points})")
        return 0
    previous = old.previous(instance, args.move_budget, keep, REPLAN_NAMES)
    request = PlanRequest(instance, oracle, budget=args.budget, gap=args.gap,
                          solvers=tuple(args.solvers) if args.solvers else None, seed=args.seed, names=CLI_NAMES,
                          previous=previous)
    report = run(request, echo=print)
    result = report.result
    if result.plan is None:
        print(f"no plan: {result.no_plan_reason}", file=sys.stderr)
        return EXIT_NO_PLAN
    # Every output is made in memory first (a plan TorchRec cannot take fails here), then written all or none.
    outputs = {args.output: plan_file(result.plan, report.instance, report.record)}
    why_not = delta = None
    if args.torchrec_out:
        from .planfiles import sharding_plan_bytes

        paths = old.module_paths
        module = args.module_path if args.module_path is not None else paths[0] if len(paths) == 1 else ""
        sharding_plan, delta, why_not = torchrec_plans(report.instance, result, old, previous, module)
        outputs |= plan_files(sharding_plan, args.torchrec_out, sidecar_path(args.torchrec_out), report.instance,
                              result.plan)
        if delta is not None:
            outputs[delta_path(args.torchrec_out)] = sharding_plan_bytes(delta)
    write_files_atomic(outputs)
    print(f"plan written to {args.output}")
    if args.torchrec_out:
        print(f"TorchRec ShardingPlan written to {args.torchrec_out} (readable: {sidecar_path(args.torchrec_out)})")
        if delta is None:
            print(f"no reshard delta: {why_not}")
        else:
            changed = sum(len(module_plan) for _, module_plan in delta.values())
            print(f"reshard delta ({changed} table{'s' if changed != 1 else ''} whose ranks change) written to "
                  f"{delta_path(args.torchrec_out)}: DistributedModelParallel.reshard(shardbench.load_plan(...))")
    return 0


def _page_outputs(args: argparse.Namespace) -> None:
    """A frontier writes a page (.md) with its plot (.png) and points (.json) beside it."""
    page = Path(args.output)
    if page.suffix != ".md":
        raise InstanceError("-o", f"with --frontier, names the results page to write (a .md file), got {args.output!r}")
    for path in (page.with_suffix(".png"), page.with_suffix(".json")):
        check_output_path(path, "-o")
    if {Path(args.instance).resolve(), Path(args.previous).resolve()} & \
            {p.resolve() for p in (page, page.with_suffix(".png"), page.with_suffix(".json"))}:
        raise InstanceError("-o", "the page, plot and points must not overwrite the instance or the old plan")


def _cmd_show_plan(args: argparse.Namespace) -> int:
    instance = load_instance(args.instance)
    plan = load_plan(args.plan, instance)
    name, notes = (args.oracle, ()) if args.oracle else default_oracle()
    _say_notes(notes)
    oracle = get_oracle(name)
    costs = oracle.device_costs(instance, plan)
    memory = plan.storage_per_device(instance)
    capacity = instance.topology.capacity
    totals = [c.total for c in costs]
    types = ", ".join(f"{k} {v}" for k, v in plan.sharding_types().items())
    print(f"plan for {instance.id}: {instance.num_tables} tables ({types}) on {instance.num_devices} devices "
          f"({instance.topology.nodes} node(s) × {instance.topology.devices_per_node})")
    print(f"under {oracle.name}: max device cost {max(totals):.6g} {oracle.unit}, balance "
          f"{min(totals) / max(totals) if max(totals) > 0 else 1.0:.3f}; peak memory {describe(memory.max(axis=0), capacity)}")
    print("compute kernels: " + ", ".join(f"{k} {v}" for k, v in plan.kernels().items()))
    print(_torchrec_storage_line(instance, plan))
    if not args.brief:
        for table, sharding in zip(instance.tables, plan.tables):
            devices = sorted({shard.device for shard in sharding.shards})
            cache = f", load factor {sharding.cache_load_factor:g}" if sharding.cache_load_factor is not None else ""
            print(f"table {table.name}: {sharding.sharding_type}, {sharding.compute_kernel}{cache}, on device"
                  f"{'s' if len(devices) > 1 else ''} {', '.join(map(str, devices))}")
    shards: list[list[str]] = [[] for _ in range(instance.num_devices)]
    for table, sharding in zip(instance.tables, plan.tables):
        for shard in sharding.shards:
            part = ""
            if sharding.sharding_type in ("row_wise", "table_row_wise"):
                part = f" rows {shard.rows[0]}:{shard.rows[1]}"
            elif sharding.sharding_type in ("column_wise", "table_column_wise"):
                part = f" cols {shard.cols[0]}:{shard.cols[1]}"
            elif sharding.sharding_type == "grid_shard":
                part = f" rows {shard.rows[0]}:{shard.rows[1]} cols {shard.cols[0]}:{shard.cols[1]}"
            shards[shard.device].append(f"{table.name} {sharding.sharding_type}{part}")
    for d, (cost, used) in enumerate(zip(costs, memory)):
        breakdown = (f" (forward {cost.forward_compute:.4g}, backward {cost.backward_compute:.4g}, forward comm "
                     f"{cost.forward_comm:.4g}, backward comm {cost.backward_comm:.4g})" if oracle.has_breakdown else "")
        print(f"device {d}: cost {cost.total:.6g}{breakdown}; memory {describe(used, capacity)}; "
              f"{len(shards[d])} shards")
        if not args.brief:
            print("  " + "; ".join(shards[d]))
    return 0


def _torchrec_storage_line(instance, plan) -> str:
    """The plan's peak HBM by TorchRec's own storage estimate (what export checks), against a device's."""
    try:
        from interop.oracle import TorchRecOracle

        peak = int(TorchRecOracle().storage_per_device(instance, plan)[:, HBM].max())
    except ImportError as exc:  # TorchRec not installed: say so instead of the check
        return f"by TorchRec's storage estimate: not checked ({exc})"
    peak_text, capacity_text = format_sizes(peak, instance.topology.memory_bytes)
    verdict = "fits" if peak <= instance.topology.memory_bytes else "OVER: export refuses this plan"
    return f"by TorchRec's storage estimate: peak HBM {peak_text} of {capacity_text} per device ({verdict})"


def _cmd_solvers(args: argparse.Namespace) -> int:
    names = solver_names()
    width = max(len(n) for n in (*names, "name")) + 1
    print(f"{'name':<{width}} {'exact':<6} {'additive':<9} {'stochastic':<11} {'splits':<8} description")
    for name in names:
        info = get_solver(name)
        print(f"{name:<{width}} {'yes' if info.exact else 'no':<6} {'needs' if info.needs_additive else 'any':<9} "
              f"{'yes' if info.stochastic else 'no':<11} {'yes' if info.splits else 'whole':<8} {info.description}")
    return 0


def _cmd_oracles(args: argparse.Namespace) -> int:
    names = oracle_names()
    width = max(len(n) for n in (*names, "name")) + 1
    print(f"{'name':<{width}} {'additive':<9} {'unit':<13} description")
    for name in names:
        try:
            oracle = get_oracle(name)
        except (FileNotFoundError, ImportError, RuntimeError) as exc:
            print(f"{name:<{width}} {'-':<9} {'-':<13} unavailable here: {exc}")
            continue
        print(f"{name:<{width}} {'yes' if oracle.additive else 'no':<9} {oracle.unit:<13} {oracle.description}")
    return 0


DESCRIPTION = """Plan the sharding of embedding tables (what TorchRec's planner decides): import a model as an
instance, plan it with a portfolio of solvers under a cost oracle, and export the plan TorchRec runs.
The benchmark harness's commands (bench, measure, train, summarize, refit-recommender) compare the
solvers and refit the planner choice."""


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    """The command line; `plugins` adds the commands of the installed command sets (the harness's)."""
    parser = Parser(prog="shardbench", description=DESCRIPTION, epilog=examples(
        "shardbench instances import-torchrec model.toml -o instance.json",
        "shardbench plan instance.json -o plan.json --torchrec-out plan.pt",
        "shardbench <command> --help"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    add_demo_command(sub)  # first in the help: the real job on the shipped example

    inst = sub.add_parser("instances", help="sample, import, validate and show instances",
                          description="Sample, import, validate and show instances.",
                          epilog=examples("shardbench instances import-torchrec model.toml -o instance.json",
                                          "shardbench instances validate instance.json")).add_subparsers(
        dest="instances_command", required=True, metavar="command")
    sample = inst.add_parser("sample", help="sample a protocol's tasks into an instance-set folder",
                             epilog=examples("shardbench instances sample --tables 40 --devices 4 --count 5 -o set40"))
    sample.add_argument("--protocol", choices=PROTOCOLS, default="autoshard", help="the papers' sampling protocol")
    sample.add_argument("--tables", type=POSITIVE, required=True, help="tables per task")
    sample.add_argument("--devices", type=POSITIVE, help="devices per task (default: tables/10 for AutoShard, 4 for "
                        "DreamShard)")
    sample.add_argument("--nodes", type=POSITIVE, default=1, help="nodes the devices are spread over")
    sample.add_argument("--devices-per-node", type=POSITIVE, help="devices per node (then devices = nodes × this; "
                        "default: devices / nodes)")
    sample.add_argument("--sharding-types", type=sharding_types, default=LEGACY_SHARDING_TYPES,
                        help="allowed sharding types, comma-separated, or 'all'")
    sample.add_argument("--host-memory-bytes", type=POSITIVE, help="host memory (DDR) per device, bytes: tables may "
                        "then live there (fused_uvm, fused_uvm_caching), and --tightness may be below 1 (default: "
                        "none)")
    bandwidth = number(float, 1.0, 1e18, what="bytes per second")
    sample.add_argument("--intra-node-bw", type=bandwidth, default=Topology.intra_node_a2a_bw,
                        help="all-to-all bandwidth inside a node, bytes/s")
    sample.add_argument("--inter-node-bw", type=bandwidth, default=Topology.inter_node_a2a_bw,
                        help="all-to-all bandwidth between nodes, bytes/s")
    sample.add_argument("--split", choices=SPLITS, default="test", help="which split of the table pool to draw from")
    sample.add_argument("--count", type=POSITIVE, help="keep only the first COUNT tasks of the split (default: all)")
    sample.add_argument("--seed", type=SEED, default=0, help="sampling seed")
    sample.add_argument("--unseen-ratio", type=number(float, 0, 1, what="ratio"), default=1.0,
                        help="share of unseen tables (unseen protocol)")
    memory = sample.add_mutually_exclusive_group()
    memory.add_argument("--capacity-bytes", type=POSITIVE, help="memory per device, bytes (default: 10 GiB)")
    memory.add_argument("--tightness", type=number(float, 0, 1e6, low_open=True, what="factor"),
                        help="memory per device as a factor of the average load (default: --capacity-bytes)")
    sample.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="fp16", help="embedding data type")
    sample.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="optimizer (its state takes memory)")
    sample.add_argument("--batch-size", type=POSITIVE, default=65536, help="batch size per device")
    sample.add_argument("--pool", help="a pool JSON (as written by `instances import-raw`) instead of the embedded "
                        "one (default: the embedded dlrm_t856 pool)")
    sample.add_argument("-o", "--output", "--out", dest="output", required=True, help="new folder for the instance set")
    sample.set_defaults(func=_cmd_sample)
    raw = inst.add_parser("import-raw", help="compute pool features from a raw dlrm_datasets .pt/.pt.gz file",
                          epilog=examples("shardbench instances import-raw fbgemm_t856_bs65536_0.pt.gz -o pool.json"))
    raw.add_argument("file", help="a dlrm_datasets file (indices, offsets, lengths)")
    raw.add_argument("-o", "--output", "--out", dest="output", required=True, help="the pool JSON to write")
    raw.set_defaults(func=_cmd_import_raw)
    torchrec = inst.add_parser("import-torchrec", help="an instance from a TorchRec model spec (JSON or TOML in "
                               "TorchRec's field names)",
                               epilog=examples("shardbench instances import-torchrec model.toml -o instance.json"))
    torchrec.add_argument("spec", help="the spec: tables (name, num_embeddings, embedding_dim, ...), world_size, "
                          "hbm_cap (bytes or e.g. \"80GiB\"), batch_size, optimizer, ...")
    torchrec.add_argument("-o", "--output", "--out", dest="output", required=True, help="the instance JSON to write")
    torchrec.set_defaults(func=_cmd_import_torchrec)
    validate = inst.add_parser("validate", help="check instance files or set folders (and that they can fit)",
                               epilog=examples("shardbench instances validate instance.json set40"))
    validate.add_argument("paths", nargs="+", help="instance files or instance-set folders")
    validate.set_defaults(func=_cmd_validate)
    show = inst.add_parser("show", help="summarise an instance or a set",
                           epilog=examples("shardbench instances show instance.json"))
    show.add_argument("path", help="an instance file or an instance-set folder")
    show.set_defaults(func=_cmd_show)

    solve = sub.add_parser("solve", help="solve one instance with one solver",
                           epilog=examples("shardbench solve instance.json --solver cpsat --oracle lookup --budget 30 "
                                           "-o plan.json"))
    solve.add_argument("instance", help="the instance JSON")
    solve.add_argument("--solver", required=True, help="a solver name (see `shardbench solvers`)")
    solve.add_argument("--oracle", help=f"the cost oracle (see `shardbench oracles`; {ORACLE_DEFAULT})")
    solve.add_argument("--budget", "--time-limit", dest="budget", type=TIME_LIMIT, default=10.0,
                       help="seconds the solver may take")
    solve.add_argument("--seed", type=SEED, default=0, help="seed of a stochastic solver")
    solve.add_argument("--gap", type=gap_fraction, default=0.0, help=GAP_HELP)
    solve.add_argument("--sharding-types", type=sharding_types, help="plan with only these sharding types, "
                       "comma-separated or 'all' (default: the instance's)")
    solve.add_argument("--compute-kernels", type=compute_kernels, help="plan with only these compute kernels, comma-separated or 'all' (fused, fused_uvm, "
                       "fused_uvm_caching, dense; default: the instance's)")
    solve.add_argument("-o", "--output", help="write the validated plan here (default: not written)")
    solve.set_defaults(func=_cmd_solve)

    for name, help_text, example in (
            ("recommend", "the solver (and portfolio) expected to plan this instance best, with the evidence",
             "shardbench recommend instance.json --oracle analytic --budget 30"),
            ("plan", "run the recommended portfolio side by side and write the best validated plan",
             "shardbench plan instance.json --budget 30 -o plan.json --torchrec-out plan.pt")):
        question = sub.add_parser(name, help=help_text, epilog=examples(example))
        question.add_argument("instance", help="the instance JSON")
        question.add_argument("--oracle", help=f"the cost oracle (see `shardbench oracles`; {ORACLE_DEFAULT})")
        question.add_argument("--budget", "--time-limit", dest="budget", type=TIME_LIMIT, default=10.0,
                              help="seconds the portfolio may take")
        question.add_argument("--sharding-types", type=sharding_types, help="plan with only these sharding types "
                              "(default: the instance's)")
        question.add_argument("--compute-kernels", type=compute_kernels, help="plan with only these compute kernels, comma-separated or 'all' (fused, fused_uvm, "
                       "fused_uvm_caching, dense; default: the instance's)")
        question.add_argument("--rules", help="a rules file written by refit-recommender (default: the shipped one)")
        if name == "recommend":
            question.set_defaults(func=_cmd_recommend)
        else:
            question.add_argument("-o", "--output", required=True, help="the best validated plan (JSON)")
            question.add_argument("--torchrec-out", help="also the TorchRec ShardingPlan (torch.save) and, beside "
                                  "it, its readable .sharding.json (default: not written)")
            question.add_argument("--module-path", type=module_path, default="", help=MODULE_PATH_HELP)
            question.add_argument("--solvers", type=lambda v: [s.strip() for s in v.split(",") if s.strip()],
                                  help="run these instead of the recommendation, comma-separated (default: the "
                                  "recommended portfolio)")
            question.add_argument("--seed", type=SEED, default=0, help="seed of the stochastic members")
            question.add_argument("--gap", type=gap_fraction, default=0.0, help=GAP_HELP)
            question.add_argument("--grid-caches", action="store_true", help="keep every cache at a load factor "
                                  "of the options' grid (default: under TorchRec's estimator caches are also offered "
                                  "the load factors the LP over every load factor picks, on budgets of at least 30 s "
                                  "finer ones too, and the kept plan's caches are re-sized off the grid into the "
                                  "HBM left; the best plan is tidied on the "
                                  "grid either way, time allowing)")
            question.set_defaults(func=_cmd_plan)
    replan = sub.add_parser("replan", help="replan after a workload shift, moving at most a budget of bytes from the "
                            "old plan (TorchRec's reshard)",
                            description="Replan an instance whose workload shifted (pooling factors, batch size, "
                            "access curves; tables added or dropped) from its old plan, moving at most --move-budget "
                            "bytes of shards (with their optimizer state) between devices: the best plan the "
                            "portfolio finds within the budget, with a bound over every plan within it. By default "
                            "every old table keeps its sharding type, shard count and kernel, so that only ranks "
                            "change, as TorchRec's DistributedModelParallel.reshard moves them; new tables are placed "
                            "and dropped ones free their memory, neither counting as moved.",
                            epilog=examples("shardbench replan new.json --from plan.json --move-budget 20GiB "
                                            "-o new-plan.json",
                                            "shardbench replan new.json --from plan.pt --move-budget 0 -o kept.json",
                                            "shardbench replan new.json --from plan.json --frontier -o frontier.md"))
    replan.add_argument("instance", metavar="NEW_INSTANCE", help="the new instance JSON (the workload as it is "
                        "now)")
    replan.add_argument("--from", dest="previous", metavar="OLD_PLAN", required=True, help="the old plan: our "
                        "plan JSON or a TorchRec ShardingPlan (.pt, as plan --torchrec-out writes it); tables are "
                        "matched by name")
    replan.add_argument("--move-budget", type=move_budget, metavar="SIZE", help="bytes the replan may move: a size "
                        "with a unit (20GiB, 500MB), 0 to keep the old plan, or unlimited (required unless --frontier)")
    replan.add_argument("--allow-type-changes", action="store_true", help="let old tables change sharding type, shard "
                        "count and kernel too (a checkpoint-and-reload re-shard; no reshard delta is written)")
    replan.add_argument("--frontier", action="store_true", help="instead of one plan, write the frontier of cost "
                        "against bytes moved, from the old plan to a fresh one (each point --budget seconds), as a "
                        "results page (-o PAGE.md) with its plot (PAGE.png) and points (PAGE.json)")
    replan.add_argument("--oracle", help=f"the cost oracle (see `shardbench oracles`; {ORACLE_DEFAULT})")
    replan.add_argument("--budget", type=TIME_LIMIT, default=10.0, help="seconds the portfolio may take")
    replan.add_argument("--solvers", type=lambda v: [s.strip() for s in v.split(",") if s.strip()],
                        help="run these instead of the replan portfolio (local-search + cpsat), comma-separated")
    replan.add_argument("--seed", type=SEED, default=0, help="seed of the stochastic members")
    replan.add_argument("--gap", type=gap_fraction, default=0.0, help=GAP_HELP)
    replan.add_argument("-o", "--output", required=True, help="the best validated plan (JSON), or with --frontier "
                        "the results page (.md)")
    replan.add_argument("--torchrec-out", help="also the TorchRec ShardingPlan (torch.save), its readable "
                        ".sharding.json and, where a running job can reshard into it, the delta "
                        "DistributedModelParallel.reshard takes (.reshard.pt) (default: not written)")
    replan.add_argument("--module-path", type=module_path, help=MODULE_PATH_HELP.replace(
        "default: \"\", the model itself", "default: the old ShardingPlan's, else \"\", the model itself"))
    replan.set_defaults(func=_cmd_replan)

    show_plan = sub.add_parser("show-plan", help="a plan per table (kernel, load factor) and per device (shards, "
                               "HBM and host memory, cost breakdown)",
                               epilog=examples("shardbench show-plan plan.json --instance instance.json --brief"))
    show_plan.add_argument("plan", help="the plan JSON")
    show_plan.add_argument("--instance", required=True, help="the instance the plan is for")
    show_plan.add_argument("--oracle", help=f"the cost oracle that prices the plan ({ORACLE_DEFAULT})")
    show_plan.add_argument("--brief", action="store_true",
                           help="leave out the lines per table and the list of shards per device")
    show_plan.set_defaults(func=_cmd_show_plan)

    export = sub.add_parser("export-torchrec", help="a plan as the ShardingPlan TorchRec runs (torch.save) plus a "
                            "readable JSON",
                            epilog=examples("shardbench export-torchrec plan.json --instance instance.json -o plan.pt"))
    export.add_argument("plan", help="the plan JSON")
    export.add_argument("--instance", required=True, help="the instance the plan is for")
    export.add_argument("-o", "--output", required=True, help="the ShardingPlan, torch.save'd (e.g. plan.pt)")
    export.add_argument("--json", help="the readable per-table ParameterSharding (default: OUTPUT with .sharding.json)")
    export.add_argument("--device-type", choices=("cuda", "cpu"), default="cuda", help="placements' device type")
    export.add_argument("--module-path", type=module_path, default="", help=MODULE_PATH_HELP)
    export.set_defaults(func=_cmd_export_torchrec)

    add_row_commands(sub)
    for plugin in command_plugins() if plugins else ():
        plugin.add_commands(sub)
    sub.add_parser("solvers", help="list solvers with metadata",
                   epilog=examples("shardbench solvers")).set_defaults(func=_cmd_solvers)
    sub.add_parser("oracles", help="list cost oracles",
                   epilog=examples("shardbench oracles")).set_defaults(func=_cmd_oracles)
    return parser


@functools.cache
def command_plugins() -> tuple:
    """The command sets installed beside the product, by their `shardbench.commands` entry points (the
    benchmark harness is one): each a module with `add_commands(sub)` and `ERRORS`."""
    from importlib.metadata import entry_points

    return tuple(point.load() for point in sorted(entry_points(group="shardbench.commands"), key=lambda p: p.name))


def _parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, tuple]:
    """The product's own parser for one of its own commands (the harness need not load for `plan`), else
    the full one; with the command sets it loaded."""
    product = build_parser(plugins=False)
    commands = next(a for a in product._actions if isinstance(a, argparse._SubParsersAction)).choices
    first = next((word for word in argv if not word.startswith("-")), None)
    return (product, ()) if first in commands else (build_parser(), command_plugins())


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that it unwinds as from Ctrl-C: its members killed, its
    unfinished outputs removed."""


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises Terminated inside (in the main thread; the previous handler comes back after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """Runs one command: its exit status, with bad input, no plan and interrupts each said in one line."""
    try:
        with _sigterm_raises():
            return _run(sys.argv[1:] if argv is None else list(argv))
    except Terminated:
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(argv: list[str]) -> int:
    parser, plugins = _parser_for(argv)
    plugin_errors = tuple(error for plugin in plugins for error in plugin.ERRORS)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad argument (reported in one line) or --help
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        return args.func(args)
    except (InstanceError, PlanError, UnknownSolverError, UnknownOracleError, SolverOracleMismatch, BudgetError,
            OSError, RecommenderError, *plugin_errors) as exc:
        print(f"error: {' '.join(_describe(exc).split())}", file=sys.stderr)
        return EXIT_ERROR


def _describe(exc: Exception) -> str:
    """An error's line: an OSError from the system (a read-only or full disk) by its path and cause."""
    if isinstance(exc, OSError) and exc.strerror:
        paths = [p for p in (exc.filename, exc.filename2) if p is not None]
        return f"{' -> '.join(map(str, paths))}: {exc.strerror}" if paths else f"{exc.strerror}"
    return str(exc)


def entry() -> int:
    """The console script: a closed pipe (`shardbench ... | head`) ends the command quietly, as in any CLI."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


if __name__ == "__main__":
    sys.exit(entry())
