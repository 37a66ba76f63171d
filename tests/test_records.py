"""Records say which code produced them and pages say it too: the checkout's revision (dirty or unknown where
it must be), the store's schema checks, the backfill of old records, and pages that show their plot and
name their revisions."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import backfill_revisions
from benchmarks.environment import checkout_revision, revision
from benchmarks.leaderboard import publish_leaderboard
from benchmarks.pages import plot_line, revisions_line, short_revision
from benchmarks.store import SCHEMA_VERSIONS, StoreError, read_records
from benchmarks.suite import STORES, load_suite

ROOT = Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"
RECORD = {"instance": "i", "solver": "lpt", "oracle": "lookup", "time_limit": 1.0, "seed": 0, "status": "feasible",
          "solve_time": 0.1, "objective": 10.0, "balance": 1.0, "lower_bound": None, "instance_bound": 9.0}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_checkout_revision_is_its_head_dirty_with_changed_code_and_unknown_elsewhere(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    assert checkout_revision.__wrapped__(repo) == "unknown"  # not a checkout
    (repo / "code.py").write_text("x = 1\n")
    (repo / "benchmarks" / "results" / "s.jsonl").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "c")
    head = _git(repo, "rev-parse", "HEAD")
    assert checkout_revision.__wrapped__(repo) == head
    (repo / "benchmarks" / "results" / "s.jsonl").write_text("{}\n{}\n")  # a run appends to its store
    (repo / "untracked.py").write_text("")
    assert checkout_revision.__wrapped__(repo) == head
    (repo / "code.py").write_text("x = 2\n")
    assert checkout_revision.__wrapped__(repo) == head + "+dirty"
    assert checkout_revision.__wrapped__(repo / "benchmarks") == "unknown"  # a copy inside another repository


def test_this_code_names_the_commit_it_runs_from():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert revision().removesuffix("+dirty") == head


def _store(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({**RECORD, **fields}) + "\n")
    return path


@pytest.mark.parametrize("fields, message", [
    ({"schema_version": 3, "revision": COMMIT}, "schema_version: unknown version 3"),
    ({"schema_version": 0}, "schema_version: unknown version 0"),
    ({"schema_version": None}, "schema_version: unknown version None"),
    ({"schema_version": "2", "revision": COMMIT}, "schema_version: wrong type"),
    ({"schema_version": True, "revision": COMMIT}, "schema_version: wrong type"),
    ({"schema_version": 2}, "revision: missing"),
    ({"schema_version": 2, "revision": None}, "revision: missing"),
    ({"schema_version": 2, "revision": 7}, "revision: wrong type"),
    ({"schema_version": 1, "revision": [COMMIT]}, "revision: wrong type"),
    ({"schema_version": 1, "revision": COMMIT, "revision_note": 1}, "revision_note: wrong type"),
])
def test_the_store_refuses_an_unknown_schema_version_or_a_revision_that_is_not_a_string(tmp_path, fields, message):
    with pytest.raises(StoreError, match=message) as error:
        read_records(_store(tmp_path, **fields))
    assert "\n" not in str(error.value) and str(error.value).startswith(f"{tmp_path / 's.jsonl'}:1: ")


@pytest.mark.parametrize("fields", [{}, {"schema_version": 1}, {"schema_version": 2, "revision": "unknown"},
                                    {"schema_version": 1, "revision": COMMIT, "revision_note": "backfilled"}])
def test_the_store_reads_every_known_version(tmp_path, fields):
    assert read_records(_store(tmp_path, **fields)) == [{**RECORD, **fields}]
    assert SCHEMA_VERSIONS == (1, 2)


def test_every_committed_record_names_its_schema_version_and_revision():
    for store in sorted(STORES.rglob("*.jsonl")):
        for number, line in enumerate(store.read_text().splitlines(), start=1):
            record = json.loads(line)
            assert record.get("schema_version") in SCHEMA_VERSIONS and isinstance(record.get("revision"), str), \
                f"{store}:{number}"


def test_the_backfill_adds_the_version_1_fields_and_keeps_every_other_byte(monkeypatch):
    monkeypatch.setattr(backfill_revisions, "parent", lambda commit: f"parent-of-{commit}")
    record = {"b": 1.0000000000000002, "a": [1, {"z": None}], "c": "← x"}
    added = {"schema_version": 1, "revision": "parent-of-c1", "revision_note": backfill_revisions.NOTE}
    # As the store writes records (keys sorted), and in the order a writer that does not sort left them.
    assert backfill_revisions.backfilled(json.dumps(record, sort_keys=True), "c1") == \
        json.dumps({**record, **added}, sort_keys=True)
    assert backfill_revisions.backfilled(json.dumps(record), "c1") == json.dumps({**record, **added})
    versioned = json.dumps({**record, **added})
    assert backfill_revisions.backfilled(versioned, "c2") == versioned


def test_revisions_line_counts_each_revision_and_notes_the_backfilled():
    records = [{"revision": COMMIT}] * 3 + [{"revision": COMMIT + "+dirty"}] + \
              [{"revision": "f" * 40, "revision_note": "backfilled: the commit before"}] * 5 + [{}]
    assert revisions_line(records) == ("Numbers from revisions `fffffff`¹ (5 records), `0123456` (3 records), "
                                       "`0123456+dirty` (1 record), `not recorded` (1 record). "
                                       "¹ Backfilled: the commit before.")
    assert revisions_line([{"revision": "unknown"}]) == "Numbers from revision `unknown` (1 record)."
    assert short_revision(COMMIT) == "0123456" and short_revision("main") == "main"


@given(st.lists(st.fixed_dictionaries({"revision": st.sampled_from([COMMIT, "f" * 40, "unknown"]),
                                       "revision_note": st.sampled_from([None, "n1", "n2"])}), min_size=1, max_size=40))
def test_revisions_line_accounts_for_every_record_whatever_their_order(records):
    line = revisions_line(records)
    counts = [int(part.split(" record")[0]) for part in line.split("(")[1:]]
    assert sum(counts) == len(records)
    assert revisions_line(list(reversed(records))) == line


def test_a_published_page_shows_its_plot_and_names_its_revisions(tmp_path):
    (tmp_path / "set").mkdir()
    (tmp_path / "s.toml").write_text('name = "t"\ninstances = "set"\nresults = "out/t.jsonl"\noracles = ["lookup"]\n'
                                     'solvers = ["lpt"]\n')
    suite = load_suite(tmp_path / "s.toml")
    records = [{**RECORD, "schema_version": 2, "revision": COMMIT},
               {**RECORD, "solver": "random", "objective": 20.0, "revision": "f" * 40, "revision_note": "inferred"}]
    page = publish_leaderboard(suite, records)
    assert (tmp_path / "out" / "t.md").read_text() == page + "\n" and (tmp_path / "out" / "t.png").stat().st_size > 1000
    assert page.endswith("\n\n![t: the leaderboard per solver (bars: means; whiskers: min–max)](t.png)\n\n"
                         "Numbers from revisions `0123456` (1 record), `fffffff`¹ (1 record). ¹ Inferred.")
    assert plot_line(tmp_path / "docs" / "a.md", tmp_path / "img" / "a.png", "x") == "![x](../img/a.png)"
