"""Kept measurements (the probe cache: --draft-kernels auto and --draft-length auto's prices) as
properties: varying any input a measurement depends on, alone, gives another key, so a kept answer
is never reused where it was not measured; and any sequence of stores loads each question's last
answer, whatever else was stored around it. The inputs a measurement depends on are written down
here from what the measurement reads, not from the key under test."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec import kernels
from minispec.chain.drafters import make_drafter
from minispec.kernels import fbgemm, measure, packed, probe_cache
from minispec.lab import step_cost
from minispec.testing import random_model, tiny_config


def asked_key(monkeypatch, call) -> tuple[str, str]:
    """(machine key, question) that `call` looks up in the probe cache (its measurement stubbed)."""
    seen = []
    monkeypatch.setattr(probe_cache, "load", lambda question, *a, **k: seen.append((probe_cache.machine_key(), question)))
    monkeypatch.setattr(probe_cache, "store", lambda *a, **k: True)
    call()
    assert len(seen) == 1, seen
    return seen[0]


MODEL = st.fixed_dictionaries({"hidden_size": st.sampled_from([16, 32]), "intermediate_size": st.sampled_from([24, 48]),
                               "dtype": st.sampled_from([torch.float32, torch.bfloat16]), "threads": st.sampled_from([1, 2])})


@settings(max_examples=25, deadline=None)
@given(a=MODEL, b=MODEL)
def test_the_kernel_choice_key_separates_every_input_its_probe_reads(a, b):
    """measure.fastest_kind(candidates, d, f, dtype) on a machine with some thread count: a change
    of any of those is another key; the same inputs, the same key."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        kernel_keys(a, b, monkeypatch)


def kernel_keys(a, b, monkeypatch):
    monkeypatch.setattr(packed, "packs", lambda dtype: True)
    monkeypatch.setattr(fbgemm, "available", lambda: True)
    monkeypatch.setattr(measure, "fastest_kind", lambda *args: "fast")
    threads = torch.get_num_threads()
    keys = []
    try:
        for m in (a, b):
            torch.set_num_threads(m["threads"])
            model = random_model(tiny_config(hidden_size=m["hidden_size"], intermediate_size=m["intermediate_size"]), 0,
                                 dtype=m["dtype"])
            keys.append(asked_key(monkeypatch, lambda: kernels.auto_draft_kind(model)))
    finally:
        torch.set_num_threads(threads)
    assert (keys[0] == keys[1]) == (a == b), (a, b, keys)


DRAFT = st.sampled_from(["ngram", "early-exit:1", "early-exit:2", "model", "model-bf16"])
PRICE = st.fixed_dictionaries({"gamma": st.integers(1, 4), "draft": DRAFT, "dtype": st.sampled_from([torch.float32, torch.bfloat16]),
                               "threads": st.sampled_from([1, 2]), "width": st.sampled_from([16, 32])})


def price_inputs(target, drafter, gamma) -> tuple:
    """What step_cost.timings reads: the target (shapes, dtype, kind), the drafter's model (the same,
    and how many of its blocks run), gamma, and the machine's thread count."""
    def model_of(m, layers):
        c = m.config
        return (c.hidden_size, c.intermediate_size, c.num_layers, c.vocab_size, m.dtype, kernels.kind_of(m), layers)
    model = getattr(drafter, "model", None)
    draft = None if model is None else model_of(model, getattr(drafter, "num_layers", None) or model.config.num_layers)
    return (model_of(target, target.config.num_layers), draft, gamma, torch.get_num_threads())


@settings(max_examples=40, deadline=None)
@given(a=PRICE, b=PRICE)
def test_the_price_key_separates_every_input_the_timings_read(a, b):
    with pytest.MonkeyPatch.context() as monkeypatch:
        price_keys(a, b, monkeypatch)


def price_keys(a, b, monkeypatch):
    monkeypatch.setattr(step_cost, "measure_costs", lambda target, drafter, gamma: [1.0] * (gamma + 1))
    threads = torch.get_num_threads()
    seen = []
    try:
        for p in (a, b):
            torch.set_num_threads(p["threads"])
            target = random_model(tiny_config(hidden_size=p["width"], num_layers=3), 0, dtype=p["dtype"])
            spec = p["draft"]
            if spec.startswith("model"):
                spec = random_model(tiny_config(), 1, dtype=torch.bfloat16 if spec.endswith("bf16") else torch.float32)
            drafter = make_drafter(spec, target)
            key = asked_key(monkeypatch, lambda: step_cost.costs(target, drafter, p["gamma"]))
            seen.append((key, price_inputs(target, drafter, p["gamma"])))
    finally:
        torch.set_num_threads(threads)
    (key_a, inputs_a), (key_b, inputs_b) = seen
    assert (key_a == key_b) == (inputs_a == inputs_b), seen


STORE = st.tuples(st.sampled_from(["q1", "q2", "q3"]), st.text(alphabet="abc,.0123", min_size=1, max_size=6))


@settings(max_examples=60, deadline=None)
@given(stores=st.lists(st.tuples(st.sampled_from(["machine A", "machine B"]), STORE), max_size=12))
def test_any_sequence_of_stores_loads_each_questions_last_answer(stores, tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        stores_then_loads(stores, monkeypatch, tmp_path_factory.mktemp("cache") / "probe.json")


def stores_then_loads(stores, monkeypatch, path):
    last = {}
    for machine, (question, answer) in stores:
        monkeypatch.setattr(probe_cache, "machine_key", lambda machine=machine: machine)
        assert probe_cache.store(question, answer, path)
        last[machine, question] = answer
    for machine in ("machine A", "machine B"):
        monkeypatch.setattr(probe_cache, "machine_key", lambda machine=machine: machine)
        for question in ("q1", "q2", "q3"):
            assert probe_cache.load(question, path=path) == last.get((machine, question))
