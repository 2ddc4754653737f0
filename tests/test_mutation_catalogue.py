"""The mutation catalogue (scripts/tooling/mutants.toml) stays applicable: a mutant whose target text
no longer occurs exactly once in its file would stop the check (or mutate the wrong place) the
next time it runs, so every code change that moves a mutant's text must move the mutant too."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import mutation_check  # noqa: E402


@pytest.mark.parametrize("mutant", mutation_check.CATALOGUE, ids=lambda m: m.name)
def test_every_mutant_targets_text_that_occurs_exactly_once(mutant):
    text = (ROOT / mutant.file).read_text(encoding="utf-8")
    assert text.count(mutant.old) == 1, f"{mutant.name}: its target text occurs {text.count(mutant.old)} times in {mutant.file}"
    assert mutant.new != mutant.old
    for first in mutant.first:
        assert (ROOT / first).exists(), f"{mutant.name}: first test file {first} does not exist"


def test_mutant_names_are_unique():
    names = [m.name for m in mutation_check.CATALOGUE]
    assert len(names) == len(set(names))


def test_every_class_has_members_and_is_documented():
    classes = {m.kind for m in mutation_check.CATALOGUE}
    assert classes == set(mutation_check.CLASSES), f"classes with no mutant: {set(mutation_check.CLASSES) - classes}"
    doc = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    missing = [c for c in mutation_check.CLASSES if f"| {c} |" not in doc]
    assert not missing, f"docs/testing.md's class table lacks {missing}"
