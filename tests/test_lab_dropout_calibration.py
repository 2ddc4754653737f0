"""minispec.lab.dropout_calibration: the agreement curves and the bisection on p.

The estimate is checked against a Monte Carlo of the dropout itself where its assumptions hold
(a wide LM-head input of i.i.d. coordinates: the central limit theorem applies), the measured
curve against its definition, and the bisection on planted targets.
"""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec.lab.dropout_calibration import (EstimatedAgreement, MeasuredAgreement, auto_dropout_p,
                                                     bracket_p, calibrate_p)
from minispec.errors import MinispecError
from minispec.testing import model_configs, random_model, seeds


def rows_and_head(seed: int, n: int = 12, d: int = 16, vocab: int = 10, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen, dtype=torch.float64)  # [n, d]
    weight = scale * torch.randn(vocab, d, generator=gen, dtype=torch.float64) / math.sqrt(d)  # [V, d]
    return hidden, weight, (lambda x: x @ weight.T)


@settings(max_examples=20)
@given(seed=seeds, paths=st.integers(1, 6), ps=st.lists(st.floats(0.001, 0.95), min_size=2, max_size=6),
       method=st.sampled_from(EstimatedAgreement.METHODS))
def test_the_estimate_is_one_at_p_zero_and_falls_monotonically_in_p(seed, paths, ps, method):
    hidden, weight, _ = rows_and_head(seed)
    estimate = EstimatedAgreement(hidden, weight, paths, method=method)
    assert estimate(0.0) == 1.0
    values = [estimate(p) for p in sorted(ps)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert all(a >= b for a, b in zip(values, values[1:])), values


@settings(max_examples=20)
@given(seed=seeds, paths=st.integers(1, 6), p=st.floats(0.01, 0.9))
def test_the_measured_agreement_is_the_share_of_positions_where_every_dropped_head_keeps_the_argmax(seed, paths, p):
    hidden, weight, head = rows_and_head(seed)
    measured = MeasuredAgreement(hidden, head, paths, seed=seed)
    assert measured(0.0) == 1.0
    masks = (measured.uniforms < 1 - p).double()  # [K, n, d]: the same uniforms, the definition spelled out
    tokens = (hidden * masks / (1 - p) @ weight.T).argmax(dim=-1)  # [K, n]
    want = (tokens == (hidden @ weight.T).argmax(dim=-1)).all(dim=0).double().mean()
    assert measured(p) == pytest.approx(float(want), abs=0)


def monte_carlo_keep(hidden, weight, p, draws, gen):
    """P(one dropped head keeps the clean argmax) per position by sampling masks: [n]."""
    masks = (torch.rand(draws, *hidden.shape, generator=gen, dtype=torch.float64) < 1 - p).double()
    logits = (hidden * masks / (1 - p)) @ weight.T  # [draws, n, V]
    return (logits.argmax(dim=-1) == (hidden @ weight.T).argmax(dim=-1)).double().mean(dim=0)  # [n]


@pytest.mark.parametrize("p", [0.002, 0.005, 0.01])
def test_the_first_order_estimate_is_exact_up_to_two_dropped_coordinates(p):
    """With at most one coordinate dropped the spike rule is exact (no drop keeps the argmax; one
    drop flips it iff that coordinate is a spike), so |estimate - truth| <= P(2+ dropped). Hidden
    states with outlier coordinates, as LLMs have, so spikes exist. 20000 masks per position:
    Monte Carlo standard error <= 0.0036; tolerance = P(2+ dropped) + 0.015."""
    gen = torch.Generator().manual_seed(1)
    n, d, vocab = 16, 32, 12
    hidden = 0.3 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    hidden[:, :3] *= 30  # three outlier coordinates
    weight = torch.randn(vocab, d, generator=gen, dtype=torch.float64)
    estimate = EstimatedAgreement(hidden, weight, paths=1)
    assert float(estimate.spikes.sum()) >= n  # the case under test is there
    two_or_more = 1 - (1 - p) ** d - d * p * (1 - p) ** (d - 1)
    truth = monte_carlo_keep(hidden, weight, p, 20000, gen)
    assert torch.allclose(estimate.keep_probability(p), truth, atol=two_or_more + 0.015), (estimate.keep_probability(p), truth)


def test_the_gaussian_estimate_predicts_a_monte_carlo_of_the_dropout_where_the_central_limit_theorem_holds():
    """One competitor (V = 2), d = 1024 i.i.d. coordinates: per position, P(a dropped head keeps the
    argmax) = Phi(g / s) up to the CLT's error. 4000 masks per position: Monte Carlo standard error
    <= 0.008; tolerance 0.03 = ~3.5 standard errors + the normal approximation's error."""
    gen = torch.Generator().manual_seed(0)
    n, d, draws = 6, 1024, 4000
    hidden = torch.randn(n, d, generator=gen, dtype=torch.float64)
    weight = torch.randn(2, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
    for p in (0.01, 0.05, 0.3):
        keep = EstimatedAgreement(hidden, weight, paths=1, method="gaussian").keep_probability(p)  # [n]
        monte_carlo = monte_carlo_keep(hidden, weight, p, draws, gen)
        assert torch.allclose(keep, monte_carlo, atol=0.03), (p, keep, monte_carlo)
        # and not trivially: somewhere the head does flip
    assert float(keep.min()) < 0.97


def test_all_k_heads_keep_the_argmax_with_the_kth_power_of_one_heads_probability():
    hidden, weight, _ = rows_and_head(3)
    one, five = EstimatedAgreement(hidden, weight, 1), EstimatedAgreement(hidden, weight, 5)
    assert five(0.2) == pytest.approx(float((one.keep_probability(0.2) ** 5).mean()), rel=1e-12)


@settings(max_examples=20)
@given(seed=seeds, paths=st.integers(1, 6), planted=st.floats(0.002, 0.8))
def test_the_bisection_finds_a_planted_p_on_the_estimate(seed, paths, planted):
    hidden, weight, _ = rows_and_head(seed, scale=3.0)
    estimate = EstimatedAgreement(hidden, weight, paths, method="gaussian")  # strictly falling: one p per level
    level = estimate(planted)
    if not 1e-9 < level < 1 - 1e-9:
        return  # a flat curve there: no single p to find
    found = calibrate_p(estimate, level, steps=40)
    assert estimate(found) >= level
    assert estimate(found) == pytest.approx(level, abs=1e-6)


@settings(max_examples=10)
@given(cfg=model_configs(), seed=seeds, planted=st.sampled_from([0.05, 0.1, 0.2, 0.4]))
def test_the_bisection_finds_a_crossing_of_a_tiny_models_measured_agreement(cfg, seed, planted):
    """On a tiny random model's LM-head inputs: the measured curve is a step function (common
    random numbers), so the bisection returns a p where it is >= the level and a step later < it."""
    model = random_model(cfg, seed, scale=3.0)
    with torch.no_grad():
        hidden = model.forward_hidden(torch.arange(min(12, cfg.vocab_size)).unsqueeze(0))[0]  # [n, d]
    measured = MeasuredAgreement(hidden, model.head, paths=3, seed=seed)
    level = measured(planted)
    if level in (0.0, 1.0):
        return
    lo, hi = bracket_p(measured, level, steps=30)
    assert measured(lo) >= level > measured(hi) and hi - lo <= 0.9 / 2 ** 30 * 1.01  # (the halvings round)
    assert calibrate_p(measured, level, steps=30) == lo


def test_calibrate_p_returns_the_top_of_the_range_when_agreement_never_drops_and_rejects_bad_levels():
    assert calibrate_p(lambda p: 1.0, 0.8, p_max=0.9) == 0.9
    for level in (0.0, 1.5, -0.1):
        with pytest.raises(MinispecError, match="agreement level"):
            calibrate_p(lambda p: 1.0, level)
    with pytest.raises(MinispecError, match="dropout p"):
        EstimatedAgreement(*rows_and_head(0)[:2], paths=1).keep_probability(1.0)


@settings(max_examples=5)
@given(cfg=model_configs(), seed=seeds, prompt=st.lists(st.integers(0, 7), min_size=1, max_size=6))
def test_auto_dropout_p_calibrates_on_the_targets_own_greedy_continuation(cfg, seed, prompt):
    from minispec.chain.speculative import generate_chain as generate

    model = random_model(cfg, seed, scale=3.0)
    continuation = generate(model, prompt, max_new_tokens=8, eos_token_ids=[]).tokens
    chosen = auto_dropout_p(model, prompt, paths=5, level=0.5, continuation=continuation)
    with torch.no_grad():
        hidden = model.forward_hidden(torch.tensor([prompt + continuation]))[0, len(prompt) - 1:-1]
    lo, hi = bracket_p(MeasuredAgreement(hidden, model.head, 5), 0.5, steps=16)
    assert chosen == lo
