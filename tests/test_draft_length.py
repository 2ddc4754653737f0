"""Adaptive draft length (minispec.chain.draft_length) and the model drafter's confidence cut-off (p_min):
the schedules' rules on hand-built steps, their wiring into the loop, and that neither changes
what greedy speculative decoding emits."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec.chain import draft_length
from minispec.chain.draft_length import DraftLength, Fixed, Heuristic
from minispec.lab.draft_length import Fallback, Priced, best_length, expected_tokens
from minispec.chain.drafters import ModelDrafter, NgramDrafter, confidence, make_drafter
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams
from minispec.chain.speculative import generate_chain as generate
from minispec.testing import loop_setups, model_configs, random_model, seeds, tiny_config

DRAFT_KINDS = ["same", "random", "ngram", "early-exit", "self:bf16"]


def build_draft(kind, target, seed, p_min=0.0):
    """A drafter of each kind (as in test_speculative.py), with the cut-off where it applies."""
    if kind == "ngram":
        return make_drafter("ngram:2", target)
    spec = {"same": target, "random": random_model(target.config, seed + 1),
            "early-exit": "early-exit:1" if target.config.num_layers > 1 else target}.get(kind, kind)
    return make_drafter(spec, target, p_min=p_min)



def one_line(err):
    assert "\n" not in str(err.value)
    return str(err.value)


# ----------------------------------------------------------------------------- the schedules


def lengths(schedule: DraftLength, steps: list[tuple[int, int]]) -> list[int]:
    """next() before each (num_drafted, num_accepted) step, and after the last."""
    schedule.reset()
    out = []
    for drafted, accepted in steps:
        out.append(schedule.next())
        schedule.update(drafted, accepted)
    return out + [schedule.next()]


def test_fixed_drafts_gamma_whatever_happens():
    assert lengths(Fixed(4), [(4, 0), (4, 4), (0, 0), (2, 1)]) == [4] * 5


def test_heuristic_grows_by_two_on_full_acceptance_and_shrinks_by_one_otherwise():
    # starts at gamma; capped there; -1 per step with a rejection
    assert lengths(Heuristic(5), [(5, 5), (5, 2), (4, 4), (5, 0), (4, 3), (3, 3)]) == [5, 5, 4, 5, 4, 3, 5]
    # from a given start: +2 twice hits the cap of 8
    assert lengths(Heuristic(8, start=2), [(2, 2), (4, 4), (6, 6), (8, 8)]) == [2, 4, 6, 8, 8]


def test_heuristic_never_drops_below_one():
    assert lengths(Heuristic(3), [(3, 0), (2, 0), (1, 0), (1, 0)]) == [3, 2, 1, 1, 1]
    assert lengths(Heuristic(3), [(3, 1), (2, 1), (1, 0), (1, 1)]) == [3, 2, 1, 1, 3]


def test_heuristic_counts_what_was_drafted_not_what_was_asked():
    # asked for 6, a cut-off (or the tokens left) gave 2, both accepted: every draft was, so +2
    assert lengths(Heuristic(8, start=6), [(2, 2)]) == [6, 8]
    # nothing drafted (an n-gram miss, a cut before the first token): no evidence, no change
    assert lengths(Heuristic(8, start=6), [(0, 0), (0, 0)]) == [6, 6, 6]


def test_heuristic_starts_afresh_every_generation():
    schedule = Heuristic(6, start=3)
    assert lengths(schedule, [(3, 0), (2, 0)]) == [3, 2, 1]
    assert lengths(schedule, []) == [3]  # lengths() calls reset() first, as the loop does


def test_fallback_turns_off_below_the_break_even_probes_and_turns_back_on():
    schedule = Fallback(4, break_even=2.0, window=2, probe=3)
    # two steps of 0 accepted (1 token each): mean 1 < 2, off; 0, 0, then the third step probes
    assert lengths(schedule, [(4, 0), (4, 0), (0, 0), (0, 0), (4, 4)]) == [4, 4, 0, 0, 4, 4]
    # the probe's 5 tokens lift the window mean to (1 + 5) / 2 = 3 >= 2: back on


def test_fallback_never_turns_off_while_speculation_pays_and_waits_for_a_full_window():
    schedule = Fallback(4, break_even=2.0, window=3, probe=5)
    assert lengths(schedule, [(4, 1)] * 10) == [4] * 11  # 2 tokens per step: at the break-even, on
    assert lengths(schedule, [(4, 0), (4, 0), (4, 4)]) == [4, 4, 4, 4]  # mean (1+1+5)/3 >= 2 at the full window
    assert lengths(schedule, [(4, 0)] * 3 + [(0, 0)] * 4) == [4, 4, 4] + [0] * 4 + [4]


@given(break_even=st.floats(1.0, 6.0), window=st.integers(1, 5), probe=st.integers(1, 6),
       steps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=40))
def test_fallback_answers_gamma_or_zero_and_probes_within_probe_steps(break_even, window, probe, steps):
    """Whatever it hears (a drafter may propose fewer than asked), it asks for gamma or 0, and never
    for 0 more than probe - 1 times in a row."""
    schedule = Fallback(5, break_even, window=window, probe=probe)
    schedule.reset()
    run = 0
    for proposed, accepted in steps:
        asked = schedule.next()
        assert asked in (0, 5)
        run = run + 1 if asked == 0 else 0
        assert run <= probe - 1
        drafted = min(proposed, asked)
        schedule.update(drafted, min(accepted, drafted))


def test_fallback_is_per_request_and_resets():
    schedule = Fallback(3, break_even=3.0, window=1, probe=10)
    assert lengths(schedule, [(3, 0)]) == [3, 0]
    assert lengths(schedule, []) == [3]  # a new generation starts on


@given(g=st.integers(0, 30), alpha=st.floats(0.0, 1.0))
def test_expected_tokens_is_the_geometric_sum(g, alpha):
    """E(g) = sum_{i=0..g} alpha^i: the bonus or correction token, plus draft i kept with chance alpha^i."""
    assert math.isclose(expected_tokens(g, alpha), sum(alpha ** i for i in range(g + 1)), rel_tol=1e-9, abs_tol=1e-12)


@given(costs=st.lists(st.one_of(st.floats(0.05, 20.0), st.sampled_from([1.0, 2.0, 3.0])), min_size=1, max_size=10),
       alpha=st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0])), lowest=st.integers(0, 9))
def test_best_length_maximises_expected_tokens_per_cost(costs, alpha, lowest):
    """Ties drawn on purpose (costs from a few values; alpha 0, where every E(g) is 1, and alpha 1,
    where E(g) = g + 1): the smallest of the best lengths wins."""
    lowest = min(lowest, len(costs) - 1)
    g = best_length(costs, alpha, lowest)
    rates = [expected_tokens(k, alpha) / costs[k] for k in range(len(costs))]
    assert lowest <= g < len(costs)
    assert rates[g] == max(rates[lowest:]) and all(r < rates[g] for r in rates[lowest:g])  # the smallest best


def test_best_length_drafts_all_when_drafts_are_free_and_none_when_they_never_land():
    assert best_length([1.0] * 7, 0.5) == 6  # a verify as cheap as a step, drafts for nothing: every token pays
    assert best_length([1.0, 1.1, 1.2, 1.3], 0.0) == 0  # nothing is ever accepted: any draft only costs
    assert best_length([1.0, 2.0, 3.0], 1.0) == 0 and best_length([1.0, 1.0], 0.0) == 0  # ties: the shortest
    steep = [1.0, 1.3, 1.7, 2.2, 2.8, 3.5]  # a verify that climbs with its rows (fp16 on AVX2, say)
    assert best_length(steep, 0.95) == 3 and best_length([1.0, 1.05, 1.1, 1.15, 1.2, 1.25], 0.95) == 5


def test_priced_estimates_alpha_from_trials_over_its_window():
    schedule = Priced(4, [1.0, 1.1, 1.2, 1.3, 1.4], start=0.5, prior=2.0, window=2)
    assert schedule.alpha == 0.5
    schedule.update(4, 4)  # 4 trials, 4 kept (no rejection to count)
    assert schedule.alpha == (4 + 1) / (4 + 2)
    schedule.update(4, 1)  # kept 1, then the rejection: 2 trials
    assert schedule.alpha == (5 + 1) / (6 + 2)
    schedule.update(3, 0)  # the window (2) drops the first step
    assert schedule.alpha == (1 + 0 + 1) / (2 + 1 + 2)
    schedule.update(0, 0)  # nothing drafted: no evidence
    assert schedule.alpha == (1 + 0 + 1) / (2 + 1 + 2)
    schedule.reset()
    assert schedule.alpha == 0.5 and schedule.recent == []


def test_priced_costs_are_in_plain_steps_and_checked():
    assert Priced(2, [2.0, 3.0, 4.0]).costs == [1.0, 1.5, 2.0]
    for costs, words in [([1.0, 1.1], "expected gamma + 1 = 3"), ([1.0, float("nan"), 1.0], "finite positive"),
                         ([1.0, 0.0, 1.0], "finite positive"), ([1.0, -1.0, 1.0], "finite positive"),
                         ([True, 1.0, 1.0], "finite positive"), ("1,2,3", "finite positive")]:
        with pytest.raises(MinispecError) as err:
            Priced(2, costs)
        assert words in one_line(err) and "auto draft length: costs" in str(err.value)
    for option, value in [("start", 1.5), ("start", float("nan")), ("prior", 0.0), ("window", 0), ("probe", 2.5),
                          ("window", True)]:
        with pytest.raises(MinispecError) as err:
            Priced(2, [1.0, 1.0, 1.0], **{option: value})
        assert f"auto draft length: {option} = " in one_line(err)
    with pytest.raises(MinispecError) as err:
        draft_length.get("auto", 5)
    assert "minispec.lab.draft_length" in one_line(err)


@given(costs=st.lists(st.floats(0.2, 10.0), min_size=2, max_size=7), start=st.floats(0.0, 1.0),
       probe=st.integers(1, 6), steps=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=40))
def test_priced_answers_the_best_length_at_its_alpha_and_probes_when_none_pays(costs, start, probe, steps):
    gamma = len(costs) - 1
    schedule = Priced(gamma, costs, start=start, probe=probe)
    off = 0  # steps in a row without a draft
    for drafted, accepted in steps:
        g = schedule.next()
        best = best_length(schedule.costs, schedule.alpha)
        probing = best == 0 and off + 1 >= probe  # no length pays, and a probe is due
        assert g == (best_length(schedule.costs, schedule.alpha, 1) if probing else best)
        drafted = min(drafted, g)
        schedule.update(drafted, min(accepted, drafted))
        off = off + 1 if drafted == 0 else 0
        assert 0.0 <= schedule.alpha <= 1.0


def test_get_builds_by_name_and_passes_objects_through():
    assert isinstance(draft_length.get("fixed", 5), Fixed) and draft_length.get("fixed", 5).next() == 5
    schedule = draft_length.get("heuristic", 8)
    assert isinstance(schedule, Heuristic) and (schedule.gamma, schedule.start) == (8, 8)
    mine = Heuristic(4, start=1)
    assert draft_length.get(mine, 5) is mine
    fallback = Fallback(6, 1.5)  # the lab's schedules plug in as objects
    assert draft_length.get(fallback, 6) is fallback


def test_get_and_schedule_errors_are_one_line():
    with pytest.raises(MinispecError) as err:
        draft_length.get("adaptive", 5)
    assert "draft_length='adaptive': unknown draft length schedule; expected fixed, heuristic" in one_line(err)
    with pytest.raises(MinispecError) as err:
        draft_length.get(Heuristic(8), 5)
    assert "draft_length=" in one_line(err) and "up to 8 tokens; expected at most gamma=5" in one_line(err)
    with pytest.raises(MinispecError) as err:
        Heuristic(4, start=5)
    assert "start = 5; expected an integer in 1..gamma=4" in one_line(err)
    for break_even, words in [(0.5, "break_even = 0.5; expected a number of tokens per step in 1..gamma+1=6"),
                              (float("nan"), "break_even = nan"), (7, "break_even = 7")]:
        with pytest.raises(MinispecError) as err:
            Fallback(5, break_even)
        assert words in one_line(err)
    for options, words in [(dict(window=0), "window = 0; expected an integer"), (dict(probe=2.5), "probe = 2.5"),
                           (dict(break_even=True), "break_even = True")]:
        with pytest.raises(MinispecError) as err:
            Fallback(5, **({"break_even": 2.0} | options))
        assert words in one_line(err)
    target = random_model(tiny_config(), 0)
    with pytest.raises(MinispecError) as err:
        generate(target, [1], max_new_tokens=3, draft="ngram", draft_length="nope")
    assert "draft_length='nope'" in one_line(err)


# ------------------------------------------------------------------------------- in the loop


class Recorded(Heuristic):
    """The heuristic, remembering what it answered and what it was told."""

    def reset(self):
        super().reset()
        self.asked, self.told = [], []

    def next(self):
        self.asked.append(super().next())
        return self.asked[-1]

    def update(self, num_drafted, num_accepted):
        self.told.append((num_drafted, num_accepted))
        super().update(num_drafted, num_accepted)


@given(setup=loop_setups(), gamma=st.integers(1, 6), kind=st.sampled_from(DRAFT_KINDS), n_new=st.integers(1, 20),
       schedule=st.sampled_from(["fixed", "heuristic", "fallback:1.0", "fallback:2.5", "fallback:7"]),
       p_min=st.sampled_from([0.0, 0.3, 0.7, 1.0]))
def test_adaptive_greedy_equals_plain_greedy(setup, gamma, kind, n_new, schedule, p_min):
    """Whatever the schedule and the cut-off, exact speculative greedy emits plain greedy's tokens."""
    cfg, seed, prompt = setup
    name = schedule.partition(":")[0]
    if name == "fallback":  # a break-even in 1..gamma+1
        schedule = Fallback(gamma, min(float(schedule.partition(':')[2]), gamma + 1))
    target = random_model(cfg, seed, scale=3.0)  # peaky distributions: long greedy agreements
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    drafter = build_draft(kind, target, seed, p_min=0.0 if kind == "ngram" else p_min)
    spec = generate(target, prompt, max_new_tokens=n_new, draft=drafter, policy="exact", gamma=gamma,
                    draft_length=schedule, eos_token_ids=[])
    assert spec.tokens == plain.tokens
    s = spec.stats
    assert s["draft_length"] == name and s["gamma"] == gamma
    assert 1 <= s["tau"] <= gamma + 1
    assert sum(s["accepted_length_histogram"]) + s["no_draft_steps"] == s["verify_steps"]


@settings(max_examples=15)
@given(setup=loop_setups(), gamma=st.integers(1, 6), kind=st.sampled_from(DRAFT_KINDS), n_new=st.integers(1, 20),
       start=st.integers(1, 6), p_min=st.sampled_from([0.0, 0.5]))
def test_the_loop_asks_the_schedule_and_reports_every_step(setup, gamma, kind, n_new, start, p_min):
    """Each step drafts at most what the schedule said (fewer only near max_new_tokens or when the
    drafter proposes fewer), and the schedule hears each step's drafted and accepted counts."""
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    schedule = Recorded(gamma, start=min(start, gamma))
    records = []
    out = generate(target, prompt, max_new_tokens=n_new, draft=build_draft(kind, target, seed, p_min=0.0 if kind == "ngram" else p_min),
                   gamma=gamma, draft_length=schedule, eos_token_ids=[], on_step=records.append)
    assert out.stats["draft_length"] == "heuristic"
    assert schedule.told == [(r.inp.gamma, r.decision.num_accepted) for r in records]
    assert len(schedule.asked) == len(records)
    produced = 1  # the prefill's token
    for asked, r in zip(schedule.asked, records):
        assert r.inp.gamma <= min(asked, n_new - produced - 1)
        if kind in ("same", "random", "early-exit", "self:bf16") and p_min == 0:
            assert r.inp.gamma == min(asked, n_new - produced - 1)  # a model drafter without a cut gives all
        produced += len(r.emitted)


def test_heuristic_grows_to_gamma_when_every_draft_is_accepted_and_shrinks_to_one_when_none_is():
    target = random_model(tiny_config(), 3, scale=3.0)
    records = []
    generate(target, [5, 6, 7], max_new_tokens=40, draft=target, gamma=6, draft_length=Heuristic(6, start=1),
             eos_token_ids=[], on_step=records.append)  # the target drafting for itself: always right
    assert [r.inp.gamma for r in records][:5] == [1, 3, 5, 6, 6]
    assert all(r.decision.num_accepted == r.inp.gamma for r in records)
    records = []
    out = generate(target, [5, 6, 7], max_new_tokens=40, draft=random_model(tiny_config(), 4), gamma=6,
                   draft_length="heuristic", eos_token_ids=[], on_step=records.append)
    steps = [(r.inp.gamma, r.decision.num_accepted) for r in records]  # a draft that rarely agrees
    assert steps[:6] == [(6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0)]  # -1 per rejection, down to 1
    assert steps[6:8] == [(1, 1), (3, 0)]  # +2 after the one accepted draft
    assert out.stats["num_drafted"] < 2 * len(records)  # fixed gamma 6 would have drafted ~6 per step


def test_fallback_decodes_plainly_when_the_draft_never_agrees_and_never_when_it_always_does():
    target = random_model(tiny_config(), 3, scale=3.0)
    records = []
    generate(target, [5, 6, 7], max_new_tokens=40, draft=random_model(tiny_config(), 4), gamma=4,
             draft_length=Fallback(4, 2.0, window=2, probe=5), eos_token_ids=[], on_step=records.append)
    drafted = [r.inp.gamma for r in records]
    assert drafted[:2] == [4, 4] and drafted.count(0) >= len(drafted) // 2  # off after two failed steps
    records = []
    generate(target, [5, 6, 7], max_new_tokens=40, draft=target, gamma=4, draft_length=Fallback(4, 4.5),
             eos_token_ids=[], on_step=records.append)  # the target drafting for itself: 5 tokens a step
    assert all(r.inp.gamma == min(4, 40 - 1 - 5 * i - 1) for i, r in enumerate(records))  # never off


@settings(max_examples=25)
@given(setup=loop_setups(), kind=st.sampled_from(DRAFT_KINDS), n_new=st.integers(1, 20),
       costs=st.lists(st.floats(0.2, 4.0), min_size=2, max_size=7), start=st.floats(0.0, 1.0))
def test_priced_greedy_equals_plain_greedy(setup, kind, n_new, costs, start):
    """Whatever the prices, the auto schedule only chooses how many to draft: exact greedy is plain greedy."""
    cfg, seed, prompt = setup
    gamma = len(costs) - 1
    target = random_model(cfg, seed, scale=3.0)
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    records = []
    spec = generate(target, prompt, max_new_tokens=n_new, draft=build_draft(kind, target, seed), policy="exact",
                    gamma=gamma, draft_length=Priced(gamma, costs, start=start), eos_token_ids=[],
                    on_step=records.append)
    assert spec.tokens == plain.tokens and spec.stats["draft_length"] == "auto"
    assert all(0 <= r.inp.gamma <= gamma for r in records)


@pytest.mark.parametrize("schedule", ["fixed", "heuristic", "fallback:2", "auto"])
def test_same_seed_same_tokens_with_a_schedule_object_reused(schedule):
    target = random_model(tiny_config(), 0)
    drafter = ModelDrafter(random_model(tiny_config(), 1), p_min=0.2)
    shared = Priced(5, [1.0, 1.2, 1.5, 1.9, 2.4, 3.0]) if schedule == "auto" else Fallback(5, 2.0) \
        if schedule == "fallback:2" else draft_length.get(schedule, 5)
    runs = [generate(target, [1, 2, 3], max_new_tokens=20, draft=drafter, policy="sampling", temperature=1.0,
                     seed=s, draft_length=shared, eos_token_ids=[]).tokens for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


# --------------------------------------------------------------------------------- the cut-off


@settings(max_examples=20)
@given(cfg=model_configs(), seed=seeds, gamma=st.integers(1, 6), p_min=st.floats(0.0, 1.0),
       context=st.lists(st.integers(0, 5), min_size=1, max_size=10), temperature=st.sampled_from([0.0, 1.0]))
def test_p_min_ends_the_draft_at_the_first_doubted_token(cfg, seed, gamma, p_min, context, temperature):
    """With p_min, the draft is the draft without it cut before the first position whose top
    probability (softmax of the draft's logits) is below p_min; the tokens before are the same."""
    model = random_model(cfg, seed)
    params = SamplingParams(temperature)
    drafts = []
    for cut in (0.0, p_min):
        drafter = ModelDrafter(model, p_min=cut)
        drafter.start(64)
        drafts.append(drafter.propose(context, gamma, params, torch.Generator().manual_seed(seed)))
    full, cut = drafts
    doubted = [confidence(row) < p_min for row in full.logits]
    expected = doubted.index(True) if p_min > 0 and any(doubted) else gamma
    assert cut.tokens == full.tokens[:expected]
    assert cut.q_draft.shape == (expected, cfg.vocab_size) and cut.logits.shape == (expected, cfg.vocab_size)


@pytest.mark.parametrize("kind", ["random", "early-exit", "self:bf16"])
def test_p_min_one_drafts_nothing_and_decodes_plain_greedy(kind):
    """No draft is sure to the last bit: with p_min = 1 every step is a plain decode step."""
    target = random_model(tiny_config(num_layers=2), 3)
    plain = generate(target, [5, 6, 7], max_new_tokens=12, eos_token_ids=[])
    out = generate(target, [5, 6, 7], max_new_tokens=12, draft=build_draft(kind, target, 3, p_min=1.0), gamma=4,
                   eos_token_ids=[])
    assert out.tokens == plain.tokens
    s = out.stats
    assert s["num_drafted"] == 0 and s["no_draft_steps"] == s["verify_steps"] == 11 and s["tau"] == 1.0


def test_p_min_saves_draft_forwards_where_the_draft_doubts():
    target = random_model(tiny_config(), 3, scale=3.0)
    runs = {p: generate(target, [5, 6, 7], max_new_tokens=30, draft=ModelDrafter(random_model(tiny_config(), 4), p_min=p),
                        gamma=6, eos_token_ids=[]) for p in (0.0, 0.6)}
    assert runs[0.6].tokens == runs[0.0].tokens
    assert runs[0.6].stats["num_drafted"] < runs[0.0].stats["num_drafted"]
    assert runs[0.6].stats["draft_forwards"] < runs[0.0].stats["draft_forwards"]


def test_p_min_errors_are_one_line():
    target = random_model(tiny_config(), 0)
    for spec in ("ngram", "ngram:2", NgramDrafter(2)):
        with pytest.raises(MinispecError) as err:
            make_drafter(spec, target, p_min=0.5)
        assert "p_min=0.5: the n-gram drafter has no probabilities to cut on" in one_line(err)
    assert isinstance(make_drafter("ngram", target, p_min=0.0), NgramDrafter)
    for bad in (1.5, -0.1, math.nan):
        with pytest.raises(MinispecError) as err:
            make_drafter("early-exit:1", random_model(tiny_config(num_layers=2), 0), p_min=bad)
        assert "p_min=" in one_line(err) and "expected a number in [0, 1]" in one_line(err)
    with pytest.raises(MinispecError) as err:
        make_drafter(ModelDrafter(target), target, p_min=0.5)
    assert "drafter's own constructor" in one_line(err)
    assert make_drafter(target, target, p_min=0.5).p_min == 0.5
