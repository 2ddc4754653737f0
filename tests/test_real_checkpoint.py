"""The real checkpoint (SmolLM2-135M-Instruct, converted from its GGUF), fp32, end to end.

Golden values come from transformers' LlamaForCausalLM on the same folder
(scripts/tooling/make_golden.py). Tolerance 2e-4 absolute on logits of magnitude ~10-30: the two
implementations order their float32 operations differently through 30 layers; the observed
maximum difference is 3.6e-5.

Speculative decoding with `exact` must reproduce plain greedy decoding, compared tie-aware: the
verify pass scores gamma+1 rows in one matmul while plain decoding scores one row, and float32
kernels for different shapes round differently (~1e-5 on these logits). So the outputs may
legitimately part where the target's top-2 logits are within that noise. The check: up to the
first divergence the tokens are equal, and at the divergence the target's top-2 logits
(recomputed from scratch) are within MARGIN = 1e-3, ~30x the largest float32 discrepancy
between implementations (3.6e-5, above).
"""

import copy
import json
from pathlib import Path

import pytest
import torch

from minispec import kernels
from minispec.kernels import packed
from minispec.batch.speculative import generate_batch
from minispec.chain.drafters import make_drafter
from minispec.decode import generate
from minispec.trees.drafters import TreeSpec

GOLDEN = Path(__file__).parent / "data" / "golden_smollm2.json"
ATOL = 2e-4
MARGIN = 1e-3


def test_logits_match_transformers_golden_values(real_model_any):
    real_model = real_model_any
    golden = json.loads(GOLDEN.read_text())
    for record in golden["prompts"]:
        with torch.no_grad():
            logits = real_model(torch.tensor([record["ids"]]))[0]  # [T, V]
        top5_ids = torch.tensor(record["top5_ids"])
        torch.testing.assert_close(logits.gather(1, top5_ids), torch.tensor(record["top5_logits"]), atol=ATOL, rtol=0)
        torch.testing.assert_close(logits[:, golden["probe_ids"]], torch.tensor(record["probe_logits"]), atol=ATOL, rtol=0)
        # and the argmax agrees wherever the reference's top-2 are not within the tolerance
        clear = (torch.tensor(record["top5_logits"])[:, 0] - torch.tensor(record["top5_logits"])[:, 1]) > 2 * ATOL
        assert (logits.argmax(-1) == top5_ids[:, 0])[clear].all()


def test_greedy_chat_answer_names_paris(real_model_any, real_tokenizer):
    real_model = real_model_any
    prompt = real_tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    out = generate(real_model, prompt, max_new_tokens=20)
    text = real_tokenizer.decode(out.tokens, skip_special_tokens=True)
    assert "Paris" in text
    assert out.tokens[-1] in real_tokenizer.eos_token_ids  # it stopped by itself, at <|im_end|>


def test_plain_continuation_matches_the_documented_one(real_model, real_tokenizer):
    ids = real_tokenizer.encode("Once upon a time, in a small village by the sea,")
    out = generate(real_model, ids, max_new_tokens=11, eos_token_ids=[])
    assert real_tokenizer.decode(out.tokens) == " there was a wise old wizard named Thorold."


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
    """kernels "fast": the target (and the self-draft copy, made before packing) rewritten."""
    if draft == "self:bf16" and not packed.packs(torch.bfloat16):
        pytest.skip("this CPU's oneDNN has no packed bfloat16 matmul (no AVX-512 BW/VL/DQ or AVX-NE-CONVERT)")
    target = kernels.apply(copy.deepcopy(real_model), "fast")
    drafter = make_drafter(draft, real_model)  # a self-draft copies the reference weights
    kernels.apply_drafter(drafter, "fast")
    _check_speculative_equals_plain(target, real_tokenizer, drafter)


@pytest.mark.parametrize("draft", ["ngram", "early-exit:24"])
def test_tree_speculative_equals_plain_greedy_on_the_fast_path(real_model, real_tokenizer, draft):
    """Trees of 8 nodes (n-gram trie; early exit static 4,2,1) verified in one fast-kernel pass."""
    target = kernels.apply(copy.deepcopy(real_model), "fast")
    shape = {} if draft == "ngram" else {"branching": (4, 2, 1)}  # an n-gram tree has no branching
    _check_speculative_equals_plain(target, real_tokenizer, draft, tree=TreeSpec(budget=8, **shape))


def _check_speculative_equals_plain(real_model, real_tokenizer, draft, tree=None):
    for text in PROMPTS:
        prompt = real_tokenizer.apply_chat_template([{"role": "user", "content": text}])
        plain = generate(real_model, prompt, max_new_tokens=40)
        spec = generate(real_model, prompt, max_new_tokens=40, draft=draft, policy="exact", gamma=5, tree=tree)
        assert_equal_up_to_near_tie(real_model, prompt, spec.tokens, plain.tokens)
        assert spec.stats["tau"] > 1.0  # the drafter did get tokens accepted


@pytest.mark.parametrize("draft", [None, "ngram", "early-exit:24"])
def test_batched_greedy_equals_each_prompt_alone_on_the_fast_path(real_model, real_tokenizer, draft):
    """Both prompts (different lengths) in one batch on the fast kernels: each row is plain greedy
    on its prompt alone, up to near-ties (the batched matmuls sum in another order)."""
    target = kernels.apply(copy.deepcopy(real_model), "fast")
    prompts = [real_tokenizer.apply_chat_template([{"role": "user", "content": text}]) for text in PROMPTS]
    batch = generate_batch(target, prompts, max_new_tokens=40, draft=draft, gamma=5)
    for prompt, row in zip(prompts, batch):
        plain = generate(target, prompt, max_new_tokens=40)
        assert_equal_up_to_near_tie(target, prompt, row.tokens, plain.tokens)
