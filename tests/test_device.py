"""The loop on another device: every tensor it, the drafters and the policies create follows the
target's device. Runs on MINISPEC_DEVICE (default cpu), e.g.

    MINISPEC_DEVICE=cuda python -m pytest tests/test_device.py     (or: python -m pytest --device cuda ...)

Tiny random models in float64 (exactness properties), moved to the device after they are drawn
on the CPU (so the weights are the same on every device).
"""

import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minispec import acceptance
from minispec.lab.dropout_calibration import MeasuredAgreement
from minispec.chain.drafters import make_drafter
from minispec.chain.speculative import generate_chain as generate
from minispec.testing import model_configs, random_model, seeds

DEVICE = os.environ.get("MINISPEC_DEVICE", "cpu")
try:
    torch.empty(0, device=DEVICE)
except (RuntimeError, AssertionError) as err:  # pragma: no cover - only on a machine without the device
    pytest.skip(f"MINISPEC_DEVICE={DEVICE!r} is not available here: {str(err).splitlines()[0]}", allow_module_level=True)


def on_device(cfg, seed: int, scale: float = 3.0):
    return random_model(cfg, seed, scale=scale).to(DEVICE)


@settings(max_examples=8)
@given(cfg=model_configs(max_layers=3), seed=seeds, gamma=st.integers(1, 5),
       draft=st.sampled_from(["ngram:2", "model", "early-exit:1", "self:bf16"]),
       policy=st.sampled_from(["exact", "dropmatch", "dropmatch-lazy"]),
       draft_length=st.sampled_from(["fixed", "heuristic"]), p_min=st.sampled_from([0.0, 0.6]),
       prompt=st.lists(st.integers(0, 5), min_size=1, max_size=8))
def test_speculative_greedy_equals_plain_greedy_on_the_device(cfg, seed, gamma, draft, policy, draft_length, p_min,
                                                              prompt):
    """exact, and DropMatch at p = 0, at T = 0, with either draft length and confidence cut-off: the
    target's own greedy tokens, on DEVICE."""
    target = on_device(cfg, seed)
    drafter = on_device(cfg, seed + 1) if draft == "model" else draft
    if draft.startswith("early-exit") and cfg.num_layers < 2:
        drafter = "ngram:2"  # an early exit needs a block to skip
    if p_min and not (draft == "ngram:2" or drafter == "ngram:2"):  # the n-gram drafter has no confidence to cut at
        drafter = make_drafter(drafter, target, p_min=p_min)
    plain = generate(target, prompt, max_new_tokens=10, eos_token_ids=[]).tokens
    chosen = policy if policy == "exact" else acceptance.get(policy, p=0.0)
    spec = generate(target, prompt, max_new_tokens=10, draft=drafter, policy=chosen, gamma=gamma, eos_token_ids=[],
                    draft_length=draft_length)
    assert spec.tokens == plain


@settings(max_examples=6)
@given(cfg=model_configs(max_layers=2), seed=seeds, policy=st.sampled_from(["sampling", "typical", "dropmatch"]),
       draft=st.sampled_from(["ngram:2", "model"]), prompt=st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_sampled_runs_on_the_device_are_reproducible_by_seed(cfg, seed, policy, draft, prompt):
    """T = 1: the same seed gives the same tokens (the draws come from a seeded CPU generator)."""
    target = on_device(cfg, seed)
    drafter = on_device(cfg, seed + 1) if draft == "model" else draft
    runs = [generate(target, prompt, max_new_tokens=8, draft=drafter, policy=policy, gamma=3, temperature=1.0,
                     seed=seed, eos_token_ids=[]).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 8
    plain = [generate(target, prompt, max_new_tokens=8, temperature=1.0, seed=seed, eos_token_ids=[]).tokens
             for _ in range(2)]
    assert plain[0] == plain[1]


@settings(max_examples=5)
@given(cfg=model_configs(max_layers=2), seed=seeds, p=st.sampled_from([0.1, 0.3]),
       prompt=st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_dropmatch_and_its_lazy_form_decide_alike_on_the_device(cfg, seed, p, prompt):
    target = on_device(cfg, seed)
    outs = [generate(target, prompt, max_new_tokens=10, draft="ngram:2", gamma=3, eos_token_ids=[],
                     policy=acceptance.get(name, p=p, seed=seed)).tokens for name in ("dropmatch", "dropmatch-lazy")]
    assert outs[0] == outs[1]


def test_measured_head_agreement_runs_on_the_device():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 16, generator=gen, dtype=torch.float64).to(DEVICE)
    weight = torch.randn(9, 16, generator=gen, dtype=torch.float64).to(DEVICE)
    measured = MeasuredAgreement(hidden, lambda x: x @ weight.T, paths=3)
    assert measured(0.0) == 1.0 and 0.0 <= measured(0.5) <= 1.0
