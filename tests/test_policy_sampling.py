"""Speculative sampling (minispec/acceptance/sampling.py): its rules on edge cases, exact match at
T = 0, and losslessness computed exactly in float64 from the module's own rules. The same property
through the real loop (chi-square on sampled outputs) is minispec.testing.check_policy's, run on
this policy in test_testing.py."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from minispec.acceptance import ExactMatch, SpeculativeSampling
from minispec.acceptance.sampling import acceptance_probability, residual_distribution
from minispec.model.sampling import SamplingParams, logits_to_probs
from minispec.testing import decided, verify_input

F64 = torch.float64


@st.composite
def greedy_cases(draw, max_vocab: int = 8, max_gamma: int = 5):
    """(draft_tokens [gamma], target_logits [gamma+1, V]) in float64, from a drawn seed.

    Integer-valued logits half the time, so ties (and the lowest-id rule) are common. Each
    draft token is the target's argmax with probability 0.6, so long prefixes get accepted.
    """
    vocab, gamma, seed = draw(st.integers(2, max_vocab)), draw(st.integers(0, max_gamma)), draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    if draw(st.booleans()):
        target_logits = torch.randint(-2, 3, (gamma + 1, vocab), generator=gen).to(F64)
    else:
        target_logits = 3 * torch.randn(gamma + 1, vocab, generator=gen, dtype=F64)
    use_argmax = torch.rand(gamma, generator=gen) < 0.6
    random_tokens = torch.randint(0, vocab, (gamma,), generator=gen)
    draft_tokens = torch.where(use_argmax, target_logits[:gamma].argmax(-1), random_tokens)
    return draft_tokens, target_logits


@given(case=greedy_cases())
def test_sampling_equals_exact_at_temperature_zero(case):
    draft_tokens, target_logits = case
    inp = verify_input(draft_tokens.tolist(), target_logits)  # one-hot p_target and q_draft
    assert decided(SpeculativeSampling()(inp)) == decided(ExactMatch()(inp))


def _distributions(vocab: int):
    """A strategy for a probability vector over `vocab` tokens, zeros allowed."""
    weights = st.lists(st.one_of(st.sampled_from([0.0, 1.0, 2.0]), st.floats(0, 10)), min_size=vocab, max_size=vocab)
    return weights.filter(lambda w: sum(w) > 0).map(lambda w: torch.tensor(w, dtype=F64) / sum(w))


@given(data=st.data())
def test_sampling_is_lossless_analytically(data):
    """P(first emitted token = y) = sum_x q(x) [a(x) 1{y = x} + (1 - a(x)) r(y)] must equal p(y).

    Composed from the module's own acceptance_probability and residual_distribution, gamma = 1.
    (The bonus branch, a draw from p_target[gamma], is checked by check_policy through the loop.)
    """
    vocab = data.draw(st.integers(2, 6), label="V")
    p_row, q_row = data.draw(_distributions(vocab), label="p"), data.draw(_distributions(vocab), label="q")
    residual = residual_distribution(p_row, q_row)  # [V]
    first_token = torch.zeros(vocab, dtype=F64)  # [V]
    for x in range(vocab):
        accept = acceptance_probability(p_row[None], q_row[None], torch.tensor([x]))[0]
        first_token += q_row[x] * (accept * torch.nn.functional.one_hot(torch.tensor(x), vocab) + (1 - accept) * residual)
    # float64, a handful of operations on numbers <= 1: round-off is ~1e-15; 1e-12 leaves room.
    torch.testing.assert_close(first_token, p_row, atol=1e-12, rtol=0)


def test_sampling_helpers_edge_cases():
    p_target = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]], dtype=F64)
    q_draft = torch.tensor([[0.0, 0.2, 0.8], [0.0, 1.0, 0.0]], dtype=F64)
    # q(0) = 0 with p(0) > 0: 1;  then p(1)/q(1) = 0.5
    assert acceptance_probability(p_target, q_draft, torch.tensor([0, 1])).tolist() == [1.0, 0.5]
    # q(x) = 0 and p(x) = 0: never accepted
    assert acceptance_probability(p_target[1:], q_draft[:1], torch.tensor([0])).tolist() == [0.0]
    # the residual of p <= q everywhere (p == q) is empty: p itself keeps the draw defined
    assert residual_distribution(p_target[0], p_target[0]).tolist() == [0.5, 0.5, 0.0]
    assert residual_distribution(p_target[0], q_draft[0]).tolist() == [0.5 / 0.8, 0.3 / 0.8, 0.0]


def test_sampling_same_seed_same_decision():
    gen = torch.Generator().manual_seed(5)
    target_logits = torch.randn(5, 6, generator=gen, dtype=F64)
    draft_logits = torch.randn(4, 6, generator=gen, dtype=F64)
    params = SamplingParams(temperature=1.0)
    draft = torch.multinomial(logits_to_probs(draft_logits, params), 1, generator=gen)[:, 0].tolist()
    runs = {seed: [decided(SpeculativeSampling()(verify_input(draft, target_logits, params, draft_logits=draft_logits,
                                                                seed=seed))) for _ in range(2)] for seed in range(20)}
    assert all(first == second for first, second in runs.values())
    assert len({first for first, _ in runs.values()}) > 1  # and the seed does matter
