"""The real checkpoint (SmolLM2-135M-Instruct, converted from its GGUF), fp32.

Golden values come from transformers' LlamaForCausalLM on the same folder
(scripts/make_golden.py). Tolerance 2e-4 absolute on logits of magnitude ~10-30: the two
implementations order their float32 operations differently through 30 layers; the observed
maximum difference is 3.6e-5.
"""

import json
from pathlib import Path

import torch

from minispec.speculative import generate

GOLDEN = Path(__file__).parent / "data" / "golden_smollm2.json"
ATOL = 2e-4


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
