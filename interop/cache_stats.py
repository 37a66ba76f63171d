"""Our access curves as TorchRec's `CacheStatistics`, so that `CacheParams(stats=…)`, TorchRec's estimator
and its `EmbeddingOffloadScaleupProposer` (per-table cache sizing) read the same hit rates our oracles do.
torchrec loads only when `cache_statistics` is called."""
from __future__ import annotations

from functools import lru_cache

from instances import Instance, InstanceError, Table
from instances.access import AccessCurve, access_curve, expected_distinct

from .common import load_torchrec


@lru_cache(maxsize=1)
def _statistics_class():
    load_torchrec()
    from torchrec.distributed.types import CacheStatistics

    class CurveStatistics(CacheStatistics):
        """TorchRec's three numbers from an access curve: the distinct rows of a global batch (the cache's
        lookups per step), the miss rate of a cache of the hottest fraction clf of rows, and the area under
        the miss-rate curve (TorchRec's `cacheability`: 0 very cacheable, 1/2 uniform access)."""

        def __init__(self, curve: AccessCurve, lookups: float):
            self._curve = curve
            self._lookups = lookups

        @property
        def expected_lookups(self) -> float:
            return self._lookups

        def expected_miss_rate(self, clf: float) -> float:
            return 1.0 - self._curve.hit_rate(min(1.0, max(0.0, float(clf))))

        @property
        def cacheability(self) -> float:
            return self._curve.miss_area()

    return CurveStatistics


def cache_statistics(instance: Instance, table: Table):
    """The `CacheStatistics` of one of the instance's tables; its global batch is the per-device batch
    times the devices."""
    if table not in instance.tables:
        raise InstanceError("table", f"{table.name!r} is not a table of instance {instance.id!r}")
    batch = instance.workload.batch_size * instance.num_devices
    return _statistics_class()(access_curve(table), expected_distinct(table, batch))
