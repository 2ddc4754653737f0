"""The draft-then-verify loop on random tiny models.

Exactness properties run in float64 (see test_model_properties.py for why); a bf16 self-draft
is fine there because a draft only changes what gets accepted, never what gets emitted.
"""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec import acceptance
from minispec.drafters import ModelDrafter, NgramDrafter, make_drafter
from minispec.errors import MinispecError
from minispec.speculative import generate
from minispec.testing import model_configs, random_model, seeds, tiny_config
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


@st.composite
def setups(draw, max_layers=2):
    cfg = draw(model_configs(max_layers=max_layers))
    seed = draw(seeds)
    # repetitive prompts give the n-gram drafter something to find
    prompt = draw(st.lists(st.integers(0, min(cfg.vocab_size, 6) - 1), min_size=1, max_size=16))
    return cfg, seed, prompt


@given(setup=setups(), gamma=st.integers(1, 6), kind=st.sampled_from(DRAFT_KINDS), n_new=st.integers(1, 20))
def test_speculative_exact_equals_plain_greedy(setup, gamma, kind, n_new):
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)  # peaky distributions: long greedy agreements
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    spec = generate(target, prompt, max_new_tokens=n_new, draft=build_draft(kind, target, seed),
                    policy="exact", gamma=gamma, eos_token_ids=[])
    assert spec.tokens == plain.tokens
    s = spec.stats
    assert 1 <= s["tau"] <= gamma + 1
    assert sum(s["accepted_length_histogram"]) == s["verify_steps"]
    if kind == "same":  # the target drafting for itself is always right
        assert s["acceptance_rate"] == 1.0 or s["num_drafted"] == 0


@given(setup=setups(), gamma=st.integers(1, 5), kind=st.sampled_from(["same", "random", "ngram"]),
       paths=st.integers(1, 6), criterion=st.sampled_from(["js_or_majority", "js", "majority", "naive"]),
       or_base=st.booleans())
def test_dropmatch_at_p0_equals_exact(setup, gamma, kind, paths, criterion, or_base):
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    draft = build_draft(kind, target, seed)
    exact = generate(target, prompt, max_new_tokens=12, draft=draft, policy="exact", gamma=gamma, eos_token_ids=[])
    policy = acceptance.get("dropmatch", p=0.0, paths=paths, criterion=criterion, or_base=or_base)
    dm = generate(target, prompt, max_new_tokens=12, draft=draft, policy=policy, gamma=gamma, eos_token_ids=[])
    assert dm.tokens == exact.tokens
    # Same decisions too, except for the JS test alone without its base: at p=0 its radius is 0,
    # so it accepts only a draft whose whole distribution equals the target's, and rejects even a
    # correct one-hot draft (which the argmax correction then re-emits: same tokens, lower tau).
    if or_base or criterion != "js":
        assert dm.stats["accepted_length_histogram"] == exact.stats["accepted_length_histogram"]


@settings(max_examples=25)
@given(setup=setups(), gamma=st.integers(1, 5), kind=st.sampled_from(["same", "random", "ngram"]),
       p=st.sampled_from([0.1, 0.3, 0.6]), or_base=st.booleans(), temperature=st.sampled_from([0.0, 1.0]))
def test_lazy_dropmatch_emits_what_eager_dropmatch_emits(setup, gamma, kind, p, or_base, temperature):
    """Lazy paths (default) and all paths in the verify's head call: same masks, same decisions."""
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    draft = build_draft(kind, target, seed)
    runs = [generate(target, prompt, max_new_tokens=12, draft=draft, gamma=gamma, temperature=temperature, seed=seed,
                     policy=acceptance.get("dropmatch", p=p, or_base=or_base, seed=seed, lazy=lazy), eos_token_ids=[])
            for lazy in (True, False)]
    assert runs[0].tokens == runs[1].tokens
    for key in ("accepted_length_histogram", "accepted_by_dropmatch_only"):
        assert runs[0].stats[key] == runs[1].stats[key]
    assert "heads_all_agree" in runs[1].stats and "heads_all_agree" not in runs[0].stats
    assert runs[0].stats["path_positions_per_step"] <= gamma  # lazy: at most the drafted positions


@settings(max_examples=10)
@given(setup=setups(), gamma=st.integers(1, 5), kind=st.sampled_from(["random", "ngram", "early-exit"]),
       policy=st.sampled_from(["exact", "sampling", "typical", "dropmatch"]), temperature=st.sampled_from([0.0, 1.0]))
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


# Losslessness of `sampling` (one step and 3-token outputs through this loop, chi-square against
# the exact distribution) is checked by minispec.testing.check_policy in test_testing_api.py.


def test_eos_stops_inside_an_accepted_run():
    target = random_model(tiny_config(), 3, scale=3.0)
    plain = generate(target, [5, 6, 7], max_new_tokens=12, eos_token_ids=[])
    eos = plain.tokens[6]
    stop = plain.tokens.index(eos) + 1
    spec = generate(target, [5, 6, 7], max_new_tokens=12, draft=target, gamma=5, eos_token_ids=[eos])
    assert spec.tokens == plain.tokens[:stop]


def test_ngram_lookup_proposes_what_followed_the_last_match():
    d = NgramDrafter(max_ngram=2, vocab_size=10)
    assert d.lookup([1, 2, 3, 4, 9, 1, 2, 5, 1, 2], 3) == [5, 1, 2]  # the most recent "1 2"
    assert d.lookup([1, 2, 3], 2) == []
    assert d.lookup([7, 3, 8, 3], 4) == [8, 3]  # unigram fallback, clipped at the end


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
    assert "--draft = 'bogus': unknown drafter" in one_line(err)
    with pytest.raises(MinispecError) as err:
        generate(target, [1], max_new_tokens=3, draft="ngram", gamma=0)
    assert "gamma = 0; expected an integer >= 1" in one_line(err)
    with pytest.raises(MinispecError) as err:
        acceptance.get("dropmatch", p=1.0)
    assert "p = 1.0" in one_line(err)
    with pytest.raises(MinispecError) as err:
        generate(target, [1], max_new_tokens=3, draft=random_model(tiny_config(vocab_size=40), 0))
    assert "vocabulary of 40 tokens != the target's 32" in one_line(err)
    with pytest.raises(MinispecError) as err:
        generate(target, [1], max_new_tokens=3, draft="early-exit:2")
    assert "expected an integer N with 1 <= N <= 1" in one_line(err)


@settings(max_examples=20)
@given(setup=setups(max_layers=3), gamma=st.integers(1, 5), n_new=st.integers(1, 16),
       noise=st.sampled_from([0.0, 0.3]), early_exit=st.booleans())
def test_a_draft_on_the_targets_own_cache_leaves_it_exact(setup, gamma, n_new, noise, early_exit):
    """Shared-cache drafts (early exit, or a perturbed float64 copy standing in for a lower-precision
    self-draft): the target's cache is checked against recomputation before every target pass, the
    output is plain greedy's, and the draft makes exactly one forward per token it feeds."""
    cfg, seed, prompt = setup
    target = random_model(cfg, seed, scale=3.0)
    if early_exit:
        drafter = ModelDrafter(target, num_layers=max(1, cfg.num_layers - 1), share_cache=True)
    else:
        copy = random_model(cfg, seed, scale=3.0)
        with torch.no_grad():
            for p in copy.parameters():
                p.add_(noise * torch.randn_like(p))
        drafter = ModelDrafter(copy, share_cache=True)
    plain = generate(target, prompt, max_new_tokens=n_new, eos_token_ids=[])
    with watch_caches(target):
        spec = generate(target, prompt, max_new_tokens=n_new, draft=drafter, policy="exact", gamma=gamma, eos_token_ids=[])
    assert spec.tokens == plain.tokens
    assert drafter.sharing and spec.stats["draft_shares_target_cache"]
    # no draft prefill, no catch-up: one forward per fed token (the last one, then d_1..d_{g-1})
    assert spec.stats["draft_forwards"] == spec.stats["num_drafted"]


def test_a_shared_cache_draft_of_another_dtype_falls_back_to_its_own_cache():
    target = random_model(tiny_config(), 0)  # float64: its cache is float64
    drafter = make_drafter("self:bf16", target)  # a bfloat16 copy: its cache would be bfloat16
    out = generate(target, [1, 2, 3], max_new_tokens=8, draft=drafter, gamma=3, eos_token_ids=[])
    assert drafter.share_cache and not drafter.sharing and not out.stats["draft_shares_target_cache"]
    assert out.tokens == generate(target, [1, 2, 3], max_new_tokens=8, eos_token_ids=[]).tokens
