"""kernels.frequent_head: a draft's LM head over a subset of the vocabulary (FR-Spec).

- The restricted logits are the full head's at the kept ids (float64: up to summation order) and -inf everywhere else, on the
  reference model and after each kernels rewrite (the kept rows move into the kind's layer).
- Speculative decoding with a restricted draft gives the target's own output: greedy tokens
  equal plain greedy (float64, exactly), and at T > 0 lossless sampling keeps the target's
  distribution (the same property the loop tests prove for any draft; here with a draft whose
  q is 0 outside the kept ids).
- Bad sizes and a second restriction are one-line errors.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec import kernels
from minispec.decode import generate
from minispec.errors import MinispecError
from minispec.kernels import frequent_head
from minispec.testing import random_model, seeds, tiny_config

CONFIG = tiny_config(hidden_size=32, intermediate_size=48, vocab_size=64)


@settings(deadline=None, max_examples=25)
@given(seed=seeds, keep=st.integers(1, 64), added=st.lists(st.integers(0, 63), max_size=5))
def test_kept_logits_are_the_full_heads_and_the_rest_minus_infinity(seed, keep, added):
    model = random_model(CONFIG, seed)
    restricted = frequent_head.apply(copy.deepcopy(model), keep, added)
    kept = sorted(set(range(keep)) | set(added))
    assert restricted.lm_head.token_ids.tolist() == kept
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full, part = model(ids), restricted(ids)  # [1, 7, V]
    others = [v for v in range(64) if v not in kept]
    # float64: a matmul over fewer rows may block its sums differently, so equal to ~1e-15, not bit for bit
    assert torch.allclose(part[..., kept], full[..., kept], rtol=1e-12, atol=1e-12)
    assert torch.all(part[..., others] == float("-inf"))


@pytest.mark.parametrize("kind", ["fast", "int8"])
def test_a_kernels_rewrite_keeps_the_restriction(kind):
    model = random_model(CONFIG, 3, dtype=torch.float32)
    reference = kernels.apply(copy.deepcopy(model), kind)
    restricted = kernels.apply(frequent_head.apply(copy.deepcopy(model), 20, [60, 61]), kind)
    assert isinstance(restricted.lm_head, frequent_head.FrequentHead)
    ids = torch.tensor([[1, 5, 9, 60, 2]])
    with torch.no_grad():
        full, part = reference(ids), restricted(ids)
    kept = list(range(20)) + [60, 61]
    assert torch.allclose(part[..., kept].float(), full[..., kept].float(), atol=1e-5)
    assert torch.all(part[..., 20:60] == float("-inf")) and torch.all(part[..., 62:] == float("-inf"))


@settings(deadline=None, max_examples=15)
@given(seed=seeds, keep=st.integers(1, 64), gamma=st.integers(1, 5))
def test_greedy_output_with_a_restricted_draft_is_the_targets(seed, keep, gamma):
    target = random_model(CONFIG, seed)
    draft = frequent_head.apply(random_model(CONFIG, seed + 1), keep)
    prompt = [3, 1, 4, 1, 5]
    plain = generate(target, prompt, max_new_tokens=12, eos_token_ids=[])
    speculative = generate(target, prompt, max_new_tokens=12, eos_token_ids=[], draft=draft, gamma=gamma)
    assert speculative.tokens == plain.tokens


def test_lossless_sampling_with_a_restricted_draft_keeps_the_targets_distribution():
    """Exact distribution of 2 tokens over a 64-token vocabulary at T = 1, by the loop's sampling,
    against the target's: chi-square over 3000 runs (seeded), p > 1e-3."""
    from minispec.model.sampling import SamplingParams
    from minispec.testing.distribution import chi_square_p_value, sequence_distribution

    config = tiny_config(hidden_size=32, intermediate_size=48, vocab_size=8)
    target = random_model(config, 11, scale=0.3)
    draft = frequent_head.apply(random_model(config, 12, scale=0.3), 3)  # proposes only ids 0, 1, 2
    prompt = [1, 2]
    probs = sequence_distribution(target, prompt, 2, SamplingParams(temperature=1.0))
    counts: dict = {}
    for seed in range(3000):
        out = generate(target, prompt, max_new_tokens=2, eos_token_ids=[], draft=draft, gamma=2, policy="sampling",
                       temperature=1.0, seed=seed).tokens
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    assert chi_square_p_value(counts, probs, 3000) > 1e-3
    assert any(t[0] > 2 for t in counts)  # the target supplies tokens the draft cannot propose


@pytest.mark.parametrize("keep", [0, -1, 65, True, 2.5])
def test_a_bad_size_is_one_line(keep):
    with pytest.raises(MinispecError, match=r"keep=.*expected a whole number of tokens in \[1, 64\]"):
        frequent_head.apply(random_model(CONFIG, 0), keep)


def test_a_second_restriction_or_a_rewritten_model_is_refused():
    model = frequent_head.apply(random_model(CONFIG, 0), 10)
    with pytest.raises(MinispecError, match="expected a freshly loaded draft model"):
        frequent_head.apply(model, 10)
    with pytest.raises(MinispecError, match="expected a freshly loaded draft model"):
        frequent_head.apply(kernels.apply(random_model(CONFIG, 0, dtype=torch.float32), "fast"), 10)


def test_token_ids_as_a_list_or_a_tensor_keep_the_same_rows_and_bad_ids_are_one_line():
    """token_ids as the docstring allows (a list or 1-D tensor, any order, repeats kept once); ids outside
    the vocabulary, in token_ids or added_ids, are refused by name, not dropped."""
    cfg = tiny_config(vocab_size=20)
    as_list = frequent_head.apply(random_model(cfg, 0), 5, token_ids=[7, 3, 3, 11])
    as_tensor = frequent_head.apply(random_model(cfg, 0), 5, token_ids=torch.tensor([3, 7, 11]))
    assert as_list.lm_head.token_ids.tolist() == as_tensor.lm_head.token_ids.tolist() == [3, 7, 11]
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(as_list(ids), as_tensor(ids))
    for kwargs, name in [(dict(token_ids=[1, 20]), "token_ids"), (dict(token_ids=[-1]), "token_ids"),
                         (dict(added_ids=[25]), "added_ids"), (dict(token_ids=[]), "token_ids"),
                         (dict(token_ids=[0.5]), "token_ids")]:
        with pytest.raises(MinispecError, match=f"frequent_head.apply: {name}"):
            frequent_head.apply(random_model(cfg, 0), 5, **kwargs)
