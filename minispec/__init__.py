"""minispec: a minimal, property-tested PyTorch reference for speculative decoding.

Reading guide: three chapters, each a folder read after what it depends on; each file one concept,
its docstring gives the math.

Chapter 1, the chain (chain/): draft, verify gamma+1 rows in one pass, decide, roll back
  chain/speculative.py    the loop, generate_chain: read it first
  chain/request.py, stats.py a call's results, callbacks and checks; tau and the rest, defined once
  chain/drafters.py       the drafter interface and its kinds; draft_length.py: how many to draft
  lab/pacing.py         a stream in fixed chunks at a fixed cadence: the accepted counts hidden
  acceptance/             base.py: what a policy sees and returns; one rule per file: exact.py,
                          sampling.py, block.py (and traversal's chain form), typical.py, lenience.py,
                          fly.py, ensemble.py, kl_judge.py, dropmatch/ (rule.py: Algorithm 1 as written;
                          lazy.py: its shortcuts)
  model/                  transformer.py and kv_cache.py (the cache that rolls back), config.py,
                          memory.py (every size checked before it is allocated), sampling.py (p and q)
Chapter 2, trees (trees/, after chapter 1): one pass scores every branch
  trees/tree.py           a draft tree: parents, depths, positions and the ancestors-only mask
  trees/drafters.py       n-gram and model trees (static, or EAGLE-2's dynamic); TreeSpec
  trees/walks/            each policy as a walk down the tree, one rule per file, in a registry
  trees/speculative.py    the loop over trees, generate_tree
Chapter 3, batches (batch/, after chapter 1): several prompts, each row exactly as if alone
  batch/ragged_cache.py   one cache, a length, positions and a mask per row
  batch/drafters.py       drafting for every row at once
  batch/speculative.py    the loop over a batch, generate_batch
Above the chapters: decode.py (minispec.decode.generate, the front door that hands a call to a
chapter's loop), generate/ (the command line: flags.py, policy_spec.py, prompts.py, run.py,
printing.py, trace.py) and testing/ (the invariants as a library: check_policy, check_cache,
watch_caches).
Beside them, the wings: checkpoints/ (a name, folder or hub id to a model and tokenizer; fetch and
convert GGUF files), kernels/ (the same model made fast on CPU: kernels.apply(model, "fast")).
The lab (lab/, not for a first reading): what the docs measured, never imported by the reference.
"""

from importlib import import_module

# The names below load on first use (PEP 562), so that `import minispec.errors` or the CLI's first
# lines do not wait for torch. The front door is minispec.decode.generate; minispec.generate is the
# command line's package (`python -m minispec.generate`).
_LAZY = {"load_model": "minispec.checkpoints.load", "load_tokenizer": "minispec.checkpoints.tokenizer",
         "ensure_default_checkpoint": "minispec.checkpoints.fetch", "ModelConfig": "minispec.model.config",
         "Transformer": "minispec.model.transformer", "KVCache": "minispec.model.kv_cache",
         "make_drafter": "minispec.chain.drafters", "generate_chain": "minispec.chain.speculative",
         "generate_tree": "minispec.trees.speculative", "RaggedKVCache": "minispec.batch.ragged_cache",
         "generate_batch": "minispec.batch.speculative"}
from minispec.errors import MinispecError  # noqa: E402 (no torch)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "generate":  # a submodule not imported yet: say where the function is
        raise AttributeError("module 'minispec' has no attribute 'generate': the front door is "
                             "minispec.decode.generate; minispec.generate is the command line's package")
    raise AttributeError(f"module 'minispec' has no attribute {name!r}")


__all__ = ["load_model", "load_tokenizer", "ensure_default_checkpoint", "make_drafter", "ModelConfig",
           "Transformer", "KVCache", "RaggedKVCache", "generate_chain", "generate_tree", "generate_batch",
           "MinispecError"]
__version__ = "0.1.0"
