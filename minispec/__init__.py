"""minispec: a minimal, property-tested PyTorch reference for speculative decoding.

Reading order (each file one concept; its docstring gives the math):

 1. speculative.py         the loop: prefill, draft, verify gamma+1 rows, decide, roll back; stats.py: tau and co.
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

from minispec.checkpoint import load_model
from minispec.config import ModelConfig
from minispec.errors import MinispecError
from minispec.kv_cache import KVCache
from minispec.model import Transformer


def load_tokenizer(path):
    """The checkpoint's tokenizer (tokenizer.json + chat template); see minispec.tokenizer."""
    from minispec.tokenizer import load_tokenizer as _load

    return _load(path)


__all__ = ["load_model", "load_tokenizer", "ModelConfig", "KVCache", "Transformer", "MinispecError"]
__version__ = "0.1.0"
