"""What placing each priced piece on each device moves from the previous plan (instances.moves' rule, asked
once for every piece), for solvers that replan within a move budget: the bytes a piece moves onto a device
that held none of it, less what a device held, and where the old plan had each old table."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from instances import Instance
from instances.moves import Previous, held, moved_bytes, rectangle_bytes
from instances.options import FREE, NODE, Option, OptionPieces


@dataclass(frozen=True, eq=False)
class Moves:
    """`stored[p]`: the bytes piece p moves onto a device that held none of it (0 for a new table's pieces);
    `keys` (sorted piece × devices + device) and `kept`: on the devices that held part of a piece, the bytes
    it then does not move. `old_option[t]` is table t's old sharding among the options (-1: a new table, or
    one whose old sharding the instance no longer allows),
    `old_device[p]` the device piece p of an old option was on (-1 otherwise), and `fixed_node[o]` the node
    a table-row-wise option must stay on where types are kept (-1: any)."""

    previous: Previous
    devices: int
    stored: np.ndarray
    keys: np.ndarray
    kept: np.ndarray
    old_option: np.ndarray
    old_device: np.ndarray
    fixed_node: np.ndarray

    @property
    def budget(self) -> float:
        """The move budget in bytes (infinite when unlimited)."""
        return np.inf if self.previous.budget is None else float(self.previous.budget)

    @classmethod
    def build(cls, instance: Instance, options: OptionPieces, previous: Previous) -> "Moves":
        pieces, k = options.pieces, instance.num_devices
        known = np.array([old is not None for old in previous.shardings], dtype=bool)[pieces.table]
        stored = np.where(known, rectangle_bytes(instance, pieces.table, pieces.rows, pieces.width), 0)
        index, device, area = held(previous, pieces.table, pieces.row_start, pieces.row_end, pieces.col_start,
                                   pieces.col_end)
        kept = stored[index] - moved_bytes(stored[index], (pieces.rows * pieces.width)[index], area)
        useful = kept > 0
        keys = index[useful] * k + device[useful]
        order = np.argsort(keys, kind="stable")
        old_option = np.full(instance.num_tables, -1, dtype=np.int64)
        old_device = np.full(len(pieces), -1, dtype=np.int64)
        fixed_node = np.full(len(options.options), -1, dtype=np.int64)
        index_of = {option: o for o, option in enumerate(options.options)}
        for t, old in enumerate(previous.shardings):
            o = -1 if old is None else index_of.get(old_option_of(t, old), -1)
            if o < 0:  # a new table, or an old one whose old sharding the instance no longer allows
                continue
            old_option[t] = o
            members, placement = options.members(o), options.options[o].placement
            if placement == FREE:  # column blocks (or the whole table) by their columns
                where = {s.cols: s.device for s in old.shards}
                old_device[members] = [where[int(pieces.col_start[p]), int(pieces.col_end[p])] for p in members]
            else:
                node = old.shards[0].device // instance.topology.devices_per_node
                old_device[members] = options.devices(o, node=node, per_node=instance.topology.devices_per_node)
                if previous.keep_types and placement == NODE:
                    fixed_node[o] = node
        return cls(previous, k, stored.astype(np.int64), keys[order], kept[useful][order].astype(np.int64), old_option,
                   old_device, fixed_node)

    def moved(self, pieces, devices) -> np.ndarray:
        """What each piece moves onto its device (arrays of equal length)."""
        pieces, devices = np.asarray(pieces, dtype=np.int64), np.asarray(devices, dtype=np.int64)
        if self.keys.size == 0:
            return self.stored[pieces].copy()
        keys = pieces * self.devices + devices
        at = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        return self.stored[pieces] - np.where(self.keys[at] == keys, self.kept[at], 0)

    def row(self, piece: int) -> np.ndarray:
        """What the piece moves onto each device."""
        return self.moved(np.full(self.devices, piece), np.arange(self.devices))

    def rows(self, pieces) -> np.ndarray:
        """What each of the pieces moves onto each device, shape (pieces, devices)."""
        pieces = np.asarray(pieces, dtype=np.int64)
        return self.moved(np.repeat(pieces, self.devices), np.tile(np.arange(self.devices), pieces.size)).reshape(
            pieces.size, self.devices)


def old_option_of(table: int, old) -> Option:
    """The option an old table's sharding is (its type, shard count, kernel and load factor)."""
    return Option(table, old.sharding_type, len(old.shards), old.compute_kernel, old.cache_load_factor)
