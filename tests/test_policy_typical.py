"""Typical acceptance (minispec/acceptance/typical.py): Medusa's threshold against an independent
plain-Python reading of it, strictness, and our rule at temperature 0."""

import math

import torch

from minispec.acceptance import ExactMatch, TypicalAcceptance
from minispec.acceptance.typical import typical_acceptances
from minispec.model.sampling import SamplingParams, sample_token
from minispec.testing import decided, verify_input

F64 = torch.float64


def _medusa_threshold(row: list[float], eps: float = 0.09, delta: float = 0.3) -> float:
    """min(eps, delta * exp(-H)), written independently in plain Python."""
    entropy = -sum(v * math.log(v) for v in row if v > 0)
    return min(eps, delta * math.exp(-entropy))


TYPICAL_TABLE = [
    # p_target row, draft token     entropy H   min(0.09, 0.3 e^-H)   p(draft)   accepted
    ([0.25, 0.25, 0.25, 0.25], 3),  # ln 4       0.075                 0.25       yes: a flat row lets anything through
    ([0.85, 0.05, 0.05, 0.05], 0),  # 0.587      0.09 (0.167 > eps)    0.85       yes: the peak
    ([0.85, 0.05, 0.05, 0.05], 1),  # 0.587      0.09                  0.05       no
]


def test_typical_threshold_rule_on_a_table():
    rows = [row for row, _ in TYPICAL_TABLE]
    draft = [token for _, token in TYPICAL_TABLE]
    p_target = torch.tensor(rows + [[0.1, 0.2, 0.3, 0.4]], dtype=F64)  # [gamma+1, V]
    for (row, token), accepted in zip(TYPICAL_TABLE, typical_acceptances(p_target, torch.tensor(draft), 0.09, 0.3)):
        assert bool(accepted) == (row[token] > _medusa_threshold(row))
    params = SamplingParams(temperature=1.0)
    decision = TypicalAcceptance()(verify_input(draft, p_target.log(), params, p_target=p_target, seed=3))
    assert decision.num_accepted == 2
    # the correction is one draw from p_target at the rejected row, from the verify generator
    assert decision.next_token == sample_token(p_target[2], torch.Generator().manual_seed(3))


def test_typical_threshold_is_strict():
    row = [0.5, 0.25, 0.25, 0.0]  # delta = 10 makes eps = 0.25 the threshold; 0.25 is exact in binary
    p_target = torch.tensor([row, row], dtype=F64)
    assert typical_acceptances(p_target, torch.tensor([1]), eps=0.25, delta=10).tolist() == [False]
    assert typical_acceptances(p_target, torch.tensor([0]), eps=0.25, delta=10).tolist() == [True]


def test_typical_at_temperature_zero_accepts_a_close_second():
    target_logits = [
        [2.0, 1.9, -3, -3],  # argmax 0; softmax at T=1 gives token 1 ~0.47 > 0.09
        [0.0, 0.0, 0.0, 5],  # bonus: 3
    ]
    inp = verify_input([1], target_logits)
    assert decided(ExactMatch()(inp)) == (0, 0)
    assert decided(TypicalAcceptance()(inp)) == (1, 3)
    # The criterion temperature is ours: a sharp one (0.01) puts token 1 at e^-10 and rejects it.
    assert decided(TypicalAcceptance(greedy_criterion_temperature=0.01)(inp)) == (0, 0)



def test_each_option_out_of_its_range_is_one_line_naming_it():
    import pytest

    from minispec.errors import MinispecError

    for options, named in (({"delta": 0}, "typical delta"), ({"delta": math.inf}, "typical delta"),
                           ({"delta": math.nan}, "typical delta"), ({"greedy_criterion_temperature": 0},
                                                                     "typical greedy_criterion_temperature"),
                           ({"greedy_criterion_temperature": math.inf}, "typical greedy_criterion_temperature"),
                           ({"greedy_criterion_temperature": "1"}, "typical greedy_criterion_temperature")):
        with pytest.raises(MinispecError, match=rf"^{named} = "):
            TypicalAcceptance(**options)
