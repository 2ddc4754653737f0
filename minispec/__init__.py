"""minispec: a minimal, property-tested PyTorch reference for speculative decoding.

Reading guide: three chapters, each read after what it depends on; each file one concept, its
docstring gives the math.

Chapter 1, the chain: the loop, and everything the other chapters build on
  speculative.py        the loop: prefill, draft, verify gamma+1 rows, decide, roll back
  loop.py, stats.py     what every loop shares (results, checks, commit); tau and the rest, defined once
  acceptance/           base.py: what a policy sees and returns; exact.py, sampling.py, block.py
                        (block verification, and traversal's chain form), typical.py, lenience.py,
                        fly.py, dropmatch.py (Algorithm 1 as written), dropmatch_lazy.py (its shortcuts)
  drafters.py           the drafter interface and its kinds; draft_length.py: how many to draft
  model.py, kv_cache.py the Llama / Qwen2 / Qwen3 transformer, and the cache that rolls back
  config.py, checkpoint.py, tokenizer.py, sampling.py   a Hugging Face folder in, logits to p and q
  memory.py             what the machine can hold: every size checked before it is allocated
Chapter 2, trees (after chapter 1): one pass scores every branch
  tree.py               a draft tree: parents, depths, positions and the ancestors-only mask
  tree_drafters.py      n-gram and model trees (static, or EAGLE-2's dynamic); TreeSpec
  tree_speculative.py   the loop over trees
  acceptance/trees.py   each policy as a walk down the tree, in a registry a policy can join
Chapter 3, batches (after chapter 1): several prompts, each row exactly as if alone
  ragged_cache.py       one cache, a length, positions and a mask per row
  batch_drafters.py     drafting for every row at once
  batch.py              the loop over a batch
Above the chapters: decode.py (generate, the front door that hands off to a chapter),
generate/ (the CLI: flags.py, run.py, printing.py; trace.py prints --trace) and testing/ (the
invariants as a library: check_policy, check_cache, watch_caches).

Beside the reading path: kernels/ (the same model made fast on CPU, one call away:
kernels.apply(model, "fast")), weights.py (fetch + convert the default checkpoint), hub.py (hub
repo ids), and the benchmarks in scripts/.
"""

from importlib import import_module

# The names below load on first use (PEP 562), so that `import minispec.errors` or the CLI's first
# lines do not wait for torch.
_LAZY = {"load_model": "minispec.checkpoint", "ModelConfig": "minispec.config", "KVCache": "minispec.kv_cache",
         "Transformer": "minispec.model", "load_tokenizer": "minispec.tokenizer",
         "RaggedKVCache": "minispec.ragged_cache", "generate_batch": "minispec.batch",
         "generate_tree": "minispec.tree_speculative"}
from minispec.errors import MinispecError  # noqa: E402 (no torch)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'minispec' has no attribute {name!r}")


__all__ = ["load_model", "load_tokenizer", "ModelConfig", "KVCache", "RaggedKVCache", "Transformer", "generate_batch",
           "generate_tree", "MinispecError"]
__version__ = "0.1.0"
