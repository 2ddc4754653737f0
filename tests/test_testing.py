"""minispec.testing used the way a user would: on our own policies and cache, on a policy
written here outside the package, and on broken variants that it must catch readably."""

import re

import pytest
import torch

from minispec.acceptance import (AcceptancePolicy, BlockVerification, Decision, ExactMatch, FLy, KLJudge, Lenience,
                                 MultiPathBlockVerification,
                                 SpeculativeSampling, StaticEnsemble, TraversalVerification, TypicalAcceptance)
from minispec.acceptance.base import first_rejection
from minispec.model.kv_cache import KVCache
from minispec.batch.ragged_cache import RaggedKVCache
from minispec.model.sampling import sample_token
from minispec.errors import MinispecError
from minispec.testing import CheckFailed, check_cache, check_policy, check_ragged_cache


# ------------------------------------------------------------------------------ our own code

def test_our_cache_passes():
    check_cache(KVCache)


def test_exact_passes():
    check_policy(ExactMatch, statistical=False)  # lossless at T=0 only: it is greedy decoding


def test_sampling_passes_every_check_including_the_statistical_ones():
    check_policy(SpeculativeSampling)


def test_block_verification_passes_every_check_including_the_statistical_ones():
    check_policy(BlockVerification)


def test_traversal_verification_passes_the_checks_of_a_lossless_policy():
    # On a chain its decide is block verification's (inherited), whose statistical checks run above;
    # the tree walk has its own exact and chi-square tests (tests/test_policy_traversal.py).
    check_policy(TraversalVerification, statistical=False)


def test_multipath_passes_the_checks_of_a_lossless_policy():
    # on a chain it is block verification, draw for draw (tests/test_policy_multipath.py), whose
    # statistical checks run above; its tree form is checked exactly in that file
    check_policy(MultiPathBlockVerification, statistical=False)


def test_lenience_is_sampling_at_its_neutral_beta_at_every_temperature():
    check_policy(Lenience, neutral={"beta": 1.0}, base="sampling", neutral_temperatures=(0.0, 1.0))


def test_fly_is_its_base_at_its_neutral_threshold_at_every_temperature():
    # the base is exact at T = 0 and sampling at T > 0, which at T = 0 emits exact's tokens
    # window 0 (the gate alone): the harness draws runs of any gamma, and a window must fit inside one
    check_policy(lambda **options: FLy(window_size=0, **options), neutral={"entropy_threshold": float("inf")},
                 base="sampling", neutral_temperatures=(0.0, 1.0))


def test_the_static_ensemble_is_sampling_at_weight_one_at_every_temperature():
    check_policy(StaticEnsemble, neutral={"weight": 1.0}, base="sampling", neutral_temperatures=(0.0, 1.0))


def test_the_kl_judge_is_its_base_at_threshold_zero_at_every_temperature():
    # the base is exact at T = 0 and sampling at T > 0, which at T = 0 emits exact's tokens
    check_policy(KLJudge, neutral={"threshold": 0.0}, base="sampling", neutral_temperatures=(0.0, 1.0))


def test_typical_passes_the_generic_checks():
    check_policy(TypicalAcceptance)


@pytest.mark.parametrize("kwargs, words", [
    (dict(neutral={"strength": 1.0}), ["check_policy: neutral = {'strength': 1.0}", "policy_factory(**neutral) failed", "'strength'"]),
    (dict(neutral=[("beta", 1.0)]), ["check_policy: neutral = [('beta', 1.0)]", "expected a dict"]),
    (dict(neutral={"beta": 1.0}, base="greedy"), ["check_policy: base = 'greedy'", "not a registered acceptance policy", "available()"]),
    (dict(neutral={"beta": 1.0}, neutral_temperatures=(1.0, -1.0)), ["neutral_temperatures", "temperature = -1.0"]),
    (dict(neutral={"beta": 1.0}, neutral_temperatures=()), ["neutral_temperatures = ()", "non-empty"]),
    (dict(base="sampling"), ["base = 'sampling'", "neutral="]),
    (dict(neutral_temperatures=(0.0, 1.0)), ["neutral_temperatures = (0.0, 1.0)", "neutral="]),
])
def test_a_mistake_in_the_neutral_arguments_is_a_usage_error_before_any_check(kwargs, words, capsys):
    """The caller's mistake in neutral=, base= or neutral_temperatures= is one MinispecError line
    before any check runs (not a CheckFailed that blames the policy), and base= or
    neutral_temperatures= without neutral= is refused rather than ignored."""
    with pytest.raises(MinispecError) as err:
        check_policy(Lenience, **kwargs)
    message = str(err.value)
    assert not isinstance(err.value, CheckFailed) and "\n" not in message
    assert all(word in message for word in words), message
    assert "check_policy(Lenience):" not in capsys.readouterr().err  # no check started


class NeedsAnOption(AcceptancePolicy):
    def __init__(self, strength):
        self.strength = strength

    def decide(self, inp):
        raise AssertionError("never reached: the factory cannot be called with no arguments")


@pytest.mark.parametrize("call, words", [
    (lambda: check_cache(42), ["check_cache(42): not callable (int)", "a cache class"]),
    (lambda: check_ragged_cache("RaggedKVCache"), ["check_ragged_cache('RaggedKVCache'): not callable (str)"]),
    (lambda: check_policy(NeedsAnOption), ["check_policy(NeedsAnOption): calling it with no arguments failed",
                                           "'strength'", "lambda: NeedsAnOption("]),
])
def test_a_factory_the_checks_cannot_call_is_one_line_before_any_check(call, words, capsys):
    with pytest.raises(MinispecError) as err:
        call()
    message = str(err.value)
    assert not isinstance(err.value, CheckFailed) and "\n" not in message
    assert all(word in message for word in words), message
    assert "FAILED" not in capsys.readouterr().err  # no check started


# ------------------------------------------------------------- a user's policy, right and wrong

class MySampling(AcceptancePolicy):
    """A user's own speculative sampling, written against the public interface only."""

    lossless = True
    name = "my-sampling"

    def residual(self, p, q):
        r = (p - q).clamp(min=0)
        return r / r.sum() if r.sum() > 0 else p

    def decide(self, inp):
        g = inp.gamma
        u = torch.rand(g, generator=inp.generator, dtype=torch.float64)
        x = inp.draft_tokens
        p_x = inp.p_target[torch.arange(g), x]
        q_x = inp.q_draft[torch.arange(g), x]
        n = first_rejection(u * q_x < p_x)  # u < p/q without dividing
        if n < g:
            return Decision(n, sample_token(self.residual(inp.p_target[n], inp.q_draft[n]), inp.generator))
        return Decision(n, sample_token(inp.p_target[g], inp.generator))


class MyBrokenSampling(MySampling):
    """The classic bug: on rejection, resample from p instead of the residual max(0, p - q)."""

    def residual(self, p, q):
        return p


def test_a_users_policy_passes():
    check_policy(MySampling)


def test_a_wrong_residual_is_reported_readably():
    with pytest.raises(CheckFailed) as err:
        check_policy(MyBrokenSampling)
    message = str(err.value)
    assert message.startswith("check_policy(MyBrokenSampling): one_step_lossless:")
    assert "not distributed as p_target" in message and "p-value" in message


def test_a_policy_right_only_at_temperature_1_is_reported():
    """When sampling, its target law read from softmax(target_logits), the temperature forgotten: at
    T = 1 that is p_target, so greedy and one position at T = 1 pass; the multi-step check, at
    T = 0.5 and 2, must not."""
    from dataclasses import replace

    class AtOne(MySampling):
        def decide(self, inp):
            if inp.params.greedy:
                return super().decide(inp)
            raw = torch.softmax(inp.target_logits.double(), dim=-1).to(inp.p_target.dtype)
            return super().decide(replace(inp, p_target=raw))

    with pytest.raises(CheckFailed) as err:
        check_policy(AtOne)
    assert str(err.value).startswith("check_policy(AtOne): multi_step_lossless: AtOne changes the distribution")


def test_a_policy_that_edits_its_inputs_in_place_is_reported():
    """The residual computed in place: its own decision is right, but p_target (which the loop and the
    stats read after the decision) is left as max(0, p - q)."""
    class InPlace(MySampling):
        def residual(self, p, q):
            p.sub_(q).clamp_(min=0)
            return p / p.sum() if p.sum() > 0 else p

    with pytest.raises(CheckFailed) as err:
        check_policy(InPlace, statistical=False)
    assert "decision_range" in str(err.value) and "changed in place" in str(err.value)


def test_a_validation_hole_is_reported():
    class NoChecks(MySampling):
        def __call__(self, inp):  # skips the base class's input check
            return self.decide(inp)

    with pytest.raises(CheckFailed) as err:
        check_policy(NoChecks, statistical=False)
    assert str(err.value).startswith("check_policy(NoChecks): validation: NoChecks crashed on q_draft with the wrong vocabulary")


class OffByOneCache(KVCache):
    """Rolls back one position too few: a rejected draft's keys stay visible."""

    def truncate(self, length):
        super().truncate(min(length + 1, self.length))


def test_a_broken_cache_is_reported():
    with pytest.raises(CheckFailed) as err:
        check_cache(OffByOneCache)
    assert str(err.value).startswith("check_cache(OffByOneCache): cache validity under appends and rollbacks:")


def test_check_ragged_cache_passes_the_ragged_cache():
    check_ragged_cache(RaggedKVCache, progress=False)


class FirstRowRollbackCache(RaggedKVCache):
    """Rolls every row back to the first row's length (capped at its own): one rollback for all."""

    def truncate(self, lengths):
        super().truncate([min(lengths[0], n) for n in self.lengths] if len(lengths) else lengths)


class SharedMaskCache(RaggedKVCache):
    """Masks by the longest row only: a shorter row sees its own pads and stale drafts."""

    def mask(self, num_new):
        span = max(self.lengths, default=0) + num_new
        causal = torch.arange(span)[None, :] <= (span - num_new + torch.arange(num_new))[:, None]  # [T, S]
        return causal.expand(self.batch_size, 1, num_new, span)


@pytest.mark.parametrize("broken", [FirstRowRollbackCache, SharedMaskCache])
def test_a_broken_ragged_cache_is_reported(broken):
    with pytest.raises(CheckFailed) as err:
        check_ragged_cache(broken, progress=False)
    assert str(err.value).startswith(f"check_ragged_cache({broken.__name__}): every row equals a single cache")


# Every registered rule runs the shared harness (check_policy: decision range, the info-counter
# rule, determinism, validation, its neutral setting, losslessness where claimed): the test that does.
HARNESSED = {
    "exact": "test_testing.py::test_exact_passes",
    "sampling": "test_testing.py::test_sampling_passes_every_check_including_the_statistical_ones",
    "block": "test_testing.py::test_block_verification_passes_every_check_including_the_statistical_ones",
    "traversal": "test_testing.py::test_traversal_verification_passes_the_checks_of_a_lossless_policy",
    "multipath": "test_testing.py::test_multipath_passes_the_checks_of_a_lossless_policy",
    "lenience": "test_testing.py::test_lenience_is_sampling_at_its_neutral_beta_at_every_temperature",
    "fly": "test_testing.py::test_fly_is_its_base_at_its_neutral_threshold_at_every_temperature",
    "ensemble": "test_testing.py::test_the_static_ensemble_is_sampling_at_weight_one_at_every_temperature",
    "kl-judge": "test_testing.py::test_the_kl_judge_is_its_base_at_threshold_zero_at_every_temperature",
    "typical": "test_testing.py::test_typical_passes_the_generic_checks",
    "dropmatch": "test_policy_dropmatch.py::test_dropmatch_and_lazy_dropmatch_at_p0_are_exact_match_through_the_loop",
    "dropmatch-lazy": "test_policy_dropmatch.py::test_dropmatch_and_lazy_dropmatch_at_p0_are_exact_match_through_the_loop",
}


def test_every_registered_rule_runs_the_shared_harness():
    """A rule added to the registry without a check_policy run fails here, so the info-counter rule
    and the rest of the harness reach every rule, present and future."""
    from pathlib import Path

    from minispec import acceptance

    assert set(acceptance.BUILT_IN) == set(HARNESSED), set(acceptance.BUILT_IN) ^ set(HARNESSED)  # tests register their own too
    for name, where in HARNESSED.items():
        file, test = where.split("::")
        source = (Path(__file__).parent / file).read_text()
        body = source.split(f"def {test}(", 1)[1].split("\ndef ", 1)[0]
        assert "check_policy(" in body, f"{name}: {where} does not run check_policy"


@pytest.mark.parametrize("info, words", [
    ({"accepted_extra": 2}, "counts positions as a number"),
    ({"deferred": [1, 0]}, "2 per-position flags; expected gamma = 3"),
    ({"judged": [0, 2, 0]}, "expected flags of 0 or 1"),
    ({"calls": -1}, "expected a count >= 0"),
])
def test_the_info_counter_rule_refuses_a_count_the_loop_cannot_cut(info, words):
    from minispec.testing.checks import check_info

    with pytest.raises(AssertionError, match=re.escape(words)):
        check_info(info, 3)
    check_info({"accepted_extra": [1, 0, 1], "calls": 4, "note": "x", "on": True}, 3)
