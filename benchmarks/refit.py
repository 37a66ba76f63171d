"""Refitting the planner-choice rules from the `workloads-*` stores: every (instance, oracle, budget,
sharding setting) of a store is a workload with each solver's result; the two rule granularities are
compared leaving one workload family out, and the better one is fitted on all of them."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from instances import load_instances
from shardbench.recommend import EXCLUDED, GRANULARITIES, RecommenderError, Rules, Workload
from shardbench.workloads import workload_features
from solvers import get_solver

from .analysis import INSTANCE_SETTING, TABLE_WISE_SETTING, setting_of
from .store import read_records
from .suite import Suite, load_suites

SUITES_DIR = Path(__file__).parent / "suites"
FAMILY_PREFIX = "workloads-"


def family_suites(directory: Path = SUITES_DIR) -> list[Path]:
    return sorted(directory.glob(f"{FAMILY_PREFIX}*.toml"))


def distinct_stores(suite_paths: Iterable[Path]) -> list[Suite]:
    """The suites of the files (each suite of a grid a family of its own), each store once: a store read
    twice (the same suite given twice, or two suites naming one store) would put a family's workloads on
    both sides of the leave-one-family-out split."""
    suites, first = [], {}
    for path in suite_paths:
        for suite in load_suites(path):
            store = suite.results.resolve()
            if store in first:
                raise RecommenderError(f"{path}: its results store {suite.results} is also that of {first[store]}; "
                                       "give each store once")
            first[store] = path
            suites.append(suite)
    return suites


def collect_evidence(suite_paths: Iterable[Path]) -> list[Workload]:
    """Workloads of the suites' stores. A whole-table solver's plan is a plan of the split problem too, so
    it competes in both settings; a splitting solver's only in its own."""
    workloads = []
    for suite in distinct_stores(suite_paths):
        if not suite.results.exists():
            raise RecommenderError(f"{suite.results}: no results store for suite {suite.name} (run it first)")
        try:
            records = read_records(suite.results)
        except (ValueError, OSError) as exc:
            raise RecommenderError(f"{suite.results}: {exc}") from exc
        if not records:
            raise RecommenderError(f"{suite.results}: the store is empty")
        instances = {i.id: i for i in load_instances(suite.instances)}
        groups: dict[tuple, dict] = defaultdict(dict)
        for r in records:
            if r["solver"] in EXCLUDED or r["instance"] not in instances:
                continue
            entry = {"objective": r.get("objective"), "time": float(r["solve_time"]), "status": r["status"]}
            setting = setting_of(r)
            settings = [setting] if get_solver(r["solver"]).splits else [TABLE_WISE_SETTING, INSTANCE_SETTING]
            for s in settings:
                if s in suite.sharding:
                    groups[(r["instance"], r["oracle"], float(r["time_limit"]), s)][r["solver"]] = entry
        for (instance_id, oracle, budget, setting), results in sorted(groups.items()):
            # Every workload is kept, planless ones too: the report counts them (rank() leaves them out).
            instance = instances[instance_id]
            if setting == TABLE_WISE_SETTING:
                instance = instance.restricted_to(("table_wise",))
            workloads.append(Workload(suite.name, instance_id, oracle, budget, setting,
                                      workload_features(instance, oracle, budget), results))
    if not workloads:
        raise RecommenderError("no workloads in the evidence")
    return workloads


# ------------------------------------------------------------------ held-out evaluation


def leave_one_family_out(workloads: list[Workload], granularity: str) -> list[dict]:
    """Per held-out workload: the recommended solver's and portfolio's regret and time, fitted without
    the workload's family."""
    rows = []
    for family in sorted({w.family for w in workloads}):
        rules = Rules.fit([w for w in workloads if w.family != family], granularity)
        for w in (w for w in workloads if w.family == family and w.best is not None):
            chosen = rules.portfolio(w.features)
            rows.append({"family": family, "workload": w, "solver": chosen[0], "regret": w.regret(chosen[0]),
                         "portfolio": chosen, "portfolio_regret": min(w.regret(s) for s in chosen),
                         "time": w.time(chosen[0])})
    return rows


def choose_granularity(workloads: list[Workload]) -> tuple[str, dict]:
    """The granularity with the lower mean held-out regret (ties: coarse), and both evaluations."""
    evaluations = {g: leave_one_family_out(workloads, g) for g in GRANULARITIES}
    score = {g: float(np.mean([r["regret"] for r in rows])) for g, rows in evaluations.items()}
    return min(GRANULARITIES, key=lambda g: (score[g], GRANULARITIES.index(g))), evaluations


def refit(suite_paths: Iterable[Path]) -> tuple[Rules, dict]:
    workloads = collect_evidence(suite_paths)
    if len({w.family for w in workloads}) < 2:
        raise RecommenderError("refitting needs the stores of at least two workload families")
    granularity, evaluations = choose_granularity(workloads)
    return Rules.fit(workloads, granularity), evaluations
