"""Acceptance policies: hand-built tables, exactness properties, and losslessness.

Greedy cases are written as tables of target logits, one row per verified position (the last
row is the bonus position), in the style of vLLM's rejection-sampler tests. Exactness
properties run in float64. Every tolerance says why it is what it is.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import minispec.acceptance as acceptance
from minispec.acceptance import (AcceptancePolicy, Decision, DropMatch, ExactMatch, PolicyInputError,
                                 SpeculativeSampling, TypicalAcceptance, VerifyInput, check_input, first_rejection,
                                 register)
from minispec.acceptance.dropmatch import (LN2, DropoutPaths, draft_votes, js_acceptances, js_divergence, js_to_one_hot,
                                          vote_acceptances)
from minispec.acceptance.exact import greedy_acceptances
from minispec.acceptance.sampling import acceptance_probability, residual_distribution, sample_acceptances
from minispec.acceptance.typical import typical_acceptances
from minispec.errors import MinispecError
from minispec.sampling import SamplingParams, logits_to_probs, sample_token

GREEDY = SamplingParams(temperature=0.0)
F64 = torch.float64


def verify_input(draft, target_logits, params=GREEDY, *, q_draft=None, draft_logits=None, seed=0, head_extras=None,
                 p_target=None) -> VerifyInput:
    """A VerifyInput from plain lists. Without q_draft: the post-processed draft_logits if given,
    else a one-hot q on each draft token (an n-gram drafter)."""
    draft_tokens = torch.tensor(draft, dtype=torch.int64)  # [gamma]
    target_logits = torch.as_tensor(target_logits, dtype=F64)  # [gamma+1, V]
    vocab = target_logits.shape[1]
    if draft_logits is not None:
        draft_logits = torch.as_tensor(draft_logits, dtype=F64)  # [gamma, V]
    if q_draft is None:
        if draft_logits is not None:
            q_draft = logits_to_probs(draft_logits, params)
        else:
            q_draft = torch.nn.functional.one_hot(draft_tokens, vocab).to(F64)
    q_draft = torch.as_tensor(q_draft, dtype=F64).reshape(len(draft), vocab)  # [gamma, V]
    if p_target is None:
        p_target = logits_to_probs(target_logits, params)  # [gamma+1, V]
    return VerifyInput(draft_tokens, q_draft, target_logits, torch.as_tensor(p_target, dtype=F64), params,
                       torch.Generator().manual_seed(seed), draft_logits, head_extras)


def decided(decision: Decision) -> tuple[int, int]:
    return decision.num_accepted, decision.next_token


# ============================================================================== base


@register("test-accept-nothing")
class AcceptNothing(AcceptancePolicy):
    """A user policy, registered from outside the package: always rejects, emits token 0."""

    def decide(self, inp: VerifyInput) -> Decision:
        return Decision(0, 0)


class AcceptTooMuch(AcceptancePolicy):
    def decide(self, inp: VerifyInput) -> Decision:
        return Decision(inp.gamma + 1, 0)


def _good_input() -> VerifyInput:
    return verify_input([1, 2], [[0, 5, 0, 0], [0, 0, 5, 0], [5, 0, 0, 0]])


@pytest.mark.parametrize("field, bad, expected_name", [
    ("draft_tokens", torch.tensor([[1, 2]]), "draft_tokens"),  # [1, gamma], not [gamma]
    ("draft_tokens", torch.tensor([1, 2], dtype=torch.int32), "draft_tokens"),
    ("draft_tokens", torch.tensor([1, 4]), "draft_tokens"),  # id 4 with V = 4
    ("draft_tokens", torch.tensor([-1, 2]), "draft_tokens"),
    ("target_logits", torch.zeros(2, 4, dtype=F64), "target_logits"),  # gamma rows, not gamma+1
    ("p_target", torch.zeros(3, 5, dtype=F64), "p_target"),
    ("q_draft", torch.zeros(3, 4, dtype=F64), "q_draft"),
    ("draft_logits", torch.zeros(2, 3, dtype=F64), "draft_logits"),
])
def test_check_input_rejects_wrong_shapes_and_ids(field, bad, expected_name):
    inp = _good_input()
    check_input(inp)  # the unmodified input passes
    setattr(inp, field, bad)
    with pytest.raises(PolicyInputError, match=expected_name):
        check_input(inp)
    with pytest.raises(PolicyInputError):  # and a policy call checks before deciding
        ExactMatch()(inp)


def test_get_unknown_name_lists_the_known_names():
    with pytest.raises(MinispecError) as err:
        acceptance.get("greedy-ish")
    for name in ("exact", "sampling", "typical", "dropmatch"):
        assert name in str(err.value)
    assert "\n" not in str(err.value)


def test_get_builds_by_name_with_options():
    policy = acceptance.get("dropmatch", p=0.1, paths=3)
    assert isinstance(policy, DropMatch) and (policy.p, policy.paths) == (0.1, 3)
    assert acceptance.get(policy) is policy
    assert set(acceptance.available()) >= {"exact", "sampling", "typical", "dropmatch"}


def test_register_a_user_policy():
    policy = acceptance.get("test-accept-nothing")
    assert isinstance(policy, AcceptNothing) and policy.name == "test-accept-nothing"
    assert decided(policy(_good_input())) == (0, 0)
    with pytest.raises(ValueError, match="already registered"):
        register("exact")(AcceptNothing)


def test_call_rejects_a_num_accepted_out_of_range():
    with pytest.raises(PolicyInputError, match="num_accepted"):
        AcceptTooMuch()(_good_input())


def test_first_rejection_is_the_prefix_rule():
    assert first_rejection(torch.tensor([True, True, False, True])) == 2  # the last True is discarded
    assert first_rejection(torch.tensor([True, True])) == 2
    assert first_rejection(torch.tensor([], dtype=torch.bool)) == 0


@pytest.mark.parametrize("build, name", [
    (lambda: DropMatch(p=1.0), "dropout p = 1.0; expected 0 <= p < 1"),
    (lambda: DropMatch(p=-0.1), "dropout p"),
    (lambda: DropMatch(paths=0), "paths"),
    (lambda: DropMatch(criterion="vote"), "criterion"),
    (lambda: DropMatch(majority="most"), "majority"),
    (lambda: DropMatch(js_temperature=0.0), "js_temperature"),
    (lambda: TypicalAcceptance(eps=0.0), "eps"),
    (lambda: TypicalAcceptance(eps=1.5), "eps"),
    (lambda: TypicalAcceptance(delta=0.0), "delta"),
])
def test_bad_policy_options_are_one_line_errors_naming_the_parameter(build, name):
    with pytest.raises(MinispecError) as err:
        build()
    assert name in str(err.value) and "\n" not in str(err.value)


# ============================================================================== exact


def test_exact_all_accepted_takes_the_bonus_from_the_last_row():
    target_logits = [
        # 0  1  2  3
        [0, 9, 0, 0],  # argmax 1 = d_1
        [0, 0, 9, 0],  # argmax 2 = d_2
        [0, 0, 0, 9],  # argmax 3 = d_3
        [9, 0, 0, 0],  # bonus: 0
    ]
    assert decided(ExactMatch()(verify_input([1, 2, 3], target_logits))) == (3, 0)


def test_exact_first_rejection_emits_the_correction_and_discards_the_rest():
    target_logits = [
        [0, 9, 0, 0],  # argmax 1 = d_1: accepted
        [0, 0, 9, 0],  # argmax 2, d_2 = 0: rejected, correction 2
        [0, 0, 0, 9],  # argmax 3 = d_3, but after a rejection: discarded
        [9, 0, 0, 0],
    ]
    assert decided(ExactMatch()(verify_input([1, 0, 3], target_logits))) == (1, 2)


def test_exact_ties_go_to_the_lowest_id():
    target_logits = [
        [0, 7, 7, 0],  # tie between 1 and 2: argmax is 1, so d_1 = 2 is rejected
        [0, 0, 0, 0],
    ]
    assert decided(ExactMatch()(verify_input([2], target_logits))) == (0, 1)
    assert decided(ExactMatch()(verify_input([1], target_logits))) == (1, 0)  # all-tie bonus row: 0


def test_exact_gamma_zero_emits_just_the_bonus():
    assert decided(ExactMatch()(verify_input([], [[0, 0, 9, 0]]))) == (0, 2)


def test_exact_is_greedy_at_any_temperature():
    target_logits = [[0, 3, 2.5, 0], [1, 0, 0, 4]]
    hot = SamplingParams(temperature=1.5)
    for draft, expected in [([1], (1, 3)), ([2], (0, 1))]:
        assert decided(ExactMatch()(verify_input(draft, target_logits, hot))) == expected
        assert decided(ExactMatch()(verify_input(draft, target_logits))) == expected


# ============================================================================== strategies


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


# ============================================================================== sampling


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
    (The bonus branch, a draw from p_target[gamma], is checked through decide() below.)
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


def test_sampling_is_lossless_empirically_through_decide():
    """The real decide(): x ~ q, then the policy's first emitted token must be distributed as p_target[0],
    and the bonus (when x was accepted) as p_target[1]."""
    p_target = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]], dtype=F64)  # [gamma+1, V]
    q_draft = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=F64)  # [gamma, V]: far from p, so both branches matter
    num_draws, params = 20_000, SamplingParams(temperature=1.0)
    drafts = torch.multinomial(q_draft[0], num_draws, replacement=True, generator=torch.Generator().manual_seed(1))
    generator, policy = torch.Generator().manual_seed(2), SpeculativeSampling()
    first_counts, bonus_counts = torch.zeros(4), torch.zeros(4)
    for x in drafts.tolist():
        inp = VerifyInput(torch.tensor([x]), q_draft, p_target.log(), p_target, params, generator)
        decision = policy(inp)
        if decision.num_accepted == 1:
            first_counts[x] += 1
            bonus_counts[decision.next_token] += 1
        else:
            first_counts[decision.next_token] += 1
    _assert_distributed_as(first_counts, p_target[0])
    _assert_distributed_as(bonus_counts, p_target[1])
    with pytest.raises(AssertionError):  # the check has power: the draft alone is not distributed as p
        _assert_distributed_as(torch.bincount(drafts, minlength=4).float(), p_target[0])


def _assert_distributed_as(counts: torch.Tensor, probs: torch.Tensor) -> None:
    """Counts vs a distribution: a chi-square test at p-value 1e-4 (seeds are fixed, so this is
    deterministic; a correct sampler fails it with probability 1e-4 per seed choice), or, without
    scipy, every frequency within 4.5 binomial standard deviations."""
    total = float(counts.sum())
    try:
        from scipy.stats import chisquare
    except ImportError:
        sigma = (probs * (1 - probs) / total).sqrt()
        assert bool(((counts / total - probs).abs() <= 4.5 * sigma).all()), (counts / total, probs)
        return
    result = chisquare(counts.double().numpy(), (probs * total).numpy())
    assert result.pvalue > 1e-4, (counts / total, probs, result.pvalue)


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


# ============================================================================== typical


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


# ============================================================================== DropMatch: hand-built cases


def test_dropmatch_js_radius_accepts_a_draft_without_a_majority():
    # Three heads each back a different token: no majority for d_1 = 1 (one vote of three), but the
    # centroid (the logit mean, flat) is close to the draft's own flat q: JS(q || pbar) = 0.007 is
    # inside the radius max_k JS(p_k || pbar) = 0.109.
    path_logits = torch.tensor([
        # position 1     bonus position
        [[2., 0., 0.], [0., 0., 5.]],  # head 1: y = 0
        [[0., 2., 0.], [0., 0., 5.]],  # head 2: y = 1
        [[0., 0., 2.], [0., 0., 5.]],  # head 3: y = 2
    ], dtype=F64)  # [K=3, gamma+1=2, V=3]
    target_logits = [[1., 0., 0.], [0., 0., 5.]]  # clean argmax 0: exact rejects d_1 = 1
    inp = verify_input([1], target_logits, draft_logits=[[0., 0.5, 0.]], head_extras=path_logits)
    assert decided(DropMatch(paths=3, criterion="majority")(inp)) == (0, 0)  # base and majority: no
    decision = DropMatch(paths=3)(inp)
    assert decided(decision) == (1, 2)  # accepted by JS; bonus from the clean target
    assert decision.info == {"heads_all_agree": 0.5, "accepted_by_dropmatch_only": 1}


def test_dropmatch_majority_is_the_fallback_when_js_fails():
    # The heads agree tightly (radius 0.0007) on token 1; the n-gram draft's one-hot q is far from
    # their centroid (JS 0.17), so the JS test fails, but all three heads vote for d_1 = 1.
    path_logits = torch.tensor([
        [[0.0, 1.0, 0.], [0., 0., 5.]],
        [[0.0, 1.2, 0.], [0., 0., 5.]],
        [[0.1, 1.0, 0.], [0., 0., 5.]],
    ], dtype=F64)
    target_logits = [[1., 0.9, 0.], [0., 0., 5.]]  # clean argmax 0: the base rejects
    inp = verify_input([1], target_logits, head_extras=path_logits)
    assert decided(DropMatch(paths=3, criterion="js", or_base=False)(inp)) == (0, 0)
    assert decided(DropMatch(paths=3, criterion="majority", or_base=False)(inp)) == (1, 2)
    assert decided(DropMatch(paths=3, or_base=False)(inp)) == (1, 2)


def test_dropmatch_centroid_is_the_mean_of_logits_not_of_probabilities():
    # Two confident heads disagree (1 vs 2). The logit mean [0, -4, -4] backs token 0 (pbar(0) =
    # 0.96); the mean of their probabilities would be [0.12, 0.44, 0.44]. The draft's q equals the
    # logit-mean centroid, so the real rule accepts (JS 0 <= radius 0.46); with a probability-mean
    # centroid it would reject (JS 0.43 > radius 0.19). No head votes for 0, and the base says 1.
    path_logits = torch.tensor([[[0., 2., -10.], [5., 0., 0.]],
                                [[0., -10., 2.], [5., 0., 0.]]], dtype=F64)  # [K=2, 2, V=3]
    head_probs = path_logits[:, 0].softmax(-1)  # [K, V]
    wrong_centroid = head_probs.mean(0)  # [V]
    q_row = path_logits[:, 0].mean(0).softmax(-1)  # [V]
    assert js_divergence(q_row, wrong_centroid) > js_divergence(head_probs, wrong_centroid).max()  # premise
    inp = verify_input([0], [[0., 1., 0.], [5., 0., 0.]], draft_logits=[[0., -4., -4.]], head_extras=path_logits)
    assert decided(DropMatch(paths=2)(inp)) == (1, 0)


def test_dropmatch_plurality_versus_strict_majority():
    votes_by_position = torch.tensor([
        # head: 1  2  3  4  5      draft   strict (> 5/2)   plurality (unique mode)
        [1, 1, 3, 4, 5],  #         1       no (2 votes)     yes
        [2, 2, 2, 0, 3],  #         2       yes (3 votes)    yes
        [1, 1, 2, 2, 0],  #         1       no               no: a 2-2 tie
    ])  # [gamma=3, K=5]
    head_tokens, draft_tokens = votes_by_position.T, torch.tensor([1, 2, 1])  # [K, gamma], [gamma]
    assert vote_acceptances(head_tokens, draft_tokens, "strict").tolist() == [False, True, False]
    assert vote_acceptances(head_tokens, draft_tokens, "plurality").tolist() == [True, True, False]
    assert vote_acceptances(head_tokens, draft_tokens, "naive").tolist() == [True, True, True]


def test_dropmatch_needs_the_paths_from_head_logits():
    inp = verify_input([1], [[0., 5., 0.], [5., 0., 0.]])
    with pytest.raises(PolicyInputError, match="head_logits"):
        DropMatch()(inp)
    inp.head_extras = torch.zeros(4, 2, 3, dtype=F64)  # 4 paths, the policy has 5
    with pytest.raises(PolicyInputError, match="head_extras"):
        DropMatch()(inp)


def test_dropmatch_js_alone_without_base_rejects_a_correct_one_hot_draft_at_p0():
    # The one exception to "p = 0 equals exact": the JS test looks at q, not at the token. A
    # one-hot q is never inside a radius of 0, even on the clean argmax.
    target_logits = torch.tensor([[0., 3., 0.], [5., 0., 0.]], dtype=F64)
    policy = DropMatch(p=0.0, paths=3, criterion="js", or_base=False)
    _, path_logits = policy.head_logits(torch.eye(2, dtype=F64), lambda h: h @ target_logits)  # hidden = I, W = logits^T
    assert decided(policy(verify_input([1], target_logits, head_extras=path_logits))) == (0, 1)
    assert decided(ExactMatch()(verify_input([1], target_logits))) == (1, 0)


# ============================================================================== DropMatch: head_logits


class CountingHead:
    """A linear LM head W [V, d] that records every call."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight, self.inputs = weight, []

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        self.inputs.append(hidden)
        return hidden @ self.weight.T


def test_eager_head_logits_calls_the_head_once_with_inverted_dropout_rows():
    num_paths, num_positions, hidden_size, vocab, p = 5, 3, 2000, 7, 0.3
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(num_positions, hidden_size, generator=gen, dtype=F64) + 3  # no zeros
    head = CountingHead(torch.randn(vocab, hidden_size, generator=gen, dtype=F64))
    clean, paths = DropMatch(p=p, paths=num_paths, lazy=False).head_logits(hidden, head)
    assert len(head.inputs) == 1  # ONE head call for the clean row and all paths
    rows = head.inputs[0].view(num_paths + 1, num_positions, hidden_size)  # [K+1, gamma+1, d]
    assert torch.equal(rows[0], hidden)  # the clean rows come first, untouched
    ratio = rows[1:] / hidden  # [K, gamma+1, d]: each entry is 0 (dropped) or 1/(1-p) (kept, rescaled)
    dropped = ratio == 0
    # 1/(1-p) * h / h: float64 round-off of one multiply and one divide, well under 1e-12
    assert torch.allclose(ratio[~dropped], torch.full_like(ratio[~dropped], 1 / (1 - p)), rtol=1e-12, atol=0)
    # 30000 Bernoulli(0.3) draws: sd 0.0026, so 0.02 is ~7 sd
    assert abs(float(dropped.double().mean()) - p) < 0.02
    assert clean.shape == (num_positions, vocab) and paths.shape == (num_paths, num_positions, vocab)
    # float64, the same dot products in a different GEMM shape: agreement to ~1e-13 relative
    torch.testing.assert_close(clean, hidden @ head.weight.T, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(paths, rows[1:] @ head.weight.T, rtol=1e-12, atol=1e-10)


def test_lazy_head_logits_reads_the_clean_rows_then_one_position_per_call_with_the_eager_masks():
    num_paths, num_positions, hidden_size, vocab, p = 4, 5, 64, 7, 0.3
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(num_positions, hidden_size, generator=gen, dtype=F64)
    weight = torch.randn(vocab, hidden_size, generator=gen, dtype=F64)
    lazy_head, eager_head = CountingHead(weight), CountingHead(weight)
    clean, paths = DropMatch(p=p, paths=num_paths, seed=3, prefetch=0).head_logits(hidden, lazy_head)
    eager_clean, eager_paths = DropMatch(p=p, paths=num_paths, seed=3, lazy=False).head_logits(hidden, eager_head)
    assert len(lazy_head.inputs) == 1 and torch.equal(lazy_head.inputs[0], hidden)  # the clean rows only
    assert isinstance(paths, DropoutPaths) and paths.shape == (num_paths, num_positions, vocab) and paths.asked == []
    at2 = paths.at(2)  # [K, V]
    assert len(lazy_head.inputs) == 2 and lazy_head.inputs[1].shape == (num_paths, hidden_size)
    assert paths.asked == [2] and paths.head_calls == 1
    assert paths.at(2) is at2 and len(lazy_head.inputs) == 2  # computed once, then remembered
    # the same masks as the eager call (same seed, same draw order); float64, other GEMM shapes: ~1e-13
    torch.testing.assert_close(clean, eager_clean, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(paths.all(), eager_paths, rtol=1e-12, atol=1e-10)
    # prefetch=2: the first two drafted positions' paths ride along in the verify's head call
    prefetch_head = CountingHead(weight)
    clean2, paths2 = DropMatch(p=p, paths=num_paths, seed=3, prefetch=2).head_logits(hidden, prefetch_head)
    assert len(prefetch_head.inputs) == 1 and prefetch_head.inputs[0].shape == (num_positions + 2 * num_paths, hidden_size)
    torch.testing.assert_close(clean2, eager_clean, rtol=1e-12, atol=1e-10)
    for i in range(num_positions):
        torch.testing.assert_close(paths2.at(i), eager_paths[:, i], rtol=1e-12, atol=1e-10)
    assert paths2.head_calls == num_positions - 2  # only the positions not prefetched cost a call


def test_head_logits_masks_are_seeded_fresh_per_step_and_reset_reseeds():
    hidden = torch.ones(4, 16, dtype=F64)
    weight = torch.randn(9, 16, generator=torch.Generator().manual_seed(1), dtype=F64)
    head = CountingHead(weight)
    first, second = DropMatch(seed=7, lazy=False), DropMatch(seed=7, lazy=False)
    step1 = first.head_logits(hidden, head)[1]
    assert torch.equal(step1, second.head_logits(hidden, head)[1])  # same seed, same masks
    step2 = first.head_logits(hidden, head)[1]
    assert not torch.equal(step1, step2)  # fresh masks for the next step
    assert not torch.equal(step1[0], step1[1])  # and for each path
    assert not torch.equal(DropMatch(seed=8, lazy=False).head_logits(hidden, head)[1], step1)
    first.reset()
    assert torch.equal(first.head_logits(hidden, head)[1], step1)  # reset() starts the masks over


# ============================================================================== DropMatch: properties


@st.composite
def dropmatch_cases(draw, temperature_zero: bool = True):
    """A verify step through a random linear head: (policy options, VerifyInput without head_extras,
    hidden [gamma+1, d], head). Drafts are consistent with their q: an n-gram draft (one-hot q)
    or a model draft whose token is its argmax (T = 0) or a draw from q (T > 0)."""
    vocab, gamma, hidden_size = draw(st.integers(2, 8)), draw(st.integers(0, 4)), draw(st.integers(1, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if draw(st.booleans()):  # integer weights and hidden states: exact float64 logits, frequent ties
        hidden = torch.randint(-2, 3, (gamma + 1, hidden_size), generator=gen).to(F64)
        weight = torch.randint(-2, 3, (vocab, hidden_size), generator=gen).to(F64)
    else:
        hidden = torch.randn(gamma + 1, hidden_size, generator=gen, dtype=F64)
        weight = 2 * torch.randn(vocab, hidden_size, generator=gen, dtype=F64)
    target_logits = hidden @ weight.T  # [gamma+1, V]
    params = GREEDY if temperature_zero else SamplingParams(temperature=draw(st.sampled_from([0.5, 1.0, 2.0])),
                                                            top_k=draw(st.sampled_from([None, 2])))
    draft_logits = None
    if draw(st.booleans()):  # a model drafter: the target's logits plus noise of a drawn size (0 = the same model)
        noise = draw(st.sampled_from([0.0, 0.5, 3.0]))
        draft_logits = target_logits[:gamma] + noise * torch.randn(gamma, vocab, generator=gen, dtype=F64)
        q_draft = logits_to_probs(draft_logits, params)  # [gamma, V]
        if params.greedy:
            draft_tokens = draft_logits.argmax(-1)
        else:
            draft_tokens = torch.multinomial(q_draft, 1, generator=gen)[:, 0] if gamma else torch.zeros(0, dtype=torch.int64)
    else:  # an n-gram drafter: often the target's argmax, otherwise any token
        use_argmax = torch.rand(gamma, generator=gen) < 0.6
        draft_tokens = torch.where(use_argmax, target_logits[:gamma].argmax(-1), torch.randint(0, vocab, (gamma,), generator=gen))
        q_draft = torch.nn.functional.one_hot(draft_tokens, vocab).to(F64)
    inp = VerifyInput(draft_tokens, q_draft, target_logits, logits_to_probs(target_logits, params), params,
                      torch.Generator().manual_seed(draw(st.integers(0, 100))), draft_logits)
    options = dict(paths=draw(st.integers(1, 5)), criterion=draw(st.sampled_from(["js_or_majority", "js", "majority", "naive"])),
                   majority=draw(st.sampled_from(["strict", "plurality"])), or_base=draw(st.booleans()),
                   seed=draw(st.integers(0, 100)))
    return options, inp, hidden, CountingHead(weight)


def _with_paths(inp: VerifyInput, policy: DropMatch, hidden: torch.Tensor, head) -> VerifyInput:
    """The input as the loop would build it: clean logits and paths from the policy's head_logits,
    and a fresh copy of the verify generator (so several policies see the same random stream)."""
    clean, paths = policy.head_logits(hidden, head)
    generator = torch.Generator().manual_seed(inp.generator.initial_seed())
    return VerifyInput(inp.draft_tokens, inp.q_draft, clean, inp.p_target, inp.params, generator, inp.draft_logits, paths)


@given(case=dropmatch_cases())
def test_dropmatch_p0_at_temperature_zero_equals_exact(case):
    options, inp, hidden, head = case
    if options["criterion"] == "js" and not options["or_base"]:
        options["criterion"] = "js_or_majority"  # the one exception, pinned in its own test above
    policy = DropMatch(p=0.0, **options)
    inp = _with_paths(inp, policy, hidden, head)
    assert len(head.inputs) == 1  # p = 0 still reads the head once, and does no dropout work
    decision = policy(inp)
    assert decided(decision) == decided(ExactMatch()(inp))
    assert decision.info == {"heads_all_agree": 1.0, "accepted_by_dropmatch_only": 0}


@given(case=dropmatch_cases(), p=st.sampled_from([0.1, 0.3, 0.6]))
def test_dropmatch_naive_accepts_at_least_what_majority_accepts(case, p):
    options, inp, hidden, head = case
    options.update(or_base=False)
    inp = _with_paths(inp, DropMatch(p=p, lazy=False, **options), hidden, head)
    head_tokens = inp.head_extras[:, :inp.gamma].argmax(-1)  # [K, gamma]
    naive = vote_acceptances(head_tokens, inp.draft_tokens, "naive")
    for rule in ("strict", "plurality"):  # per position: naive ⊇ plurality ⊇ strict
        assert bool((vote_acceptances(head_tokens, inp.draft_tokens, rule) <= naive).all())
    assert bool((vote_acceptances(head_tokens, inp.draft_tokens, "strict")
                 <= vote_acceptances(head_tokens, inp.draft_tokens, "plurality")).all())
    options.pop("criterion")
    num_naive = DropMatch(p=p, criterion="naive", **options)(inp).num_accepted
    assert num_naive >= DropMatch(p=p, criterion="majority", **options)(inp).num_accepted


@given(case=st.one_of(dropmatch_cases(temperature_zero=True), dropmatch_cases(temperature_zero=False)),
       p=st.sampled_from([0.0, 0.3, 0.6]))
def test_dropmatch_or_base_never_accepts_less_than_its_base(case, p):
    options, inp, hidden, head = case
    options.update(or_base=True)
    policy = DropMatch(p=p, **options)
    inp_drop = _with_paths(inp, policy, hidden, head)
    inp_base = _with_paths(inp, DropMatch(p=0.0, paths=1), hidden, head)  # same clean logits, same verify seed
    base = ExactMatch() if inp.params.greedy else SpeculativeSampling()
    decision, base_decision = policy(inp_drop), base(inp_base)
    assert decision.num_accepted >= base_decision.num_accepted
    if decision.num_accepted > base_decision.num_accepted:  # at least the base's first rejection is DropMatch's
        assert decision.info["accepted_by_dropmatch_only"] >= 1
    if decision.num_accepted == base_decision.num_accepted:  # the base's draws, the base's token
        assert decision.next_token == base_decision.next_token


@given(case=st.one_of(dropmatch_cases(temperature_zero=True), dropmatch_cases(temperature_zero=False)),
       p=st.sampled_from([0.1, 0.3, 0.6]))
def test_lazy_dropmatch_decides_as_eager_and_computes_paths_only_where_a_verdict_is_needed(case, p):
    options, inp, hidden, head = case
    if torch.equal(hidden, hidden.round()):  # integer data: exact logit ties are common, and only an exact
        p = 0.5  # dropout scale (1/(1-p) = 2) keeps the head's sums equal in every GEMM shape, hence the argmaxes
    prefetch = options["seed"] % 3  # 0, 1 or 2 prefetched positions
    lazy_policy, eager_policy = DropMatch(p=p, prefetch=prefetch, **options), DropMatch(p=p, lazy=False, **options)
    lazy_inp, eager_inp = _with_paths(inp, lazy_policy, hidden, head), _with_paths(inp, eager_policy, hidden, head)
    lazy, eager = lazy_policy(lazy_inp), eager_policy(eager_inp)
    assert decided(lazy) == decided(eager)
    assert lazy.info["accepted_by_dropmatch_only"] == eager.info["accepted_by_dropmatch_only"]
    # Which positions needed a verdict: up to the first rejection, those the base's own per-position
    # verdict does not settle (with or_base), or all of them (without). The base's draws at T > 0
    # come from a fresh copy of the verify generator, as in the policy.
    if inp.params.greedy:
        base_accepted = greedy_acceptances(inp.draft_tokens, inp.target_logits).tolist()
    else:
        generator = torch.Generator().manual_seed(inp.generator.initial_seed())
        base_accepted = sample_acceptances(inp.p_target, inp.q_draft, inp.draft_tokens, generator).tolist()
    n = lazy.num_accepted
    needed = [i for i in range(min(n + 1, inp.gamma)) if not (options["or_base"] and base_accepted[i])]
    assert lazy_inp.head_extras.asked == needed
    assert lazy.info["path_positions"] == len(needed)
    assert lazy.info["path_head_calls"] == len([i for i in needed if i >= prefetch])


def test_dropmatch_k1_reduces_to_the_single_heads_argmax():
    # K = 1: the centroid is the one head, the radius is 0, the strict majority is that head's token.
    path_logits = torch.tensor([[[0., 2., 1.], [1., 3., 0.], [0., 0., 2.]]], dtype=F64)  # [K=1, gamma+1=3, V]: y = 1, 1, 2
    target_logits = [[2., 0., 1.], [3., 1., 0.], [0., 4., 0.]]  # clean argmax 0, 0, 1
    policy = DropMatch(paths=1, or_base=False)
    # n-gram drafts (one-hot q: JS > 0 = radius): accepted iff the draft is the head's argmax
    assert decided(policy(verify_input([1, 1], target_logits, head_extras=path_logits))) == (2, 1)
    assert decided(policy(verify_input([1, 0], target_logits, head_extras=path_logits))) == (1, 0)
    # a draft whose q is exactly p_1 = softmax(l_1) is inside the zero radius, whatever its token
    inp = verify_input([2, 0], target_logits, draft_logits=path_logits[0, :2], head_extras=path_logits)
    assert decided(policy(inp)) == (2, 1)
    assert decided(DropMatch(paths=1, criterion="majority", or_base=False)(inp)) == (0, 0)


def test_dropmatch_same_seed_same_decision_at_temperature_one():
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, 8, generator=gen, dtype=F64)
    head = CountingHead(torch.randn(6, 8, generator=gen, dtype=F64))
    params = SamplingParams(temperature=1.0)
    draft_logits = torch.randn(4, 6, generator=gen, dtype=F64)
    draft = torch.multinomial(logits_to_probs(draft_logits, params), 1, generator=gen)[:, 0].tolist()

    def run(seed: int) -> list:
        policy, outcomes = DropMatch(seed=seed), []
        for step in range(3):  # the mask generator advances per step; the verify seed is fixed per step
            clean, paths = policy.head_logits(hidden, head)
            inp = verify_input(draft, clean, params, draft_logits=draft_logits, seed=step, head_extras=paths)
            decision = policy(inp)
            outcomes.append((decided(decision), decision.info))
        return outcomes

    assert run(0) == run(0)


# ============================================================================== DropMatch: its shortcuts equal the definitions


def _js_test_by_definition(path_logits, centroid_logits, draft_probs, temperature):
    """Algorithm 1's JS test as written: K JS divergences over the whole vocabulary -> [n] bool."""
    centroid_probs = torch.softmax(centroid_logits / temperature, dim=-1)  # [n, V]
    radius = js_divergence(torch.softmax(path_logits / temperature, dim=-1), centroid_probs.unsqueeze(0)).amax(0)
    return js_divergence(draft_probs, centroid_probs) <= radius  # [n]


@st.composite
def js_test_cases(draw):
    """Path logits [K, n, V] spread around a base by a drawn amount (0: the radius is 0), their
    centroid, and a draft: one-hot (n-gram), a soft q (model draft), q = pbar (JS 0), or q near
    one path (accepted, and with a large spread close to the TV bound)."""
    num_paths, n, vocab = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(2, 40))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    base = draw(st.sampled_from([0.5, 2.0, 8.0])) * torch.randn(1, n, vocab, generator=gen, dtype=F64)
    spread = draw(st.sampled_from([0.0, 0.01, 0.3, 3.0]))
    path_logits = base + spread * torch.randn(num_paths, n, vocab, generator=gen, dtype=F64)  # [K, n, V]
    centroid_logits = path_logits.mean(dim=0)  # [n, V]
    temperature = draw(st.sampled_from([0.5, 1.0, 2.0]))
    kind = draw(st.sampled_from(["one-hot", "soft", "centroid", "near a path"]))
    if kind == "near a path":  # 0.9 p_k + 0.1 pbar: JS <= 0.9 JS(p_k || pbar) (convexity), so accepted with room
        path_probs = torch.softmax(path_logits[draw(st.integers(0, num_paths - 1))] / temperature, dim=-1)  # [n, V]
        draft_probs = 0.9 * path_probs + 0.1 * torch.softmax(centroid_logits / temperature, dim=-1)  # [n, V]
        draft_tokens = draft_probs.argmax(-1)
    elif kind == "one-hot":
        draft_tokens = torch.randint(0, vocab, (n,), generator=gen)
        draft_probs = torch.nn.functional.one_hot(draft_tokens, vocab).to(F64)  # [n, V]
    else:
        noise = 0.0 if kind == "centroid" else draw(st.sampled_from([0.05, 1.0]))
        draft_probs = torch.softmax((centroid_logits + noise * torch.randn(n, vocab, generator=gen, dtype=F64))
                                    / temperature, dim=-1)  # [n, V]
        draft_tokens = draft_probs.argmax(-1)
    return path_logits, centroid_logits, draft_probs, temperature, draft_tokens


@given(case=js_test_cases())
def test_js_test_with_its_tv_bound_and_one_hot_form_decides_as_the_definition(case):
    # float64: the shortcuts' round-off (~1e-16) is far below RADIUS_BOUND_SLACK, so every decision
    # must be the definition's.
    path_logits, centroid_logits, draft_probs, temperature, draft_tokens = case
    expected = _js_test_by_definition(path_logits, centroid_logits, draft_probs, temperature)
    assert torch.equal(js_acceptances(path_logits, centroid_logits, draft_probs, temperature, draft_tokens), expected)
    assert torch.equal(js_acceptances(path_logits, centroid_logits, draft_probs, temperature), expected)


@given(case=js_test_cases())
def test_js_is_at_most_ln2_times_total_variation(case):
    # The inequality js_acceptances relies on, JS(a || b) <= ln 2 * TV(a, b), on random pairs
    # (float64; 1e-12 absorbs the sums' round-off).
    path_logits, centroid_logits, draft_probs, temperature, _ = case
    a, b = torch.softmax(path_logits / temperature, dim=-1), draft_probs.unsqueeze(0)  # [K, n, V], [1, n, V]
    total_variation = 0.5 * (a - b).abs().sum(dim=-1)  # [K, n]
    assert bool((js_divergence(a, b) <= LN2 * total_variation + 1e-12).all())


@given(prob=st.floats(0.0, 1.0), vocab=st.integers(2, 6), seed=st.integers(0, 1000))
def test_js_to_a_one_hot_needs_only_the_probability_at_the_draft(prob, vocab, seed):
    # Any distribution b with b[d] = prob: the rest of b does not matter (float64, 1e-12: round-off).
    rest = torch.rand(vocab - 1, generator=torch.Generator().manual_seed(seed), dtype=F64)
    b = torch.cat([torch.tensor([prob], dtype=F64), (1 - prob) * rest / rest.sum()])  # [V], b[0] = prob
    one_hot = torch.nn.functional.one_hot(torch.tensor(0), vocab).to(F64)  # [V]
    assert math.isclose(float(js_to_one_hot(torch.tensor(prob, dtype=F64))), float(js_divergence(one_hot, b)),
                        abs_tol=1e-12)


@given(seed=st.integers(0, 2**31), num_paths=st.integers(1, 5), n=st.integers(1, 3), vocab=st.integers(2, 6))
def test_draft_votes_count_the_heads_whose_argmax_is_the_draft_lowest_id_on_ties(seed, num_paths, n, vocab):
    gen = torch.Generator().manual_seed(seed)
    path_logits = torch.randint(0, 3, (num_paths, n, vocab), generator=gen).to(F64)  # small integers: many ties
    draft_tokens = torch.randint(0, vocab, (n,), generator=gen)
    expected = (path_logits.argmax(-1) == draft_tokens).sum(dim=0)  # torch.argmax: the lowest id on ties
    assert torch.equal(draft_votes(path_logits, draft_tokens), expected)
