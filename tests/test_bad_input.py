"""Every command that reads a file, given every kind of broken file: one line naming the problem, exit 2,
no traceback, nothing written (benchmarks.fuzz holds the mutations and the check)."""
import pytest
from conftest import examples
from hypothesis import given
from hypothesis import strategies as st

from shardbench.cli import main
from benchmarks.fuzz import KINDS, MUTATIONS, TARGETS, mutate, run_case

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
