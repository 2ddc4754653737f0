"""DropMatch (minispec/acceptance/dropmatch/rule.py) and LazyDropMatch (dropmatch_lazy.py).

Hand-built tables pin Algorithm 1's rules on the plain class; float64 properties pin its
invariants (p = 0 is exact match, naive contains majority, or_base never accepts less than the
base) and that LazyDropMatch decides exactly as DropMatch, step after step, on random inputs and
on the real checkpoint's hidden states. Then each of the lazy class's shortcuts against its
definition, and both classes through the real loop with minispec.testing.check_policy.

Exactness by construction: a BLAS may sum a row's dot product in an order that depends on how
many rows share the call, so the same path row scored in DropMatch's one big head call and in
LazyDropMatch's smaller ones can differ in the last bits. The comparisons use SharedHead, which
scores each distinct row once and hands both classes those logits; it also proves that the lazy
class scores only rows DropMatch scored (the same masks).
"""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

import pytest
import torch

from minispec.chain.stats import info_counts
from hypothesis import given, settings
from hypothesis import strategies as st

from minispec.acceptance import (DropMatch, ExactMatch, LazyDropMatch, PolicyInputError, SpeculativeSampling,
                                 VerifyInput)
from minispec.acceptance.dropmatch.rule import js_divergence, vote_acceptances
from minispec.acceptance.dropmatch.lazy import LN2, draft_votes, js_acceptance
from minispec.acceptance.sampling import sample_acceptances
from minispec.chain.drafters import NgramDrafter
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams, greedy_token, logits_to_probs
from minispec.testing import check_policy, decided, verify_input


def mask_seed(seed: int) -> int:
    """The mask generator's seed as the rule's docstring writes it (not read from the code): another
    stream than the verify generator's, which is seeded with `seed` itself."""
    return (seed + 0x9E3779B97F4A7C15) % 2**64


F64 = torch.float64
GREEDY = SamplingParams(temperature=0.0)
CLASSES = (DropMatch, LazyDropMatch)


# ============================================================================== helpers


class SharedHead:
    """An LM head [n, d] -> [n, V] that records its calls and scores each distinct row once: a row
    seen before gets the logits computed then (see the module docstring). new_rows counts the
    rows scored for the first time."""

    def __init__(self, head) -> None:
        self.head, self.calls, self.new_rows, self._memo = head, [], 0, {}

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        self.calls.append(rows)
        keys = [row.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() for row in rows]  # any dtype
        new = list(dict.fromkeys(k for k in keys if k not in self._memo))
        if new:
            index = {k: i for i, k in enumerate(keys)}
            logits = self.head(rows[[index[k] for k in new]])  # [len(new), V]
            self._memo.update(zip(new, logits))
            self.new_rows += len(new)
        return torch.stack([self._memo[k] for k in keys])  # [n, V]


def linear_head(weight: torch.Tensor) -> SharedHead:
    return SharedHead(lambda h: h @ weight.T)


@dataclass
class Step:
    """One verify step: hidden [gamma+1, d] (the LM-head input), the drafts, and the verify seed."""

    hidden: torch.Tensor
    draft_tokens: torch.Tensor  # [gamma]
    draft_logits: torch.Tensor | None  # [gamma, V]; None: an n-gram draft, one-hot q
    seed: int


def loop_input(step: Step, head, params: SamplingParams) -> VerifyInput:
    """The VerifyInput minispec.chain.speculative builds: the verify rows through the head, the
    head's input and the head itself."""
    hidden = step.hidden
    target_logits = head(hidden)  # [gamma+1, V]
    if step.draft_logits is None:
        q_draft = torch.nn.functional.one_hot(step.draft_tokens, target_logits.shape[1]).to(target_logits.dtype)
    else:
        q_draft = logits_to_probs(step.draft_logits, params)  # [gamma, V]
    return VerifyInput(step.draft_tokens, q_draft, target_logits, logits_to_probs(target_logits, params), params,
                       torch.Generator().manual_seed(step.seed), step.draft_logits, hidden=hidden, head=head)


def table_input(draft, target_logits, path_logits, params=GREEDY, **kwargs) -> VerifyInput:
    """A table-style input whose LM head returns path_logits [K, gamma+1, V] for DropMatch's path call."""
    num_paths, num_rows, vocab = path_logits.shape

    def head(rows: torch.Tensor) -> torch.Tensor:
        assert rows.shape[0] == num_paths * num_rows, "DropMatch scores all K(gamma+1) path rows in one call"
        return path_logits.reshape(-1, vocab)

    return verify_input(draft, target_logits, params, hidden=torch.ones(num_rows, 4, dtype=F64), head=head, **kwargs)


def committed_info(decision) -> dict:
    """The decision's info as the loop counts it when every accepted draft is committed."""
    return info_counts(decision.info, decision.num_accepted)


def outcome(decision) -> tuple[int, int, int]:
    return decision.num_accepted, decision.next_token, committed_info(decision)["accepted_by_dropmatch_only"]


# ============================================================================== hand-built cases


def test_js_radius_accepts_a_draft_without_a_majority():
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
    inp = table_input([1], target_logits, path_logits, draft_logits=[[0., 0.5, 0.]])
    assert decided(DropMatch(paths=3, criterion="majority")(inp)) == (0, 0)  # base and majority: no
    decision = DropMatch(paths=3)(inp)
    assert decided(decision) == (1, 2)  # accepted by JS; the bonus from the clean target
    assert committed_info(decision) == {"accepted_by_dropmatch_only": 1, "heads_agree": 1, "positions": 2}


def test_majority_is_the_fallback_when_js_fails():
    # The heads agree tightly (radius 0.0007) on token 1; the n-gram draft's one-hot q is far from
    # their centroid (JS 0.17), so the JS test fails, but all three heads vote for d_1 = 1.
    path_logits = torch.tensor([
        [[0.0, 1.0, 0.], [0., 0., 5.]],
        [[0.0, 1.2, 0.], [0., 0., 5.]],
        [[0.1, 1.0, 0.], [0., 0., 5.]],
    ], dtype=F64)
    target_logits = [[1., 0.9, 0.], [0., 0., 5.]]  # clean argmax 0: the base rejects
    inp = table_input([1], target_logits, path_logits)
    assert decided(DropMatch(paths=3, criterion="js", or_base=False)(inp)) == (0, 0)
    assert decided(DropMatch(paths=3, criterion="majority", or_base=False)(inp)) == (1, 2)
    assert decided(DropMatch(paths=3, or_base=False)(inp)) == (1, 2)


def test_centroid_is_the_mean_of_logits_not_of_probabilities():
    # Two confident heads disagree (1 vs 2). The logit mean [0, -4, -4] backs token 0 (pbar(0) =
    # 0.96); the mean of their probabilities would be [0.12, 0.44, 0.44]. The draft's q equals the
    # logit-mean centroid, so the rule accepts (JS 0 <= radius 0.46); with a probability-mean
    # centroid it would reject (JS 0.43 > radius 0.19). No head votes for 0, and the base says 1.
    path_logits = torch.tensor([[[0., 2., -10.], [5., 0., 0.]],
                                [[0., -10., 2.], [5., 0., 0.]]], dtype=F64)  # [K=2, 2, V=3]
    head_probs = path_logits[:, 0].softmax(-1)  # [K, V]
    wrong_centroid = head_probs.mean(0)  # [V]
    q_row = path_logits[:, 0].mean(0).softmax(-1)  # [V]
    assert js_divergence(q_row, wrong_centroid) > js_divergence(head_probs, wrong_centroid).max()  # premise
    inp = table_input([0], [[0., 1., 0.], [5., 0., 0.]], path_logits, draft_logits=[[0., -4., -4.]])
    assert decided(DropMatch(paths=2)(inp)) == (1, 0)


def test_plurality_versus_strict_majority_and_a_tie_at_half():
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
    # K = 4, exactly K/2 = 2 votes for the draft: not a strict majority (> K/2), but a plurality (2 > 1)
    half = torch.tensor([[7], [7], [3], [4]])  # [K=4, 1]
    assert vote_acceptances(half, torch.tensor([7]), "strict").tolist() == [False]
    assert vote_acceptances(half, torch.tensor([7]), "plurality").tolist() == [True]


def test_k1_reduces_to_the_single_heads_argmax():
    # K = 1: the centroid is the one head, the radius is 0, the strict majority is that head's token.
    path_logits = torch.tensor([[[0., 2., 1.], [1., 3., 0.], [0., 0., 2.]]], dtype=F64)  # [K=1, 3, V]: y = 1, 1, 2
    target_logits = [[2., 0., 1.], [3., 1., 0.], [0., 4., 0.]]  # clean argmax 0, 0, 1
    policy = DropMatch(paths=1, or_base=False)
    # n-gram drafts (one-hot q: JS > 0 = radius): accepted iff the draft is the head's argmax
    assert decided(policy(table_input([1, 1], target_logits, path_logits))) == (2, 1)
    assert decided(policy(table_input([1, 0], target_logits, path_logits))) == (1, 0)
    # a draft whose q is exactly p_1 = softmax(l_1) is inside the zero radius, whatever its token
    inp = table_input([2, 0], target_logits, path_logits, draft_logits=path_logits[0, :2])
    assert decided(policy(inp)) == (2, 1)
    assert decided(DropMatch(paths=1, criterion="majority", or_base=False)(inp)) == (0, 0)


def test_js_alone_without_base_rejects_a_correct_one_hot_draft_at_p0():
    # The one exception to "p = 0 equals exact": the JS test looks at q, not at the token. A
    # one-hot q is never inside a radius of 0, even on the clean argmax.
    target_logits = torch.tensor([[0., 3., 0.], [5., 0., 0.]], dtype=F64)
    for cls in CLASSES:
        inp = verify_input([1], target_logits, hidden=torch.eye(2, dtype=F64), head=lambda h: h @ target_logits)
        assert decided(cls(p=0.0, paths=3, criterion="js", or_base=False)(inp)) == (0, 1)
    assert decided(ExactMatch()(verify_input([1], target_logits))) == (1, 0)


def test_without_base_a_rejection_only_dropmatch_made_draws_the_correction_from_p_target():
    # p = [0.6, 0.3, 0.1], q = [0.6, 0.4, 0]: the base accepts d_1 = 0 surely (p(0) / q(0) = 1), and its
    # residual norm(max(0, p - q)) is all on token 2. The heads all vote 1, so DropMatch rejects d_1;
    # the correction is drawn from p_target itself, so tokens 0 and 1 appear too.
    params = SamplingParams(temperature=1.0)
    path_logits = torch.tensor([[[0., 9., 0.], [0., 0., 0.]]] * 3, dtype=F64)  # [K=3, 2, V=3]
    target_logits = torch.tensor([[0.6, 0.3, 0.1], [1 / 3] * 3], dtype=F64).log()
    corrections = set()
    for seed in range(40):
        inp = table_input([0], target_logits, path_logits, params, q_draft=[[0.6, 0.4, 0.0]], seed=seed)
        decision = DropMatch(paths=3, criterion="majority", or_base=False)(inp)
        assert decision.num_accepted == 0 and committed_info(decision)["accepted_by_dropmatch_only"] == 0
        corrections.add(decision.next_token)
        assert DropMatch(paths=3, criterion="majority")(inp).num_accepted == 1  # with the base: accepted
    assert corrections == {0, 1, 2}  # from p_target; the residual would give only 2


@pytest.mark.parametrize("cls", CLASSES)
def test_missing_hidden_or_head_is_an_input_error_naming_the_fields(cls):
    inp = verify_input([1], [[0., 5., 0.], [5., 0., 0.]])
    with pytest.raises(PolicyInputError, match=r"hidden and \.head"):
        cls()(inp)
    inp.hidden = torch.ones(2, 4, dtype=F64)
    with pytest.raises(PolicyInputError, match=r"VerifyInput\.head is None"):
        cls()(inp)


@pytest.mark.parametrize("build, name", [
    (lambda: DropMatch(p=1.0), "p"), (lambda: DropMatch(p=-0.1), "p"), (lambda: DropMatch(paths=0), "paths"),
    (lambda: DropMatch(paths=True), "paths"), (lambda: DropMatch(criterion="any"), "criterion"),
    (lambda: DropMatch(majority="most"), "majority"), (lambda: DropMatch(js_temperature=0.0), "js_temperature"),
    (lambda: LazyDropMatch(paths=2.5), "paths"),
])
def test_bad_options_are_one_line_errors_naming_the_parameter(build, name):
    with pytest.raises(MinispecError) as err:
        build()
    assert f"{name} = " in str(err.value) and "\n" not in str(err.value)


# ============================================================================== masks and head calls


def test_dropmatch_scores_all_paths_in_one_head_call_with_inverted_dropout_rows():
    num_paths, hidden_size, vocab, p = 5, 2000, 7, 0.3
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, hidden_size, generator=gen, dtype=F64) + 3  # [gamma+1 = 3, d], no zeros
    head = linear_head(torch.randn(vocab, hidden_size, generator=gen, dtype=F64))
    policy = DropMatch(p=p, paths=num_paths)
    policy(loop_input(Step(hidden, torch.tensor([0, 1]), None, 0), head, GREEDY))
    assert len(head.calls) == 2  # the verify's own call, then ONE call for every path of every position
    ratio = head.calls[1].view(num_paths, 3, hidden_size) / hidden  # [K, gamma+1, d]: 0 (dropped) or 1/(1-p)
    dropped = ratio == 0
    # 1/(1-p) * h / h: float64 round-off of one multiply and one divide, well under 1e-12
    assert torch.allclose(ratio[~dropped], torch.full_like(ratio[~dropped], 1 / (1 - p)), rtol=1e-12, atol=0)
    assert abs(float(dropped.double().mean()) - p) < 0.02  # 30000 Bernoulli(0.3) draws: sd 0.0026


@pytest.mark.parametrize("cls", CLASSES)
def test_masks_are_fresh_per_path_position_and_step_and_reset_reseeds(cls):
    num_paths, hidden_size = 4, 64
    hidden = torch.ones(3, hidden_size, dtype=F64)  # each scored path row is then its mask / (1-p)
    weight = torch.randn(9, hidden_size, generator=torch.Generator().manual_seed(1), dtype=F64)
    step = Step(hidden, torch.tensor([0, 0]), None, 0)

    def masks(policy) -> torch.Tensor:
        """One step's masks [K, positions, d], read off the path rows the policy scored: DropMatch's
        path call (all gamma+1 positions), or the lazy class's first (position 0: without or_base
        every verdict needs its paths)."""
        head = linear_head(weight)
        policy(loop_input(step, head, GREEDY))
        return (head.calls[1] != 0).view(num_paths, -1, hidden_size)  # [K, positions, d]

    def build(seed: int):
        return cls(paths=num_paths, seed=seed, or_base=cls is not LazyDropMatch)

    policy = build(7)
    step1, step2 = masks(policy), masks(policy)
    positions = range(step1.shape[1])
    for k in range(num_paths):  # P(two masks of 64 entries are equal) = 0.58^64: any repeat is a bug
        for i in positions:
            assert not any(torch.equal(step1[k, i], step1[j, i]) for j in range(num_paths) if j != k)  # per path
            assert not any(torch.equal(step1[k, i], step1[k, j]) for j in positions if j != i)  # per position
            assert not torch.equal(step1[k, i], step2[k, i])  # per step
    assert torch.equal(masks(build(7)), step1)  # the same seed, the same masks
    assert not torch.equal(masks(build(8)), step1)
    policy.reset()
    assert torch.equal(masks(policy), step1)  # reset() starts the masks over


@settings(max_examples=20)
@given(cls=st.sampled_from(CLASSES), seeds=st.lists(st.integers(0, 2**63 - 1), min_size=2, max_size=2, unique=True))
def test_without_a_seed_of_its_own_the_masks_follow_the_runs_seed(cls, seeds):
    """The loop reseeds a policy with the run's seed (policy.reset(seed)): the same run seed gives
    the same masks, another run seed other masks (P(equal) = 0.58^(4 x 3 x 64): never by chance)."""
    num_paths, hidden_size = 4, 64
    hidden = torch.ones(3, hidden_size, dtype=F64)
    weight = torch.randn(9, hidden_size, generator=torch.Generator().manual_seed(1), dtype=F64)
    step = Step(hidden, torch.tensor([0, 0]), None, 0)
    policy = cls(paths=num_paths, or_base=False)  # every verdict needs the paths: the lazy class scores position 0

    def masks_after_reset(seed) -> torch.Tensor:
        policy.reset(seed)
        head = linear_head(weight)
        policy(loop_input(step, head, GREEDY))
        return head.calls[1]

    first = masks_after_reset(seeds[0])
    assert not torch.equal(masks_after_reset(seeds[1]), first)
    assert torch.equal(masks_after_reset(seeds[0]), first)


@given(cls=st.sampled_from(CLASSES), paths=st.integers(1, 8), rows=st.integers(1, 17), vocab=st.integers(2, 200_000),
       hidden=st.integers(1, 8192))
def test_the_size_check_refuses_whenever_the_path_logits_alone_do_not_fit(cls, paths, rows, vocab, hidden):
    """K paths x rows of float32 logits (K x rows x V x 4 bytes) are allocated at every verify step;
    with less memory free than that, drawing the step's masks refuses in one line naming the paths,
    before anything is drawn (the mask stream is where it was); with ten times what the policy holds
    at once (masks, dropped rows, logits, softmax), it draws."""
    from minispec.model import memory

    policy, fresh = cls(paths=paths, seed=1), cls(paths=paths, seed=1)
    logits_bytes = 4 * paths * rows * vocab
    held = 4 * paths * rows * (2 * hidden + 2 * vocab)
    with mock.patch.object(memory, "available_bytes", lambda device="cpu": logits_bytes - 1):
        with pytest.raises(MinispecError) as err:
            policy.draw_masks(torch.ones(rows, hidden), vocab)
    assert f"paths={paths}" in str(err.value) and "\n" not in str(err.value)
    with mock.patch.object(memory, "available_bytes", lambda device="cpu": 10 * held):
        masks = policy.draw_masks(torch.ones(rows, hidden), vocab)
    assert masks.shape == (paths, rows, hidden) and torch.equal(masks, fresh.draw_masks(torch.ones(rows, hidden), vocab))


@pytest.mark.parametrize("cls", CLASSES)
def test_same_seed_same_decisions_at_temperature_one(cls):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(6, 8, generator=gen, dtype=F64)
    params = SamplingParams(temperature=1.0)
    steps = []
    for seed in range(3):  # the mask generator advances per step; the verify seed is fixed per step
        draft_logits = torch.randn(4, 6, generator=gen, dtype=F64)
        draft = torch.multinomial(logits_to_probs(draft_logits, params), 1, generator=gen)[:, 0]
        steps.append(Step(torch.randn(5, 8, generator=gen, dtype=F64), draft, draft_logits, seed))

    def run(seed: int) -> list:
        policy, head, outcomes = cls(seed=seed), linear_head(weight), []
        for step in steps:
            decision = policy(loop_input(step, head, params))
            outcomes.append((decided(decision), info_counts(decision.info, decision.num_accepted)))
        return outcomes

    assert run(0) == run(0)  # a fresh policy with the same seed: the same masks, so the same decisions
    assert any(run(seed) != run(0) for seed in range(1, 6))  # and the masks do depend on the seed


# ============================================================================== properties (float64)


RUN_PARAMS = [GREEDY, SamplingParams(0.5), SamplingParams(1.0), SamplingParams(2.0, top_k=2)]
CRITERIA = ["js_or_majority", "js", "majority", "naive"]


@st.composite
def dropmatch_runs(draw, criterion=None, or_base=None, params=None):
    """DropMatch options and 1-3 consecutive verify
    steps through one random linear head. Integer hidden states and weights half the time (exact
    logit ties, so the lowest-id rule matters). Drafts are consistent with their q: an n-gram draft
    (one-hot, the target's argmax 60% of the time) or a model draft (the target's logits plus noise
    of a drawn size, 0 = the same model), its argmax at T = 0, a draw from q at T > 0."""
    vocab, hidden_size = draw(st.integers(2, 8)), draw(st.integers(1, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    integer = draw(st.booleans())
    weight = (torch.randint(-2, 3, (vocab, hidden_size), generator=gen).to(F64) if integer
              else 2 * torch.randn(vocab, hidden_size, generator=gen, dtype=F64))
    params = params or draw(st.sampled_from(RUN_PARAMS))
    noise = draw(st.sampled_from([None, 0.0, 0.5, 3.0]))  # None: an n-gram drafter
    steps = []
    for seed in range(draw(st.integers(1, 3))):
        gamma = draw(st.integers(0, 5))
        hidden = (torch.randint(-2, 3, (gamma + 1, hidden_size), generator=gen).to(F64) if integer
                  else torch.randn(gamma + 1, hidden_size, generator=gen, dtype=F64))  # [gamma+1, d]
        target_logits = hidden[:gamma] @ weight.T  # [gamma, V]
        if noise is None:
            use_argmax = torch.rand(gamma, generator=gen) < 0.6
            random_tokens = torch.randint(0, vocab, (gamma,), generator=gen)
            draft_tokens = torch.where(use_argmax, target_logits.argmax(-1), random_tokens)
            draft_logits = None
        else:
            draft_logits = target_logits + noise * torch.randn(gamma, vocab, generator=gen, dtype=F64)  # [gamma, V]
            if params.greedy or gamma == 0:
                draft_tokens = draft_logits.argmax(-1)
            else:
                draft_tokens = torch.multinomial(logits_to_probs(draft_logits, params), 1, generator=gen)[:, 0]
        steps.append(Step(hidden, draft_tokens, draft_logits, seed))
    options = dict(p=draw(st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.6])), paths=draw(st.integers(1, 5)),
                   criterion=criterion or draw(st.sampled_from(CRITERIA)),
                   majority=draw(st.sampled_from(["strict", "plurality"])),
                   or_base=draw(st.booleans()) if or_base is None else or_base,
                   seed=draw(st.integers(0, 100)), js_temperature=draw(st.sampled_from([1.0, 0.5])))
    return options, steps, weight, params


@given(run=dropmatch_runs())
def test_lazy_dropmatch_decides_exactly_as_dropmatch(run):
    assert_lazy_decides_as_eager(run)


def assert_lazy_decides_as_eager(run):
    options, steps, weight, params = run
    plain, lazy = DropMatch(**options), LazyDropMatch(**options)
    head = linear_head(weight)
    for step in steps:  # consecutive steps: both mask generators advance
        want = plain(loop_input(step, head, params))
        head.new_rows = 0
        got = lazy(loop_input(step, head, params))
        assert head.new_rows == 0, "LazyDropMatch scored a row DropMatch did not: not the same masks"
        assert outcome(got) == outcome(want)


@pytest.mark.parametrize("paths", [2, 4])
def test_lazy_dropmatch_strict_majority_at_exactly_half_the_paths(paths):
    """The vote's boundary, enumerated rather than drawn: integer heads and hidden states at p = 1/2
    make a draft with exactly K/2 votes common; strict majority rejects it in both classes. The
    vote alone decides (criterion majority, no base), so nothing else can accept such a position."""
    ties = 0
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        weight = torch.randint(-2, 3, (4, 3), generator=g).to(F64)  # [V, d]
        step = Step(torch.randint(-2, 3, (4, 3), generator=g).to(F64), torch.randint(0, 4, (3,), generator=g), None, 1)
        options = dict(p=0.5, paths=paths, criterion="majority", majority="strict", or_base=False, seed=seed)
        assert_lazy_decides_as_eager((options, [step], weight, GREEDY))
        # the votes as documented (masks from the documented mask seed, inverted dropout, lowest id on ties)
        masks = (torch.rand((paths, 4, 3), generator=torch.Generator().manual_seed(mask_seed(seed))) < 0.5).to(F64)
        path_tokens = greedy_token((step.hidden * masks / 0.5) @ weight.T)  # [K, gamma+1]
        votes = (path_tokens[:, :3] == step.draft_tokens).sum(0)  # [gamma]
        ties += int((2 * votes == paths).sum())
    assert ties >= 20, f"only {ties} positions with exactly K/2 votes: the boundary was not reached"


@given(run=dropmatch_runs())
def test_lazy_dropmatch_decides_exactly_as_dropmatch_with_a_bfloat16_head(run):
    """The --dtype bfloat16 slice: the head's weight and input in bfloat16, as the loop runs a bf16
    target (masks, path logits and the JS test then start from bf16 rows)."""
    options, steps, weight, params = run
    as_bf16 = [Step(s.hidden.to(torch.bfloat16), s.draft_tokens, s.draft_logits, s.seed) for s in steps]
    assert_lazy_decides_as_eager((options, as_bf16, weight.to(torch.bfloat16), params))


@pytest.mark.parametrize("criterion", CRITERIA)
@pytest.mark.parametrize("or_base", [True, False])
@pytest.mark.parametrize("params", RUN_PARAMS, ids=["T0", "T0.5", "T1", "T2-top2"])
def test_lazy_dropmatch_decides_exactly_as_dropmatch_in_every_cell(criterion, or_base, params):
    """The property above in every criterion x or_base x temperature cell, each drawn on its own (a
    cell the sampled test rarely reaches, such as the JS test alone at a temperature other than its
    own, is tested every run)."""
    @settings(max_examples=8)
    @given(run=dropmatch_runs(criterion=criterion, or_base=or_base, params=params))
    def cell(run):
        assert_lazy_decides_as_eager(run)

    cell()


@given(run=dropmatch_runs())
def test_lazy_dropmatch_computes_paths_only_where_a_verdict_is_needed(run):
    options, steps, weight, params = run
    plain, lazy = DropMatch(**options), LazyDropMatch(**options)
    num_paths, p = options["paths"], options["p"]
    for step in steps:
        plain_head, lazy_head = linear_head(weight), linear_head(weight)
        plain(loop_input(step, plain_head, params))
        inp = loop_input(step, lazy_head, params)
        decision = lazy(inp)
        # Needed: up to the first rejection, the positions the base does not accept (with or_base),
        # or all of them (without). The base's coins are the verify generator's first draws.
        gamma = step.draft_tokens.shape[0]
        if params.greedy:
            base_accepted = (step.draft_tokens == inp.target_logits[:gamma].argmax(-1)).tolist()
        else:
            base_accepted = sample_acceptances(inp.p_target, inp.q_draft, step.draft_tokens,
                                               torch.Generator().manual_seed(step.seed)).tolist()
        settled_by_base = [options["or_base"] and accepted for accepted in base_accepted]
        needed = [i for i in range(min(decision.num_accepted + 1, gamma)) if not settled_by_base[i]]
        assert decision.info["path_positions"] == len(needed)
        if p == 0:  # every path is the clean head: no rows beyond the verify's
            assert [len(c) for c in lazy_head.calls] == [gamma + 1] and decision.info["path_head_calls"] == 0
            continue
        plain_rows = plain_head.calls[1].view(num_paths, gamma + 1, -1)  # [K, gamma+1, d]: the step's path rows
        assert torch.equal(lazy_head.calls[0], step.hidden)  # the verify's own call, nothing added to it
        assert decision.info["path_head_calls"] == len(needed) == len(lazy_head.calls) - 1
        for call, i in zip(lazy_head.calls[1:], needed):  # one call of K rows per position, in order
            assert torch.equal(call, plain_rows[:, i])


@given(run=dropmatch_runs())
def test_p0_at_temperature_zero_equals_exact(run):
    options, steps, weight, _ = run
    if options["criterion"] == "js" and not options["or_base"]:
        options["criterion"] = "js_or_majority"  # the one exception, pinned in its own test above
    options["p"] = 0.0
    steps = [Step(s.hidden, s.draft_tokens if s.draft_logits is None else s.draft_logits.argmax(-1), s.draft_logits,
                  s.seed) for s in steps]  # a model drafter's tokens at T = 0: its argmax
    for policy in (DropMatch(**options), LazyDropMatch(**options)):
        for step in steps:
            head = linear_head(weight)
            inp = loop_input(step, head, GREEDY)
            decision = policy(inp)
            assert len(head.calls) == 1  # p = 0 scores no path rows: every path is the clean head
            assert decided(decision) == decided(ExactMatch()(inp))
            assert committed_info(decision)["accepted_by_dropmatch_only"] == 0
            if isinstance(policy, LazyDropMatch):
                assert decision.info["path_head_calls"] == 0
            else:
                assert decision.info["heads_agree"] == decision.info["positions"] == step.hidden.shape[0]


@given(run=dropmatch_runs(), p=st.sampled_from([0.1, 0.3, 0.6]))
def test_naive_accepts_at_least_what_majority_accepts(run, p):
    options, steps, weight, params = run
    options.update(p=p, or_base=False)
    del options["criterion"]
    step = steps[0]
    head = linear_head(weight)
    naive = DropMatch(criterion="naive", **options)
    num_naive = naive(loop_input(step, head, params)).num_accepted
    gamma, num_paths = step.draft_tokens.shape[0], options["paths"]
    path_logits = head(head.calls[1]).view(num_paths, gamma + 1, -1)  # [K, gamma+1, V]: the paths naive saw
    head_tokens = path_logits[:, :gamma].argmax(-1)  # [K, gamma]
    naive_votes = vote_acceptances(head_tokens, step.draft_tokens, "naive")
    strict_votes = vote_acceptances(head_tokens, step.draft_tokens, "strict")
    plurality_votes = vote_acceptances(head_tokens, step.draft_tokens, "plurality")
    assert bool((strict_votes <= plurality_votes).all())  # per position: strict within plurality within naive
    assert bool((plurality_votes <= naive_votes).all())
    for cls in CLASSES:  # same seed: the same masks
        majority = cls(criterion="majority", **options)
        assert num_naive >= majority(loop_input(step, head, params)).num_accepted


@given(run=dropmatch_runs())
def test_or_base_never_accepts_less_than_its_base(run):
    options, steps, weight, params = run
    options.update(or_base=True)
    base = ExactMatch() if params.greedy else SpeculativeSampling()
    for policy in (DropMatch(**options), LazyDropMatch(**options)):
        head = linear_head(weight)
        for step in steps:
            decision = policy(loop_input(step, head, params))
            base_decision = base(loop_input(step, head, params))  # same logits, a fresh verify generator
            assert decision.num_accepted >= base_decision.num_accepted
            if decision.num_accepted > base_decision.num_accepted:  # at least the base's first rejection is DropMatch's
                assert committed_info(decision)["accepted_by_dropmatch_only"] >= 1
            else:  # the base's draws, the base's token
                assert decided(decision) == decided(base_decision)


# ============================================================================== lazy shortcuts = definitions


def _js_test_by_definition(path_logits, centroid_logits, draft_probs, temperature) -> bool:
    """Algorithm 1's JS test as written: K JS divergences over the whole vocabulary."""
    centroid_probs = torch.softmax(centroid_logits / temperature, dim=-1)  # [V]
    radius = js_divergence(torch.softmax(path_logits / temperature, dim=-1), centroid_probs).amax()
    return bool(js_divergence(draft_probs, centroid_probs) <= radius)


@st.composite
def js_test_cases(draw):
    """Path logits [K, V] spread around a base by a drawn amount (0: the radius is 0), their
    centroid, and a draft: one-hot (n-gram), a soft q (model draft), q = pbar (JS 0), q near
    one path (accepted, and with a large spread close to the TV bound), or a one-hot draft where
    one head is exactly one-hot at the same token (an exact tie: JS(q || pbar) = JS(p_k || pbar)
    bitwise, so the non-strict test accepts)."""
    num_paths, vocab = draw(st.integers(1, 5)), draw(st.integers(2, 40))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    base = draw(st.sampled_from([0.5, 2.0, 8.0])) * torch.randn(1, vocab, generator=gen, dtype=F64)
    spread = draw(st.sampled_from([0.0, 0.01, 0.3, 3.0]))
    path_logits = base + spread * torch.randn(num_paths, vocab, generator=gen, dtype=F64)  # [K, V]
    centroid_logits = path_logits.mean(dim=0)  # [V]
    temperature = draw(st.sampled_from([0.5, 1.0, 2.0]))
    kind = draw(st.sampled_from(["one-hot", "soft", "centroid", "near a path", "tie with a one-hot head"]))
    if kind == "tie with a one-hot head":  # exp(-2000 / T) underflows to 0: head 0's softmax is exactly one-hot
        draft_token = draw(st.integers(0, vocab - 1))
        path_logits[0, draft_token] = path_logits[0].max() + 2000.0
        centroid_logits = path_logits.mean(dim=0)  # [V]
    if kind == "near a path":  # 0.9 p_k + 0.1 pbar: JS <= 0.9 JS(p_k || pbar) (convexity), so accepted with room
        path_probs = torch.softmax(path_logits[draw(st.integers(0, num_paths - 1))] / temperature, dim=-1)  # [V]
        draft_probs = 0.9 * path_probs + 0.1 * torch.softmax(centroid_logits / temperature, dim=-1)  # [V]
    elif kind in ("one-hot", "tie with a one-hot head"):
        draft_token = draw(st.integers(0, vocab - 1)) if kind == "one-hot" else draft_token
        draft_probs = torch.nn.functional.one_hot(torch.tensor(draft_token), vocab).to(F64)  # [V]
    else:
        noise = 0.0 if kind == "centroid" else draw(st.sampled_from([0.05, 1.0]))
        draft_probs = torch.softmax((centroid_logits + noise * torch.randn(vocab, generator=gen, dtype=F64))
                                    / temperature, dim=-1)  # [V]
    return path_logits, centroid_logits, draft_probs, temperature, kind


@given(case=js_test_cases())
def test_js_test_with_its_tv_bound_decides_as_the_definition(case):
    # float64: the bound's round-off (~1e-16) is far below RADIUS_BOUND_SLACK, so every decision
    # must be the definition's, exact ties included.
    path_logits, centroid_logits, draft_probs, temperature, kind = case
    expected = _js_test_by_definition(path_logits, centroid_logits, draft_probs, temperature)
    assert js_acceptance(path_logits, centroid_logits, draft_probs, temperature) == expected
    if kind == "tie with a one-hot head":
        assert expected


@given(case=js_test_cases())
def test_js_is_at_most_ln2_times_total_variation(case):
    # The inequality js_acceptance relies on, JS(a || b) <= ln 2 * TV(a, b), on random pairs
    # (float64; 1e-12 absorbs the sums' round-off).
    path_logits, _, draft_probs, temperature, _ = case
    a = torch.softmax(path_logits / temperature, dim=-1)  # [K, V]
    total_variation = 0.5 * (a - draft_probs).abs().sum(dim=-1)  # [K]
    assert bool((js_divergence(a, draft_probs) <= LN2 * total_variation + 1e-12).all())


def test_js_test_at_exact_ties_decides_as_the_definition():
    """Two kinds of exact ties, 200 random cases each, where a JS shortcut that rounds differently
    from js_divergence flips verdicts: (1) an n-gram's one-hot q and a head exactly one-hot at the
    same token (q = p_k bitwise: the non-strict test accepts, whatever pbar is); (2) K = 1, so the
    radius is exactly 0, and a nearly one-hot pbar (pbar[d] rounds to 1, the rest ~1e-20): JS(q ||
    pbar) is tiny but positive, so the definition rejects."""
    gen = torch.Generator().manual_seed(0)
    for case in range(200):
        num_paths, vocab = 1 + case % 5, 2 + case % 37
        temperature = (0.5, 1.0, 2.0)[case % 3]
        path_logits = 3.0 * torch.randn(num_paths, vocab, generator=gen, dtype=F64)  # [K, V]
        draft = int(torch.randint(vocab, (1,), generator=gen))
        path_logits[0, draft] = path_logits[0].max() + 2000.0  # head 0: exactly one-hot at the draft
        one_hot = torch.nn.functional.one_hot(torch.tensor(draft), vocab).to(F64)  # [V]
        assert js_acceptance(path_logits, path_logits.mean(dim=0), one_hot, temperature), f"case {case}"

        path_logits = 3.0 * torch.randn(1, vocab, generator=gen, dtype=F64)  # [K = 1, V]
        path_logits[0, draft] = path_logits[0].max() + temperature * (40.0 + case)  # exp(-40 - case) left elsewhere
        assert not js_acceptance(path_logits, path_logits[0], one_hot, temperature), f"case {case}"
        assert not _js_test_by_definition(path_logits, path_logits[0], one_hot, temperature)


@given(seed=st.integers(0, 2**31), num_paths=st.integers(1, 5), vocab=st.integers(2, 6))
def test_draft_votes_count_the_heads_whose_argmax_is_the_draft_lowest_id_on_ties(seed, num_paths, vocab):
    gen = torch.Generator().manual_seed(seed)
    path_logits = torch.randint(0, 3, (num_paths, vocab), generator=gen).to(F64)  # small integers: many ties
    for draft_token in range(vocab):
        expected = int((path_logits.argmax(-1) == draft_token).sum())  # torch.argmax: the lowest id on ties
        assert draft_votes(path_logits, draft_token) == expected


# ============================================================================== real checkpoint


REAL_TEXT = "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the log."


@pytest.fixture(scope="module")
def real_steps(real_model, real_tokenizer) -> list[Step]:
    """Nine verify steps along a prompt, on the real checkpoint (float32), three kinds in turn:
    n-gram drafts (one-hot q), the model's second-best token as the first draft (a plausible
    wrong draft, then the prompt's tokens), and a soft self-draft (the model's own logits along
    the prompt as draft_logits, their argmax as the drafts). hidden is what the verify pass of
    [last, d_1..d_g] computes, with the prompt so far in the KV cache."""
    prompt = real_tokenizer.encode(REAL_TEXT)
    start, drafter = len(prompt) // 2, NgramDrafter(max_ngram=3)
    steps = []
    with torch.no_grad():
        along = real_model(torch.tensor([prompt]))[0]  # [P, V]: row t scores the token after prompt[:t+1]
        cache = real_model.new_cache(1, len(prompt) + 8)
        real_model.forward_hidden(torch.tensor([prompt[:start - 1]]), cache)
        for j, t in enumerate(range(start, start + 9)):  # the context is prompt[:t]
            draft_logits = None
            if j % 3 == 0:
                drafts = drafter.lookup(prompt[:t], 4)
            elif j % 3 == 1:
                drafts = [int(along[t - 1].topk(2).indices[1])] + prompt[t + 1:t + 4]
            else:
                draft_logits = along[t - 1:t + 3]  # [4, V]
                drafts = draft_logits.argmax(-1).tolist()
            hidden = real_model.forward_hidden(torch.tensor([[prompt[t - 1]] + drafts]), cache)[0]  # [g+1, d]
            cache.truncate(t)  # keep prompt[:t]
            steps.append(Step(hidden, torch.tensor(drafts, dtype=torch.long), draft_logits, seed=j))
    return steps


@pytest.mark.parametrize("params, options", [
    (GREEDY, dict(criterion="js_or_majority", majority="strict", or_base=False)),
    (SamplingParams(temperature=1.0), dict(criterion="js", or_base=False)),
    (GREEDY, dict(criterion="majority", majority="plurality", or_base=True)),
])
def test_lazy_dropmatch_decides_exactly_as_dropmatch_on_the_real_checkpoint(real_model, real_steps, params, options):
    plain, lazy = DropMatch(**options), LazyDropMatch(**options)
    head = SharedHead(real_model.head)  # the real LM head, each row scored once (module docstring)
    outcomes = []
    with torch.no_grad():
        for step in real_steps:
            want = plain(loop_input(step, head, params))
            head.new_rows = 0
            got = lazy(loop_input(step, head, params))
            assert head.new_rows == 0, "LazyDropMatch scored a row DropMatch did not: not the same masks"
            assert outcome(got) == outcome(want)
            outcomes.append(outcome(want))
    assert any(n < len(step.draft_tokens) for (n, _, _), step in zip(outcomes, real_steps))  # some rejections
    assert sum(n for n, _, _ in outcomes) > 0  # and some acceptances


# ============================================================================== through the real loop


def test_dropmatch_and_lazy_dropmatch_at_p0_are_exact_match_through_the_loop():
    for cls in CLASSES:
        check_policy(cls, neutral={"p": 0.0}, base="exact")
