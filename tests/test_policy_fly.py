"""FLy (minispec/acceptance/fly.py), float64: its base (exact at T = 0, sampling at T > 0) draw
for draw at the neutral settings (an infinite threshold, or a window no draft can fill);
decide() equal to the rule written out with Python lists on random inputs with ties, over
windows, thresholds and top-k; the table cases that tell its parts apart; its options checked.
Through the real loop: check_policy with neutral entropy_threshold = inf, in test_testing.py."""

from __future__ import annotations

import math

import pytest
import torch

from minispec.chain.stats import info_counts
from hypothesis import given
from hypothesis import strategies as st

from minispec.acceptance import ExactMatch, FLy, SpeculativeSampling, get
from minispec.acceptance.sampling import correction_or_bonus
from minispec.errors import MinispecError
from minispec.testing import decided, seeds, verify_input
from test_policy_traversal import chains

windows, top_ks = st.integers(0, 6), st.integers(1, 8)
thresholds = st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0, math.inf]) | st.floats(0, 2)


def base_policy(inp):
    return ExactMatch() if inp.params.greedy else SpeculativeSampling()


@given(inp=chains(), seed=seeds, window=windows, top_k=top_ks)
def test_with_an_infinite_threshold_fly_is_its_base_draw_for_draw(inp, seed, window, top_k):
    inp.generator = torch.Generator().manual_seed(seed)
    want = base_policy(inp)(inp)
    want_state = inp.generator.get_state()
    inp.generator = torch.Generator().manual_seed(seed)
    assert decided(FLy(window, math.inf, top_k)(inp)) == decided(want)
    assert torch.equal(inp.generator.get_state(), want_state)


@given(inp=chains(), seed=seeds, threshold=thresholds, top_k=top_ks, extra=st.integers(0, 3))
def test_with_a_window_no_draft_can_fill_fly_is_its_base(inp, seed, threshold, top_k, extra):
    inp.generator = torch.Generator().manual_seed(seed)
    want = decided(base_policy(inp)(inp))
    inp.generator = torch.Generator().manual_seed(seed)
    assert decided(FLy(inp.gamma + extra, threshold, top_k)(inp)) == want


def from_the_definition(inp, window: int, threshold: float, top_k: int) -> tuple[int, int]:
    """FLy's rule position by position with Python lists (the module docstring's table)."""
    gamma, drafts = inp.gamma, inp.draft_tokens.tolist()
    greedy = inp.params.greedy
    if greedy:
        logits = inp.target_logits.tolist()
        base = [drafts[i] == logits[i].index(max(logits[i])) for i in range(gamma)]  # lowest id on ties
        criterion = torch.softmax(inp.target_logits, -1).tolist()
    else:
        coins = torch.rand(gamma, generator=inp.generator, dtype=torch.float64).tolist()
        base = []
        for i in range(gamma):
            p, q = float(inp.p_target[i, drafts[i]]), float(inp.q_draft[i, drafts[i]])
            base.append(coins[i] < (min(1.0, p / q) if q > 0 else float(p > 0)))
        criterion = inp.p_target.tolist()
    accepted = []
    for i in range(gamma):
        top = sorted(criterion[i], reverse=True)[:top_k]
        entropy = -sum(v * math.log(v) for v in top if v > 0)
        window_ok = i + window < gamma and all(base[i + 1:i + 1 + window])
        accepted.append(base[i] or (entropy >= threshold and criterion[i][drafts[i]] > 0 and window_ok))
    num_accepted = next((i for i, a in enumerate(accepted) if not a), gamma)
    if greedy:
        row = logits[num_accepted]
        return num_accepted, row.index(max(row))
    return num_accepted, correction_or_bonus(inp.p_target, inp.q_draft, num_accepted, inp.generator)  # the base's


@given(inp=chains(), seed=seeds, window=windows, threshold=thresholds, top_k=top_ks, at=st.none() | st.integers(0, 4),
       above=st.booleans())
def test_fly_equals_its_rule_written_out(inp, seed, window, threshold, top_k, at, above):
    """On every slice; with `at`, the threshold sits a hair above or below position at's own top-k
    entropy (the definition's c: p_target at T > 0, softmax of the logits at T = 0), so that the
    gate's verdict there turns on reading the right distribution."""
    if at is not None and at < inp.gamma:
        c = (torch.softmax(inp.target_logits, -1) if inp.params.greedy else inp.p_target)[at].tolist()
        entropy = -sum(v * math.log(v) for v in sorted(c, reverse=True)[:top_k] if v > 0)
        threshold = entropy * (1 + (1e-9 if above else -1e-9))
        if entropy < 1e-6:
            return  # a one-hot row: no threshold tells readings apart
    inp.generator = torch.Generator().manual_seed(seed)
    got = decided(FLy(window, threshold, top_k)(inp))
    inp.generator = torch.Generator().manual_seed(seed)
    assert got == from_the_definition(inp, window, threshold, top_k)


# Four drafts at T = 0; the target's row 0 is flat over three tokens (top-3 entropy ln 3 = 1.10)
# and prefers token 0; d_1 = 1 is a mismatch there. Rows 1-3 are peaked on the drafts 2, 2, 2.
FLAT, PEAKED = [1.0, 0.9, 0.9, -9.0], [-9.0, -9.0, 9.0, -9.0]


@pytest.mark.parametrize("draft, rows, window, threshold, want, top_k", [
    ([1, 2, 2, 2], [FLAT, PEAKED, PEAKED, PEAKED, PEAKED], 3, 0.3, (4, 2), 3),  # deferred: the next 3 agree
    ([1, 2, 2, 2], [FLAT, PEAKED, PEAKED, PEAKED, PEAKED], 4, 0.3, (0, 0), 3),  # the window does not fit
    ([1, 2, 0, 2], [FLAT, PEAKED, PEAKED, PEAKED, PEAKED], 3, 0.3, (0, 0), 3),  # a mismatch inside the window
    ([1, 2, 0, 2], [FLAT, PEAKED, PEAKED, PEAKED, PEAKED], 1, 0.3, (2, 2), 3),  # a window of 1 fits before it
    ([1, 2, 2, 2], [FLAT, PEAKED, PEAKED, PEAKED, PEAKED], 3, 1.2, (0, 0), 3),  # the threshold above ln 3
    ([1, 2, 2, 2], [PEAKED, PEAKED, PEAKED, PEAKED, PEAKED], 3, 0.3, (0, 2), 3),  # a confident target: no deferral
    ([3, 2, 2, 2], [FLAT, PEAKED, PEAKED, PEAKED, PEAKED], 0, 0.0, (4, 2), 3),  # W = 0: the gate alone
    # top-1 "entropy" -p ln p = 0.37 of the flat row's p = 0.36: over 0.3 (renormalised over the one, it is 0)
    ([1, 2, 2, 2], [FLAT, PEAKED, PEAKED, PEAKED, PEAKED], 0, 0.3, (4, 2), 1),
])
def test_table_cases_at_temperature_zero(draft, rows, window, threshold, want, top_k):
    assert decided(FLy(window, threshold, top_k)(verify_input(draft, rows))) == want


def test_a_token_the_target_gives_no_mass_is_never_deferred():
    rows = [[1.0, -math.inf, 0.9, 0.9], [-9.0, -9.0, 9.0, -9.0], [0.0, 0.0, 0.0, 0.0]]
    assert decided(FLy(1, 0.0)(verify_input([1, 2], rows))) == (0, 0)
    assert decided(FLy(1, 0.0)(verify_input([3, 2], rows))) == (2, 0)


def test_the_deferrals_are_counted_in_the_decision_info():
    rows = [FLAT, PEAKED, FLAT, PEAKED, PEAKED]
    decision = FLy(1, 0.3)(verify_input([1, 2, 1, 2], rows))
    assert decided(decision) == (4, 2) and info_counts(decision.info, decision.num_accepted) == {"deferred": 2}


@pytest.mark.parametrize("options, field", [
    ({"window_size": -1}, "window_size"), ({"window_size": 1.5}, "window_size"), ({"window_size": True}, "window_size"),
    ({"entropy_threshold": -0.1}, "entropy_threshold"), ({"entropy_threshold": math.nan}, "entropy_threshold"),
    ({"entropy_threshold": "0.3"}, "entropy_threshold"), ({"entropy_top_k": 0}, "entropy_top_k"),
    ({"entropy_top_k": 2.0}, "entropy_top_k"),
])
def test_a_bad_option_is_one_line_naming_it(options, field):
    with pytest.raises(MinispecError, match=f"fly {field}"):
        FLy(**options)
    with pytest.raises(MinispecError, match=f"fly {field}"):
        get("fly", **options)


@pytest.mark.parametrize("loop", ["chain", "batch"])  # FLy has no tree form
@pytest.mark.parametrize("window, gamma, max_new_tokens, refused", [
    (4, 4, 20, True), (3, 4, 20, False), (0, 1, 3, False), (2, 8, 4, True), (2, 8, 5, False)])
def test_a_window_no_step_can_hold_is_refused_before_the_first_step(loop, window, gamma, max_new_tokens, refused):
    """FLy defers a rejection only when the W drafts after it are in the same step: a run whose steps
    hold at most min(gamma, max_new_tokens - 2) drafts refuses W >= that, in
    one line naming the window, before anything runs; W = 0 (the gate alone) always runs."""
    from minispec.decode import generate
    from minispec.errors import MinispecError
    from minispec.testing import random_model, tiny_config

    target = random_model(tiny_config(), 0)
    calls = []
    prompt = [[1, 2], [3]] if loop == "batch" else [1, 2]
    options = dict(max_new_tokens=max_new_tokens, draft="ngram", gamma=gamma, temperature=1.0,
                   policy=FLy(window_size=window), on_tokens=lambda *a: calls.append(a))
    most = min(gamma, max_new_tokens - 2)
    if refused and window >= most:
        with pytest.raises(MinispecError, match=rf"^fly window_size = {window}: .* at most {most} "):
            generate(target, prompt, **options)
        assert calls == []
    else:
        generate(target, prompt, **options)
