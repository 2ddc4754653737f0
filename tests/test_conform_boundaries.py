"""Every plug-in boundary of the conformance suite: whatever an engine's step, batch form, claims or
accepts returns or raises, the suite gives a FAIL verdict naming it, never a crash and never a pass.
The returns are drawn by hypothesis from what user code gets wrong: floats (never truncated to
ids), strings (never parsed), bools, None, pairs of the wrong length, ids out of range, tensors
of the wrong kind or shape, unnormalised, negative or nan distributions, and exceptions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec.testing.conform import Budget, conform, minispec_engine
from minispec.testing.conform.contract import Engine, StepOutput, lossless, overlap

QUICK = Budget(delta=0.25, start=200, limit=400)
GOOD = minispec_engine("sampling")


class Boom(Exception):
    pass


def raising():
    raise Boom("user code failed")


BAD_IDS = st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.booleans(), st.none(),
                    st.integers(min_value=-5, max_value=-1), st.integers(min_value=10**3, max_value=10**6),
                    st.just(torch.tensor([1, 2])), st.just(torch.tensor(1.0)), st.just(torch.tensor(True)))
BAD_STEPS = st.one_of(
    st.tuples(BAD_IDS, st.just(0)), st.tuples(st.just(0), BAD_IDS),
    st.lists(st.integers(0, 1), max_size=4).filter(lambda xs: len(xs) != 2),
    st.builds(StepOutput, BAD_IDS, st.just(0)),
    st.just("raise"), st.none(), st.text(max_size=3))


def status(engine: Engine, invariant: str) -> tuple[str, str]:
    verdict = next(v for v in conform(engine, QUICK, only=(invariant,)) if v.invariant == invariant)
    return verdict.status, verdict.evidence


@settings(max_examples=40, deadline=None)
@given(bad=BAD_STEPS)
def test_a_step_returning_anything_outside_the_contract_fails_the_check(bad):
    def step(inp):
        return raising() if bad == "raise" else bad

    for invariant in ("greedy", "seeded", "zero_probability"):
        got, evidence = status(Engine("bad", step, greedy=True), invariant)
        assert got == "FAIL", (bad, invariant, evidence)
        assert "\n" not in evidence


@settings(max_examples=15, deadline=None)
@given(bad=BAD_STEPS)
def test_a_sampling_steps_bad_return_fails_every_statistical_check_too(bad):
    """The same returns from an engine that claims the target's law: each statistical check (and the
    grammar check, which decides its masked steps in batches of its own) is a FAIL, not a crash."""
    def step(inp):
        return raising() if bad == "raise" else bad

    for invariant in ("claimed_distribution", "both_sides_processed", "filtered_slices", "constrained"):
        got, evidence = status(Engine("bad", step, claims=lossless, accepts=overlap), invariant)
        assert got == "FAIL", (bad, invariant, evidence)
        assert "\n" not in evidence


BAD_DISTRIBUTIONS = st.one_of(
    st.just(torch.full((4,), 0.5)), st.just(torch.tensor([1.5, -0.5, 0.0, 0.0])),
    st.just(torch.tensor([math.nan, 1.0, 0.0, 0.0])), st.just(torch.ones(3) / 3), st.just(torch.ones(2, 4) / 8),
    st.just([0.25] * 4), st.floats(), st.none(), st.just("raise"), st.just(torch.ones(4, dtype=torch.bool)))


@settings(max_examples=20, deadline=None)
@given(bad=BAD_DISTRIBUTIONS)
def test_claims_returning_anything_but_a_distribution_fails_the_check(bad):
    engine = Engine("bad claims", GOOD.step, claims=lambda p, q: raising() if isinstance(bad, str) else bad)
    for invariant in ("claimed_distribution", "both_sides_processed", "judged_as_sampled"):
        got, evidence = status(engine, invariant)
        assert got == "FAIL", (bad, invariant, evidence)


@settings(max_examples=20, deadline=None)
@given(bad=st.one_of(st.floats(min_value=1.0001), st.floats(max_value=-0.0001), st.just(math.nan), st.text(max_size=2),
                     st.none(), st.booleans(), st.just(torch.tensor([0.5, 0.5])), st.just("raise")))
def test_accepts_returning_anything_but_a_probability_fails_the_check(bad):
    engine = Engine("bad accepts", GOOD.step, claims=lossless,
                    accepts=lambda c, q: raising() if bad == "raise" else bad)
    got, evidence = status(engine, "accepted_length")
    assert got == "FAIL", (bad, evidence)


@settings(max_examples=15, deadline=None)
@given(extra=st.integers(-3, 3).filter(lambda n: n != 0))
def test_a_batch_form_returning_another_row_count_fails_the_check(extra):
    def batch_step(inputs):
        outs = [GOOD.step(i) for i in inputs]
        return outs[:extra] if extra < 0 else outs + outs[:extra]

    got, evidence = status(Engine("short batch", GOOD.step, batch_step=batch_step), "batch_independent")
    assert got == "FAIL" and "outputs, one per input" in evidence, evidence


def test_an_engine_that_writes_into_its_inputs_changes_nothing_the_suite_compares_with():
    def step(inp):
        out = GOOD.step(inp)
        inp.p_target.zero_()  # a careless engine: the suite's reference must not move
        inp.target_logits.fill_(7.0)
        return out

    def claims(p, q):
        c = lossless(p, q)
        q.zero_()
        return c

    verdicts = conform(Engine("writer", step, claims=claims, accepts=overlap, batch_step=GOOD.batch_step), QUICK)
    assert all(v.passed for v in verdicts), [(v.invariant, v.evidence) for v in verdicts if not v.passed]
    assert [v.status for v in verdicts] == [v.status for v in conform(GOOD, QUICK)]


def test_the_good_engine_still_passes_through_the_checked_boundaries():
    assert {v.status for v in conform(GOOD, QUICK)} == {"pass"}


def test_a_verdict_from_a_planted_write_would_show():
    """The isolation test above can fail: without the copies, an engine that zeroes the reference
    p_target makes the statistical check compare against nothing (planted here by hand)."""
    from minispec.testing.conform import invariants

    setting = invariants.Setting(invariants.logits(3, 4, torch.Generator().manual_seed(0)),
                                 invariants.logits(2, 4, torch.Generator().manual_seed(1)))
    before = setting.reference.p_target.clone()
    inp = setting.input(torch.tensor([0, 1]), 0)
    inp.p_target.zero_()
    assert torch.equal(setting.reference.p_target, before)  # the step saw a copy


def _clone(generator: torch.Generator) -> torch.Generator:
    twin = torch.Generator()
    twin.set_state(generator.get_state())
    return twin


@pytest.mark.parametrize("source", ["first", "last", "previous"])
def test_a_batch_whose_rows_draw_from_another_rows_seed_fails_batch_independent(source):
    """A batch form that decides every row with a copy of another row's generator (one request's
    seed for the whole batch) draws no fewer numbers than the rows alone, so only distinct seeds per
    row tell it apart: the check must give each row its own."""
    from dataclasses import replace

    def batch_step(inputs):
        pick = {"first": lambda r: 0, "last": lambda r: len(inputs) - 1, "previous": lambda r: max(r - 1, 0)}[source]
        return [GOOD.step(replace(inp, generator=_clone(inputs[pick(r)].generator))) for r, inp in enumerate(inputs)]

    got, evidence = status(Engine("one seed", GOOD.step, claims=lossless, accepts=overlap, batch_step=batch_step),
                           "batch_independent")
    assert got == "FAIL" and "alone, with the same generator seed" in evidence, evidence


def test_the_largest_seed_a_budget_takes_runs_every_check():
    """Budget takes seeds up to 2**63 - 1; every stream the checks derive from it stays a seed a
    torch.Generator takes (below 2**64), so the top of the range is a run, not a traceback."""
    top = Budget(delta=0.25, start=200, limit=400, seed=2**63 - 1)
    verdicts = conform(GOOD, top)
    assert {v.status for v in verdicts} <= {"pass", "n/a"}, [(v.invariant, v.evidence) for v in verdicts if v.status == "FAIL"]
