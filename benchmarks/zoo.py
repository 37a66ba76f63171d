"""The conformance zoo: TorchRec models nobody on this team wrote, each planned by ShardbenchPlanner and by
TorchRec's EmbeddingShardingPlanner in three memory regimes, both plans rated by TorchRec's estimator."""
from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
import os
import statistics
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Callable

from instances.io import read_text, write_text_atomic
from shardbench.isolation import kill_group
from solvers.base import wall_limit

from .environment import provenance
from .pages import revisions_line

GiB = 2**30
FITS_HBM = 80 * GiB     # an 80 GB GPU: every model here fits in HBM
SHORT_DDR = 512 * GiB   # host memory per rank where a regime gives ddr_cap
RESERVE = 0.15          # the share of HBM both planners keep back (TorchRec's default)
RATING_MATCH = 1e-9     # our objective against TorchRec's rating of our plan: relative, float noise only
TINY_ROWS = 10_000      # a tiny model's tables have this many times fewer rows, at least TINY_MIN_ROWS
TINY_MIN_ROWS = 100
# TorchRec's default batch per rank (its planner's BATCH_SIZE) for its test models; MLPerf's global 65,536
# over 8 ranks for the Criteo models.
TEST_BATCH, CRITEO_BATCH = 512, 8192
TEST_FLOAT_FEATURES = 10  # TorchRec's test models' default num_float_features

REGIMES = {
    "fits": "80 GiB of HBM per rank: every table fits in HBM",
    "short": "HBM short, TorchRec's default Topology: the HBM its planner leaves the tables after its default "
             "reservation (15 %, and per rank 6 × the dense parameters and 20 input batches), over all ranks, is "
             "half of what its storage estimate gives the tables in HBM; no ddr_cap, so TorchRec assumes its "
             "default DDR (128 GiB per rank)",
    "short-ddr": "the same HBM with an explicit ddr_cap of 512 GiB per rank",
}

# MLPerf DLRM-DCNv2 (Criteo 1TB, multi-hot): rows per table, and multi_hot_sizes as the pooling factors.
CRITEO_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938,
               155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)
CRITEO_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
CRITEO_DIM = 128
CRITEO_DENSE = 13

# The test models' tables: (rows, dim, pooling factor per feature), a spread of sizes and lookups.
PLAIN = ((10_000_000, 128, (20,)), (5_000_000, 64, (1,)), (2_000_000, 128, (8,)), (1_000_000, 64, (3,)),
         (300_000, 32, (40,)), (50_000, 64, (2,)), (5_000, 16, (1,)), (200, 16, (5,)))
WEIGHTED = ((2_000_000, 64, (10,)), (100_000, 32, (25,)), (1_000, 16, (4,)))
MULTI_FEATURE = ((8_000_000, 128, (20, 2, 6)), (2_000_000, 64, (1, 30, 4)), (500_000, 64, (8, 8, 1)),
                 (40_000, 32, (3, 50, 2)), (1_000, 16, (1, 1, 12)))
SEQUENCE = ((4_000_000, 64, (30,)), (1_000_000, 64, (12,)), (200_000, 64, (50,)), (10_000, 64, (5,)))
# Tables behind a position-weighted feature processor: (name, rows, dim, max length); half of it on average.
POSITION_WEIGHTED = (("pw0", 3_000_000, 64, 40), ("pw1", 200_000, 64, 10))


@dataclass(frozen=True)
class ZooModel:
    """A model (on the meta device unless built on another) with what planning it takes: the sharders that
    shard it, pooling factors per feature as ParameterConstraints by table name, the batch per rank, and its
    ranks; `batch(n, seed)` gives the arguments of one forward over n samples, on cpu (a ModelInput, whose
    label TorchRec's test models score themselves in training, or a DLRM's dense features and KeyedJaggedTensor)."""

    name: str
    source: str
    model: object
    sharders: tuple
    constraints: dict
    batch_size: int
    world_size: int
    local_world_size: int
    tables: int
    features: int
    batch: Callable[[int, int], tuple]


def _rows(rows: int, tiny: bool) -> int:
    return min(rows, max(TINY_MIN_ROWS, rows // TINY_ROWS)) if tiny else rows


def _configs(kind, prefix: str, specs, tiny: bool) -> list:
    """Tables `prefix0`, `prefix1`, ... of the config class `kind`, one feature per pooling factor (a single
    feature named as its table)."""
    def features(name: str, count: int) -> list[str]:
        return [f"{name}_f{j}" for j in range(count)] if count > 1 else [name]

    return [kind(name=f"{prefix}{i}", num_embeddings=_rows(rows, tiny), embedding_dim=dim,
                 feature_names=features(f"{prefix}{i}", len(pooling))) for i, (rows, dim, pooling) in enumerate(specs)]


def _constraints(prefix: str, specs) -> dict:
    from torchrec.distributed.planner import ParameterConstraints

    return {f"{prefix}{i}": ParameterConstraints(pooling_factors=[float(p) for p in pooling])
            for i, (_, _, pooling) in enumerate(specs)}


def _sharders(*kinds: str) -> tuple:
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder

    made = {"ebc": EmbeddingBagCollectionSharder, "ec": EmbeddingCollectionSharder,
            "fp-ebc": FeatureProcessedEmbeddingBagCollectionSharder}
    return tuple(made[k]() for k in kinds)


def _test_model(name: str, source: str, build: Callable, sharders: tuple, constraints: dict, device: str,
                tables: list, weighted: list | tuple = (), max_lengths: dict | None = None) -> ZooModel:
    """One of TorchRec's test models on 4 ranks in 2 nodes, built with every tensor it allows on `device`; its
    batches are ModelInput.generate's over its `tables` and `weighted` tables, position-weighted features
    capped at `max_lengths` (their position weights end there)."""
    import torch

    with torch.device(device):
        model = build(torch.device(device))
    configs = [c for m in model.modules() for c in _module_configs(m)]
    # Per feature, as ModelInput.generate takes them; 0 leaves a feature uncapped.
    capped = None if max_lengths is None else [max_lengths.get(f, 0) for t in tables for f in t.feature_names]

    def batch(size: int, seed: int) -> tuple:
        from torchrec.distributed.test_utils.test_model import ModelInput

        _, (local,) = ModelInput.generate(batch_size=size, world_size=1, num_float_features=TEST_FLOAT_FEATURES,
                                          tables=tables, weighted_tables=list(weighted),
                                          max_feature_lengths=capped, random_seed=seed)
        return (local,)

    return ZooModel(name, source, model, sharders, constraints, TEST_BATCH, 4, 2, len(configs),
                    sum(len(c.feature_names) for c in configs), batch)


def _module_configs(module) -> list:
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    if isinstance(module, EmbeddingBagCollection):
        return module.embedding_bag_configs()
    if isinstance(module, EmbeddingCollection):
        return module.embedding_configs()
    return []


SPARSE_NN = "torchrec.distributed.test_utils.test_model.TestSparseNN"


def sparse_nn(tiny: bool = False, device: str = "meta") -> ZooModel:
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed.test_utils.test_model import TestSparseNN

    tables = _configs(EmbeddingBagConfig, "t", PLAIN, tiny)
    return _test_model("sparse-nn", SPARSE_NN, lambda d: TestSparseNN(tables=tables, dense_device=d, sparse_device=d),
                       _sharders("ebc"), _constraints("t", PLAIN), device, tables)


def sparse_nn_weighted(tiny: bool = False, device: str = "meta") -> ZooModel:
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed.test_utils.test_model import TestSparseNN

    tables = _configs(EmbeddingBagConfig, "t", PLAIN[:5], tiny)
    weighted = _configs(EmbeddingBagConfig, "w", WEIGHTED, tiny)
    return _test_model("sparse-nn-weighted", SPARSE_NN + " (weighted_tables)",
                       lambda d: TestSparseNN(tables=tables, weighted_tables=weighted, dense_device=d, sparse_device=d),
                       _sharders("ebc"), {**_constraints("t", PLAIN[:5]), **_constraints("w", WEIGHTED)}, device,
                       tables, weighted)


def sparse_nn_multi_feature(tiny: bool = False, device: str = "meta") -> ZooModel:
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed.test_utils.test_model import TestSparseNN

    tables = _configs(EmbeddingBagConfig, "m", MULTI_FEATURE, tiny)
    return _test_model("sparse-nn-multi-feature", SPARSE_NN + " (3 features per table)",
                       lambda d: TestSparseNN(tables=tables, dense_device=d, sparse_device=d),
                       _sharders("ebc"), _constraints("m", MULTI_FEATURE), device, tables)


def sparse_nn_sequence(tiny: bool = False, device: str = "meta") -> ZooModel:
    from torchrec import EmbeddingConfig
    from torchrec.distributed.test_utils.test_model import TestSparseNN

    tables = _configs(EmbeddingConfig, "s", SEQUENCE, tiny)
    return _test_model("sparse-nn-sequence", SPARSE_NN + " (EmbeddingConfig tables: TestECSparseArch)",
                       lambda d: TestSparseNN(tables=tables, dense_device=d, sparse_device=d),
                       _sharders("ec"), _constraints("s", SEQUENCE), device, tables)


def mixed_ebc_ec(tiny: bool = False, device: str = "meta") -> ZooModel:
    from torchrec import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.distributed.test_utils.test_model import TestMixedEmbeddingSparseArch

    tables = _configs(EmbeddingBagConfig, "t", PLAIN[:5], tiny) + _configs(EmbeddingConfig, "s", SEQUENCE, tiny)
    return _test_model("mixed-ebc-ec", "torchrec.distributed.test_utils.test_model.TestMixedEmbeddingSparseArch",
                       lambda d: TestMixedEmbeddingSparseArch(tables=tables, dense_device=d, sparse_device=d, device=d),
                       _sharders("ebc", "ec"), {**_constraints("t", PLAIN[:5]), **_constraints("s", SEQUENCE)},
                       device, tables)


def sparse_nn_position_weighted(tiny: bool = False, device: str = "meta") -> ZooModel:
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.test_utils.test_model import TestSparseNN

    # TestSparseNN keys its position weights by table name and looks features up by them: one feature
    # per table, named as the table.
    weighted = [EmbeddingBagConfig(name=name, num_embeddings=_rows(rows, tiny), embedding_dim=dim, feature_names=[name])
                for name, rows, dim, _ in POSITION_WEIGHTED]
    tables = _configs(EmbeddingBagConfig, "t", PLAIN[:4], tiny) + weighted
    lengths = {name: length for name, _, _, length in POSITION_WEIGHTED}
    constraints = {**_constraints("t", PLAIN[:4]),
                   **{name: ParameterConstraints(pooling_factors=[length / 2]) for name, length in lengths.items()}}
    return _test_model("sparse-nn-position-weighted", SPARSE_NN + " (max_feature_lengths: "
                       "FeatureProcessedEmbeddingBagCollection with PositionWeightedModuleCollection)",
                       lambda d: TestSparseNN(tables=tables, max_feature_lengths=lengths, dense_device=d,
                                              sparse_device=d),
                       _sharders("ebc", "fp-ebc"), constraints, device, tables, max_lengths=lengths)


def _criteo(name: str, kind: str, tiny: bool, device: str) -> ZooModel:
    """torchrec.models.dlrm's `kind` with MLPerf DLRM-DCNv2's arch sizes and Criteo-1TB tables, fp32 (TorchRec's
    default), 8 ranks in one node; its batches take each table's multi-hot size of lookups per sample."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.models import dlrm

    tables = [EmbeddingBagConfig(name=f"t_cat_{i}", num_embeddings=_rows(rows, tiny), embedding_dim=CRITEO_DIM,
                                 feature_names=[f"cat_{i}"]) for i, rows in enumerate(CRITEO_ROWS)]
    extra = {"dcn_num_layers": 3, "dcn_low_rank_dim": 512} if kind == "DLRM_DCN" else {}
    with torch.device(device):  # DLRM_DCN builds its cross net without a device argument
        ebc = EmbeddingBagCollection(tables=tables, device=torch.device(device))
        model = getattr(dlrm, kind)(embedding_bag_collection=ebc, dense_in_features=CRITEO_DENSE,
                                    dense_arch_layer_sizes=[512, 256, CRITEO_DIM],
                                    over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
                                    dense_device=torch.device(device), **extra)
    constraints = {f"t_cat_{i}": ParameterConstraints(pooling_factors=[float(h)]) for i, h in enumerate(CRITEO_HOT)}

    def batch(size: int, seed: int) -> tuple:
        generator = torch.Generator().manual_seed(seed)
        values = torch.cat([torch.randint(0, t.num_embeddings, (hot * size,), generator=generator)
                            for t, hot in zip(tables, CRITEO_HOT)])
        # A KeyedJaggedTensor's lengths run key by key, each over the batch.
        lengths = torch.tensor(CRITEO_HOT).repeat_interleave(size)
        return (torch.rand(size, CRITEO_DENSE, generator=generator),
                KeyedJaggedTensor.from_lengths_sync(keys=[f"cat_{i}" for i in range(len(tables))], values=values,
                                                    lengths=lengths))

    return ZooModel(name, f"torchrec.models.dlrm.{kind}", model, _sharders("ebc"), constraints, CRITEO_BATCH, 8, 8,
                    len(tables), len(tables), batch)


def dlrm_criteo(tiny: bool = False, device: str = "meta") -> ZooModel:
    return _criteo("dlrm-criteo", "DLRM", tiny, device)


def dlrm_dcn_criteo(tiny: bool = False, device: str = "meta") -> ZooModel:
    return _criteo("dlrm-dcn-criteo", "DLRM_DCN", tiny, device)


MODELS: dict[str, Callable[..., ZooModel]] = {
    "sparse-nn": sparse_nn,
    "sparse-nn-weighted": sparse_nn_weighted,
    "sparse-nn-multi-feature": sparse_nn_multi_feature,
    "sparse-nn-sequence": sparse_nn_sequence,
    "mixed-ebc-ec": mixed_ebc_ec,
    "sparse-nn-position-weighted": sparse_nn_position_weighted,
    "dlrm-criteo": dlrm_criteo,
    "dlrm-dcn-criteo": dlrm_dcn_criteo,
}


def hbm_need(zoo: ZooModel) -> int:
    """Bytes of HBM the model's tables take with every table in HBM, by TorchRec's storage estimate: per
    table, the least HBM of its options with the `fused` kernel (weights and TorchRec's buffers)."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    options = EmbeddingEnumerator(topology=topology(zoo, FITS_HBM, None), batch_size=zoo.batch_size,
                                  constraints=zoo.constraints).enumerate(zoo.model, list(zoo.sharders))
    least: dict[tuple[str, str], int] = {}
    for option in options:
        if option.compute_kernel == "fused":
            hbm = sum(shard.storage.hbm for shard in option.shards)
            key = (option.path, option.name)
            least[key] = min(least.get(key, hbm), hbm)
    return sum(least.values())


def reserved_hbm(zoo: ZooModel) -> int:
    """HBM per rank that TorchRec's planner keeps back by default beyond its share (its
    HeuristicalStorageReservation: dense parameters × 6 and 20 input batches)."""
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    ranks = topology(zoo, FITS_HBM, None)
    with warnings.catch_warnings():  # its advice to use another reservation: this one is its planner's default
        warnings.simplefilter("ignore", FutureWarning)
        reservation = HeuristicalStorageReservation(percentage=RESERVE)
    left = reservation.reserve(ranks, zoo.batch_size, zoo.model, list(zoo.sharders), zoo.constraints)
    return int(FITS_HBM * (1 - RESERVE) - left.devices[0].storage.hbm)


@dataclass(frozen=True)
class Sizing:
    """What the regimes are cut from: `need`, the bytes of HBM the tables take (hbm_need), and `reserved`,
    the bytes per rank TorchRec's planner keeps back beyond its share (reserved_hbm)."""

    need: int
    reserved: int


def regime_caps(zoo: ZooModel, regime: str, sizing: Sizing) -> tuple[int, int | None]:
    """HBM and DDR per rank in a regime (see REGIMES); DDR None where TorchRec's default stands."""
    short = int((sizing.need / (2 * zoo.world_size) + sizing.reserved) / (1 - RESERVE))
    return {"fits": (FITS_HBM, None), "short": (short, None), "short-ddr": (short, SHORT_DDR)}[regime]


def topology(zoo: ZooModel, hbm_cap: int, ddr_cap: int | None):
    """The model's ranks on cuda with these memories and TorchRec's default bandwidths."""
    from torchrec.distributed.planner import Topology

    return Topology(world_size=zoo.world_size, local_world_size=zoo.local_world_size, compute_device="cuda",
                    hbm_cap=hbm_cap, **({"ddr_cap": ddr_cap} if ddr_cap is not None else {}))


@dataclass(frozen=True)
class Side:
    """One planner on one case: `status` is plan, failed (it raised: `error` is the exception's class and
    first line), killed (at the timeout) or died; `rating_ms` is TorchRec's rating of its plan (max over
    ranks of Σ shard perf.total), `hbm_peak` the most HBM a rank holds by TorchRec's storage estimate,
    `rating_error` why the plan could not be rated or measured; `shardings` counts tables by sharding type /
    kernel. Ours also reports its objective, bound, gap and winning solver (and, where `plan` re-sized its
    caches off the grid of load factors, the cost before, `grid_objective_ms`, which the bound and the gap are
    of); TorchRec's planner its own rating of its best plan (`self_rating_ms`), which the rating must equal."""

    status: str
    error: str | None = None
    wall_s: float | None = None
    rating_ms: float | None = None
    rating_error: str | None = None
    hbm_peak: int | None = None
    shardings: dict = dataclasses.field(default_factory=dict)
    objective_ms: float | None = None
    bound_ms: float | None = None
    gap: float | None = None
    grid_objective_ms: float | None = None
    solver: str | None = None
    self_rating_ms: float | None = None


@dataclass(frozen=True)
class ZooRow:
    """One model in one regime, both planners on it; `hbm_cap` and `ddr_cap` are per rank (`ddr_cap` None:
    TorchRec's default), `hbm_need` and `hbm_reserved` the Sizing the regime was cut from."""

    model: str
    regime: str
    source: str
    tiny: bool
    budget: float
    timeout: float
    ours: Side
    torchrec: Side
    tables: int | None = None
    features: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    batch_size: int | None = None
    hbm_cap: int | None = None
    ddr_cap: int | None = None
    hbm_need: int | None = None
    hbm_reserved: int | None = None
    env: dict = dataclasses.field(default_factory=dict)
    schema_version: int | None = None  # the results record's (benchmarks.store)
    revision: str | None = None        # the code's (benchmarks.environment)
    revision_note: str | None = None   # how a revision was inferred where it was not recorded

    @property
    def objective_error(self) -> float | None:
        """How far our reported objective is from TorchRec's rating of our plan, relative to the rating."""
        if self.ours.objective_ms is None or not self.ours.rating_ms:
            return None
        return (self.ours.objective_ms - self.ours.rating_ms) / self.ours.rating_ms

    @property
    def ratio(self) -> float | None:
        """TorchRec's rating of its plan over its rating of ours (> 1: ours is faster)."""
        if self.ours.rating_ms and self.torchrec.rating_ms is not None:
            return self.torchrec.rating_ms / self.ours.rating_ms
        return None

    def record(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> ZooRow:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in fields and k not in ("ours", "torchrec")},
                   ours=Side(**record["ours"]), torchrec=Side(**record["torchrec"]))


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0].strip()}" if lines else type(error).__name__


def _shardings(sharding_plan) -> dict:
    counts = Counter(f"{p.sharding_type}/{p.compute_kernel}" for module_plan in sharding_plan.plan.values()
                     for p in module_plan.values())
    return dict(sorted(counts.items()))


def hbm_peak(zoo: ZooModel, ranks, sharding_plan) -> int:
    """The most HBM any rank holds under the plan by TorchRec's storage estimate: its enumerator's
    shard.storage.hbm with each table narrowed to its planned type, kernel, cache and column block, each
    shard on its planned rank (the zoo's table names are unique across a model's modules)."""
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    planned = [(path, name, p) for path, module_plan in sharding_plan.plan.items() for name, p in module_plan.items()]
    narrowed = {}
    for _, name, p in planned:
        base = zoo.constraints.get(name) or ParameterConstraints()
        width = int(p.sharding_spec.shards[0].shard_sizes[1]) if p.sharding_type == "column_wise" else None
        narrowed[name] = dataclasses.replace(base, sharding_types=[p.sharding_type], compute_kernels=[p.compute_kernel],
                                             cache_params=p.cache_params or base.cache_params,
                                             min_partition=width or base.min_partition)
    options = EmbeddingEnumerator(topology=ranks, batch_size=zoo.batch_size,
                                  constraints=narrowed).enumerate(zoo.model, list(zoo.sharders))
    held = [0] * ranks.world_size
    for path, name, p in planned:
        rank_of = None if p.sharding_spec is None else {tuple(m.shard_offsets): int(m.placement.rank())
                                                        for m in p.sharding_spec.shards}
        option = next((o for o in options if (o.path, o.name, o.sharding_type, o.compute_kernel) ==
                       (path, name, p.sharding_type, p.compute_kernel)
                       and (rank_of is None or set(rank_of) == {tuple(s.offset) for s in o.shards})), None)
        if option is None:
            raise ValueError(f"table {name}: TorchRec's enumerator has no {p.sharding_type} / {p.compute_kernel} "
                             "option cut as the plan cuts it")
        on = list(p.ranks) if rank_of is None else [rank_of[tuple(s.offset)] for s in option.shards]
        for shard, rank in zip(option.shards, on):
            held[rank] += shard.storage.hbm
    return max(held)


def _rated(zoo: ZooModel, ranks, sharding_plan, wall: float, **reported) -> Side:
    from interop.export import torchrec_rating

    shardings = _shardings(sharding_plan)
    try:
        rating = max(torchrec_rating(zoo.model, list(zoo.sharders), sharding_plan, ranks, zoo.batch_size,
                                     zoo.constraints))
        peak = hbm_peak(zoo, ranks, sharding_plan)
    except Exception as error:  # a plan TorchRec's estimators cannot rate is a finding, kept in the row
        return Side("plan", wall_s=wall, rating_error=_first_line(error), shardings=shardings, **reported)
    return Side("plan", wall_s=wall, rating_ms=rating, hbm_peak=peak, shardings=shardings, **reported)


def plan_ours(zoo: ZooModel, ranks, budget: float) -> Side:
    """ShardbenchPlanner at `budget` (its defaults otherwise) on the model, and TorchRec's rating of the plan."""
    from shardbench import ShardbenchPlanner

    planner = ShardbenchPlanner(ranks, batch_size=zoo.batch_size, constraints=zoo.constraints, budget=budget)
    started = time.monotonic()
    try:
        sharding_plan = planner.plan(zoo.model, list(zoo.sharders))
    except Exception as error:
        return Side("failed", error=_first_line(error), wall_s=time.monotonic() - started)
    wall = time.monotonic() - started
    result = planner.result
    return _rated(zoo, ranks, sharding_plan, wall, objective_ms=result.objective, bound_ms=result.bound,
                  gap=result.gap, grid_objective_ms=result.grid_objective, solver=result.solver)


def plan_torchrec(zoo: ZooModel, ranks) -> Side:
    """TorchRec's EmbeddingShardingPlanner with its defaults on the model, and TorchRec's rating of the plan."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    planner = EmbeddingShardingPlanner(topology=ranks, batch_size=zoo.batch_size, constraints=zoo.constraints,
                                       debug=False)
    started = time.monotonic()
    try:
        sharding_plan = planner.plan(zoo.model, list(zoo.sharders))
    except Exception as error:
        return Side("failed", error=_first_line(error), wall_s=time.monotonic() - started)
    wall = time.monotonic() - started
    totals = [0.0] * ranks.world_size
    for option in planner._best_plan or []:  # its own rating: what its planner chose this plan by
        for shard in option.shards:
            totals[shard.rank] += shard.perf.total
    return _rated(zoo, ranks, sharding_plan, wall, self_rating_ms=max(totals))


def _child(connection, work: Callable[[], Side]) -> None:
    os.setpgid(0, 0)  # its own process group: a kill at the timeout takes the planner's own workers along
    try:
        connection.send(work())
    except BaseException as error:  # whatever the planner's process raises outside the planner is its row
        connection.send(Side("failed", error=_first_line(error)))
    finally:
        connection.close()


def bounded(work: Callable[[], Side], timeout: float) -> Side:
    """`work` in a forked process killed (with everything it started) after `timeout` seconds: its Side, or
    one saying it was killed or died. The process is not a daemon, as multiprocessing's workers are, since
    ShardbenchPlanner forks its portfolio's members from it."""
    context = mp.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, work))
    started = time.monotonic()
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            return Side("killed", error=f"killed at the {timeout:g} s timeout", wall_s=time.monotonic() - started)
        try:
            return receiver.recv()
        except EOFError:
            process.join(1.0)
            return Side("died", error=f"its process died (exit code {process.exitcode})",
                        wall_s=time.monotonic() - started)
    finally:
        kill_group(process)
        receiver.close()


def run_case(zoo: ZooModel, regime: str, sizing: Sizing, budget: float, timeout: float, tiny: bool) -> ZooRow:
    """Both planners on one model in one regime, each in its own process killed at `timeout` seconds, one
    after the other so that neither's wall time includes the other's work."""
    hbm_cap, ddr_cap = regime_caps(zoo, regime, sizing)
    ranks = topology(zoo, hbm_cap, ddr_cap)
    ours = bounded(partial(plan_ours, zoo, ranks, budget), timeout)
    theirs = bounded(partial(plan_torchrec, zoo, ranks), timeout)
    return ZooRow(zoo.name, regime, zoo.source, tiny, budget, timeout, ours, theirs,
                  tables=zoo.tables, features=zoo.features, world_size=zoo.world_size,
                  local_world_size=zoo.local_world_size, batch_size=zoo.batch_size, hbm_cap=hbm_cap,
                  ddr_cap=ddr_cap, hbm_need=sizing.need, hbm_reserved=sizing.reserved, **provenance())


def _cases(name: str, regimes, budget: float, timeout: float, tiny: bool):
    """The model's rows, one per regime as it finishes; a model that does not build gives its rows with both
    planners failed."""
    try:
        zoo = MODELS[name](tiny)
        sizing = Sizing(hbm_need(zoo), reserved_hbm(zoo))
    except Exception as error:
        unbuilt = Side("failed", error=f"the model did not build: {_first_line(error)}")
        for regime in regimes:
            yield ZooRow(name, regime, "", tiny, budget, timeout, unbuilt, unbuilt, **provenance())
        return
    for regime in regimes:
        yield run_case(zoo, regime, sizing, budget, timeout, tiny)


def run_zoo(models=tuple(MODELS), regimes=tuple(REGIMES), budget: float = 10.0, timeout: float = 300.0,
            tiny: bool = False, on_row: Callable[[ZooRow], None] | None = None) -> list[ZooRow]:
    """Every model in every regime, `on_row` told of each row as it finishes (TorchRec is imported once,
    before the planners' processes fork)."""
    from interop.common import load_torchrec

    load_torchrec()
    rows = []
    for name in models:
        for row in _cases(name, regimes, budget, timeout, tiny):
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def write_store(path, rows: list[ZooRow]) -> None:
    write_text_atomic(path, "".join(json.dumps(row.record(), sort_keys=True) + "\n" for row in rows))


def read_store(path) -> list[ZooRow]:
    """The rows of a zoo store; a line that is not a zoo row is a StoreError naming it."""
    from .store import StoreError

    rows = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(ZooRow.from_record(json.loads(line)))
        except (ValueError, TypeError, KeyError) as error:
            raise StoreError(f"{path}:{number}: not a zoo row ({error})") from error
    return rows


def _gib(value: float | None) -> str:
    return "" if value is None else f"{value / GiB:.3g}"


def _cut(text: str, limit: int = 150) -> str:
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _rating(side: Side) -> str:
    if side.status != "plan":
        return f"**{side.status}**: {_cut(side.error or '')}"
    if side.rating_ms is None:
        return f"**not rated**: {_cut(side.rating_error or '')}"
    return f"{side.rating_ms:.4g}"


def _usable(row: ZooRow) -> float | None:
    """HBM per rank left to the tables after TorchRec's default reservation."""
    if row.hbm_cap is None or row.hbm_reserved is None:
        return None
    return row.hbm_cap * (1 - RESERVE) - row.hbm_reserved


def _peak(side: Side, usable: float | None) -> str:
    if side.hbm_peak is None:
        return "—"
    over = usable is not None and side.hbm_peak > usable
    return f"{_gib(side.hbm_peak)}" + (" **over**" if over else "")


def _memory(row: ZooRow) -> str:
    if row.hbm_cap is None:
        return ""
    return f"{_gib(row.hbm_cap)}" + (f" + DDR {_gib(row.ddr_cap)}" if row.ddr_cap is not None else "")


def _readings(rows: list[ZooRow]) -> list[str]:
    ours = [r for r in rows if r.ours.rating_ms is not None]
    theirs = [r for r in rows if r.torchrec.rating_ms is not None]
    both = [r for r in rows if r.ratio is not None]
    exact = [r for r in ours if r.objective_error is not None and abs(r.objective_error) <= RATING_MATCH]
    off = [r for r in ours if r.objective_error is not None and abs(r.objective_error) > RATING_MATCH]
    judged = [r for r in theirs if r.torchrec.self_rating_ms is not None]
    agree = [r for r in judged if math.isclose(r.torchrec.self_rating_ms, r.torchrec.rating_ms, rel_tol=1e-9)]
    late = [r for r in rows if r.ours.wall_s is not None and r.ours.wall_s > wall_limit(r.budget)]
    over = [f"{r.model}/{r.regime} ({who})" for r in rows
            for who, side in (("ours", r.ours), ("TorchRec's", r.torchrec))
            if side.hbm_peak is not None and _usable(r) is not None and side.hbm_peak > _usable(r)]
    lines = [f"- Plans rated: ours {len(ours)}/{len(rows)}, TorchRec's planner's {len(theirs)}/{len(rows)}."]
    if both:
        ratios = [r.ratio for r in both]
        lines.append(f"- Where both planned ({len(both)}): ours rated no worse on "
                     f"{sum(x >= 1 - 1e-9 for x in ratios)}/{len(both)}; TorchRec's plan / ours median "
                     f"{statistics.median(ratios):.3f}× (min {min(ratios):.3f}×, max {max(ratios):.3f}×).")
    misses = ", ".join(f"{r.model}/{r.regime} ({r.objective_error:+.2%})" for r in off)
    worst = max((abs(r.objective_error) for r in exact + off), default=0.0)
    lines.append(f"- Our reported objective equals TorchRec's rating of our plan (within {RATING_MATCH:g} relative) on "
                 f"{len(exact)}/{len(exact) + len(off)} (largest difference {worst:.1e})"
                 + (f": off on {misses}" if off else "") + ".")
    lines.append(f"- The judge against TorchRec's planner's own number for its plan: equal on {len(agree)}/"
                 f"{len(judged)}.")
    lines.append(f"- Our planner past 1.1 × budget + 2 s: {len(late)}/{len(rows)}"
                 + (" (" + ", ".join(f"{r.model}/{r.regime} {r.ours.wall_s:.1f} s" for r in late) + ")" if late else "")
                 + ".")
    lines.append("- Plans holding more HBM on a rank than TorchRec's default reservation leaves: "
                 + (", ".join(over) if over else "none") + ".")
    return lines


def page(rows: list[ZooRow], store: str) -> str:
    """The results page: the models, the regimes, per model and regime both planners' ratings, our
    objective against the rating, times, failures, memory and shardings."""
    first = rows[0]
    env = first.env or {}
    machine = env.get("machine", {})
    sizes = "Tables at tiny sizes (rows / 10,000, at least 100): a smoke run. " if first.tiny else ""
    lines = [
        "#### The conformance zoo: TorchRec's models, planned by ShardbenchPlanner and by TorchRec's planner", "",
        "Models nobody on this team wrote — TorchRec's test models and `torchrec.models` DLRMs with MLPerf's "
        "Criteo-1TB tables — built on the meta device. `ShardbenchPlanner` (its defaults, budget "
        f"{first.budget:g} s) and TorchRec's `EmbeddingShardingPlanner` (its defaults: its proposers and "
        "`HeuristicalStorageReservation(0.15)`) plan each, one after the other, each in its own process killed "
        f"at {first.timeout:g} s. Both plans are rated by TorchRec's estimator on the model "
        "(`interop.export.torchrec_rating`: its enumerator and default estimators, each table narrowed to its "
        "planned type, kernel and cut; the rating is the slowest rank's Σ shard perf.total, ms per step). "
        f"{sizes}Run on {machine.get('cpu', '?')} ({machine.get('cores', '?')} cores), torch {env.get('torch')}, "
        f"torchrec {env.get('torchrec')}, fbgemm_gpu {env.get('fbgemm_gpu')}. Records: `{store}`; "
        "regenerate with `shardbench zoo` (`--render-only` rewrites this page from the records).", "",
        "Regimes (HBM per rank, with the ranks and batch of each model below):", "",
        *[f"- `{name}`: {text}." for name, text in REGIMES.items()], "",
        "| model | TorchRec model | tables (features) | ranks (per node) | batch per rank | tables' HBM (GiB) "
        "| TorchRec's reservation beyond 15 %, per rank (GiB) |", "|---|---|---|---|---|---|---|"]
    for row in {r.model: r for r in rows}.values():
        lines.append(f"| {row.model} | `{row.source}` | {row.tables} ({row.features}) | {row.world_size} "
                     f"({row.local_world_size}) | {row.batch_size} | {_gib(row.hbm_need)} | {_gib(row.hbm_reserved)} |")
    lines += ["", "Ratings (ms per step, TorchRec's estimator); `objective − rating`: our planner's "
              "`result.objective` against TorchRec's rating of the plan it exported, relative to the rating.", "",
              "| model | regime | HBM per rank (GiB) | TorchRec's plan | our plan | TorchRec's / ours | our objective "
              "| objective − rating | our time (s) | TorchRec's time (s) |", "|---" * 10 + "|"]
    for r in rows:
        objective = "" if r.ours.objective_ms is None else f"{r.ours.objective_ms:.4g}"
        error = ("" if r.objective_error is None else "0" if abs(r.objective_error) <= RATING_MATCH
                 else f"{r.objective_error:+.2%}")
        ratio = "" if r.ratio is None else f"{r.ratio:.3f}×"
        times = ["" if s.wall_s is None else f"{s.wall_s:.1f}" for s in (r.ours, r.torchrec)]
        lines.append(f"| {r.model} | {r.regime} | {_memory(r)} | {_rating(r.torchrec)} | {_rating(r.ours)} | {ratio} "
                     f"| {objective} | {error} | {times[0]} | {times[1]} |")
    lines += ["", "Memory and shardings: the most HBM a rank holds by TorchRec's storage estimate (GiB; **over**: "
              "more than the HBM TorchRec's default reservation leaves a rank, which both planners keep to), and "
              "tables per sharding type / kernel.", "",
              "| model | regime | HBM left by TorchRec's reservation | our peak | TorchRec's peak | our shardings "
              "| TorchRec's shardings |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        usable = _usable(r)
        kinds = [", ".join(f"{k} {n}" for k, n in s.shardings.items()) for s in (r.ours, r.torchrec)]
        lines.append(f"| {r.model} | {r.regime} | {_gib(usable)} | {_peak(r.ours, usable)} "
                     f"| {_peak(r.torchrec, usable)} | {kinds[0]} | {kinds[1]} |")
    lines += ["", "Readings:", "", *_readings(rows), "",
              revisions_line([{"revision": r.revision, "revision_note": r.revision_note} for r in rows])]
    return "\n".join(lines) + "\n"
