"""The KL judge (minispec/acceptance/kl_judge.py), float64: its base draw for draw at threshold 0 (exact
at T = 0, sampling at T > 0) and with the confidence mask at 0; never fewer accepted drafts than its
base on the same coins; decide() equal to the rule written out with Python floats on random inputs
with ties; an n-gram draft (no logits) never judged; its options checked. Through the real loop:
check_policy, in test_testing.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minispec.acceptance import ExactMatch, KLJudge, SpeculativeSampling, VerifyInput, get
from minispec.errors import MinispecError
from minispec.testing import decided, seeds
from test_policy_traversal import chains

thresholds = st.sampled_from([0.0, 0.05, 0.5, 2.0, math.inf]) | st.floats(0, 5)
confidences = st.sampled_from([0.0, 0.5, 0.9, 1.0]) | st.floats(0, 1)


def base_decision(inp: VerifyInput, seed: int):
    inp.generator = torch.Generator().manual_seed(seed)
    decision = (ExactMatch() if inp.params.greedy else SpeculativeSampling())(inp)
    return decided(decision), inp.generator.get_state()


@given(inp=chains(), seed=seeds, confidence=confidences)
def test_at_threshold_zero_the_judge_is_its_base_draw_for_draw(inp, seed, confidence):
    want, want_state = base_decision(inp, seed)
    inp.generator = torch.Generator().manual_seed(seed)
    assert decided(KLJudge(threshold=0.0, confidence=confidence)(inp)) == want
    assert torch.equal(inp.generator.get_state(), want_state)


@given(inp=chains(), seed=seeds, threshold=thresholds)
def test_with_the_confidence_mask_at_zero_the_judge_is_its_base(inp, seed, threshold):
    """max c <= 0 never holds for a distribution: the mask switches the judge off."""
    want, _ = base_decision(inp, seed)
    inp.generator = torch.Generator().manual_seed(seed)
    assert decided(KLJudge(threshold=threshold, confidence=0.0)(inp)) == want


@given(inp=chains(), seed=seeds, threshold=thresholds, confidence=confidences)
def test_the_judge_never_accepts_fewer_drafts_than_its_base_on_the_same_coins(inp, seed, threshold, confidence):
    (base_accepted, _), _ = base_decision(inp, seed)
    inp.generator = torch.Generator().manual_seed(seed)
    assert KLJudge(threshold=threshold, confidence=confidence)(inp).num_accepted >= base_accepted


def from_the_definition(inp, threshold: float, confidence: float) -> tuple[int, int]:
    """Python floats: c, e = softmax of the raw logits at T = 0, else p_target, q_draft; judged iff
    KL(c || e) < threshold and max c <= confidence and c(d) > 0; OR the base; the base's next token."""
    gamma = inp.gamma
    greedy = inp.params.greedy
    coins = [] if greedy else torch.rand(gamma, generator=inp.generator, dtype=torch.float64).tolist()
    num_accepted = gamma
    for i in range(gamma):
        d = int(inp.draft_tokens[i])
        if greedy:
            logits = inp.target_logits[i].tolist()
            base = d == logits.index(max(logits))
            c = torch.softmax(inp.target_logits[i], -1).tolist()
            e = torch.softmax(inp.draft_logits[i], -1).tolist()
        else:
            p, q = float(inp.p_target[i, d]), float(inp.q_draft[i, d])
            base = coins[i] < (min(1.0, p / q) if q > 0 else float(p > 0))
            c, e = inp.p_target[i].tolist(), inp.q_draft[i].tolist()
        kl = sum(a * (math.log(a) - math.log(b)) if b > 0 else math.inf for a, b in zip(c, e) if a > 0)
        judged = kl < threshold and max(c) <= confidence and c[d] > 0
        if not (base or judged):
            num_accepted = i
            break
    if greedy:
        logits = inp.target_logits[num_accepted].tolist()
        return num_accepted, logits.index(max(logits))
    if num_accepted == gamma:
        row = inp.p_target[gamma].tolist()
    else:
        excess = [max(0.0, float(a) - float(b)) for a, b in zip(inp.p_target[num_accepted], inp.q_draft[num_accepted])]
        row = [x / sum(excess) for x in excess] if sum(excess) > 0 else inp.p_target[num_accepted].tolist()
    return num_accepted, int(torch.multinomial(torch.tensor(row, dtype=torch.float64), 1, generator=inp.generator))


@given(inp=chains(), seed=seeds, threshold=thresholds, confidence=confidences)
def test_the_judge_equals_its_rule_written_out(inp, seed, threshold, confidence):
    """Thresholds near a KL value could part the two sums by one ulp; the strategies' KLs are
    continuous, so an exact tie has probability 0."""
    inp.generator = torch.Generator().manual_seed(seed)
    got = decided(KLJudge(threshold=threshold, confidence=confidence)(inp))
    inp.generator = torch.Generator().manual_seed(seed)
    assert got == from_the_definition(inp, threshold, confidence)


@given(inp=chains(), seed=seeds)
def test_a_draft_without_logits_is_never_judged(inp, seed):
    """An n-gram drafter's one-hot q: KL(c || one-hot) is infinite unless c is one-hot on the same token."""
    one_hot = torch.nn.functional.one_hot(inp.draft_tokens, inp.p_target.shape[1]).to(torch.float64)
    ngram = VerifyInput(inp.draft_tokens, one_hot, inp.target_logits, inp.p_target, inp.params, inp.generator, None)
    want, _ = base_decision(ngram, seed)
    ngram.generator = torch.Generator().manual_seed(seed)
    assert decided(KLJudge(threshold=1e9, confidence=0.999)(ngram)) == want


def test_a_close_draft_is_kept_where_the_target_is_unsure():
    """T = 0, target logits (1, 0.9, 0), draft logits (0.9, 1, 0): the argmaxes differ, KL = 0.0042 nats,
    the target's top probability 0.44: judged at threshold 0.01, not at 0.001, nor with confidence 0.4."""
    from minispec.model.sampling import SamplingParams
    from minispec.testing import verify_input
    inp = verify_input([1], [[1.0, 0.9, 0.0], [0.0, 0.0, 0.0]], SamplingParams(0.0), draft_logits=[[0.9, 1.0, 0.0]])
    assert KLJudge(threshold=0.01)(inp).num_accepted == 1
    assert KLJudge(threshold=0.001)(inp).num_accepted == 0
    assert KLJudge(threshold=0.01, confidence=0.4)(inp).num_accepted == 0


@pytest.mark.parametrize("option, value", [("threshold", -0.1), ("threshold", math.nan), ("threshold", "1"),
                                           ("confidence", 1.5), ("confidence", -0.1), ("confidence", math.nan)])
def test_a_bad_option_is_one_line_naming_it(option, value):
    with pytest.raises(MinispecError, match=f"kl-judge {option}"):
        KLJudge(**{option: value})
    with pytest.raises(MinispecError, match=f"kl-judge {option}"):
        get("kl-judge", **{option: value})


def test_a_token_the_target_rules_out_is_never_judged():
    """T = 1 with p(d) = 0 (what top-k or top-p leave): KL(p || q) is finite and small, the target unsure,
    yet d is not kept; the next token, drawn from max(0, p - q), is never d."""
    from minispec.model.sampling import SamplingParams
    p_target = torch.tensor([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    q_draft = torch.tensor([[0.02, 0.49, 0.49]], dtype=torch.float64)
    for seed in range(20):
        inp = VerifyInput(torch.tensor([0]), q_draft, p_target.log(), p_target, SamplingParams(1.0),
                          torch.Generator().manual_seed(seed), None)
        decision = KLJudge(threshold=1.0, confidence=1.0)(inp)
        assert decision.num_accepted == 0 and decision.next_token != 0
