"""minispec.testing: hypothesis strategies and invariant checks, reusable on your own code.

    from minispec.testing import check_policy, check_cache
    check_policy(MyPolicy)     # every invariant that applies to it; raises CheckFailed if one fails
    check_cache(MyCache)       # the append / verify / truncate state machine
    check_ragged_cache(MyBatchCache)   # the same for a batch whose rows have their own lengths
    check_recurrent_state(MyStateCheckpoints)   # recurrent state: verify passes, then zero-draft steps

Strategies (model_configs, random_model, token_lists, seeds, verify_inputs) build your own
properties; verify_input builds a policy input from plain lists for table-style tests;
watch_caches checks a model's caches against recomputation during a real run.
"""

from minispec.testing.cache_machine import make_cache_machine, make_ragged_cache_machine
from minispec.testing.cache_watch import CacheMismatch, assert_cache_matches, watch_caches
from minispec.testing.checks import CheckFailed, check_cache, check_policy, check_ragged_cache, verify_inputs
from minispec.testing.distribution import chi_square_p_value, sequence_distribution
from minispec.testing.profiles import load_profile
from minispec.testing.recurrent_state import check_recurrent_state
from minispec.testing.strategies import loop_setups, model_configs, random_model, seeds, tiny_config, token_lists
from minispec.testing.tables import decided, verify_input

__all__ = [
    "check_policy", "check_cache", "check_ragged_cache", "CheckFailed", "verify_inputs", "make_cache_machine",
    "make_ragged_cache_machine", "check_recurrent_state", "watch_caches",
    "assert_cache_matches", "CacheMismatch", "sequence_distribution", "chi_square_p_value", "load_profile",
    "loop_setups", "model_configs", "random_model", "seeds", "tiny_config", "token_lists", "verify_input", "decided",
]
