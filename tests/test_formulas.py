"""TorchRec's estimators restated over arrays (interop/formulas.py) against TorchRec itself: equal perf
components and storage on both tiers for every option of the test sets' instances, every sharding type and
kernel on small pooled and sequence models, drawn tables and topologies; and the pieces the formulas do
not cover (a kernel, a weighted table, a non-default perf config) priced by TorchRec's own estimators."""
import dataclasses
import warnings

import numpy as np
import pytest
from conftest import examples
from hypothesis import given
from hypothesis import strategies as st

import interop.oracle as oracle_module
from costmodels import get_oracle
from instances import Instance, InstanceError, Table, Topology, Workload, load_instance
from instances.kernels import FUSED_UVM_CACHING, kernels_for
from instances.model import SHARDING_TYPES
from instances.options import OptionPieces, enumerate_options
from instances.pieces import Pieces
from interop import formulas

warnings.filterwarnings("ignore")
SETS = "instances/sets"
FILES = [f"{SETS}/autoshard-n80-k8-torchrec-test/autoshard-n80-k8-s0-test-090.json",
         f"{SETS}/autoshard-n200-k20-torchrec-test/autoshard-n200-k20-s0-test-090.json",
         f"{SETS}/tiers-n80-k8-hbm0.5/autoshard-n80-k8-s0-test-090.json",
         f"{SETS}/tiers-n80-k8-hbm0.25/autoshard-n80-k8-s0-test-091.json"]
PAIRS = [(kind, kernel) for kind in SHARDING_TYPES for kernel in kernels_for(kind)]


def _sequence(instance: Instance) -> Instance:
    """The instance's tables of its most common width, as sequence tables (TorchRec's EmbeddingCollection,
    which takes one width)."""
    dims = [t.dim for t in instance.tables]
    common = max(set(dims), key=dims.count)
    tables = tuple(dataclasses.replace(t, pooled=False) for t in instance.tables if t.dim == common)
    return dataclasses.replace(instance, id=instance.id + "-seq", tables=tables).validate()


def _options(instance: Instance, keep=lambda option: True) -> Pieces:
    return OptionPieces.build(instance, [o for o in enumerate_options(instance) if keep(o)]).pieces


def _by_torchrec(monkeypatch, instance: Instance, pieces: Pieces):
    """TorchRec's own estimators for every piece (the oracle's path for pieces the formulas do not cover)."""
    with monkeypatch.context() as m:
        m.setattr(oracle_module._Estimates, "covered", lambda self, p: np.zeros(len(p), dtype=bool))
        return get_oracle("torchrec").bind(instance, pieces)


def _assert_formulas_equal_torchrec(monkeypatch, instance: Instance, pieces: Pieces):
    oracle = get_oracle("torchrec")
    ours = oracle.bind(instance, pieces)
    assert oracle._estimates(instance).covered(pieces).all()
    theirs = _by_torchrec(monkeypatch, instance, pieces)
    np.testing.assert_array_equal(ours.breakdown, theirs.breakdown)  # to the bit, as measured
    np.testing.assert_array_equal(ours.storage, theirs.storage)
    assert ours.breakdown.shape == (len(pieces), 4) and ours.storage.dtype == np.int64


@pytest.mark.parametrize("path", FILES + ["sequence"])
def test_formulas_equal_torchrec_on_every_option_of_the_test_sets(monkeypatch, path):
    instance = _sequence(load_instance(FILES[2])) if path == "sequence" else load_instance(path)
    pieces = _options(instance)
    assert len(set(pieces.kind.tolist())) >= 4
    _assert_formulas_equal_torchrec(monkeypatch, instance, pieces)


def _small(nodes: int, per_node: int, pooled: bool, host: bool = True) -> Instance:
    """Tables across TorchRec's block penalties (widths 8 to 256; sequence tables all 64 wide, as
    TorchRec's EmbeddingCollection asks), an element size each, short tables with empty row shards,
    pooling below and above one lookup."""
    specs = [(3, 16, 0.5, 2), (1000, 8, 4.0, 4), (500, 64, 12.0, 2), (2000, 128, 1.0, 1), (40, 256, 2.5, 4)]
    tables = tuple(Table(f"t{i}", rows, dim if pooled else 64, dtype, pooling, (1.0,) + (0.0,) * 16, pooled=pooled)
                   for i, (rows, dim, pooling, dtype) in enumerate(specs))
    return Instance("small", tables, Topology(nodes, per_node, 1 << 30, host_memory_bytes=(1 << 32) if host else 0),
                    Workload(batch_size=96), sharding_types=SHARDING_TYPES).validate()


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled", "sequence"])
@pytest.mark.parametrize("nodes,per_node", [(1, 4), (3, 2)])
@pytest.mark.parametrize("kind,kernel", PAIRS)
def test_formulas_equal_torchrec_for_every_sharding_type_and_kernel(monkeypatch, kind, kernel, nodes, per_node, pooled):
    instance = _small(nodes, per_node, pooled)
    pieces = _options(instance, lambda o: o.sharding_type == kind and o.kernel == kernel)
    if kind == "grid_shard" and (nodes == 1 or not pooled):  # a grid needs two nodes and a table wider than 128
        assert not len(pieces)
        return
    assert len(pieces) and set(pieces.kind.tolist()) == {SHARDING_TYPES.index(kind)}
    _assert_formulas_equal_torchrec(monkeypatch, instance, pieces)


@st.composite
def _instances(draw):
    n = draw(st.integers(1, 4))
    pooled = draw(st.booleans())
    dims = [4 * draw(st.integers(1, 80)) for _ in range(n if pooled else 1)] * (1 if pooled else n)  # one width in a sequence model
    tables = tuple(Table(f"t{i}", draw(st.integers(1, 5000)), dims[i], draw(st.sampled_from([1, 2, 4])),
                         draw(st.floats(0.05, 60.0)), (1.0,) + (0.0,) * 16, pooled=pooled) for i in range(n))
    topology = Topology(draw(st.integers(1, 3)), draw(st.integers(1, 4)), 1 << 34,
                        intra_node_a2a_bw=draw(st.floats(1e9, 1e12)), inter_node_a2a_bw=draw(st.floats(1e8, 1e11)),
                        host_memory_bytes=draw(st.sampled_from([0, 1 << 35])), host_link_bw=draw(st.floats(1e9, 1e11)))
    return Instance("drawn", tables, topology, Workload(batch_size=draw(st.integers(1, 4096))),
                    sharding_types=SHARDING_TYPES).validate()


@examples(15)
@given(_instances())
def test_formulas_equal_torchrec_on_drawn_tables_and_topologies(instance):
    with pytest.MonkeyPatch.context() as monkeypatch:
        _assert_formulas_equal_torchrec(monkeypatch, instance, _options(instance))


def _spy_on_torchrec(monkeypatch) -> list:
    """The options the oracle hands TorchRec's estimators, as they are handed."""
    handed = []
    estimate = oracle_module._Estimates.estimate

    def spy(self, options):
        handed.extend(options)
        estimate(self, options)

    monkeypatch.setattr(oracle_module._Estimates, "estimate", spy)
    return handed


def test_a_kernel_the_formulas_do_not_cover_is_priced_by_torchrec(monkeypatch):
    instance = _small(1, 4, pooled=True)
    pieces = _options(instance)
    expected = get_oracle("torchrec").bind(instance, pieces)
    monkeypatch.setattr(formulas, "COVERED_KERNELS", formulas.COVERED_KERNELS - {FUSED_UVM_CACHING})
    handed = _spy_on_torchrec(monkeypatch)
    priced = get_oracle("torchrec").bind(instance, pieces)
    cached = pieces.is_kernel(FUSED_UVM_CACHING)
    groups = {(t, k, w, f) for t, k, w, f, c in zip(pieces.table.tolist(), pieces.kind.tolist(), pieces.width.tolist(),
                                                    pieces.load_factor.tolist(), cached.tolist()) if c}
    assert {o.compute_kernel for o in handed} == {FUSED_UVM_CACHING} and len(handed) == len(groups)
    np.testing.assert_allclose(priced.breakdown, expected.breakdown, rtol=1e-9, atol=0)
    np.testing.assert_array_equal(priced.storage, expected.storage)


def test_a_weighted_model_is_priced_by_torchrec(monkeypatch):
    """TorchRec prices weighted features differently (ids read twice, an extra backward kernel), which the
    formulas do not restate: every piece goes to its estimators."""
    instance = _small(1, 4, pooled=True)
    weighted = dataclasses.replace(instance, tables=tuple(dataclasses.replace(t, weighted=True) for t in instance.tables))
    pieces = _options(instance)
    plain = get_oracle("torchrec").bind(instance, pieces)
    handed = _spy_on_torchrec(monkeypatch)
    oracle = get_oracle("torchrec")
    priced = oracle.bind(weighted, pieces)
    assert oracle._estimates(weighted).tables.problem == ("weighted features",) * instance.num_tables
    assert not oracle._estimates(weighted).covered(pieces).any() and handed
    assert (priced.breakdown.sum(axis=1) > plain.breakdown.sum(axis=1)).all()
    np.testing.assert_array_equal(priced.storage, plain.storage)


def test_a_perf_config_the_formulas_do_not_restate_sends_every_piece_to_torchrec(monkeypatch):
    from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig

    instance = _small(1, 4, pooled=True, host=False)
    pieces = _options(instance, lambda o: o.sharding_type == "table_wise")
    default = get_oracle("torchrec").bind(instance, pieces)
    monkeypatch.setattr(EmbeddingPerfEstimatorConfig, "_use_block_usage_penalty", False, raising=False)
    oracle = get_oracle("torchrec")
    priced = oracle.bind(instance, pieces)
    assert "_use_block_usage_penalty" in oracle._estimates(instance).setting.problem
    assert not oracle._estimates(instance).covered(pieces).any()
    narrow = (pieces.width < 128)
    assert (priced.breakdown[narrow, 0] < default.breakdown[narrow, 0]).all()
    np.testing.assert_array_equal(priced.breakdown[~narrow], default.breakdown[~narrow])


def test_a_piece_torchrec_would_not_cut_is_refused_naming_its_table():
    instance = _small(1, 4, pooled=True, host=False)
    rows = instance.tables[1].rows
    off = Pieces.of([1], [SHARDING_TYPES.index("row_wise")], [1], [rows // 4 + 1], [0], [instance.tables[1].dim],
                    kernel=[0])
    with pytest.raises(InstanceError, match="t1.*not one TorchRec cuts"):
        get_oracle("torchrec").bind(instance, off)
    narrow = Pieces.of([2], [SHARDING_TYPES.index("column_wise")], [0], [instance.tables[2].rows], [8], [24], kernel=[0])
    with pytest.raises(InstanceError, match="t2"):
        get_oracle("torchrec").bind(instance, narrow)
