"""The benchmark harness's commands of the `shardbench` CLI: run a suite, measure a cost dataset, train
learned components, summarise sweeps, refit the planner-choice rules and run the conformance zoo. The
product's CLI (shardbench.cli) attaches them with `add_commands`."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from instances import InstanceError, load_instances
from instances.io import check_output_path, write_json_atomic, write_text_atomic
from shardbench.args import POSITIVE, SEED, TIME_LIMIT, examples, name_list, number
from solvers import BudgetError, get_solver

from .distributed import RayUnavailableError
from .store import StoreError
from .suite import MAX_WORKERS, SuiteError
from .zoo import MODELS, REGIMES

ERRORS = (StoreError, SuiteError, RayUnavailableError)  # bad input of these commands: one line, exit 2
SUITES = "benchmarks/suites"  # as the examples name the shipped suites, from the repository root


def _cmd_refit_recommender(args: argparse.Namespace) -> int:
    from shardbench.recommend import RULES_PATH

    from .refit import family_suites, refit

    check_output_path(args.output or str(RULES_PATH), "-o")
    suites = [Path(p) for p in args.suites] or family_suites()
    rules, evaluations = refit(suites)
    out = Path(args.output) if args.output else RULES_PATH
    write_json_atomic(out, rules.to_dict())
    for granularity, rows in evaluations.items():
        regrets = np.array([r["regret"] for r in rows])
        print(f"{granularity}: held-out (leave one family out) regret mean {regrets.mean():.2%}, within 1 % on "
              f"{(regrets <= 0.01).sum()}/{len(rows)}, worst {regrets.max():.2%}")
    print(f"{len(rules.evidence)} workloads in {len({w.family for w in rules.evidence})} families from "
          f"{len(suites)} suite files; {rules.granularity} rules "
          f"({len(rules.table)} keys) written to {out}")
    return 0


def _executor_arguments(parser: argparse.ArgumentParser, unit: str) -> None:
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help=f"local: a process per {unit} on this machine; ray: a Ray task per {unit}")
    parser.add_argument("--address", help="ray: the cluster to join (default: start a local instance)")


def _check_executor(args: argparse.Namespace) -> None:
    if args.address is not None and args.executor != "ray":
        raise BudgetError("--address: only with --executor ray")


def _cmd_bench(args: argparse.Namespace) -> int:
    from .leaderboard import publish_leaderboard
    from .runner import run_suite
    from .store import read_records
    from .suite import load_suites

    _check_executor(args)
    if args.render_only and (args.fresh or args.rerun):
        raise BudgetError("--render-only: renders the stored results; --fresh or --rerun would discard them")
    if args.fresh and args.rerun:
        raise BudgetError("--rerun: --fresh already reruns every cell")
    for name in args.rerun or ():
        get_solver(name)
    for suite in load_suites(args.suite):  # a grid's suites one after another, each with its own store
        if args.output is not None:
            check_output_path(Path(args.output) / suite.results.name, "-o")
            suite = suite.relocated(Path(args.output))
        if args.render_only:
            if not suite.results.exists():
                raise StoreError(f"{suite.results}: suite {suite.name} has no results yet; run `shardbench bench`")
            records = read_records(suite.results)
        else:
            records = run_suite(suite, fresh=args.fresh, workers=args.workers, executor=args.executor,
                                address=args.address, rerun=tuple(args.rerun or ()))
        print(publish_leaderboard(suite, records))
        print(f"results: {suite.results}\nleaderboard: {suite.leaderboard_path}\nplot: {suite.plot_path}")
    return 0


def _cmd_measure(args: argparse.Namespace) -> int:
    check_output_path(args.output, "-o")
    _check_executor(args)
    from functools import partial

    from rich.progress import Progress

    from costmodels.dataset import collect
    from costmodels.measured import Protocol

    protocol = Protocol(batch=args.batch, seed=args.seed, max_rows=args.max_rows)
    run_many = None
    if args.executor == "ray":
        from .distributed import ray_map

        run_many = partial(ray_map, address=args.address, workers=args.workers)
    with Progress() as bar:
        task = bar.add_task("measuring", total=args.combos)
        written = collect(Path(args.output), args.combos, args.max_tables, args.batch, args.seed, protocol,
                          progress=lambda n: bar.update(task, completed=n), run_many=run_many)
    print(f"measured {written} new combinations into {args.output}")
    return 0


def _cmd_train_costmodel(args: argparse.Namespace) -> int:
    check_output_path(args.output, "-o")
    from rich.progress import Progress

    from costmodels.dataset import load_dataset
    from costmodels.neural import train

    records = load_dataset(args.dataset)
    if not records:
        raise InstanceError(args.dataset, "the dataset holds no records")
    with Progress() as bar:
        task = bar.add_task(f"training {args.model}", total=args.epochs)
        try:
            model, metrics = train(records, args.model, epochs=args.epochs, seed=args.seed,
                                   progress=lambda e: bar.update(task, completed=e))
        except ValueError as exc:  # a dataset that parses but cannot be learned from (one split empty, ...)
            raise InstanceError(args.dataset, str(exc)) from exc
    model.save(Path(args.output))
    for split, m in metrics.items():
        print(f"{split}: MAE {m['mae_s'] * 1e3:.3f} ms, MAPE {m['mape']:.2%}, R² {m['r2']:.4f}, "
              f"Kendall τ {m['kendall_tau']:.4f} ({m['count']} combinations)")
    print(f"weights and normalisation written to {args.output}")
    return 0


def _cmd_train_policy(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from costmodels import get_oracle
    from costmodels.neural import TrainedModel, shipped_model_path
    from solvers.rl.storage import save_policy, shipped_policy_path
    from solvers.rl.training import train_policy

    from .suite import load_suite
    from .training_curve import plot_training

    suite = load_suite(args.suite)
    tasks = load_instances(suite.instances)
    cost_model = Path(args.cost_model) if args.cost_model else shipped_model_path(f"neural-{args.algo}")
    model = TrainedModel.load(cost_model)
    real = get_oracle(args.real_oracle) if args.algo == "dreamshard" and args.real_oracle != "none" else None
    out = Path(args.output) if args.output else shipped_policy_path(args.algo)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task(f"training {args.algo}", total=args.time_budget)
        policy, log = train_policy(args.algo, tasks, model, args.time_budget, args.seed, real_oracle=real,
                                   progress=lambda lg: bar.update(task, completed=min(lg.seconds[-1], args.time_budget),
                                                                  description=f"{args.algo}: reward {lg.mean_reward[-1]:.3f}"))
    curve = Path(args.curve) if args.curve else out.with_suffix(".png")
    plot_training(log, curve, f"{args.algo} on {suite.name}")
    save_policy(policy, args.algo, model, out, {"suite": suite.name, "tasks": len(tasks), "seed": args.seed,
                                                "time_budget": args.time_budget, "episodes": log.episodes[-1],
                                                "training_seconds": log.seconds[-1],
                                                "real_rollouts": log.real_rollouts})
    first, last = np.mean(log.mean_reward[:10]), np.mean(log.mean_reward[-10:])
    print(f"{log.episodes[-1]} episodes in {log.seconds[-1]:.0f} s; mean reward {first:.4f} (first 10 updates) -> "
          f"{last:.4f} (last 10); {log.real_rollouts} real-oracle rollouts")
    print(f"policy written to {out}; training curve {curve}")
    return 0


def _cmd_summarize(args: argparse.Namespace) -> int:
    from .leaderboard import sweep_table
    from .pages import revisions_line
    from .store import read_records
    from .suite import load_suites

    named = []
    for path in args.suites:
        for suite in load_suites(path):
            if not suite.results.exists():
                raise StoreError(f"{suite.results}: suite {suite.name} has no results yet; run `shardbench bench`")
            named.append((suite.name, read_records(suite.results)))
    if args.output:
        check_output_path(args.output, "-o")
    table = sweep_table(named, args.metric)
    print(table)
    if args.output:
        revisions = revisions_line([record for _, records in named for record in records])
        write_text_atomic(args.output, (f"{args.title}\n\n" if args.title else "") + f"{table}\n\n{revisions}\n")
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from .suite import PAGES, STORES
    from .zoo import page, read_store, run_zoo, write_store

    store = Path(args.store) if args.store else STORES / "zoo.jsonl"
    output = Path(args.output) if args.output else PAGES / "zoo.md"
    check_output_path(output, "-o")
    if args.render_only:
        rows = read_store(store)
        if not rows:
            raise StoreError(f"{store}: holds no zoo rows; run `shardbench zoo`")
    else:
        check_output_path(store, "--store")

        def show(row) -> None:
            sides = " | ".join(f"{who}: " + (f"{side.rating_ms:.4g} ms" if side.rating_ms is not None else
                                             side.error or side.rating_error or side.status)
                               for who, side in (("ours", row.ours), ("TorchRec", row.torchrec)))
            print(f"{row.model} / {row.regime}: {sides}", flush=True)

        rows = run_zoo(args.models, args.regimes, budget=args.budget, timeout=args.timeout, tiny=args.tiny,
                       on_row=show)
        write_store(store, rows)
    write_text_atomic(output, page(rows, _shown(store)))
    print(f"records: {store}\npage: {output}")
    return 0


def _shown(path: Path) -> str:
    """A path as the page names it: from the repository root when it lies inside."""
    from .suite import STORES

    root = STORES.parent.parent
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)


def add_commands(sub) -> None:
    refit_parser = sub.add_parser("refit-recommender", help="refit the planner-choice rules from workloads-* stores",
                                  epilog=examples("shardbench refit-recommender -o rules.json",
                                                  f"shardbench refit-recommender {SUITES}/workloads-200x16.toml "
                                                  f"{SUITES}/workloads-800x128.toml -o rules.json"))
    refit_parser.add_argument("suites", nargs="*", help="suite files, each store once (default: "
                              "benchmarks/suites/workloads-*.toml)")
    refit_parser.add_argument("-o", "--output", help="rules file (default: the shipped one)")
    refit_parser.set_defaults(func=_cmd_refit_recommender)

    bench = sub.add_parser("bench", help="run a benchmark suite (TOML) and write its leaderboard and plot (a suite "
                           "storing under benchmarks/results publishes them under docs/results)",
                           epilog=examples(f"shardbench bench {SUITES}/quick.toml --workers 2 -o build/quick",
                                           f"shardbench bench {SUITES}/vs-torchrec-80x8.toml --render-only"))
    bench.add_argument("suite", help="a suite file; one with a [grid] runs each of its suites in turn")
    bench.add_argument("--fresh", action="store_true", help="discard stored results and rerun every cell")
    bench.add_argument("--rerun", type=lambda v: tuple(dict.fromkeys(s.strip() for s in v.split(",") if s.strip())),
                       metavar="SOLVERS",
                       help="comma-separated solvers whose stored records are dropped and run again (the rest are "
                       "kept; default: none)")
    bench.add_argument("--workers", type=number(int, 1, MAX_WORKERS, what="count"),
                       help="cells run at once (default: the suite's)")
    bench.add_argument("-o", "--output", metavar="DIR", help="keep the results store, leaderboard and plot in DIR "
                       "instead (default: the suite's own store and pages)")
    bench.add_argument("--render-only", action="store_true", help="rewrite the leaderboard and plot from the stored "
                       "results, running no solver")
    _executor_arguments(bench, "cell")
    bench.set_defaults(func=_cmd_bench)

    measure = sub.add_parser("measure", help="measure a cost dataset of pool-table combinations (FBGEMM)",
                             epilog=examples("shardbench measure --combos 200 -o dataset.jsonl"))
    measure.add_argument("--combos", type=POSITIVE, default=2000, help="table combinations to measure")
    measure.add_argument("--max-tables", type=POSITIVE, default=15, help="tables per combination at most")
    measure.add_argument("--batch", type=POSITIVE, default=4096, help="batch size of the timed lookups")
    measure.add_argument("--seed", type=SEED, default=0, help="seed of the combinations drawn")
    measure.add_argument("--max-rows", type=POSITIVE, default=1 << 18, help="CPU: rows allocated per table at most")
    measure.add_argument("-o", "--output", "--out", dest="output", required=True,
                         help="JSON-lines dataset (appended to; a rerun resumes)")
    _executor_arguments(measure, "combination")
    measure.add_argument("--workers", type=number(int, 1, MAX_WORKERS, what="count"),
                         help="ray: tasks in flight at most (default: one per GPU, or per CPU without GPUs)")
    measure.set_defaults(func=_cmd_measure)
    train = sub.add_parser("train", help="train a learned component (a neural cost model or a sharding policy)",
                           epilog=examples("shardbench train costmodel --dataset dataset.jsonl -o model.pt",
                                           f"shardbench train policy --algo dreamshard --suite {SUITES}/rl-q1.toml")
                           ).add_subparsers(dest="train_command", required=True, metavar="command")
    costmodel = train.add_parser("costmodel", help="train a neural cost oracle on a measured dataset",
                                 epilog=examples("shardbench train costmodel --dataset dataset.jsonl --model "
                                                 "dreamshard -o neural-dreamshard.pt"))
    costmodel.add_argument("--dataset", required=True, help="a dataset written by `shardbench measure`")
    costmodel.add_argument("--model", choices=("autoshard", "dreamshard"), default="autoshard",
                           help="which paper's network")
    costmodel.add_argument("--epochs", type=POSITIVE, default=300, help="training epochs")
    costmodel.add_argument("--seed", type=SEED, default=0, help="training seed")
    costmodel.add_argument("-o", "--output", "--out", dest="output", required=True,
                           help="weights and normalisation file to write")
    costmodel.set_defaults(func=_cmd_train_costmodel)
    policy = train.add_parser("policy", help="train an AutoShard or DreamShard sharding policy",
                              epilog=examples(f"shardbench train policy --algo autoshard --suite {SUITES}/rl-q1.toml "
                                              "--time-budget 120 -o policy.pt"))
    policy.add_argument("--algo", choices=("autoshard", "dreamshard"), required=True, help="which paper's policy")
    policy.add_argument("--suite", required=True, help="a suite whose instance set holds the training tasks")
    policy.add_argument("--time-budget", type=TIME_LIMIT, default=600.0, help="seconds of training")
    policy.add_argument("--seed", type=SEED, default=0, help="training seed")
    policy.add_argument("--cost-model", help="cost network weights (default: the shipped neural-<algo>)")
    policy.add_argument("--real-oracle", default="measured",
                        help="the oracle of DreamShard's periodic real rollouts ('none' to skip)")
    policy.add_argument("-o", "--output", "--out", dest="output", help="the policy file (default: the shipped one)")
    policy.add_argument("--curve", help="training curve PNG (default: next to the weights)")
    policy.set_defaults(func=_cmd_train_policy)
    summarize = sub.add_parser("summarize", help="one table of a metric across several suites (a sweep)",
                               epilog=examples(f"shardbench summarize {SUITES}/rl-dlrm.toml --metric gap -o sweep.md"))
    summarize.add_argument("suites", nargs="+", help="suite files whose stores hold results; a grid's suites give a "
                           "row each")
    summarize.add_argument("--metric", choices=("speedup", "balance", "gap"), default="speedup",
                           help="the metric tabled")
    summarize.add_argument("--title", default="", help="a title line above the table (default: none)")
    summarize.add_argument("-o", "--output", help="write the table here as Markdown (default: printed only)")
    summarize.set_defaults(func=_cmd_summarize)

    zoo = sub.add_parser("zoo", help="the conformance zoo: TorchRec's own models planned by ShardbenchPlanner and by "
                         "TorchRec's planner in three memory regimes, both plans rated by TorchRec's estimator",
                         epilog=examples("shardbench zoo", "shardbench zoo --models dlrm-criteo --regimes fits "
                                         "--store build/zoo.jsonl -o build/zoo.md",
                                         "shardbench zoo --render-only"))
    zoo.add_argument("--models", type=name_list(tuple(MODELS), "models"), default=tuple(MODELS),
                     help=f"comma-separated, or 'all' (default: all): {', '.join(MODELS)}")
    zoo.add_argument("--regimes", type=name_list(tuple(REGIMES), "regimes"), default=tuple(REGIMES),
                     help=f"comma-separated, or 'all' (default: all): {', '.join(REGIMES)}")
    zoo.add_argument("--budget", type=TIME_LIMIT, default=10.0, help="ShardbenchPlanner's budget, seconds "
                     "(default: %(default)s)")
    zoo.add_argument("--timeout", type=TIME_LIMIT, default=300.0, help="seconds each planner's process may take, "
                     "rating its plan included, before it is killed (default: %(default)s)")
    zoo.add_argument("--tiny", action="store_true", help="every table with 10,000 times fewer rows (at least 100, "
                     "smaller tables as they are): a smoke run")
    zoo.add_argument("--store", help="the records, JSON lines, replaced by this run's (default: "
                     "benchmarks/results/zoo.jsonl)")
    zoo.add_argument("-o", "--output", help="the results page (default: docs/results/zoo.md)")
    zoo.add_argument("--render-only", action="store_true", help="rewrite the page from the stored records, planning "
                     "nothing")
    zoo.set_defaults(func=_cmd_zoo)
