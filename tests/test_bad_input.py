"""Every command that reads a file, given every kind of broken file: one line naming the problem, exit 2,
no traceback, nothing written (benchmarks.fuzz holds the mutations and the check); and valid files the tool
still cannot plan (a table with no option, more devices than one machine plans, cuts TorchRec does not
make), refused the same way."""
import json

import pytest
from conftest import examples
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.cli import main
from benchmarks.fuzz import KINDS, MUTATIONS, TARGETS, Mutated, base_instance, mutate, run_case
from instances import instance_to_dict

CASES = [(target, mutation) for target in TARGETS for mutation in MUTATIONS]


@pytest.mark.parametrize("target,mutation", CASES, ids=[f"{t.name}-{m}" for t, m in CASES])
@examples(3, fixture_constant=True)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_broken_input_is_handled(target, mutation, seed, tmp_path):
    mutated = mutate(target.kind, mutation, seed)
    outcome = run_case(target, mutated, tmp_path / "work", main)
    assert outcome.handled, f"{mutated.mutation}: {outcome.problem}"


def test_every_file_kind_is_read_by_some_command():
    assert {t.kind for t in TARGETS} == set(KINDS)


# ---------------------------------------------------------------- valid JSON the tool still cannot plan

INSTANCE_TARGETS = [t for t in TARGETS if t.kind == "instance"]


def _instance_doc(edit) -> str:
    doc = instance_to_dict(base_instance())
    edit(doc)
    return json.dumps(doc)


def _only(types, dim=None, devices_per_node=None):
    def edit(doc):
        doc["tables"][1]["sharding_types"] = list(types)
        if dim is not None:
            doc["tables"][1]["dim"] = dim
        if devices_per_node is not None:
            doc["topology"]["devices_per_node"] = devices_per_node
    return edit


def _grow(nodes, per_node, tables=None):
    def edit(doc):
        doc["topology"].update(nodes=nodes, devices_per_node=per_node)
        if tables is not None:
            doc["tables"] = [dict(doc["tables"][1], name=f"t{i}") for i in range(tables)]
    return edit


UNPLANNABLE = [
    ("column-wise only, dim 6", _only(["column_wise"], dim=6), "tables[1].sharding_types: table b has no sharding option: column_wise cannot cut dim 6"),
    ("row-wise only, one device", _only(["row_wise"], devices_per_node=1), "table b has no sharding option: row_wise needs more than one device"),
    ("data-parallel only, one device", _only(["data_parallel", "column_wise"], dim=12, devices_per_node=1), "data_parallel needs more than one device"),
    ("table-row-wise only, one device per node", _only(["table_row_wise"], devices_per_node=1), "table_row_wise needs more than one device per node"),
    ("65,536 × 65,536 devices", _grow(65536, 65536), "topology: 65536 × 65536 = 4294967296 devices, more than the 65536"),
    ("65 tables × 65,536 devices", _grow(1, 65536, tables=65), "tables: 65 tables × 65536 devices = 4259840, more than the 4194304"),
]


@pytest.mark.parametrize("target", INSTANCE_TARGETS, ids=[t.name for t in INSTANCE_TARGETS])
@pytest.mark.parametrize("case,edit,message", UNPLANNABLE, ids=[c for c, _, _ in UNPLANNABLE])
def test_an_instance_that_cannot_be_planned_is_refused_naming_why(case, edit, message, target, tmp_path, capsys):
    outcome = run_case(target, Mutated(case, _instance_doc(edit), True), tmp_path / "work", main)
    assert outcome.handled and outcome.code == 2, outcome.problem or f"exit {outcome.code}"
    file = tmp_path / "instance.json"
    file.write_text(_instance_doc(edit))
    assert main(["instances", "validate", str(file)]) == 2
    assert message in capsys.readouterr().err


def test_a_table_left_without_an_option_is_a_proven_no_plan_not_a_crash(tmp_path, capsys):
    """Narrowing the types after validation (--sharding-types) can still leave a table no option."""
    file = tmp_path / "instance.json"
    file.write_text(_instance_doc(_only(["row_wise", "column_wise"], dim=6)))
    assert main(["solve", str(file), "--solver", "lpt", "--sharding-types", "table_wise,column_wise"]) == 3
    captured = capsys.readouterr()
    assert "table b has no sharding option" in captured.out + captured.err and "Traceback" not in captured.err


def _pooled_instance_and_plan(tmp_path, shards):
    """An all-pooled instance (what the TorchRec export takes) on 4 devices, and a plan with table a cut
    as `shards` (device, (col start, col end)) column-wise."""
    doc = instance_to_dict(base_instance())
    doc["tables"] = doc["tables"][:2]
    doc["topology"]["devices_per_node"] = 4
    (tmp_path / "instance.json").write_text(json.dumps(doc))
    a, b = doc["tables"]
    plan = {"schema_version": 2, "instance_id": doc["id"], "tables": [
        {"name": "a", "sharding_type": "column_wise",
         "shards": [{"device": d, "rows": [0, a["rows"]], "cols": list(c)} for d, c in shards]},
        {"name": "b", "sharding_type": "table_wise", "shards": [{"device": 0, "rows": [0, b["rows"]], "cols": [0, b["dim"]]}]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return tmp_path / "plan.json", tmp_path / "instance.json"


@pytest.mark.parametrize("shards,message", [
    ([(0, (0, 4)), (1, (4, 8)), (2, (8, 16))], "table a: column_wise cuts dim 16 into equal blocks whose widths are multiples of 4; 3 blocks are not"),
    ([(0, (0, 4)), (1, (4, 16))], "table a: column_wise blocks [0, 4), [4, 16) are not TorchRec's equal cut"),
])
def test_a_cut_torchrec_does_not_make_is_refused_by_show_plan_and_export(shards, message, tmp_path, capsys):
    plan, instance = _pooled_instance_and_plan(tmp_path, shards)
    out = tmp_path / "plan.pt"
    for argv in (["show-plan", str(plan), "--instance", str(instance)],
                 ["export-torchrec", str(plan), "--instance", str(instance), "-o", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_the_standard_cut_still_exports(tmp_path, capsys):
    plan, instance = _pooled_instance_and_plan(tmp_path, [(0, (0, 4)), (1, (4, 8)), (2, (8, 12)), (3, (12, 16))])
    assert main(["export-torchrec", str(plan), "--instance", str(instance), "-o", str(tmp_path / "plan.pt")]) == 0
