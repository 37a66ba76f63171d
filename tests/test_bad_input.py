"""Every command that reads a file, given every kind of broken file: one line naming the problem, exit 2,
no traceback, nothing written (benchmarks.fuzz holds the mutations and the check); and valid files the tool
still cannot plan (a table with no option, more devices than one machine plans, cuts TorchRec does not
make), refused the same way."""
import json
import os

import pytest
from conftest import examples
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.fuzz import KINDS, MUTATIONS, TARGETS, Mutated, base_instance, mutate, run_case
from instances import instance_to_dict
from shardbench.cli import main

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


# ---------------------------------------------------------------- outputs that cannot be written


def _files(work):
    """Every file and folder under `work`, the results store's own files left out (a sweep's store keeps what
    it ran, by design: a rerun resumes from it)."""
    return {p.relative_to(work).as_posix() for p in work.rglob("*") if not p.name.startswith("fuzz.jsonl")}


def _writers(work):
    """Each command that writes a file, with its output under `out`."""
    from dataclasses import replace

    from benchmarks.fuzz import _json, _suite_doc, base_instance, toml_text
    from instances.model import instance_to_dict
    from instances.sharding import Plan, Shard, TableSharding, plan_to_dict

    (work / "instance.json").write_text(_json(instance_to_dict(base_instance())))
    pooled = replace(base_instance(), tables=base_instance().tables[:2])  # TorchRec's EBC takes pooled tables
    a, b = pooled.tables
    halves = (Shard(0, (0, a.rows), (0, 8)), Shard(1, (0, a.rows), (8, 16)))
    whole = (Shard(1, (0, b.rows), (0, b.dim)),)
    plan = Plan(pooled.id, (TableSharding("column_wise", halves), TableSharding("table_wise", whole)))
    (work / "pooled.json").write_text(_json(instance_to_dict(pooled)))
    (work / "plan.json").write_text(_json(plan_to_dict(plan, pooled)))
    (work / "set").mkdir()
    (work / "set" / "fuzz.json").write_text(_json(instance_to_dict(base_instance())))
    (work / "set" / "manifest.json").write_text(_json({"instances": ["fuzz.json"]}))
    (work / "suite.toml").write_text(toml_text(_suite_doc()))
    instance, out = str(work / "instance.json"), work / "out"
    return {
        "solve": lambda o: ["solve", instance, "--solver", "lpt", "--oracle", "lookup", "-o", str(o / "plan.json")],
        "plan": lambda o: ["plan", instance, "--oracle", "lookup", "--budget", "0.5", "--solvers", "lpt",
                           "-o", str(o / "plan.json")],
        "export-torchrec": lambda o: ["export-torchrec", str(work / "plan.json"), "--instance",
                                      str(work / "pooled.json"), "-o", str(o / "plan.pt")],
        "instances sample": lambda o: ["instances", "sample", "--tables", "2", "--devices", "1", "--count", "1",
                                       "-o", str(o / "set")],
        "flexshard": lambda o: ["flexshard", instance, "-o", str(o / "tiers.json")],
        "flexshard --plot": lambda o: ["flexshard", instance, "--plot", str(o / "frontier.png")],
        "bench": lambda o: ["bench", str(work / "suite.toml")],
    }, out


WRITERS = ("solve", "plan", "export-torchrec", "instances sample", "flexshard", "flexshard --plot", "bench")


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("command", WRITERS)
def test_a_full_disk_is_one_line_naming_the_output_and_leaves_nothing(command, tmp_path, monkeypatch, capsys):
    import errno
    import os

    argvs, out = _writers(tmp_path)
    out.mkdir()
    before = _files(tmp_path)
    real_fdopen = os.fdopen

    class Full:
        """A file on a full disk: opening works, writing fails as the kernel says."""

        def __init__(self, handle):
            self.handle = handle

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real_fdopen(fd, mode, *args, **kwargs)
        return Full(handle) if "w" in mode else handle

    monkeypatch.setattr(os, "fdopen", fdopen)
    assert main(argvs[command](out)) == 2
    line = _one_error_line(capsys)
    assert "No space left on device" in line and str(out) in line, line
    assert _files(tmp_path) == before


@pytest.mark.parametrize("command", [c for c in WRITERS if c != "bench"])
def test_an_output_under_a_file_is_one_line(command, tmp_path, capsys):
    argvs, _ = _writers(tmp_path)
    (tmp_path / "blocker").write_text("a file, not a folder")
    before = _files(tmp_path)
    assert main(argvs[command](tmp_path / "blocker" / "deeper")) == 2
    assert "blocker is not a directory" in _one_error_line(capsys)
    assert _files(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
@pytest.mark.parametrize("command", WRITERS)
def test_a_read_only_folder_is_one_line_naming_the_output(command, tmp_path, capsys):
    argvs, out = _writers(tmp_path)
    out.mkdir()
    before = _files(tmp_path)
    out.chmod(0o500)
    try:
        assert main(argvs[command](out)) == 2
        assert "Permission denied" in _one_error_line(capsys)
        assert _files(tmp_path) == before
    finally:
        out.chmod(0o700)


# ---------------------------------------------------------------- interrupts, sizes, duplicates


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import shardbench.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_solvers", interrupted)
    assert main(["solvers"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_a_huge_world_size_is_refused_before_torchrec_objects_are_built(tmp_path, monkeypatch, capsys):
    import json

    import interop.importer as importer

    def forbidden():
        raise AssertionError("TorchRec objects built before the sizes were checked")

    monkeypatch.setattr(importer, "load_torchrec", forbidden)
    spec = {"tables": [{"name": "t", "num_embeddings": 10, "embedding_dim": 8}], "world_size": 10**7,
            "local_world_size": 8, "hbm_cap": "80GiB", "batch_size": 64}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["instances", "import-torchrec", str(tmp_path / "spec.json"), "-o", str(tmp_path / "i.json")]) == 2
    line = _one_error_line(capsys)
    assert "world_size" in line and str(importer.MAX_DEVICES) in line
    assert not (tmp_path / "i.json").exists()


def test_refit_refuses_a_store_given_twice(tmp_path, capsys):
    from benchmarks.fuzz import _suite_files, _suite_doc, toml_text

    _suite_files(tmp_path)
    (tmp_path / "suite.toml").write_text(toml_text(_suite_doc()))
    (tmp_path / "other.toml").write_text(toml_text({**_suite_doc(), "name": "other"}))
    for pair in (["suite.toml", "suite.toml"], ["suite.toml", "other.toml"]):
        assert main(["refit-recommender", *(str(tmp_path / p) for p in pair), "-o", str(tmp_path / "rules.json")]) == 2
        assert "is also that of" in _one_error_line(capsys)
        assert not (tmp_path / "rules.json").exists()


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
    assert main(["solve", str(file), "--solver", "lpt", "--oracle", "lookup",
                 "--sharding-types", "table_wise,column_wise"]) == 3
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
    for argv in (["show-plan", str(plan), "--instance", str(instance), "--oracle", "analytic"],
                 ["export-torchrec", str(plan), "--instance", str(instance), "-o", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_the_standard_cut_still_exports(tmp_path, capsys):
    plan, instance = _pooled_instance_and_plan(tmp_path, [(0, (0, 4)), (1, (4, 8)), (2, (8, 12)), (3, (12, 16))])
    assert main(["export-torchrec", str(plan), "--instance", str(instance), "-o", str(tmp_path / "plan.pt")]) == 0
