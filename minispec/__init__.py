"""minispec: a minimal, property-tested PyTorch reference for speculative decoding.

Reading order (each file one concept; its docstring gives the math):

 1. speculative.py         the loop: prefill, draft, verify gamma+1 rows, decide, roll back; stats.py: tau and co.
 1b. tree.py, tree_speculative.py   the same loop over draft trees: one pass scores every branch
 1c. batch.py              the same loop over a batch of prompts, each row at its own length
                           (ragged_cache.py: per-row lengths and masks; batch_drafters.py: drafting per row)
 2. acceptance/base.py     what a policy sees and returns; then exact.py, sampling.py, typical.py,
                           dropmatch.py (Algorithm 1 as written) and dropmatch_lazy.py (its exact shortcuts)
 3. drafters.py            the drafter interface and its kinds: draft model, self-draft, early exit, n-gram
 4. model.py               the Llama / Qwen2 / Qwen3 transformer; kv_cache.py, the cache that rolls back
 5. config.py, checkpoint.py, tokenizer.py, sampling.py    a Hugging Face folder in, logits to p and q
 6. generate.py            the CLI (cli.py: what every command line shares); trace.py, the --trace printer
 7. testing/               the invariants as a library: check_policy, check_cache, watch_caches

Beside the reading path: kernels/ (the same model made fast on CPU, one call away:
kernels.apply(model, "fast")), weights.py (fetch + convert the default checkpoint), and the
benchmarks in scripts/.
"""

from importlib import import_module

# The names below load on first use (PEP 562), so that `import minispec.errors` or the CLI's first
# lines do not wait for torch.
_LAZY = {"load_model": "minispec.checkpoint", "ModelConfig": "minispec.config", "KVCache": "minispec.kv_cache",
         "Transformer": "minispec.model", "load_tokenizer": "minispec.tokenizer",
         "RaggedKVCache": "minispec.ragged_cache", "generate_batch": "minispec.batch"}
from minispec.errors import MinispecError  # noqa: E402 (no torch)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'minispec' has no attribute {name!r}")


__all__ = ["load_model", "load_tokenizer", "ModelConfig", "KVCache", "RaggedKVCache", "Transformer", "generate_batch",
           "MinispecError"]
__version__ = "0.1.0"
