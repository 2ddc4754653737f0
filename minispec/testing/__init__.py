"""minispec.testing: hypothesis strategies and invariant checks, reusable on your own code."""

from minispec.testing.strategies import model_configs, random_model, seeds, tiny_config, token_lists

__all__ = ["model_configs", "random_model", "seeds", "tiny_config", "token_lists"]
