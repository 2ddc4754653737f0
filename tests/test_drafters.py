"""Drafters (minispec.chain.drafters): what each proposes, how a model drafter keeps its cache in step,
and how the self-drafts and early exit draft on the target's own cache."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec.chain.drafters import ModelDrafter, NgramDrafter, make_drafter, ngram_order, suffix_matches
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams
from minispec.chain.speculative import generate_chain as generate
from minispec.testing import model_configs, random_model, seeds, tiny_config
from minispec.testing.cache_watch import watch_caches


def test_ngram_lookup_proposes_what_followed_the_last_match():
    d = NgramDrafter(max_ngram=2, vocab_size=10)
    assert d.lookup([1, 2, 3, 4, 9, 1, 2, 5, 1, 2], 3) == [5, 1, 2]  # the most recent "1 2"
    assert d.lookup([1, 2, 3], 2) == []
    assert d.lookup([7, 3, 8, 3], 4) == [8, 3]  # unigram fallback, clipped at the end


def reference_matches(context, max_ngram, min_ngram):
    """Prompt lookup by its definition: for n = max_ngram down to min_ngram, every earlier start whose
    n tokens equal the context's last n, most recent first; each as the index its continuation starts at."""
    return [start + n for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1)
            for start in range(len(context) - n - 1, -1, -1) if context[start:start + n] == context[-n:]]


@settings(max_examples=200)
@given(context=st.lists(st.integers(0, 3), max_size=24), max_ngram=st.integers(1, 5), min_ngram=st.integers(1, 5))
def test_the_suffix_search_is_prompt_lookup_by_its_definition(context, max_ngram, min_ngram):
    """suffix_matches + ngram_order (the one search the chain and the tree use)
    give the definition's matches in its order, and the chain's lookup takes the first of them."""
    max_ngram = max(max_ngram, min_ngram)
    want = reference_matches(context, max_ngram, min_ngram)
    assert [end + 1 for end in ngram_order(suffix_matches(context, max_ngram), max_ngram, min_ngram)] == want
    lookup = NgramDrafter(max_ngram, min_ngram).lookup(context, 3)
    assert lookup == (context[want[0]:want[0] + 3] if want else [])


def test_ngram_draft_is_one_hot_and_keeps_no_cache():
    d = make_drafter("ngram:2", random_model(tiny_config(), 0))
    d.start(64)
    draft = d.propose([1, 2, 3, 1, 2], 3, SamplingParams(), torch.Generator())
    assert draft.tokens == [3, 1, 2] and draft.logits is None
    assert torch.equal(draft.q_draft, torch.eye(32)[[3, 1, 2]])
    assert d.cache_length is None and not d.shares_target_cache


@settings(max_examples=20)
@given(cfg=model_configs(max_layers=3), seed=seeds, gamma=st.integers(1, 5), n_new=st.integers(1, 16),
       prompt=st.lists(st.integers(0, 5), min_size=1, max_size=12), noise=st.sampled_from([0.0, 0.3]),
       early_exit=st.booleans())
def test_a_draft_on_the_targets_own_cache_leaves_it_exact(cfg, seed, gamma, n_new, prompt, noise, early_exit):
    """Shared-cache drafts (early exit, or a perturbed float64 copy standing in for a lower-precision
    self-draft): the target's cache is checked against recomputation before every target pass, the
    output is plain greedy's, and the draft makes exactly one forward per token it feeds."""
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
        spec = generate(target, prompt, max_new_tokens=n_new, draft=drafter, policy="exact", gamma=gamma,
                        eos_token_ids=[])
    assert spec.tokens == plain.tokens
    assert drafter.shares_target_cache and spec.stats["draft_shares_target_cache"]
    # no draft prefill, no catch-up: one forward per fed token (the last one, then d_1..d_{g-1})
    assert spec.stats["draft_forwards"] == spec.stats["num_drafted"]


def test_a_shared_cache_draft_of_another_dtype_falls_back_to_its_own_cache():
    target = random_model(tiny_config(), 0)  # float64: its cache is float64
    drafter = make_drafter("self:bf16", target)  # a bfloat16 copy: its cache would be bfloat16
    out = generate(target, [1, 2, 3], max_new_tokens=8, draft=drafter, gamma=3, eos_token_ids=[])
    assert drafter.share_cache and not drafter.shares_target_cache and not out.stats["draft_shares_target_cache"]
    assert out.tokens == generate(target, [1, 2, 3], max_new_tokens=8, eos_token_ids=[]).tokens


def one_line(err):
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("spec, message", [
    ("bogus", "draft='bogus': unknown drafter"),
    ("early-exit:2", "expected an integer N with 1 <= N <= 1"),
    ("early-exit:x", "expected an integer N with 1 <= N <= 1"),
    ("ngram:0", "expected an integer N with 1 <= N"),
    ("self:fp4", "unknown precision; expected self:bf16 or self:int8"),
])
def test_bad_drafter_specs_are_one_line_errors(spec, message):
    with pytest.raises(MinispecError) as err:
        make_drafter(spec, random_model(tiny_config(), 0))
    assert message in one_line(err)


def test_a_draft_model_of_another_vocabulary_is_refused():
    with pytest.raises(MinispecError) as err:
        make_drafter(random_model(tiny_config(vocab_size=40), 0), random_model(tiny_config(), 0))
    assert "vocabulary of 40 tokens != the target's 32" in one_line(err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_a_bfloat16_self_draft_of_a_bfloat16_target_is_refused(dtype):
    """self:bf16 of a bfloat16 target would be the target itself (every draft accepted, the work
    done twice): one line naming the flag and the ways out; any wider target gets its copy."""
    target = random_model(tiny_config(), 0).to(dtype)
    if dtype == torch.bfloat16:
        with pytest.raises(MinispecError) as err:
            make_drafter("self:bf16", target)
        assert one_line(err).startswith("draft='self:bf16': the target is already bfloat16")
        assert "dtype=" in str(err.value) and "self:int8" in str(err.value)
    else:
        assert make_drafter("self:bf16", target).model.dtype == torch.bfloat16


def test_the_int8_self_draft_off_the_cpu_is_a_one_line_error_naming_the_flag():
    """The int8 kernel is CPU-only: a target elsewhere (here the meta device, which any machine
    has) gets an error that names draft='self:int8' and the way out, before anything is copied."""
    from minispec.model.config import ModelConfig
    from minispec.model.transformer import Transformer

    cfg = ModelConfig(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=1, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                      rope_scaling=None, max_position_embeddings=64, tie_word_embeddings=False, qk_norm=False)
    with torch.device("meta"):
        target = Transformer(cfg)
    with pytest.raises(MinispecError, match=r"^draft='self:int8': the target is on meta; .* expected draft='self:bf16'"):
        make_drafter("self:int8", target)
