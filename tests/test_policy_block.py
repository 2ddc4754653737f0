"""Block verification (minispec/acceptance/block.py): lossless and never worse than token-level
verification, both computed exactly in float64 on tiny vocabularies; token-level verification at
gamma = 1 draw for draw; exact match at T = 0; decide() equal to a from-the-definition rule on
random inputs. Through the real loop (chi-square with its power check): check_policy, in
test_testing.py."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minispec.acceptance import BlockVerification, ExactMatch, SpeculativeSampling, VerifyInput
from minispec.acceptance.block import block_weights, next_distribution, stop_probabilities
from minispec.acceptance.sampling import acceptance_probability
from minispec.model.sampling import SamplingParams, logits_to_probs
from minispec.testing import decided, verify_input
from minispec.testing.checks import verify_inputs

F64 = torch.float64


def random_tables(seed: int, vocab: int, gamma: int, ties: bool):
    """A target and a draft "model" as tables: context (a tuple of tokens) -> distribution [V].

    With `ties`, some rows are shared between target and draft (p = q there) and some have zeros:
    the 0/0 and empty-residual cases of the rule."""
    gen = torch.Generator().manual_seed(seed)

    def row():
        logits = 2 * torch.randn(vocab, generator=gen, dtype=F64)
        if ties and torch.rand(1, generator=gen) < 0.3:
            logits[torch.randint(vocab, (1,), generator=gen)] = -float("inf")
        return torch.softmax(logits, -1)

    contexts = [c for n in range(gamma + 2) for c in itertools.product(range(vocab), repeat=n)]
    target = {c: row() for c in contexts}
    draft = {c: (target[c].clone() if ties and torch.rand(1, generator=gen) < 0.3 else row()) for c in contexts}
    return target, draft


def rows_along(table, draft: tuple, n: int) -> torch.Tensor:
    return torch.stack([table[draft[:i]] for i in range(n)])  # [n, V]


def sequence_probability(table, seq: tuple) -> float:
    """prod_i table[seq[:i]][seq[i]]: the chance a table "model" samples exactly `seq`."""
    return float(torch.prod(torch.stack([table[seq[:i]][seq[i]] for i in range(len(seq))])))


def block_outcomes(p_rows, q_rows, draft):
    """{tau: (probability, next-token distribution)} from the module's own rule, exactly."""
    weights = block_weights(p_rows, q_rows, torch.tensor(draft))
    stop = stop_probabilities(p_rows, q_rows, weights)  # [gamma]
    gamma = len(draft)
    out = {}
    for tau in range(gamma + 1):
        # tau = the largest j with u_j < h_j: stop at tau, and none of the later ones stop
        prob = (stop[tau - 1] if tau else torch.tensor(1.0, dtype=F64)) * torch.prod(1 - stop[tau:])
        out[tau] = (prob, next_distribution(p_rows, q_rows, weights, tau))
    return out


def token_level_lengths(p_rows, q_rows, draft):
    """P(tau = j) for token-level verification: accept each draft with min(1, p/q) until one fails."""
    accept = acceptance_probability(p_rows, q_rows, torch.tensor(draft))  # [gamma]
    gamma = len(draft)
    return [torch.prod(accept[:j]) * (1 - accept[j] if j < gamma else 1) for j in range(gamma + 1)]


def output_distribution(target, draft_table, vocab: int, gamma: int) -> dict[tuple, float]:
    """P(first gamma+1 emitted tokens) of one block-verification step, completed by the target's
    own sampling where the step emitted fewer: exact, over every draft and every tau."""
    dist: dict[tuple, float] = {}

    def complete(prefix: tuple, prob: float):
        if len(prefix) == gamma + 1:
            dist[prefix] = dist.get(prefix, 0.0) + prob
            return
        for v in range(vocab):
            complete(prefix + (v,), prob * float(target[prefix][v]))

    for draft in itertools.product(range(vocab), repeat=gamma):
        q_draft_prob = sequence_probability(draft_table, draft)
        if q_draft_prob == 0:
            continue
        p_rows, q_rows = rows_along(target, draft, gamma + 1), rows_along(draft_table, draft, gamma)
        for tau, (prob, nxt) in block_outcomes(p_rows, q_rows, draft).items():
            for y in range(vocab):
                if prob * nxt[y] > 0:
                    complete(draft[:tau] + (y,), q_draft_prob * float(prob) * float(nxt[y]))
    return dist


def target_distribution(target, vocab: int, length: int) -> dict[tuple, float]:
    return {seq: sequence_probability(target, seq) for seq in itertools.product(range(vocab), repeat=length)}


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), shape=st.sampled_from([(2, 1), (3, 1), (2, 2), (3, 2), (2, 3), (3, 3)]),
       ties=st.booleans())
def test_block_verification_is_lossless_exactly(seed, shape, ties):
    vocab, gamma = shape
    target, draft = random_tables(seed, vocab, gamma, ties)
    got = output_distribution(target, draft, vocab, gamma)
    want = target_distribution(target, vocab, gamma + 1)
    # float64, sums of at most V^(2 gamma + 1) products of numbers <= 1: round-off ~1e-15.
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), (seq, got.get(seq, 0.0), prob)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), shape=st.sampled_from([(2, 2), (3, 2), (2, 3), (3, 3), (4, 2), (2, 4)]),
       ties=st.booleans())
def test_block_verification_accepts_at_least_as_many_tokens_in_expectation(seed, shape, ties):
    """E[tau] over the draft and the coins, exactly: block >= token-level (Sun et al.'s optimality)."""
    vocab, gamma = shape
    target, draft = random_tables(seed, vocab, gamma, ties)
    block = token = 0.0
    for x in itertools.product(range(vocab), repeat=gamma):
        weight = sequence_probability(draft, x)
        p_rows, q_rows = rows_along(target, x, gamma + 1), rows_along(draft, x, gamma)
        block += weight * sum(tau * float(prob) for tau, (prob, _) in block_outcomes(p_rows, q_rows, x).items())
        token += weight * sum(j * float(prob) for j, prob in enumerate(token_level_lengths(p_rows, q_rows, x)))
    assert block >= token - 1e-12, (block, token)


def test_block_verification_beats_token_level_where_a_later_draft_makes_up_for_an_earlier_one():
    """The case that tells the two apart: d_1 is over-drafted (q > p) but d_2 only follows it
    under the target. Token-level accepts d_1 with p/q = 0.5; block verification, knowing d_2,
    accepts more often, and E[tau] is strictly larger."""
    p_rows = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.5, 0.5]], dtype=F64)
    q_rows = torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=F64)
    draft = (1, 0)
    block = sum(tau * float(prob) for tau, (prob, _) in block_outcomes(p_rows, q_rows, draft).items())
    token = sum(j * float(prob) for j, prob in enumerate(token_level_lengths(p_rows, q_rows, draft)))
    assert block > token + 0.1, (block, token)


@given(inp=verify_inputs(max_gamma=1, temperature=1.0), coin=st.integers(0, 2**31))
def test_at_gamma_1_it_is_token_level_verification_draw_for_draw(inp, coin):
    decisions = []
    for policy in (BlockVerification(), SpeculativeSampling()):
        inp.generator = torch.Generator().manual_seed(coin)
        decisions.append(decided(policy(inp)))
    assert decisions[0] == decisions[1]


@given(inp=verify_inputs(temperature=0.0), coin=st.integers(0, 2**31))
def test_at_temperature_0_it_is_exact_match(inp, coin):
    inp.generator = torch.Generator().manual_seed(coin)
    assert decided(BlockVerification()(inp)) == decided(ExactMatch()(inp))


def from_the_definition(inp) -> tuple[int, int]:
    """Sun et al.'s Algorithm 2, written from the paper's statement in plain Python floats."""
    p = inp.p_target.tolist()
    q = inp.q_draft.tolist()
    x = inp.draft_tokens.tolist()
    gamma, vocab = len(x), len(p[0])
    w = [1.0]
    for i in range(gamma):
        w.append(min(1.0, w[i] * p[i][x[i]] / q[i][x[i]]) if q[i][x[i]] > 0 else float(p[i][x[i]] > 0 and w[i] > 0))
    h = []
    for j in range(1, gamma + 1):
        if j == gamma:
            h.append(w[gamma])
            continue
        m = sum(max(0.0, w[j] * p[j][v] - q[j][v]) for v in range(vocab))
        h.append(m / (m + 1 - w[j]) if m + 1 - w[j] > 0 else 0.0)
    u = torch.rand(gamma, generator=inp.generator, dtype=F64).tolist()
    tau = max([j for j in range(1, gamma + 1) if u[j - 1] < h[j - 1]], default=0)
    if tau == gamma:
        row = p[gamma]
    else:
        excess = [max(0.0, w[tau] * p[tau][v] - q[tau][v]) for v in range(vocab)]
        row = excess if sum(excess) > 0 else p[tau]
    return tau, int(torch.multinomial(torch.tensor(row, dtype=F64), 1, generator=inp.generator))


@st.composite
def close_inputs(draw):
    """Inputs where the draft is near the target, so that several stop probabilities are strictly
    between 0 and 1 at once, and the first rows sometimes identical (p = q: the 0/0 case)."""
    gamma, vocab = draw(st.integers(1, 6)), draw(st.integers(2, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    noise, same = draw(st.sampled_from([0.1, 0.5, 1.5])), draw(st.integers(0, gamma))
    params = SamplingParams(draw(st.sampled_from([0.7, 1.0, 1.5])))
    target_logits = 2 * torch.randn(gamma + 1, vocab, generator=gen, dtype=F64)  # [gamma+1, V]
    draft_logits = target_logits[:gamma] + noise * torch.randn(gamma, vocab, generator=gen, dtype=F64)  # [gamma, V]
    draft_logits[:same] = target_logits[:same]
    q_draft = logits_to_probs(draft_logits, params)
    draft_tokens = torch.multinomial(q_draft, 1, generator=gen).squeeze(-1)
    return VerifyInput(draft_tokens, q_draft, target_logits, logits_to_probs(target_logits, params), params,
                       torch.Generator(), draft_logits)


@settings(max_examples=200)
@given(inp=close_inputs(), coin=st.integers(0, 2**31))
def test_decide_is_the_papers_algorithm(inp, coin):
    inp.generator = torch.Generator().manual_seed(coin)
    got = decided(BlockVerification()(inp))
    inp.generator = torch.Generator().manual_seed(coin)
    # A stop probability within round-off of its uniform could flip; drawn uniforms are 53-bit,
    # so the chance of a draw within 1e-15 of h is ~1e-15 per position.
    assert got == from_the_definition(inp)


def test_the_zero_over_zero_case_never_stops():
    """p_1 = q_1 after a fully accepted d_1 (w_1 = 1, m_1 = 0): a later position stops for sure,
    so tau is never 1 (whatever value the 0/0 stop probability is given)."""
    p_rows = torch.tensor([[0.2, 0.8], [0.3, 0.7], [0.5, 0.5]], dtype=F64)
    q_rows = torch.tensor([[0.2, 0.8], [0.3, 0.7]], dtype=F64)
    outcomes = block_outcomes(p_rows, q_rows, (1, 0))
    assert float(outcomes[1][0]) == 0.0 and float(outcomes[2][0]) == pytest.approx(1.0)
    inp = verify_input([1, 0], torch.log(p_rows), q_draft=q_rows, p_target=p_rows)
    assert BlockVerification()(inp).num_accepted == 2
