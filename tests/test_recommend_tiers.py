"""Planner choice under memory pressure: the host-memory feature beside HBM tightness, rule keys and
distances that tell tiered workloads apart, `recommend` and `plan` on a tiered instance, and the
`workloads-tiers-*` family (its suite file, its instance sets and the command that made them)."""
import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks.suite import load_suites
from instances import HBM, Workload as Traffic, load_instances, save_instance
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from shardbench.cli import main
from shardbench.recommend import Rules, rule_key
from shardbench.workloads import Features, log_distance, workload_features

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "suites" / "workloads-tiers-40x4.toml"
SUITE_80 = ROOT / "benchmarks" / "suites" / "workloads-tiers-80x8.toml"
HOST = 256 * 2**30
SAMPLE_ARGS = ["--protocol", "autoshard", "--tables", "40", "--devices", "4", "--count", "5", "--seed", "0",
               "--host-memory-bytes", str(HOST), "--batch-size", "8192"]  # as the suite file's comment gives them


def _task(tightness: float, host: int | None, tables: int = 8, devices: int = 2):
    return sample_tasks(TaskSpec("autoshard", tables, count=1, num_devices=devices,
                                 memory=MemorySpec(tightness=tightness, host_memory_bytes=host),
                                 workload=Traffic(batch_size=8192)))[0]


@pytest.mark.parametrize("oracle", ["lookup", "analytic"])
@pytest.mark.parametrize("hbm", [0.25, 0.5, 0.75])
def test_tiered_features_are_hbm_tightness_and_host_memory(oracle, hbm):
    instance = _task(hbm, HOST)
    f = workload_features(instance, oracle, 1.0)
    need = float(instance.total_storage()[HBM])
    assert f.host_memory
    assert f.tightness == pytest.approx(need / (instance.topology.memory_bytes * instance.num_devices))
    assert f.tightness == pytest.approx(1 / hbm, rel=1e-6)  # HBM per device is ⌈hbm × need / devices⌉ bytes
    # Host memory changes no other feature: the same tables and HBM without it give the same values.
    bare = dataclasses.replace(instance, topology=dataclasses.replace(instance.topology, host_memory_bytes=0))
    assert dataclasses.replace(f, host_memory=False, tier_pricing="") == workload_features(bare, oracle, 1.0)
    # Which oracle prices the tiers: analytic does, the lookup table does not.
    assert f.tier_pricing == ("analytic" if oracle == "analytic" else "")
    # Host memory that no allowed kernel may use is none.
    hbm_only = instance.restricted_to_kernels(("fused", "dense"))
    assert not workload_features(hbm_only, oracle, 1.0).host_memory
    assert workload_features(hbm_only, oracle, 1.0).tier_pricing == ""


def test_tiers_priced_by_torchrec_are_named_without_building_its_estimator():
    f = workload_features(_task(0.5, HOST), "torchrec", 1.0)
    assert f.host_memory and f.tier_pricing == "torchrec"
    assert workload_features(_task(1.3, None), "torchrec", 1.0).tier_pricing == ""


def test_an_instance_without_host_memory_keeps_its_features():
    instance = _task(1.3, None)
    f = workload_features(instance, "analytic", 1.0)
    assert not f.host_memory and f.tightness == pytest.approx(1 / 1.3, rel=1e-6)


def test_rule_keys_and_distances_tell_tiered_workloads_apart():
    flat = Features(40, 4, 1, 2.0, 0.5, 1.0, 0.2, True, 1.0)
    tiered = dataclasses.replace(flat, host_memory=True)
    for granularity in ("coarse", "fine"):
        assert rule_key(tiered, granularity) != rule_key(flat, granularity)
        assert "tiers" in rule_key(tiered, granularity) and "tiers" not in rule_key(flat, granularity)
    assert log_distance(flat, tiered) == pytest.approx(2.0)
    # Tiers priced by TorchRec's estimator are a group of their own, apart from those priced by analytic
    # (and from rules files that predate the feature, whose tiered workloads carry '').
    by_analytic, by_torchrec = (dataclasses.replace(tiered, tier_pricing=o) for o in ("analytic", "torchrec"))
    for granularity in ("coarse", "fine"):
        keys = {rule_key(f, granularity) for f in (tiered, by_analytic, by_torchrec)}
        assert len(keys) == 3 and all("tiers" in k for k in keys)
        assert "tiers by torchrec" in rule_key(by_torchrec, granularity)
    assert log_distance(by_analytic, by_torchrec) == pytest.approx(1.0)
    # HBM at a quarter of the need is farther from half of it than from itself (not capped at 2).
    quarter = dataclasses.replace(tiered, tightness=4.0)
    assert log_distance(tiered, quarter) > 0


def test_rules_written_before_memory_tiers_still_load(tmp_path):
    data = Rules.load().to_dict()
    for w in data["evidence"]:
        w["features"].pop("host_memory")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert not any(w.features.host_memory for w in Rules.load(path).evidence)


def test_the_shipped_rules_hold_tiered_evidence_and_recommend_for_it(tmp_path, capsys):
    rules = Rules.load()
    tiered = [w for w in rules.evidence if w.features.host_memory]
    assert tiered and {w.family for w in tiered} == {s.name for path in (SUITE, SUITE_80) for s in load_suites(path)}
    path = tmp_path / "i.json"
    save_instance(_task(0.5, HOST, tables=12, devices=2), path)
    assert main(["recommend", str(path), "--oracle", "analytic", "--budget", "1"]) == 0
    out = capsys.readouterr().out
    assert "with host memory" in out and "| tiers" in out
    chosen = out.split("recommended: ")[1].split(";")[0].strip()
    # The choice is one that planned tiered evidence (whole-table solvers keep every table in HBM and do not).
    assert any(w.results.get(chosen, {}).get("objective") is not None for w in tiered)
    plan_path = tmp_path / "plan.json"
    assert main(["plan", str(path), "--oracle", "analytic", "--budget", "1", "-o", str(plan_path)]) == 0
    report = json.loads(plan_path.read_text())["report"]
    assert report["objective"] is not None


def test_the_family_suite_parses_and_its_instances_validate():
    suites = load_suites(SUITE)
    assert [s.name for s in suites] == [f"workloads-tiers-40x4-hbm{h}" for h in ("0.25", "0.5", "0.75")]
    for suite, hbm in zip(suites, (0.25, 0.5, 0.75)):
        assert suite.oracles == ("analytic", "torchrec")
        assert suite.time_limits == (0.1, 1.0, 10.0) and suite.workers == 2
        instances = load_instances(suite.instances)  # validates each
        assert len(instances) == 5
        for instance in instances:
            f = workload_features(instance, "lookup", 1.0)
            assert instance.num_tables == 40 and instance.num_devices == 4
            assert f.host_memory and f.tightness == pytest.approx(1 / hbm, rel=1e-6)


@pytest.mark.parametrize("folder, args", [
    ("workloads-tiers-n40-k4-hbm0.5", SAMPLE_ARGS),
    ("workloads-tiers-n80-k8-hbm0.5", ["--protocol", "autoshard", "--tables", "80", "--devices", "8", "--count", "5",
                                       "--seed", "1", "--host-memory-bytes", str(HOST), "--batch-size", "8192"]),
])
def test_the_instance_sets_are_what_their_command_samples(tmp_path, folder, args):
    folder = ROOT / "instances" / "sets" / folder
    assert main(["instances", "sample", *args, "--tightness", "0.5", "-o", str(tmp_path / "set")]) == 0
    for committed in sorted(folder.glob("*.json")):
        assert (tmp_path / "set" / committed.name).read_text() == committed.read_text(), committed.name


@pytest.mark.parametrize("family", ["workloads-80x8", "workloads-tiers-40x4-hbm0.25"])
def test_the_shipped_evidence_has_the_features_a_users_instance_gets(family):
    # A question is answered from features computed as the evidence's were: on a committed instance of the
    # family, with and without tiers, the user's features are the stored ones.
    w = next(w for w in Rules.load().evidence if w.family == family and w.setting == "instance")
    suite = next(s for path in sorted((ROOT / "benchmarks" / "suites").glob("workloads-*.toml"))
                 for s in load_suites(path) if s.name == family)
    instance = next(i for i in load_instances(suite.instances) if i.id == w.instance)
    assert workload_features(instance, w.oracle, w.budget) == w.features
