"""Distortion (minispec/lab/distortion/): each rule's one-position output distribution
pi = q . a + (1 - sum q a) r is the distribution the policy itself emits (chi-square over the
policy's own coins and masks, exact over the draft token, for every rule with a form); the
lossless settings have zero distortion to float64 rounding; the static ensemble emits
v = (1 - w) q + w p exactly; FLy's bound is 0 where FLy is its base; the meter changes no token."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minispec import acceptance
from minispec.acceptance import VerifyInput
from minispec.lab.distortion import (DistortionMeter, FormContext, form_of, output_distribution,
                                            position_distortion, total_variation)
from minispec.lab.distortion.forms import rows
from minispec.chain.speculative import generate_chain as generate
from minispec.model.sampling import SamplingParams, logits_to_probs
from minispec.testing import seeds
from minispec.testing.checks import P_VALUE_FLOOR, verify_inputs, with_head
from minispec.testing.distribution import chi_square_p_value
from minispec.testing.strategies import random_model, tiny_config

F64 = torch.float64
RULES = {  # name -> options: settings where each rule is visibly lossy on small inputs
    "exact": {}, "sampling": {}, "lenience": {"beta": 0.5}, "ensemble": {"weight": 0.3}, "typical": {},
    "kl-judge": {"threshold": 5.0, "confidence": 1.0}, "dropmatch": {"p": 0.5, "paths": 3},
    "dropmatch-lazy": {"p": 0.5, "paths": 3},
}


def context(draws: int = 16, seed: int = 0) -> FormContext:
    return FormContext(torch.Generator().manual_seed(seed), draws)


def one_draft_input(case: int, temperature: float, vocab: int = 4, top_k: int | None = None,
                    top_p: float | None = None) -> VerifyInput:
    """gamma 1: a draft distribution q and (after with_head) a target from a random head; the draft
    token is set per test."""
    gen = torch.Generator().manual_seed(500 + case)
    params = SamplingParams(temperature, top_k, top_p)
    draft_logits = 1.5 * torch.randn(1, vocab, generator=gen, dtype=F64)  # [1, V]
    placeholder = torch.zeros(2, vocab, dtype=F64)  # replaced by the head's logits
    return VerifyInput(torch.tensor([0]), logits_to_probs(draft_logits, params), placeholder, placeholder, params,
                       torch.Generator(), draft_logits)


# The slices: T in {0, 1} (where softmax(target_logits) is p_target) and far from 1 with the filters
# on (where a form or a rule reading the raw logits instead of p_target is off).
SLICES = {"T0": (0.0, None, None), "T1": (1.0, None, None), "T0.3-top3": (0.3, 3, None), "T2-top0.9": (2.0, None, 0.9)}


@pytest.mark.parametrize("slice_", sorted(SLICES))
@pytest.mark.parametrize("name", sorted(RULES))
def test_the_form_is_the_distribution_the_policy_emits(name, slice_):
    """For each draft token x the policy decides 800 times over its own coins and masks (a fresh seed
    each); what it emits is compared by chi-square with the form's a(x) e_x + (1 - a(x)) r, x by x
    (each x at the floor / V, a Bonferroni split). A Monte Carlo form's a(x) is the mean of 4000 mask
    draws: its error, <= 0.008, is under a third of the counts' ~0.018 at 800."""
    vocab, coins = 4, 800
    temperature, top_k, top_p = SLICES[slice_]
    for case in range(2 if slice_ in ("T0", "T1") else 1):
        policy = acceptance.get(name, **RULES[name])
        inp = with_head(one_draft_input(case, temperature, vocab, top_k, top_p), seed=case)
        form = form_of(policy, inp, 0, context(draws=4000, seed=case))
        for x in range(vocab):
            expected = form.accept[x] * torch.nn.functional.one_hot(torch.tensor(x), vocab) + \
                (1 - form.accept[x]) * form.residual  # [V]
            counts = torch.zeros(vocab, dtype=F64)
            step = VerifyInput(torch.tensor([x]), inp.q_draft, inp.target_logits, inp.p_target, inp.params,
                               torch.Generator(), inp.draft_logits, hidden=inp.hidden, head=inp.head)
            for coin in range(coins):
                fresh = acceptance.get(name, **RULES[name])
                fresh.reset(coin)
                step.generator = torch.Generator().manual_seed(coin)
                decision = fresh(step)
                counts[x if decision.num_accepted == 1 else decision.next_token] += 1
            support = [y for y in range(vocab) if expected[y] > 1e-12]
            stray = float(counts.sum()) - sum(float(counts[y]) for y in support)
            assert stray == 0, f"{name}, x = {x}: emitted a token the form gives no mass: {expected.tolist()}, {counts.tolist()}"
            if len(support) > 1:
                pv = chi_square_p_value({(y,): float(counts[y]) for y in support},
                                        {(y,): float(expected[y]) for y in support}, coins)
                assert pv >= P_VALUE_FLOOR / vocab, (name, case, x, expected.tolist(), (counts / coins).tolist(), pv)


LOSSLESS_SETTINGS = [("sampling", {}), ("lenience", {"beta": 1.0}), ("ensemble", {"weight": 1.0}),
                     ("kl-judge", {"threshold": 0.0}), ("fly", {"entropy_threshold": math.inf}),
                     ("block", {}), ("traversal", {})]


@given(inp=verify_inputs(temperature=1.0), setting=st.sampled_from(LOSSLESS_SETTINGS), seed=seeds)
def test_a_lossless_setting_has_zero_distortion_to_rounding(inp, setting, seed):
    """pi = p at every row, T > 0: float64 sums of at most V terms, so 1e-12 is round-off, not slack."""
    name, options = setting
    policy = acceptance.get(name, **options)
    for row in range(inp.gamma + 1):
        measured = position_distortion(policy, inp, row, context(seed=seed))
        assert measured.tv <= 1e-12, (name, row, measured)
        assert math.isnan(measured.kl) or measured.kl <= 1e-12, (name, row, measured)


@given(inp=verify_inputs(temperature=0.0), name=st.sampled_from(["exact", "sampling", "block", "lenience"]))
def test_at_temperature_zero_the_greedy_rules_emit_the_argmax(inp, name):
    policy = acceptance.get(name)
    for row in range(inp.gamma + 1):
        assert position_distortion(policy, inp, row, context()).tv <= 1e-12


@given(inp=verify_inputs(temperature=1.0), weight=st.floats(0, 1))
def test_the_static_ensemble_emits_its_mixture_exactly(inp, weight):
    """pi = v = (1 - w) q + w p on drafted rows, so TV(pi, p) = (1 - w) TV(q, p); the bonus row is p."""
    policy = acceptance.get("ensemble", weight=weight)
    for row in range(inp.gamma):
        p_row, q_row = rows(inp, row)
        pi = output_distribution(form_of(policy, inp, row, context()), q_row)
        assert torch.allclose(pi, (1 - weight) * q_row + weight * p_row, atol=1e-12, rtol=0)
        measured = position_distortion(policy, inp, row, context())
        assert measured.tv == pytest.approx((1 - weight) * total_variation(q_row, p_row), abs=1e-12)
    assert position_distortion(policy, inp, inp.gamma, context()).tv <= 1e-12


@given(inp=verify_inputs(), seed=seeds)
def test_fly_bound_is_zero_where_no_window_fits_and_at_most_one(inp, seed):
    policy = acceptance.get("fly", window_size=2)
    for row in range(inp.gamma + 1):
        measured = position_distortion(policy, inp, row, context(seed=seed))
        assert measured.kind == ("exact" if inp.params.greedy else "bound") and 0 <= measured.tv <= 1
        if row + 2 >= inp.gamma and not inp.params.greedy:
            assert measured.tv <= 1e-12  # FLy is its (lossless) base where the window cannot fit


@given(inp=verify_inputs(max_gamma=6, temperature=0.0), window=st.integers(0, 3),
       threshold=st.sampled_from([0.0, 0.3, 0.8]))
def test_at_temperature_zero_fly_form_is_its_decision_on_the_drawn_token(inp, window, threshold):
    """q is one-hot on d at T = 0: the form keeps d (a(d) = 1) exactly when FLy, run on the step, keeps
    it at the first position; and pi is then e_d, else the argmax (no bound needed)."""
    policy = acceptance.get("fly", window_size=window, entropy_threshold=threshold)
    if inp.gamma == 0:
        return
    form = form_of(policy, inp, 0, context())
    kept = policy(inp).num_accepted >= 1
    assert float(form.accept[int(inp.draft_tokens[0])]) == float(kept)
    assert form.kind == "exact"


@given(inp=verify_inputs(temperature=1.0), threshold=st.floats(0, 10), seed=seeds)
def test_a_larger_kl_threshold_never_distorts_less_in_bound(inp, threshold, seed):
    """The judge only adds acceptance to a lossless base: TV(pi, p) <= sum q (a - a_base)."""
    policy = acceptance.get("kl-judge", threshold=threshold, confidence=1.0)
    base = acceptance.get("sampling")
    for row in range(inp.gamma):
        p_row, q_row = rows(inp, row)
        form, base_form = form_of(policy, inp, row, context()), form_of(base, inp, row, context())
        extra = float((q_row * (form.accept - base_form.accept)).sum())
        assert extra >= -1e-12
        assert position_distortion(policy, inp, row, context()).tv <= extra + 1e-12


@pytest.mark.parametrize("name, options, temperature", [
    ("typical", {}, 1.0), ("dropmatch", {"p": 0.3}, 1.0), ("dropmatch", {"p": 0.3}, 0.0),
    ("kl-judge", {"threshold": 1.0}, 0.0), ("fly", {"window_size": 1}, 1.0)])
def test_the_meter_changes_no_token_and_measures_every_judged_position(name, options, temperature):
    cfg = tiny_config(vocab_size=12, num_layers=1)
    target, draft = random_model(cfg, 3, scale=3.0), random_model(cfg, 4, scale=3.0)
    run = dict(max_new_tokens=12, draft=draft, gamma=3, temperature=temperature, seed=5, eos_token_ids=[])
    plain = generate(target, [1, 2, 3], policy=acceptance.get(name, **options), **run)
    meter = DistortionMeter(acceptance.get(name, **options), draws=8)
    metered = generate(target, [1, 2, 3], policy=meter, **run)
    assert metered.tokens == plain.tokens
    assert metered.stats["accepted_length_histogram"] == plain.stats["accepted_length_histogram"]
    histogram = plain.stats["accepted_length_histogram"]  # steps by num_accepted
    judged = sum((n + 1) * steps for n, steps in enumerate(histogram))  # rows 0..num_accepted of each step
    judged += plain.stats["no_draft_steps"]  # a step with nothing drafted: the policy draws its bonus row only
    summary = meter.summary()
    assert summary["positions"] + summary["uncovered"] == judged
    assert 0 <= summary["tv_mean"] <= 1 and 0 <= summary["tv_p95"] <= 1


def test_dropmatch_monte_carlo_error_shrinks_with_draws():
    inp = with_head(one_draft_input(0, 1.0, vocab=6), seed=0)
    policy = acceptance.get("dropmatch", p=0.5, paths=3)
    few = position_distortion(policy, inp, 0, context(draws=16))
    many = position_distortion(policy, inp, 0, context(draws=1024))
    assert few.kind == many.kind == "monte-carlo"
    assert many.tv_error < few.tv_error
    assert abs(few.tv - many.tv) <= 4 * few.tv_error + 1e-12


def test_the_distances_by_hand():
    """p = (0.5, 0.5), pi = (0.9, 0.1): TV 0.4; KL(p || pi) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5108
    (KL(pi || p) would be 0.3681); pi = 0 where p > 0 is infinite; p's zeros cost nothing."""
    from minispec.lab.distortion import kl_from_target
    p, pi = torch.tensor([0.5, 0.5], dtype=F64), torch.tensor([0.9, 0.1], dtype=F64)
    assert total_variation(pi, p) == pytest.approx(0.4, abs=1e-15)
    assert kl_from_target(p, pi) == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5.0), abs=1e-15)
    assert kl_from_target(p, torch.tensor([1.0, 0.0], dtype=F64)) == math.inf
    assert kl_from_target(torch.tensor([1.0, 0.0], dtype=F64), p) == pytest.approx(math.log(2), abs=1e-15)


def test_in_a_batch_the_meter_changes_no_token_and_every_row_records_into_it():
    from minispec.batch.speculative import generate_batch
    cfg = tiny_config(vocab_size=12, num_layers=1)
    target, draft = random_model(cfg, 3, scale=3.0), random_model(cfg, 4, scale=3.0)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    run = dict(max_new_tokens=10, draft=draft, gamma=3, temperature=1.0, seed=2, eos_token_ids=[])
    plain = generate_batch(target, prompts, policy=acceptance.get("typical"), **run)
    meter = DistortionMeter(acceptance.get("typical"))
    metered = generate_batch(target, prompts, policy=meter, **run)
    assert [r.tokens for r in metered] == [r.tokens for r in plain]
    judged = sum(sum((n + 1) * k for n, k in enumerate(r.stats["accepted_length_histogram"])) + r.stats["no_draft_steps"]
                 for r in plain)
    assert meter.summary()["positions"] == judged


def test_a_batch_rows_monte_carlo_figures_are_those_of_its_prompt_run_alone():
    """DropMatch's Monte Carlo figures come from the meter's own stream, which each run's reset seeds
    from the meter's seed and the run's: a batch row (its own seed) records what the same prompt and
    seed record alone, whoever its batch-mates are. Compared as sorted figures: rows record
    interleaved into one list. Tolerance 1e-9: a batched forward may round the logits differently
    from a lone one, far below the Monte Carlo spread of 16 draws that a shared stream would move."""
    from minispec.batch.speculative import generate_batch
    cfg = tiny_config(vocab_size=12, num_layers=1)
    target, draft = random_model(cfg, 3, scale=3.0), random_model(cfg, 4, scale=3.0)
    prompts, seeds_ = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [11, 12, 13]
    run = dict(max_new_tokens=8, draft=draft, gamma=3, temperature=1.0, eos_token_ids=[])

    def figures(meter):
        return sorted((r.tv, r.tv_error) for r in meter.records)

    together = DistortionMeter(acceptance.get("dropmatch", p=0.3), draws=16, seed=4)
    generate_batch(target, prompts, policy=together, seed=seeds_, **run)
    alone = []
    for prompt, seed in zip(prompts, seeds_):
        meter = DistortionMeter(acceptance.get("dropmatch", p=0.3), draws=16, seed=4)
        generate_batch(target, [prompt], policy=meter, seed=[seed], **run)
        assert "monte-carlo" in {r.kind for r in meter.records}
        alone += meter.records
    assert len(together.records) == len(alone)
    for got, want in zip(figures(together), sorted((r.tv, r.tv_error) for r in alone)):
        assert got == pytest.approx(want, abs=1e-9)
