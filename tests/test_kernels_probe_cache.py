"""--draft-kernels auto measures once per machine and question, and keeps the answer on disk, so
the same seed drafts with the same kind run after run (kernels/probe_cache.py)."""

import json

import pytest
import torch

from minispec import kernels
from minispec.kernels import fbgemm, measure, packed, probe_cache
from minispec.testing import random_model, tiny_config


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """Both candidate kinds available on any CPU; the cache in a fresh MINISPEC_HOME; fastest_kind
    replaced by a stand-in that counts its calls and answers what `answer` holds."""
    monkeypatch.setenv("MINISPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(packed, "packs", lambda dtype: True)
    monkeypatch.setattr(fbgemm, "available", lambda: True)
    state = {"calls": 0, "answer": "fp16"}

    def fastest_kind(kinds, d, f, dtype):
        state["calls"] += 1
        assert kinds == ("fast", "fp16")
        return state["answer"]

    monkeypatch.setattr(measure, "fastest_kind", fastest_kind)
    return state


def model():
    return random_model(tiny_config(), 0, dtype=torch.float32)


def test_the_first_answer_is_kept_and_later_runs_do_not_measure(probe):
    assert kernels.auto_draft_kind(model()) == "fp16" and probe["calls"] == 1
    probe["answer"] = "fast"  # a later probe would say otherwise: the stored answer wins
    assert kernels.auto_draft_kind(model()) == "fp16" and probe["calls"] == 1
    stored = json.loads(probe_cache.cache_path().read_text())
    assert list(stored) == [probe_cache.machine_key()] and list(stored[probe_cache.machine_key()].values()) == ["fp16"]


def test_another_machine_or_shape_is_another_question(probe, monkeypatch):
    kernels.auto_draft_kind(model())
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # a capped ISA is another machine
    probe["answer"] = "fast"
    assert kernels.auto_draft_kind(model()) == "fast" and probe["calls"] == 2
    wider = random_model(tiny_config(hidden_size=32), 0, dtype=torch.float32)
    assert kernels.auto_draft_kind(wider) == "fast" and probe["calls"] == 3
    assert len(json.loads(probe_cache.cache_path().read_text())) == 2  # both machines kept


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"%KEY%": "fp16"}', '{"%KEY%": {"%Q%": "int8"}}'])
def test_a_damaged_file_or_an_answer_outside_the_candidates_is_measured_again(probe, content):
    question = "draft kind of fast/fp16 for d=16 f=24 torch.float32"
    path = probe_cache.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(content.replace("%KEY%", probe_cache.machine_key()).replace("%Q%", question))
    assert kernels.auto_draft_kind(model()) == "fp16" and probe["calls"] == 1
    assert json.loads(path.read_text())[probe_cache.machine_key()][question] == "fp16"  # repaired


def test_a_folder_that_cannot_be_written_leaves_the_choice_uncached(probe, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MINISPEC_HOME", str(blocker / "home"))  # under a file: no folder can be made
    assert kernels.auto_draft_kind(model()) == "fp16" and kernels.auto_draft_kind(model()) == "fp16"
    assert probe["calls"] == 2 and not probe_cache.store("q", "fp16")
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]  # nothing left behind


def test_one_candidate_needs_no_probe(probe, monkeypatch):
    monkeypatch.setattr(fbgemm, "available", lambda: False)
    assert kernels.auto_draft_kind(model()) == "fast" and probe["calls"] == 0
    assert not probe_cache.cache_path().exists()
