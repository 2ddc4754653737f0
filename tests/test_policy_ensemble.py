"""The static ensemble (minispec/acceptance/ensemble.py), float64: speculative sampling draw for draw at
w = 1; every draft kept at w = 0; decide() equal to the rule written out with Python floats on random
inputs with ties; more accepted drafts in expectation as w falls (exactly); its output is v =
(1 - w) q + w p (exactly, tests/test_distortion.py; by chi-square through transformers' claim,
tests/test_conform.py); its option checked. Through the real loop: check_policy, in test_testing.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minispec.acceptance import SpeculativeSampling, StaticEnsemble, get
from minispec.acceptance.ensemble import ensemble_target
from minispec.acceptance.sampling import acceptance_probability
from minispec.errors import MinispecError
from minispec.testing import decided, seeds
from test_policy_traversal import chains

weights = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]) | st.floats(0, 1)


@given(inp=chains(), seed=seeds)
def test_at_weight_one_the_ensemble_is_speculative_sampling_draw_for_draw(inp, seed):
    inp.generator = torch.Generator().manual_seed(seed)
    want = SpeculativeSampling()(inp)
    want_state = inp.generator.get_state()
    inp.generator = torch.Generator().manual_seed(seed)
    assert decided(StaticEnsemble(weight=1.0)(inp)) == decided(want)
    assert torch.equal(inp.generator.get_state(), want_state)


def from_the_definition(inp, w: float) -> tuple[int, int]:
    """v = (1 - w) q + w p; accept d_i iff u_i < min(1, v(d_i)/q(d_i)) (q = 0: iff v > 0); correct from
    norm(max(0, v - q)) (v itself if empty), bonus from p_target[gamma]. Python floats."""
    gamma = inp.gamma
    coins = torch.rand(gamma, generator=inp.generator, dtype=torch.float64).tolist()
    v = [[(1 - w) * float(q) + w * float(p) for p, q in zip(inp.p_target[i], inp.q_draft[i])] for i in range(gamma)]
    num_accepted = gamma
    for i in range(gamma):
        d = int(inp.draft_tokens[i])
        q = float(inp.q_draft[i, d])
        ratio = min(1.0, v[i][d] / q) if q > 0 else float(v[i][d] > 0)
        if not coins[i] < ratio:
            num_accepted = i
            break
    if num_accepted == gamma:
        row = inp.p_target[gamma].tolist()
    else:
        excess = [max(0.0, a - float(b)) for a, b in zip(v[num_accepted], inp.q_draft[num_accepted])]
        row = [e / sum(excess) for e in excess] if sum(excess) > 0 else v[num_accepted]
    token = int(torch.multinomial(torch.tensor(row, dtype=torch.float64), 1, generator=inp.generator))
    return num_accepted, token


@given(inp=chains(), seed=seeds, w=weights)
def test_the_ensemble_equals_its_rule_written_out(inp, seed, w):
    inp.generator = torch.Generator().manual_seed(seed)
    got = decided(StaticEnsemble(weight=w)(inp))
    inp.generator = torch.Generator().manual_seed(seed)
    assert got == from_the_definition(inp, w)


@given(inp=chains(), low=st.floats(0, 1), high=st.floats(0, 1))
def test_a_smaller_weight_accepts_at_least_as_many_drafts_in_expectation(inp, low, high):
    """E[num_accepted] = sum_j prod_{i<=j} a_i exactly; a_i = min(1, (1 - w) + w p/q) falls as w rises."""
    low, high = min(low, high), max(low, high)

    def expected(w):
        v = ensemble_target(inp.p_target, inp.q_draft, w)  # [gamma+1, V]
        accept = acceptance_probability(v, inp.q_draft, inp.draft_tokens)  # [gamma]
        return float(torch.cumprod(accept, 0).sum()) if inp.gamma else 0.0

    assert expected(low) >= expected(high) - 1e-12


@given(inp=chains(), seed=seeds)
def test_at_weight_zero_every_draft_is_kept(inp, seed):
    """v = q: v(d)/q(d) = 1 wherever the drafter gave d mass, which a drafter drawing from q always did."""
    inp.generator = torch.Generator().manual_seed(seed)
    drawn = inp.q_draft.gather(-1, inp.draft_tokens.unsqueeze(-1)).squeeze(-1) > 0  # [gamma]
    expected = int(torch.cumprod(drawn.long(), 0).sum()) if inp.gamma else 0
    assert StaticEnsemble(weight=0.0)(inp).num_accepted == expected


@pytest.mark.parametrize("weight", [-0.1, 1.5, math.nan, math.inf, True, "0.5", None])
def test_a_bad_weight_is_one_line_naming_it(weight):
    with pytest.raises(MinispecError, match="ensemble weight"):
        StaticEnsemble(weight=weight)
    with pytest.raises(MinispecError, match="ensemble weight"):
        get("ensemble", weight=weight)
