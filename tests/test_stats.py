"""minispec.chain.stats: tau counts the correction/bonus token, and policies' counts are summed."""

import pytest
import torch
from hypothesis import given, strategies as st

from minispec.chain.stats import step_stats


def test_tau_counts_the_correction_or_bonus_token_of_every_step():
    steps, gamma = [], 3
    steps.append((3, 3, 3 + 1, {}))  # 3 drafts + the bonus: 4 tokens
    steps.append((3, 0, 0 + 1, {}))  # the correction only: 1 token
    steps.append((1, 1, 1 + 1, {}))  # a short draft, accepted, + bonus: 2 tokens
    s = step_stats(steps, gamma)
    assert s["tau"] == (4 + 1 + 2) / 3
    assert s["acceptance_rate"] == 4 / 7
    assert s["per_position_acceptance"] == [2 / 3, 1 / 2, 1 / 2]
    assert s["accepted_length_histogram"] == [1, 1, 0, 1]


def test_histogram_and_per_position_rates_count_only_steps_that_drafted():
    """A step with no draft (an n-gram miss) is not a rejection: it is counted apart, not in bucket 0;
    position i's rate is over the steps that drafted position i."""
    steps, gamma = [], 3
    steps.append((0, 0, 0 + 1, {}))  # nothing drafted
    steps.append((3, 0, 0 + 1, {}))  # first draft rejected
    steps.append((1, 1, 1 + 1, {}))  # one drafted, accepted
    steps.append((0, 0, 0 + 1, {}))
    s = step_stats(steps, gamma)
    assert s["accepted_length_histogram"] == [1, 1, 0, 0] and s["no_draft_steps"] == 2
    assert s["per_position_acceptance"] == [1 / 2, 0 / 1, 0 / 1]
    assert s["verify_steps"] == 4 and s["drafted_steps"] == 2


def test_no_step_is_tau_one_and_no_draft_is_acceptance_zero():
    s = step_stats([], 2)
    assert s["tau"] == 1.0 and s["acceptance_rate"] == 0.0 and s["per_position_acceptance"] == [None, None]


def test_numeric_policy_info_is_summed_over_steps_and_the_rest_ignored():
    steps, gamma = [], 2
    steps.append((2, 1, 1 + 1, {"accepted_by_dropmatch_only": [1, 1], "positions": 3, "note": "x", "flag": True}))
    steps.append((2, 2, 2 + 1, {"accepted_by_dropmatch_only": torch.tensor([True, True]), "positions": 3}))
    steps.append((2, 0, 0 + 1, {}))
    assert step_stats(steps, gamma)["policy_info"] == {"accepted_by_dropmatch_only": 3, "positions": 6}


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(1, 5),
                          st.lists(st.booleans(), min_size=4, max_size=4), st.integers(0, 9)), max_size=6))
def test_policy_info_counts_flags_over_the_committed_drafts_only(raw):
    """The info-counter rule, from its definition: a per-position flag counts where its draft was
    accepted AND committed (a flag on a rejected draft, or on an accepted draft after an eos inside
    the run, counts nothing); a number counts as reported. Steps are drawn with e <= n (an end inside
    the accepted run) as well as e = n + 1."""
    steps, expected_flags, expected_work = [], 0, 0
    for g, n, e, flags, work in raw:
        n = min(n, g)
        e = min(e, n + 1)
        steps.append((g, n, e, {"flagged": torch.tensor(flags[:g]), "work": work}))
        expected_flags += sum(flags[:min(n, e)])  # the drafts that were accepted and committed
        expected_work += work
    info = step_stats(steps, 4)["policy_info"]
    assert info.get("flagged", 0) == expected_flags and info.get("work", 0) == expected_work


def test_tau_drafted_leaves_out_the_steps_where_nothing_was_drafted():
    """vLLM's and llama.cpp's mean accepted length: over the steps with a draft. An n-gram miss is a
    step that emits 1 token: it lowers tau, not tau_drafted."""
    steps, gamma = [], 4
    steps.append((4, 2, 2 + 1, {}))  # 3 tokens
    steps.append((0, 0, 0 + 1, {}))  # an n-gram miss: 1 token
    steps.append((0, 0, 0 + 1, {}))  # another
    steps.append((2, 2, 2 + 1, {}))  # 3 tokens
    s = step_stats(steps, gamma)
    assert s["tau"] == (3 + 1 + 1 + 3) / 4 and s["drafted_steps"] == 2
    assert s["tau_drafted"] == (3 + 3) / 2
    assert step_stats([], 2)["tau_drafted"] is None  # no drafted step: undefined, not 1


def test_tau_drafted_equals_tau_when_every_step_drafts():
    steps, gamma = [], 3
    for drafted, accepted in [(3, 1), (3, 3), (2, 0)]:
        steps.append((drafted, accepted, accepted + 1, {}))
    s = step_stats(steps, gamma)
    assert s["tau_drafted"] == s["tau"] == (2 + 4 + 1) / 3


@pytest.mark.parametrize("num_drafted", range(0, 5))
def test_a_step_counts_what_was_committed_in_every_cell(num_drafted):
    """Every (accepted a, committed c) of a step of g drafts, enumerated rather than sampled: c <= a
    (an eos or a stop inside the accepted run, or exactly on its last draft) counts a step of c drafts,
    all accepted, c emitted; c = a + 1 (the run reached the correction or bonus token) counts g
    drafted, a accepted, a + 1 emitted."""
    for num_accepted in range(num_drafted + 1):
        for num_committed in range(1, num_accepted + 2):
            s = step_stats([(num_drafted, num_accepted, num_committed, {})], max(num_drafted, 1))
            cut = num_committed <= num_accepted
            want = (num_committed, num_committed, num_committed) if cut else (num_drafted, num_accepted, num_accepted + 1)
            got = (s["num_drafted"], s["num_accepted"], s["tau"])
            assert got == want, f"g={num_drafted} a={num_accepted} c={num_committed}: {got} != {want}"
