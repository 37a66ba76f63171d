"""Choosing a planner per workload from benchmark evidence. Evidence: every (instance, oracle, budget,
sharding setting) of the `workloads-*` stores is a workload; each solver's regret there is its objective
over the best any solver found (a missing plan counts as NO_PLAN_REGRET). The model is a rule table:
workloads are grouped by a key of coarse feature classes, and each group ranks the solvers by mean regret
(then by misses, then by time); a question whose key the evidence lacks falls back to a coarser key, then
to its nearest workloads. Two key granularities compete; the one with the lower held-out regret ships
(`benchmarks.refit` collects the evidence and chooses)."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from instances import InstanceError
from instances.io import read_text
from solvers import get_solver
from solvers.base import incompatibility

from .workloads import Features, budget_class, log_distance, size_class

RULES_PATH = Path(__file__).parent / "data" / "recommender.json"
NO_PLAN_REGRET = 1.0      # a solver without a plan on a workload counts as 100 % off the best
WITHIN = 0.01             # "within 1 % of the per-instance best"
PORTFOLIO_SIZE = 2        # solvers run side by side by `plan` (the cores of the machines we target)
NEAREST = 5               # workloads shown as evidence, and the fallback's neighbourhood
EXCLUDED = ("random",)    # the speedup reference, never a recommendation
GRANULARITIES = ("coarse", "fine")


class RecommenderError(ValueError):
    """Evidence or shipped rules that cannot be used (empty, corrupt)."""


@dataclass(frozen=True)
class Workload:
    family: str
    instance: str
    oracle: str
    budget: float
    setting: str
    features: Features
    results: dict  # solver -> {"objective": float | None, "time": float, "status": str}

    @property
    def best(self) -> float | None:
        found = [r["objective"] for r in self.results.values() if r["objective"] is not None]
        return min(found) if found else None

    def regret(self, solver: str) -> float:
        """The solver's objective over the best (NO_PLAN_REGRET when it had no plan or did not run)."""
        result, best = self.results.get(solver), self.best
        if result is None or result["objective"] is None or best is None:
            return NO_PLAN_REGRET
        return result["objective"] / best - 1.0 if best > 0 else 0.0

    def time(self, solver: str) -> float:
        result = self.results.get(solver)
        return result["time"] if result else math.nan

    def to_dict(self) -> dict:
        return {"family": self.family, "instance": self.instance, "oracle": self.oracle, "budget": self.budget,
                "setting": self.setting, "features": self.features.as_dict(), "results": self.results}

    @staticmethod
    def from_dict(data: dict) -> Workload:
        return Workload(data["family"], data["instance"], data["oracle"], float(data["budget"]), data["setting"],
                        Features(**data["features"]), data["results"])


def applicable(solver: str, features: Features) -> bool:
    return incompatibility(get_solver(solver), features.additive) is None and solver not in EXCLUDED


# ------------------------------------------------------------------ the rule table


def rule_key(features: Features, granularity: str) -> str:
    parts = [size_class(features.tables), budget_class(features.budget),
             "additive" if features.additive else "non-additive", "splits" if features.split_share > 0 else "whole"]
    if features.host_memory:  # tiers enlarge every table's options and change what fits where
        parts.append(f"tiers by {features.tier_pricing}" if features.tier_pricing else "tiers")
    if granularity == "fine":
        parts += ["tight" if features.tightness >= 0.8 else "roomy", "skewed" if features.heaviest >= 1 else "even"]
    return " | ".join(parts)


def rank(workloads: list[Workload], features: Features | None = None) -> list[dict]:
    """Solvers by mean regret over the workloads where some solver found a plan (then misses, then mean
    time): where none did, no choice would have been better, and the workload says nothing."""
    workloads = [w for w in workloads if w.best is not None]
    solvers = sorted({s for w in workloads for s in w.results})
    if features is not None:
        solvers = [s for s in solvers if applicable(s, features)]
    rows = []
    for s in solvers:
        regrets = np.array([w.regret(s) for w in workloads])
        times = np.array([w.time(s) for w in workloads])
        rows.append({"solver": s, "mean_regret": float(regrets.mean()), "max_regret": float(regrets.max()),
                     "within": int((regrets <= WITHIN).sum()), "misses": int((regrets >= NO_PLAN_REGRET).sum()),
                     "mean_time": float(np.nanmean(times)) if np.isfinite(times).any() else math.nan,
                     "workloads": len(workloads)})
    return sorted(rows, key=lambda r: (r["mean_regret"], r["misses"], r["mean_time"]))


@dataclass(frozen=True)
class Rules:
    granularity: str
    table: dict  # key -> ranking (list of rows)
    evidence: tuple[Workload, ...]

    @staticmethod
    def fit(workloads: list[Workload], granularity: str) -> Rules:
        groups: dict[str, list[Workload]] = defaultdict(list)
        for w in workloads:
            groups[rule_key(w.features, granularity)].append(w)
        return Rules(granularity, {k: rank(v) for k, v in sorted(groups.items())}, tuple(workloads))

    def nearest(self, features: Features, count: int = NEAREST) -> list[Workload]:
        return sorted(self.evidence, key=lambda w: log_distance(w.features, features))[:count]

    def recommend(self, features: Features) -> tuple[list[dict], str]:
        """The ranking for this question (applicable solvers only) and where it came from."""
        for granularity in dict.fromkeys((self.granularity, "coarse")):
            key = rule_key(features, granularity)
            ranking = [r for r in self.table.get(key, []) if applicable(r["solver"], features)]
            if granularity != self.granularity:
                ranking = rank([w for w in self.evidence if rule_key(w.features, granularity) == key], features)
            if ranking:
                return ranking, f"rule '{key}' ({ranking[0]['workloads']} workloads)"
        near = self.nearest(features)
        return rank(near, features), f"the {len(near)} nearest workloads (no rule for '{rule_key(features, 'coarse')}')"

    def portfolio(self, features: Features, size: int = PORTFOLIO_SIZE) -> list[str]:
        ranking, _ = self.recommend(features)
        return [r["solver"] for r in ranking[:size]]

    def to_dict(self) -> dict:
        return {"granularity": self.granularity, "rules": self.table,
                "evidence": [w.to_dict() for w in self.evidence]}

    @staticmethod
    def load(path: Path = RULES_PATH) -> Rules:
        try:
            data = json.loads(read_text(Path(path), "rules"))
        except (InstanceError, ValueError, RecursionError) as exc:
            raise RecommenderError(f"{path}: not a recommender rules file ({exc})") from exc
        problem = _rules_problem(data)
        if problem:
            raise RecommenderError(f"{path}: not a recommender rules file ({problem})")
        return Rules(data["granularity"], data["rules"], tuple(Workload.from_dict(w) for w in data["evidence"]))


_FEATURE_TYPES = {"tables": int, "devices": int, "nodes": int, "tightness": float, "heaviest": float,
                  "cost_cv": float, "split_share": float, "additive": bool, "budget": float, "host_memory": bool,
                  "tier_pricing": str}
# Rules files written before these features lack them (then Features' defaults).
_LATER_FEATURES = {"host_memory", "tier_pricing"}
_ROW_NUMBERS = ("mean_regret", "max_regret", "mean_time")
_ROW_COUNTS = ("within", "misses", "workloads")
_ROW_KEYS = {"solver", *_ROW_NUMBERS, *_ROW_COUNTS}
_WORKLOAD_KEYS = {"family", "instance", "oracle", "budget", "setting", "features", "results"}


def _number(value, integer: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return False
    return math.isfinite(value) and 0 <= value <= 1e18


def _rules_problem(data) -> str | None:
    """What makes a rules document unusable (naming the field), or None."""
    if not isinstance(data, dict) or set(data) != {"granularity", "rules", "evidence"}:
        return "expected exactly the keys granularity, rules, evidence"
    if data["granularity"] not in GRANULARITIES:
        return f"granularity: must be one of {GRANULARITIES}"
    if not isinstance(data["rules"], dict):
        return "rules: must map keys to rankings"
    for key, ranking in data["rules"].items():
        if not isinstance(ranking, list) or not all(
                isinstance(r, dict) and set(r) == _ROW_KEYS and isinstance(r["solver"], str)
                and all(_number(r[k]) for k in _ROW_NUMBERS) and all(_number(r[k], integer=True) for k in _ROW_COUNTS)
                for r in ranking):
            return f"rules.{key}: each entry needs exactly solver, {', '.join(_ROW_NUMBERS)} and {', '.join(_ROW_COUNTS)}"
    if not isinstance(data["evidence"], list) or not data["evidence"]:
        return "evidence: must be a non-empty list of workloads"
    for i, w in enumerate(data["evidence"]):
        where = f"evidence[{i}]"
        if not isinstance(w, dict) or set(w) != _WORKLOAD_KEYS or \
                not all(isinstance(w[k], str) for k in ("family", "instance", "oracle", "setting")):
            return f"{where}: needs exactly {', '.join(sorted(_WORKLOAD_KEYS))} (family, instance, oracle, setting as names)"
        if not _number(w.get("budget")) or w["budget"] <= 0:
            return f"{where}.budget: must be a positive number of seconds"
        features = w.get("features")
        if not isinstance(features, dict) or \
                not set(_FEATURE_TYPES) - _LATER_FEATURES <= set(features) <= set(_FEATURE_TYPES):
            return (f"{where}.features: must have exactly {', '.join(_FEATURE_TYPES)} "
                    f"({', '.join(sorted(_LATER_FEATURES))} may be left out)")
        for name, kind in _FEATURE_TYPES.items():
            if name not in features:
                continue
            value = features[name]
            ok = isinstance(value, kind) if kind in (bool, str) else _number(value, integer=kind is int)
            if not ok:
                wanted = {bool: "boolean", str: "string"}.get(kind, "finite number >= 0")
                return f"{where}.features.{name}: must be a {wanted}"
        results = w.get("results")
        if not isinstance(results, dict) or not results or not all(
                isinstance(r, dict) and set(r) == {"objective", "time", "status"} and isinstance(r["status"], str)
                and _number(r["time"])
                and (r.get("objective") is None or _number(r.get("objective"))) for r in results.values()):
            return f"{where}.results: each solver needs a status, a time and an objective (or null)"
    return None
