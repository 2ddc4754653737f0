"""minispec: a minimal, property-tested PyTorch reference for speculative decoding.

Reading order: config.py -> model.py -> kv_cache.py -> checkpoint.py -> sampling.py ->
speculative.py (the loop) -> acceptance/ (the policies) -> drafters.py -> generate.py (the CLI).
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
