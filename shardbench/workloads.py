"""Workload features: what a question (an instance, an oracle, a time budget) looks like to a planner
chooser — size, HBM tightness and host memory, how skewed the per-table costs are, how much splitting
could help — computed the same way for the evidence in the stores and for a user's instance."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from costmodels import get_oracle, is_costly, oracle_is_additive, oracle_prices_tiers
from instances import HBM, Instance

# A table "worth splitting" carries at least this share of the balanced load alone: splitting it lets
# the pieces fill the gaps between devices (or, above 1, is the only way below it).
SPLIT_WORTH_SHARE = 0.25
# Tightnesses beyond this are alike to log_distance: without host memory there is no plan past 1, and with it
# HBM at a quarter of the need is as tight as the memory-tier evidence goes.
MAX_TIGHTNESS = 4.0
PROXY_ORACLE = "lookup"  # stands in for an oracle that is slow to build or to ask (measured, neural, torchrec)


@dataclass(frozen=True)
class Features:
    """`tightness`: the tables' memory (weights and optimizer state, whole) over the cluster's HBM — above 1
    only host memory lets them fit; `host_memory`: tables may live in host memory (the devices have some and
    a host kernel is allowed), so that memory pressure is a choice of tiers rather than a wall; `heaviest`:
    the costliest table alone over the balanced load (Σ costs / devices; lookup work for an oracle that is
    costly to build) — above 1 no whole-table plan balances; `cost_cv`: coefficient of variation of the per-table costs; `split_share`: share of tables
    that allow a split and carry ≥ SPLIT_WORTH_SHARE of the balanced load; `additive`: the oracle's cost of a
    device is the sum of its tables'; `budget`: seconds; `tier_pricing`: where tables may live in host
    memory, the oracle that prices them there by their kernel (`analytic` or `torchrec`; '' otherwise) —
    TorchRec's estimator prices host memory far more dearly than `analytic`, which changes which planner wins."""

    tables: int
    devices: int
    nodes: int
    tightness: float
    heaviest: float
    cost_cv: float
    split_share: float
    additive: bool
    budget: float
    host_memory: bool = False  # rules files written before memory tiers lack it: none of their workloads had any
    tier_pricing: str = ""     # and rules files written before it: their tiered workloads were all under analytic

    def as_dict(self) -> dict:
        return asdict(self)


def workload_features(instance: Instance, oracle_name: str, budget: float) -> Features:
    # Skew and split share are coarse features: for a costly oracle, lookup work is their measure, so that
    # a question is answered in well under a second.
    if is_costly(oracle_name):
        additive, costs_from = oracle_is_additive(oracle_name), get_oracle(PROXY_ORACLE)
    else:
        costs_from = get_oracle(oracle_name)  # an unknown name fails here
        additive = costs_from.additive
    costs = np.asarray(costs_from.single_table_costs(instance), dtype=float)
    balanced = costs.sum() / instance.num_devices
    memory = float(instance.total_storage()[HBM])
    capacity = float(instance.topology.memory_bytes) * instance.num_devices
    splittable = np.array([instance.may_split(table) for table in instance.tables])
    worth = costs >= SPLIT_WORTH_SHARE * balanced if balanced > 0 else np.zeros(len(costs), dtype=bool)
    mean = costs.mean()
    return Features(tables=instance.num_tables, devices=instance.num_devices, nodes=instance.topology.nodes,
                    tightness=memory / capacity,
                    heaviest=float(costs.max() / balanced) if balanced > 0 else 0.0,
                    cost_cv=float(costs.std() / mean) if mean > 0 else 0.0,
                    split_share=float((splittable & worth).mean()),
                    additive=bool(additive), budget=float(budget), host_memory=instance.uses_host_memory,
                    tier_pricing=oracle_name if instance.uses_host_memory and oracle_prices_tiers(oracle_name) else "")


def size_class(tables: int) -> str:
    return "≤100 tables" if tables <= 100 else "≤1000 tables" if tables <= 1000 else ">1000 tables"


def budget_class(budget: float) -> str:
    return "≤0.3 s" if budget <= 0.3 else "≤3 s" if budget <= 3 else ">3 s"


def log_distance(a: Features, b: Features) -> float:
    """How far two workloads are apart: log ratios of the sizes, budget and tightness, the skew and split
    share as they are, and a step for a different oracle kind, for host memory on one side only, or for
    tiers priced by another oracle."""
    def log_ratio(x: float, y: float) -> float:
        return abs(math.log(max(x, 1e-9) / max(y, 1e-9)))

    return (log_ratio(a.tables, b.tables) + log_ratio(a.devices, b.devices) + log_ratio(a.budget, b.budget)
            + log_ratio(min(a.tightness, MAX_TIGHTNESS), min(b.tightness, MAX_TIGHTNESS))
            + abs(min(a.heaviest, 3) - min(b.heaviest, 3)) + abs(a.split_share - b.split_share)
            + (0.0 if a.additive == b.additive else 2.0) + (0.0 if a.host_memory == b.host_memory else 2.0)
            + (0.0 if a.tier_pricing == b.tier_pricing else 1.0))
