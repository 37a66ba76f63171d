"""The optimum by brute force over every option of every table and every device of every piece (tiny
instances only): the reference that tests and the tiny-instance benchmark hold the solvers to."""
from __future__ import annotations

import itertools

import numpy as np

from instances import Instance
from instances.options import OptionPieces, enumerate_options
from solvers.candidates import Candidates


def placements(options: OptionPieces, o: int, instance: Instance) -> list[np.ndarray]:
    """Every way to put option o's pieces on devices, as the option's placement allows."""
    k, per_node = instance.num_devices, instance.topology.devices_per_node
    option, members = options.options[o], options.members(o)
    nodes = range(k // per_node)
    if option.placement == "free":
        return [np.array(p) for p in itertools.product(range(k), repeat=members.size)]
    if option.placement == "node_free":
        return [node * per_node + np.array(p) for node in nodes
                for p in itertools.product(range(per_node), repeat=members.size)]
    if option.placement == "node":
        return [options.devices(o, node=n, per_node=per_node) for n in nodes]
    if option.placement == "grid":
        blocks = int(options.block[members].max()) + 1
        return [options.devices(o, node=np.array(choice), per_node=per_node)
                for choice in itertools.product(nodes, repeat=blocks)]
    return [options.devices(o)]


def brute_force_over_options(instance: Instance, oracle) -> float | None:
    """The least max device cost over every plan of the enumerated options that fits memory (by the rule the
    solvers place by: the instance's storage, and the oracle's own where it counts memory itself); None
    when no plan fits."""
    options = enumerate_options(instance)
    op = OptionPieces.build(instance, options)
    priced = oracle.bind(instance, op.pieces)
    storage = Candidates(instance, op, priced, np.ones(len(options), dtype=bool), oracle.own_memory).storage
    costs = priced.costs
    k = instance.num_devices
    capacity = instance.topology.capacity.as_array()
    per_table = []
    for t in range(instance.num_tables):
        choices = []
        for o, option in enumerate(options):
            if option.table != t:
                continue
            members = op.members(o)
            for devices in placements(op, o, instance):
                load = np.bincount(devices, weights=costs[members], minlength=k)
                used = np.zeros((k, 2), dtype=np.int64)
                np.add.at(used, devices, storage[members])
                choices.append((load, used))
        per_table.append(choices)
    best = None
    for combo in itertools.product(*per_table):
        used = sum(c[1] for c in combo)
        if (used > capacity).any():
            continue
        value = float(sum(c[0] for c in combo).max())
        best = value if best is None else min(best, value)
    return best
