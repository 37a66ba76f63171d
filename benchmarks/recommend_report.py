"""The planner-choice report: refits the shipped rules from the `workloads-*` stores, evaluates them
leave-one-family-out next to the naive choices, and runs `plan` at 10 s on every 10 s workload against
each solver run alone there. Writes docs/results/recommend.md (or -o FILE) and the shipped rules.

    python -m benchmarks.recommend_report [--skip-plan] [-o FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from instances import load_instances
from instances.io import write_json_atomic
from shardbench import plan
from shardbench.recommend import NO_PLAN_REGRET, RULES_PATH, WITHIN, Rules, applicable
from shardbench.workloads import workload_features

from .analysis import TABLE_WISE_SETTING
from .leaderboard import publish_report
from .refit import family_suites, refit
from .suite import PAGES, load_suites

NAIVE = ("cpsat", "local-search", "lpt")
PLAN_BUDGET = 10.0
MATCH = 1e-4  # "matches": within 0.01 % (searches under a wall-clock budget differ by more from run to run)


def _summary(regrets: list[float], times: list[float] | None = None) -> str:
    r = np.array(regrets)
    cells = f"{(r <= WITHIN).sum()}/{r.size} ({(r <= WITHIN).mean():.0%}) | {np.mean(r):.2%} | {r.max():.2%}"
    return cells + (f" | {np.nanmean(times):.2f}" if times is not None else "")


def evaluation_lines(rules: Rules, evaluations: dict) -> list[str]:
    planless = [w for w in rules.evidence if w.best is None]
    # Memory does not depend on the oracle: a proof under one oracle holds for the same instance under all.
    proven = {(w.family, w.instance, w.setting) for w in rules.evidence
              if any(r["status"] == "infeasible" for r in w.results.values())}
    infeasible = [w for w in planless if (w.family, w.instance, w.setting) in proven]
    workloads = [w for w in rules.evidence if w.best is not None]
    rows = evaluations[rules.granularity]
    lines = [f"Evidence: {len(rules.evidence)} workloads (instance × oracle × budget × sharding setting) in "
             f"{len({w.family for w in rules.evidence})} families; on {len(planless)} of them no solver found a plan "
             f"({len(infeasible)} proven infeasible by an exact solver; the other {len(planless) - len(infeasible)} "
             "under a non-additive oracle, where only heuristics apply and all of them dead-ended): they are "
             "counted here and left "
             "out of the regrets below (no applicable solver found a plan there to measure a choice against). Regret is a choice's max "
             f"device cost over the best any solver found on that workload (no plan, or a solver that does not "
             f"apply: {NO_PLAN_REGRET:.0%}). "
             f"Shipped: the {rules.granularity} rule table ({len(rules.table)} keys); held-out mean regret "
             + ", ".join(f"{g} {np.mean([r['regret'] for r in rs]):.2%}" for g, rs in evaluations.items()) + ".", "",
             "Leave one family out (fit on the others, recommend on the held-out family):", "",
             "| family | workloads | recommended: within 1 % | mean regret | worst | mean time (s) | portfolio (best of 2): within 1 % | mean | worst |",
             "|---|---|---|---|---|---|---|---|---|"]
    for family in sorted({r["family"] for r in rows}):
        mine = [r for r in rows if r["family"] == family]
        lines.append(f"| `{family}` | {len(mine)} | {_summary([r['regret'] for r in mine], [r['time'] for r in mine])} | "
                     f"{_summary([r['portfolio_regret'] for r in mine])} |")
    lines.append(f"| **all** | {len(rows)} | {_summary([r['regret'] for r in rows], [r['time'] for r in rows])} | "
                 f"{_summary([r['portfolio_regret'] for r in rows])} |")
    lines += ["", "Naive choices on the same workloads:", "", "| always | within 1 % | mean regret | worst | mean time (s) |",
              "|---|---|---|---|---|"]
    for solver in NAIVE:
        regrets = [w.regret(solver) if applicable(solver, w.features) else NO_PLAN_REGRET for w in workloads]
        lines.append(f"| `{solver}` | {_summary(regrets, [w.time(solver) for w in workloads])} |")
    return lines


def plan_lines(rules: Rules) -> list[str]:
    """`plan` at PLAN_BUDGET on every workload of that budget, against each solver alone in the evidence."""
    instances = {}
    for suite in (suite for path in family_suites() for suite in load_suites(path)):
        instances.update({(suite.name, i.id): i for i in load_instances(suite.instances)})
    rows, started, held_out = [], time.monotonic(), {}
    for w in (w for w in rules.evidence if w.budget == PLAN_BUDGET):
        instance = instances[(w.family, w.instance)]
        if w.setting == TABLE_WISE_SETTING:
            instance = instance.restricted_to(("table_wise",))
        if w.family not in held_out:  # the portfolio is chosen without the workload's own family
            held_out[w.family] = Rules.fit([v for v in rules.evidence if v.family != w.family], rules.granularity)
        portfolio = held_out[w.family].portfolio(workload_features(instance, w.oracle, PLAN_BUDGET))
        result = plan(instance, w.oracle, PLAN_BUDGET, portfolio, resize_caches=False)  # on the singles' grid
        singles = {s: r["objective"] for s, r in w.results.items() if r["objective"] is not None}
        beaten = [s for s, obj in singles.items() if result.objective is None or obj < result.objective * (1 - MATCH)]
        rows.append((w, result, beaten))
    matched = sum(not beaten for _, _, beaten in rows)
    lines = [f"`plan` at {PLAN_BUDGET:g} s (the portfolio recommended by rules fitted without the workload's "
             "family, + best-greedy, a process each) on the "
             f"{len(rows)} workloads with a {PLAN_BUDGET:g} s budget, against every solver run alone at "
             f"{PLAN_BUDGET:g} s in the evidence: matches (within {MATCH:.2%}) or beats all of them on {matched}/{len(rows)} "
             f"({matched / max(len(rows), 1):.0%}); {time.monotonic() - started:.0f} s in all.", ""]
    misses = [(w, r, b) for w, r, b in rows if b]
    if misses:
        lines += ["| workload | plan's solver | plan | beaten by |", "|---|---|---|---|"]
        for w, result, beaten in misses:
            best = min(w.results[s]["objective"] for s in beaten)
            lines.append(f"| {w.family} {w.instance} {w.oracle} {w.setting} | {result.solver} | "
                         f"{result.objective if result.objective is not None else 'no plan'} | "
                         f"{', '.join(beaten)} (best {best:.6g}) |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(PAGES / "recommend.md"), help="the report page (default: %(default)s)")
    parser.add_argument("--skip-plan", action="store_true", help="leave out the `plan` runs")
    args = parser.parse_args(argv)
    rules, evaluations = refit(family_suites())
    write_json_atomic(RULES_PATH, rules.to_dict())
    lines = ["#### Planner choice", "", *evaluation_lines(rules, evaluations)]
    if not args.skip_plan:
        lines += ["", *plan_lines(rules)]
    publish_report("\n".join(lines), Path(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
