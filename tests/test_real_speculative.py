"""Speculative decoding on the real checkpoint, fp32, greedy: `exact` with the n-gram and the
bf16 self-draft must reproduce plain greedy decoding.

Compared tie-aware: the verify pass scores gamma+1 rows in one matmul while plain decoding
scores one row, and float32 kernels for different shapes round differently (~1e-5 on these
logits). So the outputs may legitimately part where the target's top-2 logits are within that
noise. The check: up to the first divergence the tokens are equal, and at the divergence the
target's top-2 logits (recomputed from scratch) are within MARGIN = 1e-3, ~30x the largest
float32 discrepancy we measured between implementations (3.6e-5, test_real_checkpoint.py).
"""

import copy

import pytest
import torch

from minispec.speculative import generate

MARGIN = 1e-3
PROMPTS = [
    "Summarize: The Eiffel Tower is a wrought-iron lattice tower in Paris. It was built for the 1889 "
    "World's Fair and is 330 metres tall. The Eiffel Tower is the most visited paid monument in the world.",
    "Write a Python function that returns the sum of the squares of a list of numbers.",
]


def assert_equal_up_to_near_tie(model, prompt, got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + want[:i]]))[0, -1]
            top2 = torch.topk(logits, 2).values
            gap = float(top2[0] - top2[1])
            assert gap <= MARGIN, f"divergence at token {i} ({a} vs {b}) is not a near-tie: top-2 gap {gap:.2e}"
            return
    assert len(got) == len(want) or got[-1] in (model.config.eos_token_ids or ()) or want[-1] in model.config.eos_token_ids


@pytest.mark.parametrize("draft", ["ngram", "self:bf16"])
def test_exact_speculative_equals_plain_greedy(real_model, real_tokenizer, draft):
    _check_speculative_equals_plain(real_model, real_tokenizer, draft)


@pytest.mark.parametrize("draft", ["ngram", "self:bf16", "self:int8"])
def test_exact_speculative_equals_plain_greedy_on_the_fast_path(real_model, real_tokenizer, draft):
    """minispec.fast: the target (and the self-draft copy, made before packing) optimized."""
    from minispec import fast
    from minispec.drafters import make_drafter

    target = fast.optimize(copy.deepcopy(real_model))
    drafter = make_drafter(draft, real_model)  # a self-draft copies the reference weights
    fast.optimize_drafter(drafter)
    _check_speculative_equals_plain(target, real_tokenizer, drafter)


def _check_speculative_equals_plain(real_model, real_tokenizer, draft):
    for text in PROMPTS:
        prompt = real_tokenizer.apply_chat_template([{"role": "user", "content": text}])
        plain = generate(real_model, prompt, max_new_tokens=40)
        spec = generate(real_model, prompt, max_new_tokens=40, draft=draft, policy="exact", gamma=5)
        assert_equal_up_to_near_tie(real_model, prompt, spec.tokens, plain.tokens)
        assert spec.stats["tau"] > 1.0  # the drafter did get tokens accepted
