"""`shardbench demo`: the real job on a shipped DLRM-like model (or on yours) — plan it with our portfolio
and with TorchRec's own planner, rate both by TorchRec's estimator, print the comparison and our
certificate, and write our plan and its TorchRec ShardingPlan to a folder."""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Mapping

from costmodels import get_oracle
from instances import Instance, InstanceError, Plan
from instances.io import json_bytes, plan_file, read_text, write_files_atomic
from instances.memory import format_bytes
from instances.model import instance_from_dict, instance_to_dict

from .args import SEED, TIME_LIMIT, examples
from .pipeline import PlanRequest, admit, choose, narrow, run
from .planfiles import plan_files
from .portfolio import SAFETY_NET

EXIT_NO_PLAN = 3
EXAMPLE = "data/example_dlrm.toml"
ORACLE = "torchrec"  # both plans are rated by TorchRec's own estimator, the one its planner trusts
OUTPUTS = {"plan": "plan.json", "instance": "instance.json", "torchrec": "plan.pt", "readable": "plan.sharding.json"}


@dataclass(frozen=True)
class PeerRun:
    """TorchRec's planner on the instance: its plan (None when it found none; `failure` says why) and
    how long it took."""

    plan: Plan | None
    seconds: float
    failure: str | None = None


def read_model(path: str | None) -> tuple[Instance, str]:
    """The instance to plan and where it came from: a spec in TorchRec's field names (TOML, or JSON) or an
    instance JSON; without a path, the shipped example."""
    from interop.importer import instance_from_spec, parse_spec

    if path is None:
        text, toml = resources.files("shardbench").joinpath(EXAMPLE).read_text(), True
        where = f"the shipped example (shardbench/{EXAMPLE})"
    else:
        text, where, toml = read_text(path, "model"), path, str(path).endswith(".toml")
    data = parse_spec(text, where, toml)
    if isinstance(data, dict) and "schema_version" in data:  # an instance file, as `instances` commands write
        try:
            return instance_from_dict(data), where
        except InstanceError as exc:
            raise InstanceError(f"{where}: {exc.field}", exc.reason) from exc
    try:
        return instance_from_spec(data), where
    except InstanceError as exc:
        raise InstanceError(f"{where}: {exc.field}", exc.reason) from exc


def check_folder(path: str) -> Path:
    """The output folder, refused before any work when it cannot be one (it, or a parent, is a file)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InstanceError(str(folder), "-o: is a file; give a folder")
    parent = next((p for p in folder.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise InstanceError(str(folder), f"-o: {parent} is not a folder")
    return folder


def _first_missing(folder: Path) -> Path | None:
    """The outermost folder on the way to `folder` that does not exist yet (None when `folder` exists)."""
    missing = None
    for path in (folder, *folder.parents):
        if path.exists():
            return missing
        missing = path
    return missing


def write_all(folder: Path, files: Mapping[str, bytes]) -> None:
    """The outputs, by file name, written into `folder` all or none (instances.io.write_files_atomic); a
    failure or an interrupt also removes the folder, where the demo had to create it."""
    created = _first_missing(folder)
    try:
        write_files_atomic({folder / name: data for name, data in files.items()})
    except BaseException as exc:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(exc, OSError):
            raise InstanceError(str(folder), f"-o: cannot write there ({exc.strerror or exc})") from exc
        raise


def run_torchrec_planner(instance: Instance) -> PeerRun:
    from torchrec.distributed.planner.types import PlannerError

    from interop.peer import plan_with_torchrec

    started = time.monotonic()
    # TorchRec's planner logs through the root logger (a warning per data-parallel table, an error before
    # each PlannerError); the demo says in its own lines what happened.
    logging.disable(logging.CRITICAL)
    try:
        plan, _ = plan_with_torchrec(instance)
    except PlannerError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return PeerRun(None, time.monotonic() - started, first)
    finally:
        logging.disable(logging.NOTSET)
    return PeerRun(plan.validate(instance), time.monotonic() - started)


def types_used(plan: Plan) -> str:
    counts = sorted(plan.sharding_types().items(), key=lambda kv: -kv[1])
    return ", ".join(f"{kind} {count}" for kind, count in counts)


def comparison(theirs: float, ours: float) -> str:
    """Which plan is faster per step, by a ratio of at least 1."""
    if ours == theirs:
        return "the two plans are equally fast per step"
    faster, slow, fast = ("ours", theirs, ours) if ours < theirs else ("TorchRec's", ours, theirs)
    return f"{faster} is {slow / fast:.2f}× faster per step ({1 - fast / slow:.1%} less time on the slowest rank)"


def _describe(instance: Instance, where: str) -> str:
    topo = instance.topology
    weights = sum(t.rows * t.dim * t.dtype_bytes for t in instance.tables)
    return (f"{instance.id} from {where}: {instance.num_tables} tables ({format_bytes(weights)} of weights) on "
            f"{topo.nodes} node{'s' if topo.nodes > 1 else ''} × {topo.devices_per_node} GPUs, "
            f"{format_bytes(topo.memory_bytes)} of HBM per GPU to plan in, "
            f"batch {instance.workload.batch_size} per rank")


def run_demo(args: argparse.Namespace) -> int:
    from interop.export import to_torchrec

    folder = check_folder(args.output)
    instance, where = read_model(args.model)
    print(_describe(instance, where))
    request = PlanRequest(instance, ORACLE, budget=args.budget, seed=args.seed)
    portfolio = choose(request, admit(request, narrow(request)))
    print(f"planning with TorchRec's planner (EmbeddingShardingPlanner), then with ours "
          f"({' + '.join(dict.fromkeys([*portfolio, SAFETY_NET]))}, budget {args.budget:g} s) ...", flush=True)
    peer = run_torchrec_planner(instance)
    ours = run(request).result
    if ours.plan is None:
        print(f"no plan from our portfolio: {ours.no_plan_reason}", file=sys.stderr)
        return EXIT_NO_PLAN
    sharding_plan = to_torchrec(instance, ours.plan)  # converted before anything is written
    oracle = get_oracle(ORACLE)
    theirs = oracle.plan_cost(instance, peer.plan) if peer.plan is not None else None

    print(f"\nmax-rank cost per training step by TorchRec's estimator (oracle `{ORACLE}`, {oracle.unit}):")
    if peer.plan is None:
        print(f"  TorchRec's planner  no plan ({peer.failure}) after {peer.seconds:.1f} s")
    else:
        print(f"  TorchRec's planner  {theirs:10.6g}  planned in {peer.seconds:5.1f} s  {types_used(peer.plan)}")
    print(f"  shardbench          {ours.objective:10.6g}  planned in {ours.wall_s:5.1f} s  {types_used(ours.plan)}"
          f"  (best: {ours.solver})")
    if theirs is not None:
        print(f"  {comparison(theirs, ours.objective)}")
    for line in ours.after_race_lines(instance):
        print(f"  {line}")
    if ours.bound is not None:
        print(f"certificate: over the enumerated options no plan costs less than {ours.bound:.6g} {oracle.unit}; "
              f"ours {'before its caches were re-sized ' if ours.grid_objective is not None else ''}"
              f"is within {ours.gap:.2%} of that bound")
    else:
        print("certificate: none (no member proved a bound within the budget)")

    report = {"solver": ours.solver, "portfolio": list(dict.fromkeys([*portfolio, SAFETY_NET])), "oracle": ORACLE, "budget": args.budget,
              "seed": args.seed, "objective": ours.objective, "grid_objective": ours.grid_objective,
              "lower_bound": ours.bound, "gap": ours.gap,
              "wall_seconds": ours.wall_s,
              "torchrec_planner": {"objective": theirs, "seconds": peer.seconds, "failure": peer.failure,
                                   "sharding_types": peer.plan.sharding_types() if peer.plan is not None else None}}

    write_all(folder, {OUTPUTS["instance"]: json_bytes(instance_to_dict(instance.validate())),
                       OUTPUTS["plan"]: plan_file(ours.plan, instance, report),
                       **plan_files(sharding_plan, OUTPUTS["torchrec"], OUTPUTS["readable"], instance, ours.plan)})
    print(f"\nwritten to {folder}/: {OUTPUTS['plan']} (our plan; its instance in {OUTPUTS['instance']}), "
          f"{OUTPUTS['torchrec']} (the TorchRec ShardingPlan), {OUTPUTS['readable']} (readable)")
    print(f"  inspect: {_invoked_as()} show-plan {folder / OUTPUTS['plan']} --instance {folder / OUTPUTS['instance']} "
          f"--oracle {ORACLE}")
    return 0


def _invoked_as() -> str:
    """The command as the user ran it (`.venv/bin/shardbench` need not be on PATH), so the hint runs as printed."""
    invoked = sys.argv[0] if sys.argv else ""
    return invoked if Path(invoked).name == "shardbench" else "shardbench"


def add_command(sub) -> None:
    """Registers `demo` on the CLI's subcommands."""
    demo = sub.add_parser("demo", help="the real job on a shipped DLRM-like model: our plan against TorchRec's "
                          "planner under TorchRec's estimator, with the certificate and the exported plan",
                          description="Plans a model with our portfolio and with TorchRec's planner, rates both by "
                          "TorchRec's estimator and writes our plan, its instance and its TorchRec ShardingPlan.",
                          epilog=examples("shardbench demo", "shardbench demo my_model.toml --budget 30 -o my-plan/"))
    demo.add_argument("model", nargs="?", help="a spec in TorchRec's field names (TOML or JSON, as import-torchrec "
                      f"reads) or an instance JSON (default: the shipped 50-table example, shardbench/{EXAMPLE})")
    demo.add_argument("--budget", type=TIME_LIMIT, default=10.0, help="seconds for our portfolio")
    demo.add_argument("-o", "--output", default="demo-out", help="folder for the outputs")
    demo.add_argument("--seed", type=SEED, default=0, help="seed of the stochastic solvers")
    demo.set_defaults(func=run_demo)

