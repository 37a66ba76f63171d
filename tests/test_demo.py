"""`shardbench demo`: a tiny model planned end to end (both plans rated by TorchRec's estimator, our printed
objective the price of the plan written), TorchRec's planner failing, bad inputs refused in one line with
nothing written, and the shipped example: it parses, validates, and is what its script generates."""
import json
import re
import tomllib
import warnings
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import examples
from costmodels import get_oracle
from instances import load_instance, load_plan
from instances.pool import dlrm_pool
from shardbench.cli import main
from shardbench.demo import EXAMPLE, comparison, read_model

warnings.filterwarnings("ignore")
TINY = "\n".join(["id = \"tiny\"", "world_size = 4", "local_world_size = 2", "hbm_cap = 1073741824",
                  "batch_size = 256"]
                 + [line for name, rows, dim, pooling in (("user", 5000, 64, 20.0), ("item", 800, 32, 4.0),
                                                          ("ctx", 120, 16, 1.0), ("geo", 3000, 64, 8.0))
                    for line in ("[[tables]]", f'name = "{name}"', f"num_embeddings = {rows}",
                                 f"embedding_dim = {dim}", f"pooling_factors = [{pooling}]")]) + "\n"
OUTPUTS = ["instance.json", "plan.json", "plan.pt", "plan.sharding.json"]


def _printed_cost(text: str, who: str) -> float:
    return float(re.search(rf"^  {who}\s+([0-9.e+-]+)\s+planned in", text, re.M).group(1))


def test_the_demo_plans_a_tiny_model_and_writes_the_folder(tmp_path, capsys, monkeypatch):
    import torch

    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "out"
    monkeypatch.setattr("sys.argv", [".venv/bin/shardbench", "demo"])  # the hint runs as the user ran us
    assert main(["demo", str(tmp_path / "tiny.toml"), "--budget", "2", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == OUTPUTS
    instance = load_instance(out / "instance.json")
    plan = load_plan(out / "plan.json", instance)
    price = get_oracle("torchrec").plan_cost(instance, plan)
    assert _printed_cost(text, "shardbench") == pytest.approx(price, rel=1e-5)
    report = json.loads((out / "plan.json").read_text())["report"]
    assert report["objective"] == pytest.approx(price, rel=1e-12)
    theirs = report["torchrec_planner"]["objective"]
    assert _printed_cost(text, "TorchRec's planner") == pytest.approx(theirs, rel=1e-5)
    assert "× faster per step" in text or "equally fast" in text
    assert "over the enumerated options" in text and str(out) in text
    assert f"inspect: .venv/bin/shardbench show-plan {out / 'plan.json'} --instance {out / 'instance.json'}" in text
    readable = json.loads((out / "plan.sharding.json").read_text())
    assert set(readable["tables"]) == {t.name for t in instance.tables}
    exported = torch.load(out / "plan.pt", weights_only=False)
    assert set(next(iter(exported.plan.values()))) == {t.name for t in instance.tables}


def test_torchrecs_planner_failing_is_a_line_and_ours_is_still_written(tmp_path, capsys, monkeypatch):
    from torchrec.distributed.planner.types import PlannerError

    import interop.peer

    def refuse(instance):
        raise PlannerError("Unable to find a plan for this model\nmore detail")

    monkeypatch.setattr(interop.peer, "plan_with_torchrec", refuse)
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "out"
    assert main(["demo", str(tmp_path / "tiny.toml"), "--budget", "1", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "TorchRec's planner  no plan (Unable to find a plan for this model)" in captured.out
    assert "more detail" not in captured.out + captured.err and "Traceback" not in captured.err
    assert sorted(p.name for p in out.iterdir()) == OUTPUTS


@pytest.mark.parametrize("case", ["missing spec", "output is a file", "output under a file", "bad field",
                                  "not TOML"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, case):
    spec, out = tmp_path / "tiny.toml", tmp_path / "out"
    spec.write_text(TINY)
    if case == "missing spec":
        spec = tmp_path / "nope.toml"
    elif case == "output is a file":
        out.write_text("keep")
    elif case == "output under a file":
        (tmp_path / "file").write_text("keep")
        out = tmp_path / "file" / "out"
    elif case == "bad field":
        spec.write_text(TINY.replace("world_size = 4", "world_size = 0"))
    else:
        spec.write_text("world_size = [")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["demo", str(spec), "--budget", "1", "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err
    expected = {"missing spec": "nope.toml", "output is a file": "is a file", "output under a file": "not a folder",
                "bad field": "world_size", "not TOML": "not valid TOML"}[case]
    assert expected in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if case == "output is a file":
        assert out.read_text() == "keep"


def test_a_failed_write_leaves_no_output_and_no_folder(tmp_path, capsys, monkeypatch):
    """The third output's rename fails: the two already in place go, and the folder the demo made."""
    import errno

    import instances.io

    real, calls = instances.io.os.replace, []

    def replace(source, target):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(errno.EIO, "Input/output error")
        real(source, target)

    monkeypatch.setattr(instances.io.os, "replace", replace)
    (tmp_path / "tiny.toml").write_text(TINY)
    assert main(["demo", str(tmp_path / "tiny.toml"), "--budget", "1", "-o", str(tmp_path / "new" / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Input/output error" in err
    assert len(calls) == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]


def test_the_shipped_example_parses_validates_and_is_what_its_script_writes():
    from benchmarks.make_example import spec_text

    text = resources.files("shardbench").joinpath(EXAMPLE).read_text()
    assert text == spec_text(50)
    instance, where = read_model(None)
    assert "shipped example" in where and instance.validate() is instance
    assert (instance.num_tables, instance.num_devices, instance.topology.nodes) == (50, 16, 2)
    assert instance.topology.memory_bytes <= tomllib.loads(text)["hbm_cap"] == 80 * 2**30
    pool = dlrm_pool()
    for table in instance.tables:
        entry = pool[int(table.name.removeprefix("dlrm"))]
        assert table.rows == entry.rows and table.pooling_factor == pytest.approx(entry.pooling_factor, abs=5e-4)
        assert table.dim in (64, 128) and table.dtype_bytes == 2


@examples(50)
@given(st.floats(1e-6, 1e6), st.floats(1e-6, 1e6))
def test_the_comparison_names_the_faster_plan_with_a_ratio_of_at_least_one(theirs, ours):
    line = comparison(theirs, ours)
    if ours == theirs:
        assert "equally fast" in line
        return
    assert line.startswith("ours is" if ours < theirs else "TorchRec's is")
    assert float(re.search(r"is ([0-9.]+)×", line).group(1)) >= 1.0
