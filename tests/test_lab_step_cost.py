"""--draft-length auto prices each draft length on this CPU (lab/step_cost.py): c(g) = (t_pass(g + 1)
+ g t_draft) / t_pass(1), measured once per machine and question and kept on disk, so the same seed
drafts the same lengths run after run."""

import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec.lab.draft_length import Priced
from minispec.chain.drafters import make_drafter
from minispec.kernels import probe_cache
from minispec.lab import step_cost
from minispec.testing import random_model, tiny_config


def target():
    return random_model(tiny_config(), 0, dtype=torch.float32)


def test_measured_costs_are_in_plain_steps_one_per_length():
    model = target()
    for draft in ("ngram", random_model(tiny_config(), 1, dtype=torch.float32), "early-exit:1"):
        costs = step_cost.measure_costs(model, make_drafter(draft, model), 4)
        assert len(costs) == 5 and costs[0] == 1.0 and all(c > 0 for c in costs)


def test_a_step_of_g_drafts_costs_a_pass_of_g_plus_one_rows_and_g_draft_tokens():
    seconds = {1: 10.0, 2: 12.0, 3: 15.0, 4: 21.0, "draft": 2.0}  # a target pass of k rows; a draft token
    assert step_cost.from_timings(seconds, 3) == pytest.approx([1.0, (12 + 2) / 10, (15 + 4) / 10, (21 + 6) / 10])
    del seconds["draft"]  # a drafter without a model: its tokens cost nothing here
    assert step_cost.from_timings(seconds, 2) == pytest.approx([1.0, 1.2, 1.5])


def test_the_timings_take_turns_and_time_the_drafters_own_model():
    model = target()
    for draft, has_model in (("ngram", False), ("early-exit:1", True), (random_model(tiny_config(), 1), True)):
        seconds = step_cost.timings(model, make_drafter(draft, model), 3, reps=1)
        assert set(seconds) == {1, 2, 3, 4} | ({"draft"} if has_model else set())
        assert all(v > 0 for v in seconds.values())


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """The cache in a fresh MINISPEC_HOME; measure_costs replaced by a stand-in that counts its calls."""
    monkeypatch.setenv("MINISPEC_HOME", str(tmp_path / "home"))
    state = {"calls": 0, "answer": [1.0, 1.234567, 1.5, 2.0]}

    def measure_costs(model, drafter, gamma, reps=3):
        state["calls"] += 1
        return list(state["answer"])[:gamma + 1]

    monkeypatch.setattr(step_cost, "measure_costs", measure_costs)
    return state


def test_the_first_prices_are_kept_and_later_runs_use_them(measured):
    model = target()
    drafter = make_drafter("ngram", model)
    first = step_cost.costs(model, drafter, 3)
    assert first == [1.0, 1.2346, 1.5, 2.0] and measured["calls"] == 1  # rounded as kept, from the first run on
    measured["answer"] = [1.0, 9.0, 9.0, 9.0]  # a later measurement would differ: the kept prices win
    assert step_cost.costs(model, drafter, 3) == first and measured["calls"] == 1
    assert Priced(3, step_cost.costs(model, drafter, 3)).costs == first and measured["calls"] == 1
    assert step_cost.costs(model, drafter, 2) == [1.0, 9.0, 9.0] and measured["calls"] == 2  # another question
    assert step_cost.costs(model, make_drafter("early-exit:1", model), 3) == [1.0, 9.0, 9.0, 9.0]  # another draft


@pytest.mark.parametrize("stored", ["x,y", "1.0,2.0", "1.0,nan,1,1", "1.0,0,1,1", "1.0,-2,1,1",
                                    "1.0,100,100,100", "2.0,2.1,2.2,2.3", "1.0,1.1,1.2,50"])
def test_a_kept_answer_that_cannot_be_true_is_measured_again(measured, stored):
    """Not gamma + 1 positive numbers, or against what holds by construction: c(0) = 1, c(g) <= g + 1
    without a draft model (a hand edit pinning the schedule off)."""
    model = target()
    drafter = make_drafter("ngram", model)
    step_cost.costs(model, drafter, 3)
    path = probe_cache.cache_path()
    kept = json.loads(path.read_text())
    for questions in kept.values():
        for question in questions:
            questions[question] = stored
    path.write_text(json.dumps(kept))
    measured["answer"] = [1.0, 1.1, 1.2, 1.3]
    assert step_cost.costs(model, drafter, 3) == [1.0, 1.1, 1.2, 1.3] and measured["calls"] == 2


@settings(max_examples=200, deadline=None)
@given(gamma=st.integers(1, 8), base=st.floats(1e-4, 1.0), growth=st.lists(st.floats(0.0, 1.0), min_size=8, max_size=8),
       draft=st.floats(0.0, 1.0), with_draft=st.booleans())
def test_every_price_list_a_real_measurement_can_give_is_plausible(gamma, base, growth, draft, with_draft):
    """Timings that obey the construction (a pass of k rows costs between one and k passes of one
    row, each longer pass at least the shorter; a draft token at most the bound) always give prices
    plausible() keeps: the check never throws away a true answer."""
    seconds, t = {1: base}, base
    for k in range(2, gamma + 2):
        t = min(t + growth[k - 2] * base, k * base)  # nondecreasing, at most k x t_pass(1)
        seconds[k] = t
    share = 2.0 if with_draft else 0.0
    if with_draft:
        seconds["draft"] = draft * share * base
    values = [round(v, 4) for v in step_cost.from_timings(seconds, gamma)]
    assert step_cost.plausible(values, gamma, share), values


def test_the_draft_share_bound_follows_the_draft_models_weights():
    model = target()
    assert step_cost.draft_share_bound(model, make_drafter("ngram", model)) == 0.0
    full = step_cost.draft_share_bound(model, make_drafter(random_model(tiny_config(), 1, dtype=torch.float32), model))
    assert full == pytest.approx(step_cost.DRAFT_READS)  # the same shapes and dtype: the same bytes
    early = step_cost.draft_share_bound(model, make_drafter("early-exit:1", model))
    assert early == pytest.approx(step_cost.DRAFT_READS / 2)  # one of two layers
