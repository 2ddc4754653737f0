"""What sampling keeps: minispec.model.sampling.logits_to_probs against a plain-Python definition.

The reference, on one row of logits (float64 Python floats):

    p       = softmax(logits / T)
    top-k   keep x if logit_x >= the k-th largest logit (every token tied with the k-th is kept)
    top-p   on the top-k distribution renormalised: keep x if the mass of the tokens strictly more
            probable than x (a strictly larger logit) is below top_p (the token that crosses top_p is kept; tokens tied
            with it are kept with it: the kept set does not depend on how ties are ordered)
    result  the kept tokens' p, renormalised

Temperature comes first (the nucleus is taken on softmax(logits / T), not on softmax(logits)).
Logits are small integers half the time, so ties are common; top_p values that sit within 1e-9
of a cumulative mass are skipped (float summation order decides those, not the definition).
Tolerance: 1e-12 on each probability (float64 softmax of at most 12 logits).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from minispec.model.sampling import SamplingParams, logits_to_probs


def reference_probs(logits: list[float], temperature: float, top_k: int | None, top_p: float | None) -> list[float]:
    scaled = [x / temperature for x in logits]
    kept = list(range(len(logits)))
    if top_k is not None and top_k < len(logits):
        kth = sorted(scaled, reverse=True)[top_k - 1]
        kept = [i for i in kept if scaled[i] >= kth]
    top = max(scaled[i] for i in kept)
    weights = {i: math.exp(scaled[i] - top) for i in kept}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    if top_p is not None and top_p < 1:
        # strictly more probable = a strictly larger logit (exact in floats; two logits a few ulps apart
        # can round to one probability)
        masses = {i: sum(q for j, q in probs.items() if scaled[j] > scaled[i]) for i in probs}
        assume(all(abs(m - top_p) > 1e-9 for m in masses.values()))  # not on a float boundary
        kept = [i for i in probs if masses[i] < top_p]
        total = sum(probs[i] for i in kept)
        probs = {i: probs[i] / total for i in kept}
    return [probs.get(i, 0.0) for i in range(len(logits))]


@st.composite
def rows(draw):
    vocab = draw(st.integers(1, 12))
    if draw(st.booleans()):  # integers: many exact ties
        logits = draw(st.lists(st.integers(-3, 3), min_size=vocab, max_size=vocab))
    else:
        logits = draw(st.lists(st.floats(-8, 8, allow_nan=False), min_size=vocab, max_size=vocab))
    temperature = draw(st.sampled_from([0.25, 0.5, 1.0, 1.7, 4.0]))
    top_k = draw(st.none() | st.integers(1, vocab + 1))
    top_p = draw(st.none() | st.sampled_from([0.05, 0.3, 0.5, 0.75, 0.9, 0.999, 1.0]))
    return [float(x) for x in logits], temperature, top_k, top_p


@settings(max_examples=300)  # a millisecond each; the tie-at-the-crossing cases need a few hundred draws
@given(row=rows())
def test_logits_to_probs_keeps_what_the_definition_keeps(row):
    logits, temperature, top_k, top_p = row
    want = reference_probs(logits, temperature, top_k, top_p)
    got = logits_to_probs(torch.tensor(logits, dtype=torch.float64), SamplingParams(temperature, top_k, top_p))
    assert [g > 0 for g in got.tolist()] == [w > 0 for w in want], (got.tolist(), want)
    assert got.tolist() == pytest.approx(want, abs=1e-12)


@given(row=rows(), batch=st.integers(1, 3))
def test_rows_of_a_batch_are_post_processed_alone(row, batch):
    """[B, V] logits give each row what it gives alone (top-k and top-p per row)."""
    logits, temperature, top_k, top_p = row
    params = SamplingParams(temperature, top_k, top_p)
    table = torch.stack([torch.tensor(logits, dtype=torch.float64) * (1 + b) for b in range(batch)])  # [B, V]
    together = logits_to_probs(table, params)
    for b in range(batch):
        assert torch.equal(together[b], logits_to_probs(table[b], params))


def test_the_crossing_token_and_its_ties_are_kept():
    """softmax([2, 1, 1, 0]) = [0.53, 0.20, 0.20, 0.07]. top_p = 0.5: the first token alone reaches it.
    top_p = 0.6: the nucleus needs one of the two tied tokens, and no order tells them apart, so both
    are kept (the last is not: 0.93 is before it)."""
    logits = torch.tensor([2.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    assert (logits_to_probs(logits, SamplingParams(1.0, top_p=0.5)) > 0).tolist() == [True, False, False, False]
    assert (logits_to_probs(logits, SamplingParams(1.0, top_p=0.6)) > 0).tolist() == [True, True, True, False]
    assert logits_to_probs(torch.zeros(4, dtype=torch.float64), SamplingParams(1.0, top_p=0.3)).tolist() == [0.25] * 4
