"""Lenience (minispec/acceptance/lenience.py), float64: speculative sampling draw for draw at
beta = 1; exact match at T = 0 for every beta; decide() equal to the rule written out with
Python floats on random inputs with ties; more accepted drafts in expectation as beta falls
(exactly); its options checked. Through the real loop: check_policy with neutral beta = 1, in
test_testing.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minispec.acceptance import ExactMatch, Lenience, SpeculativeSampling, get
from minispec.acceptance.sampling import acceptance_probability
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams
from minispec.testing import decided, seeds, verify_input
from test_policy_traversal import chains

betas = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]) | st.floats(0, 1)


@given(inp=chains(), seed=seeds)
def test_at_beta_one_lenience_is_speculative_sampling_draw_for_draw(inp, seed):
    inp.generator = torch.Generator().manual_seed(seed)
    want = SpeculativeSampling()(inp)
    want_state = inp.generator.get_state()
    inp.generator = torch.Generator().manual_seed(seed)
    assert decided(Lenience(beta=1.0)(inp)) == decided(want)
    assert torch.equal(inp.generator.get_state(), want_state)


@given(inp=chains(), seed=seeds, beta=betas)
def test_at_temperature_zero_lenience_is_exact_match(inp, seed, beta):
    """A one-hot p gives every non-argmax draft p(d) = 0, which no beta lets through."""
    greedy = verify_input(inp.draft_tokens.tolist(), inp.target_logits.tolist(), SamplingParams(0.0), seed=seed,
                          draft_logits=inp.draft_logits.tolist() if inp.gamma else None)
    assert decided(Lenience(beta=beta)(greedy)) == decided(ExactMatch()(greedy))


def from_the_definition(inp, beta: float) -> tuple[int, int]:
    """accept d_i iff u_i < min(1, p(d_i) / (beta q(d_i))), Python floats; correction from
    norm(max(0, p - beta q)) at the first rejection, else the bonus from p_target[gamma]."""
    gamma = inp.gamma
    coins = torch.rand(gamma, generator=inp.generator, dtype=torch.float64).tolist()
    num_accepted = gamma
    for i in range(gamma):
        p, q = float(inp.p_target[i, inp.draft_tokens[i]]), beta * float(inp.q_draft[i, inp.draft_tokens[i]])
        ratio = min(1.0, p / q) if q > 0 else float(p > 0)
        if not coins[i] < ratio:
            num_accepted = i
            break
    if num_accepted == gamma:
        row = inp.p_target[gamma].tolist()
    else:
        p, q = inp.p_target[num_accepted].tolist(), (beta * inp.q_draft[num_accepted]).tolist()
        excess = [max(0.0, a - b) for a, b in zip(p, q)]
        row = [e / sum(excess) for e in excess] if sum(excess) > 0 else p
    token = int(torch.multinomial(torch.tensor(row, dtype=torch.float64), 1, generator=inp.generator))
    return num_accepted, token


@given(inp=chains(), seed=seeds, beta=betas)
def test_lenience_equals_its_rule_written_out(inp, seed, beta):
    inp.generator = torch.Generator().manual_seed(seed)
    got = decided(Lenience(beta=beta)(inp))
    inp.generator = torch.Generator().manual_seed(seed)
    assert got == from_the_definition(inp, beta)


@given(inp=chains(), low=st.floats(0, 1), high=st.floats(0, 1))
def test_a_smaller_beta_accepts_at_least_as_many_drafts_in_expectation(inp, low, high):
    """E[num_accepted] = sum_j prod_{i<=j} a_i, exactly, with a_i = min(1, p/(beta q)) non-increasing in beta."""
    low, high = min(low, high), max(low, high)

    def expected(beta):
        accept = acceptance_probability(inp.p_target, beta * inp.q_draft, inp.draft_tokens)  # [gamma]
        return float(torch.cumprod(accept, 0).sum()) if inp.gamma else 0.0

    assert expected(low) >= expected(high) - 1e-12


def test_at_beta_zero_every_draft_the_target_gives_mass_is_kept():
    inp = verify_input([2, 0, 1], [[0, 0, 5], [0, 0, 5], [-math.inf, 0, 0], [0, 0, 0]], SamplingParams(1.0),
                       draft_logits=[[9, 0, 0], [9, 0, 0], [0, 9, 0]])
    assert Lenience(beta=0.0)(inp).num_accepted == 3  # d_3 = 1 has p > 0; the first two are not q's choice
    blocked = verify_input([0], [[-math.inf, 0, 0], [0, 0, 0]], SamplingParams(1.0), draft_logits=[[9, 0, 0]])
    assert Lenience(beta=0.0)(blocked).num_accepted == 0  # p(d) = 0: never


@pytest.mark.parametrize("beta", [-0.1, 1.5, math.nan, math.inf, True, "0.5", None])
def test_a_bad_beta_is_one_line_naming_it(beta):
    with pytest.raises(MinispecError, match="lenience beta"):
        Lenience(beta=beta)
    with pytest.raises(MinispecError, match="lenience beta"):
        get("lenience", beta=beta)


def test_the_correction_is_drawn_from_the_scaled_residual():
    """p = (0.2, 0.3, 0.5), q = (0.6, 0.4, 0), d = 0, beta = 0.5: d is kept with 0.2 / 0.3; a
    rejection corrects from max(0, p - beta q) = (0, 0.1, 0.5), token 1 with probability 1/6,
    where sampling's residual max(0, p - q) = (0, 0, 0.5) never gives it. Over 900 seeds (about
    300 rejections) the share of token 1 has a standard deviation of 0.022; the bound is 4 of them."""
    p_target = [[0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3]]
    logits = [[math.log(v) for v in row] for row in p_target]
    corrections = []
    for seed in range(900):
        inp = verify_input([0], logits, SamplingParams(1.0), q_draft=[[0.6, 0.4, 0.0]], p_target=p_target, seed=seed)
        decision = Lenience(beta=0.5)(inp)
        if decision.num_accepted == 0:
            corrections.append(decision.next_token)
    assert 240 <= len(corrections) <= 360  # P(reject) = 1/3
    assert 0 not in corrections
    assert abs(corrections.count(1) / len(corrections) - 1 / 6) < 4 * 0.022, corrections.count(1) / len(corrections)
