"""Reading result records: which oracle judged a plan and under which sharding setting it was planned,
the random baseline per instance, the best valid lower bound per instance and setting (with bound
conflicts — a claimed bound above a plan that the bound's problem allows — reported, never used), and the
best plan per instance across settings."""
from __future__ import annotations

import math

import numpy as np

BOUND_CONFLICT_TOLERANCE = 1e-9
TABLE_WISE_SETTING = "table_wise"  # what records from before sharding settings were planned under
INSTANCE_SETTING = "instance"      # the instance's own sharding types


def judge_of(record: dict) -> str:
    """The oracle that priced a record's plan (records without one were judged by their own oracle)."""
    return record.get("judge") or record["oracle"]


def setting_of(record: dict) -> str:
    return record.get("sharding") or TABLE_WISE_SETTING


def setting_types(setting: str) -> frozenset[str] | None:
    """The sharding types a setting allows (None: whatever the instance allows)."""
    return None if setting == INSTANCE_SETTING else frozenset(setting.split(","))


def allows(outer: str, inner: str) -> bool:
    """Every plan planned under `inner` is a plan of `outer`'s problem."""
    outer_types, inner_types = setting_types(outer), setting_types(inner)
    return outer_types is None or (inner_types is not None and inner_types <= outer_types)


def random_objectives(records: list[dict]) -> dict[tuple, list[float]]:
    out: dict[tuple, list[float]] = {}
    for r in records:
        if r["solver"] == "random" and r.get("objective") is not None:
            out.setdefault((r["instance"], judge_of(r)), []).append(r["objective"])
    return out


def best_objectives(records: list[dict]) -> dict[tuple, float]:
    """Per (instance, judge): the cheapest plan under any setting."""
    out: dict[tuple, float] = {}
    for r in records:
        if r.get("objective") is not None:
            key = (r["instance"], judge_of(r))
            out[key] = min(out.get(key, np.inf), r["objective"])
    return out


def best_bounds(records: list[dict]) -> tuple[dict[tuple, float], list[str]]:
    """Per (instance, judge, setting): the best of the computed bound and every bound a solver proved. A
    bound above a valid plan that its setting allows is a solver defect: it is left out and reported."""
    cheapest: dict[tuple, float] = {}
    for r in records:
        if r.get("objective") is not None:
            key = (r["instance"], judge_of(r), setting_of(r))
            cheapest[key] = min(cheapest.get(key, np.inf), r["objective"])
    out: dict[tuple, float] = {}
    conflicts = []
    for r in records:
        instance, judge, setting = r["instance"], judge_of(r), setting_of(r)
        plans = [(value, s) for (i, j, s), value in cheapest.items() if i == instance and j == judge and allows(setting, s)]
        cheapest_allowed = min((value for value, _ in plans), default=np.inf)
        for value in (r.get("instance_bound"), r.get("lower_bound")):
            if value is None or not math.isfinite(value):
                continue
            if value > cheapest_allowed * (1 + BOUND_CONFLICT_TOLERANCE):
                conflicts.append(f"{r['solver']} ({r['time_limit']:g} s, {setting}) claims bound {value:.9g} on "
                                 f"{instance}, above a plan of cost {cheapest_allowed:.9g}")
                continue
            key = (instance, judge, setting)
            out[key] = max(out.get(key, 0.0), float(value))
    return out, conflicts
