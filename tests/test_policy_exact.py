"""Exact match (minispec/acceptance/exact.py) as tables of target logits, one row per verified
position (the last row is the bonus position), in the style of vLLM's rejection-sampler tests."""

import torch

from minispec.acceptance import ExactMatch
from minispec.model.sampling import SamplingParams
from minispec.testing import decided, verify_input

F64 = torch.float64


def test_exact_all_accepted_takes_the_bonus_from_the_last_row():
    target_logits = [
        # 0  1  2  3
        [0, 9, 0, 0],  # argmax 1 = d_1
        [0, 0, 9, 0],  # argmax 2 = d_2
        [0, 0, 0, 9],  # argmax 3 = d_3
        [9, 0, 0, 0],  # bonus: 0
    ]
    assert decided(ExactMatch()(verify_input([1, 2, 3], target_logits))) == (3, 0)


def test_exact_first_rejection_emits_the_correction_and_discards_the_rest():
    target_logits = [
        [0, 9, 0, 0],  # argmax 1 = d_1: accepted
        [0, 0, 9, 0],  # argmax 2, d_2 = 0: rejected, correction 2
        [0, 0, 0, 9],  # argmax 3 = d_3, but after a rejection: discarded
        [9, 0, 0, 0],
    ]
    assert decided(ExactMatch()(verify_input([1, 0, 3], target_logits))) == (1, 2)


def test_exact_ties_go_to_the_lowest_id():
    target_logits = [
        [0, 7, 7, 0],  # tie between 1 and 2: argmax is 1, so d_1 = 2 is rejected
        [0, 0, 0, 0],
    ]
    assert decided(ExactMatch()(verify_input([2], target_logits))) == (0, 1)
    assert decided(ExactMatch()(verify_input([1], target_logits))) == (1, 0)  # all-tie bonus row: 0


def test_exact_gamma_zero_emits_just_the_bonus():
    assert decided(ExactMatch()(verify_input([], [[0, 0, 9, 0]]))) == (0, 2)


def test_exact_is_greedy_at_any_temperature():
    target_logits = [[0, 3, 2.5, 0], [1, 0, 0, 4]]
    hot = SamplingParams(temperature=1.5)
    for draft, expected in [([1], (1, 3)), ([2], (0, 1))]:
        assert decided(ExactMatch()(verify_input(draft, target_logits, hot))) == expected
        assert decided(ExactMatch()(verify_input(draft, target_logits))) == expected

