"""Speculation under a grammar mask: the suite says which law an engine samples (the locally projected
one, the grammar-conditional one, or neither), against laws computed by enumerating every sentence."""

from itertools import product

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec.testing.conform import Budget, Engine, conform, minispec_engine
from minispec.testing.conform.grammar import MASKED, TOY
from minispec.testing.conform.invariants import constrained_rows

QUICK = Budget(delta=0.15, start=500, limit=8000)


def enumerated_first(p: torch.Tensor) -> torch.Tensor:
    """The grammar-conditional law of the first token by brute force: every sentence of V^H weighed by
    prod_i p_i(x_i), the ones TOY does not accept dropped, the first token's marginal. [V] float64."""
    first = torch.zeros(TOY.vocab, dtype=torch.float64)
    for sentence in product(range(TOY.vocab), repeat=TOY.horizon):
        state = TOY.start
        for token in sentence:
            state = None if state is None else TOY.moves[state].get(token)
        if state in TOY.accepting:
            first[sentence[0]] += torch.prod(p[torch.arange(TOY.horizon), list(sentence)].double())
    return first / first.sum()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-4, 4), min_size=TOY.horizon * TOY.vocab, max_size=TOY.horizon * TOY.vocab))
def test_the_grammar_conditional_law_is_the_enumerated_one(values):
    p = torch.softmax(torch.tensor(values, dtype=torch.float64).reshape(TOY.horizon, TOY.vocab), -1)
    assert torch.allclose(TOY.conditional_first(p), enumerated_first(p), atol=1e-12)


def test_the_masks_follow_the_drafted_path_and_leave_rows_off_the_grammar_alone():
    logits = torch.zeros(3, 4)
    masked = TOY.mask(logits, [0, 3])  # 0 commits to 3 3
    assert (masked[0] == torch.tensor([0, 0, 0, MASKED])).all()  # 3 cannot start a sentence
    assert (masked[1] == torch.tensor([MASKED, MASKED, MASKED, 0])).all() and (masked[2] == masked[1]).all()
    off = TOY.mask(logits, [3, 1])  # a forbidden first draft: the rows after it are not masked
    assert (off[1:] == 0).all()


def test_a_lossless_rule_samples_the_locally_projected_law_whichever_side_is_masked():
    verdict, = conform(minispec_engine("sampling"), QUICK, only=("constrained",))
    assert verdict.status == "pass", verdict.evidence
    assert verdict.evidence.count("the locally projected law") == 2  # both sides, target only


def test_an_engine_sampling_the_grammar_conditional_law_is_named_as_such():
    """An engine that knows the grammar and the whole target (its unmasked rows): it keeps no draft
    and draws its first token from the grammar-conditional law."""
    target, _ = constrained_rows(QUICK.seed)
    law = TOY.conditional_first(torch.softmax(target.double(), -1)).float()

    def grammar_aware(inp):
        return 0, int(torch.multinomial(law, 1, generator=inp.generator))

    verdict, = conform(Engine("grammar-aware", grammar_aware), QUICK, only=("constrained",))
    assert verdict.status == "pass", verdict.evidence
    assert verdict.evidence.count("the grammar-conditional law") == 2


def test_a_law_that_is_neither_fails():
    """Always the allowed token 1: within the grammar, but neither law."""
    verdict, = conform(Engine("always 1", lambda inp: (0, 1)), QUICK, only=("constrained",))
    assert verdict.status == "FAIL" and "neither law" in verdict.evidence, verdict.evidence


def test_a_draft_the_target_forbids_kept_is_a_token_off_the_grammar():
    """Accepting every draft: with the draft unmasked (target only), some draft leaves the grammar."""
    verdict, = conform(Engine("accepts everything", lambda inp: (inp.gamma, 3)), QUICK, only=("constrained",))
    assert verdict.status == "FAIL" and "which the grammar forbids" in verdict.evidence, verdict.evidence


def test_the_static_ensemble_with_the_target_alone_masked_leaves_the_grammar():
    pytest.importorskip("transformers", reason="the engine under test is transformers' sampler (pip install -e .[test])")
    from minispec.testing.conform import transformers_engine

    verdict, = conform(transformers_engine(0.5), QUICK, only=("constrained",))
    assert verdict.status == "FAIL" and verdict.evidence.startswith("target only: neither law"), verdict.evidence


@pytest.mark.parametrize("kwargs, needle", [
    (dict(vocab=0, horizon=3, moves={0: {}}, accepting=frozenset({0})), "expected integers >= 1"),
    (dict(vocab=4, horizon=3, moves={0: {7: 0}}, accepting=frozenset({0})), "moves[0] holds (7, 0)"),
    (dict(vocab=4, horizon=3, moves={0: {1: 9}}, accepting=frozenset({0})), "moves[0] holds (1, 9)"),
    (dict(vocab=4, horizon=3, moves={0: {}}, accepting=frozenset({5})), "start and accepting"),
])
def test_a_malformed_grammar_is_one_line(kwargs, needle):
    from minispec.errors import MinispecError
    from minispec.testing.conform.grammar import Grammar

    with pytest.raises(MinispecError) as err:
        Grammar(**kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("p, needle", [
    (torch.full((2, 4), 0.25, dtype=torch.float64), "expected [horizon=3, vocab=4]"),
    ([[0.25] * 4] * 3, "expected [horizon=3, vocab=4]"),
    (torch.tensor([[0.25] * 4, [float("nan"), 0.5, 0.25, 0.25], [0.25] * 4], dtype=torch.float64), "p[1]"),
    (torch.tensor([[0.5, 0.5, 0, 0], [0, 0, 0, 1.0], [1.0, 0, 0, 0]], dtype=torch.float64), "probability 0"),
])
def test_the_conditional_law_refuses_rows_that_are_not_distributions_over_the_grammar(p, needle):
    from minispec.errors import MinispecError

    with pytest.raises(MinispecError) as err:
        TOY.conditional_first(p)
    assert needle in str(err.value), str(err.value)
