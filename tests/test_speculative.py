"""The draft-then-verify loop (minispec.chain.speculative) on random tiny models.

Exactness properties run in float64 (see test_model.py for why); a bf16 self-draft is fine
there because a draft only changes what gets accepted, never what gets emitted. Each policy's
own properties are in test_policy_*.py, each drafter's in test_drafters.py.
"""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec import acceptance
from minispec.errors import CacheOverflowError, MinispecError
from minispec.chain.drafters import NgramDrafter, make_drafter
from minispec.chain.request import StepRecord
from minispec.chain.speculative import generate_chain as generate
from minispec.testing import loop_setups, random_model, tiny_config
from minispec.testing.cache_watch import watch_caches

DRAFT_KINDS = ["same", "random", "ngram", "early-exit", "self:bf16"]


def build_draft(kind, target, seed):
    if kind == "same":
        return target
    if kind == "random":  # a different model over the same vocabulary: rarely agrees
        return random_model(target.config, seed + 1)
    if kind == "ngram":
        return "ngram:2"
    if kind == "early-exit":
        return "early-exit:1" if target.config.num_layers > 1 else "ngram"
    return kind



@given(setup=loop_setups(), gamma=st.integers(1, 6), kind=st.sampled_from(DRAFT_KINDS), n_new=st.integers(1, 20))
def test_speculative_exact_equals_plain_greedy(setup, gamma, kind, n_new):
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)  # peaky distributions: long greedy agreements
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    spec = generate(target, prompt, max_new_tokens=n_new, draft=build_draft(kind, target, seed),
                    policy="exact", gamma=gamma, eos_token_ids=[])
    assert spec.tokens == plain.tokens
    s = spec.stats
    assert 1 <= s["tau"] <= gamma + 1
    assert sum(s["accepted_length_histogram"]) + s["no_draft_steps"] == s["verify_steps"]
    assert s["no_draft_steps"] == s["verify_steps"] - s["drafted_steps"]
    assert s["finish_reason"] == plain.finish_reason == "length"
    if kind == "same":  # the target drafting for itself is always right
        assert s["acceptance_rate"] == 1.0 or s["num_drafted"] == 0


@settings(max_examples=10)
@given(setup=loop_setups(), gamma=st.integers(1, 5), kind=st.sampled_from(["random", "ngram", "early-exit"]),
       policy=st.sampled_from(["exact", "sampling", "block", "typical", "dropmatch"]), temperature=st.sampled_from([0.0, 1.0]))
def test_both_caches_equal_recomputation_after_every_step(setup, gamma, kind, policy, temperature):
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    draft = build_draft(kind, target, seed)
    models = [target] + ([draft] if isinstance(draft, torch.nn.Module) else [])
    with watch_caches(models[0]) as target_shadows:
        if len(models) > 1:
            with watch_caches(models[1]):
                out = generate(target, prompt, max_new_tokens=15, draft=draft, policy=policy, gamma=gamma,
                               temperature=temperature, seed=seed, eos_token_ids=[])
        else:
            out = generate(target, prompt, max_new_tokens=15, draft=draft, policy=policy, gamma=gamma,
                           temperature=temperature, seed=seed, eos_token_ids=[])
    # the target's cache (the first one it saw) holds exactly the committed sequence minus the last token
    committed = prompt + out.tokens
    first_shadow = next(iter(target_shadows.values()))
    assert first_shadow[: len(committed) - 1] == committed[:-1]


@pytest.mark.parametrize("policy", ["sampling", "dropmatch", "typical"])
def test_same_seed_same_tokens(policy):
    target = random_model(tiny_config(), 0)
    draft = random_model(tiny_config(), 1)
    runs = [generate(target, [1, 2, 3], max_new_tokens=20, draft=draft, policy=policy, temperature=1.0,
                     seed=s, eos_token_ids=[]).tokens for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]  # 20 tokens at T=1 over 32 ids: equal by chance with negligible probability


@pytest.mark.parametrize("policy", ["dropmatch", "dropmatch-lazy"])
def test_the_run_seed_reaches_dropmatch_masks(policy):
    """At T = 0 the only randomness is DropMatch's masks: the same seed gives the same tokens, other
    seeds (almost surely) others; a policy built with its own seed ignores the run's."""
    target, draft = random_model(tiny_config(), 0), random_model(tiny_config(), 1)

    def run(run_seed, **options):
        policy_ = acceptance.get(policy, p=0.6, criterion="naive", **options)
        return tuple(generate(target, [1, 2, 3], max_new_tokens=20, draft=draft, policy=policy_, seed=run_seed,
                              eos_token_ids=[]).tokens)

    by_seed = [run(seed) for seed in range(4)]
    assert run(0) == by_seed[0]
    assert len(set(by_seed)) > 1, "every run seed gave the same masks"
    assert len({run(seed, seed=5) for seed in range(4)}) == 1  # its own seed: the run's does not matter


def perfect_draft_run(expected_len: int, gamma: int, max_new_tokens: int) -> dict:
    """The stats of a run whose drafts are all accepted (the target drafts for itself) and which ends
    after `expected_len` tokens, from minispec.chain.stats' definitions: the prefill gives token 1; each
    step drafts g = min(gamma, max_new_tokens - generated - 1) and emits g + 1, except a last step
    cut by an eos inside its accepted run, which counts as a draft of the e tokens it emitted."""
    generated, steps, drafted, accepted, emitted = 1, 0, 0, 0, 0
    while generated < expected_len:
        g = min(gamma, max_new_tokens - generated - 1)
        e = min(g + 1, expected_len - generated)
        drafted += g if e == g + 1 else e
        accepted += g if e == g + 1 else e
        steps, emitted, generated = steps + 1, emitted + e, generated + e
    return dict(verify_steps=steps, num_drafted=drafted, num_accepted=accepted,
                tau=emitted / steps if steps else 1.0)


@given(setup=loop_setups(), gamma=st.integers(1, 6), n_new=st.integers(1, 20), at=st.integers(0, 19),
       self_draft=st.sampled_from(["same", "self:bf16"]))
def test_eos_inside_an_accepted_run_ends_output_and_stats_exactly_there(setup, gamma, n_new, at, self_draft):
    """The target (or its bf16 copy) drafting for itself: every step's drafts are accepted, so an eos
    (any token of the plain greedy output, chosen as the eos) lands inside an accepted run, or on
    the bonus token, or at max_new_tokens. Output: plain greedy cut at the first eos. Stats: what
    was committed, computed from their definitions (perfect_draft_run) for the same-model draft,
    and for any draft: tau x steps = tokens - 1 and no accepted draft beyond the output."""
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    eos = plain.tokens[min(at, n_new - 1)]
    expected = plain.tokens[: plain.tokens.index(eos) + 1]
    draft = target if self_draft == "same" else self_draft
    streamed = []
    out = generate(target, prompt, max_new_tokens=n_new, draft=draft, gamma=gamma, eos_token_ids=[eos],
                   on_tokens=lambda tokens, num_accepted, g: streamed.append(num_accepted))
    assert out.tokens == expected
    assert out.finish_reason == ("eos" if eos in out.tokens else "length")
    s = out.stats
    assert s["tau"] * s["verify_steps"] == pytest.approx(len(expected) - 1, abs=1e-9)
    assert s["num_accepted"] == sum(streamed[1:]) <= len(expected) - 1
    assert sum(s["accepted_length_histogram"]) == s["drafted_steps"]
    if self_draft == "same":
        want = perfect_draft_run(len(expected), gamma, n_new)
        assert {k: s[k] for k in want} == pytest.approx(want, abs=1e-12)
        assert s["acceptance_rate"] == (1.0 if s["num_drafted"] else 0.0)


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_every_eos_position_of_a_run_ends_output_and_stats_exactly_there(gamma):
    """The property above at EVERY position of one run, not a sampled one: the eos is each token of
    the plain greedy output in turn (12 positions), so it lands on every offset of an accepted run,
    on its last draft, on the bonus token and on the last token allowed."""
    cfg = tiny_config(vocab_size=64)
    target = random_model(cfg, 3, scale=3.0)
    prompt, n_new = [1, 2, 3, 1, 2], 12
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[]).tokens
    for at in range(n_new):
        eos = plain[at]
        expected = plain[: plain.index(eos) + 1]
        out = generate(target, prompt, max_new_tokens=n_new, draft=target, gamma=gamma, eos_token_ids=[eos])
        assert out.tokens == expected, at
        want = perfect_draft_run(len(expected), gamma, n_new)
        assert {k: out.stats[k] for k in want} == pytest.approx(want, abs=1e-12), at


@given(setup=loop_setups(), gamma=st.integers(1, 8), kind=st.sampled_from(DRAFT_KINDS), n_new=st.integers(1, 12),
       policy=st.sampled_from(["exact", "sampling", "dropmatch"]))
def test_no_step_drafts_past_max_new_tokens(setup, gamma, kind, n_new, policy):
    """A step emits at most g drafts + 1 token, so the loop asks for g <= max_new_tokens - generated - 1:
    a drafter is never asked for tokens that could not be emitted. The caches then need only
    prompt + max_new_tokens positions (a prompt that fits exactly runs)."""
    cfg, seed, prompt = setup
    cfg = cfg.__class__(**{**cfg.__dict__, "max_position_embeddings": len(prompt) + n_new})  # fits exactly
    target = random_model(cfg, seed, scale=3.0)
    drafter = make_drafter(build_draft(kind, target, seed), target)
    asked = []
    original = drafter.propose

    def recording_propose(context, g, params, generator):
        asked.append((len(context) - len(prompt), g))  # (tokens generated so far, drafts asked for)
        return original(context, g, params, generator)

    drafter.propose = recording_propose
    out = generate(target, prompt, max_new_tokens=n_new, draft=drafter, policy=policy, gamma=gamma,
                   temperature=0.0, eos_token_ids=[])
    assert len(out.tokens) == n_new
    assert all(1 <= g <= n_new - generated - 1 for generated, g in asked), asked
    if policy != "dropmatch":  # lossless at T = 0
        assert out.tokens == generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[]).tokens


@settings(max_examples=15)
@given(setup=loop_setups(), gamma=st.integers(1, 5), kind=st.sampled_from(DRAFT_KINDS), n_new=st.integers(2, 16),
       cut=st.integers(0, 15))
def test_stop_when_ends_at_the_first_token_that_satisfies_it(setup, gamma, kind, n_new, cut):
    """A stop condition ends the run at the first token where it holds, even inside an accepted run,
    plain and speculative alike; finish_reason says "stop"."""
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    cut = min(cut, n_new - 2)  # stop strictly before max_new_tokens, so "stop" and "length" differ
    stop_when = lambda tokens: len(tokens) > cut and tokens[: cut + 1] == plain.tokens[: cut + 1]  # noqa: E731
    for draft in (None, build_draft(kind, target, seed)):
        out = generate(target, prompt, max_new_tokens=n_new, draft=draft, gamma=gamma, eos_token_ids=[],
                       stop_when=stop_when)
        assert out.tokens == plain.tokens[: cut + 1] and out.finish_reason == "stop"


def one_line(err):
    assert "\n" not in str(err.value)
    return str(err.value)


def test_clear_errors():
    target = random_model(tiny_config(), 0)
    with pytest.raises(MinispecError) as err:
        generate(target, [1], max_new_tokens=3, draft="ngram", policy="nope")
    assert "policy = 'nope': unknown acceptance policy; expected one of" in one_line(err)
    with pytest.raises(MinispecError) as err:
        generate(target, [1], max_new_tokens=3, draft="bogus")
    assert "draft='bogus': unknown drafter" in one_line(err)
    with pytest.raises(MinispecError) as err:
        generate(target, [1], max_new_tokens=3, draft="ngram", gamma=0)
    assert "gamma = 0; expected an integer >= 1" in one_line(err)
    with pytest.raises(MinispecError) as err:
        acceptance.get("dropmatch", p=1.0)
    assert "p = 1.0" in one_line(err)
    with pytest.raises(MinispecError) as err:
        generate(target, [1] * 126, max_new_tokens=3, draft="ngram", gamma=5)
    assert "exceeds the model's max_position_embeddings=128" in one_line(err)


@settings(max_examples=25)
@given(setup=loop_setups(), gamma=st.integers(1, 5), kind=st.sampled_from(["random", "ngram", "early-exit"]),
       policy=st.sampled_from(["exact", "sampling", "dropmatch"]), temperature=st.sampled_from([0.0, 1.0]),
       n_new=st.integers(1, 14))
def test_step_records_account_for_every_token_and_rollback(setup, gamma, kind, policy, temperature, n_new):
    """on_step sees each verify step as the loop did: the emitted tokens of all steps after the
    prefill's first token are the output; the target cache held context-1+g+1 positions after the
    verify pass and context+n after the rollback; n drafts were accepted out of g."""
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    records: list[StepRecord] = []
    out = generate(target, prompt, max_new_tokens=n_new, draft=build_draft(kind, target, seed), policy=policy,
                   gamma=gamma, temperature=temperature, seed=seed, eos_token_ids=[], on_step=records.append)
    assert [r.index for r in records] == list(range(out.stats["verify_steps"]))
    assert out.tokens[:1] + [t for r in records for t in r.emitted] == out.tokens
    context = len(prompt) + 1
    for r in records:
        g, n = r.inp.gamma, r.decision.num_accepted
        assert r.target_cache == (context - 1 + g + 1, context + n)
        assert r.emitted[:n] == r.inp.draft_tokens[:n].tolist()[: len(r.emitted)]
        context += len(r.emitted)
    assert sum(r.decision.num_accepted for r in records) == out.stats["num_accepted"]


def test_prompt_longer_than_the_cache():
    model = random_model(tiny_config(max_position_embeddings=16), 0)
    with pytest.raises(CacheOverflowError) as err:
        generate(model, list(range(12)), max_new_tokens=8)
    assert "prompt of 12 tokens + max_new_tokens=8 exceeds the model's max_position_embeddings=16" in one_line(err)
    cache = model.new_cache(1, 10)
    with pytest.raises(CacheOverflowError) as err:
        model(torch.tensor([list(range(12))]), cache)
    assert "0 cached + 12 new tokens exceeds max_seq_len=10" in one_line(err)


def test_a_drafter_object_follows_or_checks_the_target_vocabulary():
    """An NgramDrafter built without a vocabulary takes each target's, run by run (it is reusable
    across models); one built for a vocabulary, or a ModelDrafter, must match the target's."""
    small = random_model(tiny_config(vocab_size=16), 0, scale=3.0)
    large = random_model(tiny_config(vocab_size=40), 1, scale=3.0)
    ngram = NgramDrafter(max_ngram=2)
    for target in (small, large, small):
        prompt = [1, 2, 3, 1, 2, 3, 1, 2]
        out = generate(target, prompt, max_new_tokens=8, draft=ngram, eos_token_ids=[])
        assert out.tokens == generate(target, prompt, max_new_tokens=8, eos_token_ids=[]).tokens
    assert ngram.vocab_size is None
    with pytest.raises(MinispecError) as err:
        generate(large, [1, 2], max_new_tokens=3, draft=NgramDrafter(vocab_size=16))
    assert "NgramDrafter(vocab_size=16): vocabulary of 16 tokens != the target's 40" in one_line(err)
    with pytest.raises(MinispecError) as err:
        generate(large, [1, 2], max_new_tokens=3, draft=make_drafter(small, small))
    assert "vocabulary of 16 tokens != the target's 40" in one_line(err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("loop", ["chain", "batch"])
def test_a_policy_sees_float32_logits_and_probabilities_from_a_low_precision_model(dtype, loop):
    """The verify pass of a bfloat16 or float16 model yields logits in that dtype; the loop hands the
    policy float32 (target_logits, p_target, q_draft, draft_logits), so no rule rounds its
    probabilities, ratios or residuals to 8 bits."""
    from minispec.acceptance.sampling import SpeculativeSampling
    from minispec.batch.speculative import generate_batch

    seen = set()

    class Recording(SpeculativeSampling):
        def decide(self, inp):
            seen.add((inp.target_logits.dtype, inp.p_target.dtype, inp.q_draft.dtype, inp.draft_logits.dtype))
            return super().decide(inp)

    cfg = tiny_config(vocab_size=12, num_layers=1)
    target, draft = random_model(cfg, 1).to(dtype), random_model(cfg, 2).to(dtype)
    run = dict(max_new_tokens=6, draft=draft, gamma=2, policy=Recording(), temperature=1.0, eos_token_ids=[])
    if loop == "chain":
        generate(target, [1, 2, 3], **run)
    else:
        generate_batch(target, [[1, 2, 3], [4, 5]], **run)
    assert seen == {(torch.float32,) * 4}
