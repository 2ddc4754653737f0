"""A hypothesis state machine that drives a KV cache through appends, verify-sized chunks and
rollbacks, checking every model output against a from-scratch forward over the token list.

Works with any cache class that has KVCache's constructor and the four methods the model calls
(check_room, write, advance, truncate) plus `length` and `max_seq_len`: pass it as
`cache_factory` to `make_cache_machine`, or use `minispec.testing.check_cache`.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minispec.kv_cache import KVCache
from minispec.testing.strategies import model_configs, random_model, seeds

ATOL = 1e-9  # float64 models: chunked and full passes agree to ~1e-14


def make_cache_machine(cache_factory=KVCache, max_len: int = 40) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class testing caches built by `cache_factory(num_layers,
    batch_size, num_kv_heads, max_seq_len, head_dim, dtype=..., device=...)`."""

    class CacheMachine(RuleBasedStateMachine):
        @initialize(cfg=model_configs(), seed=seeds)
        def setup(self, cfg, seed):
            self.model = random_model(cfg, seed)
            self.cache = cache_factory(cfg.num_layers, 1, cfg.num_kv_heads, max_len, cfg.head_dim,
                                       dtype=torch.float64, device="cpu")
            self.tokens: list[int] = []
            self.vocab = cfg.vocab_size

        def _feed(self, new: list[int]) -> None:
            got = self.model(torch.tensor([new]), self.cache)[0]  # [T, V]
            self.tokens += new
            want = self.model(torch.tensor([self.tokens]))[0, -len(new):]  # from scratch, no cache
            err = (got - want).abs().max().item()
            assert err <= ATOL, (f"after feeding {new} the logits differ from a from-scratch forward over "
                                 f"{len(self.tokens)} tokens by {err:.3g}")

        @precondition(lambda self: len(self.tokens) < max_len)
        @rule(data=st.data())
        def append_one(self, data):  # a decode step
            self._feed([data.draw(st.integers(0, self.vocab - 1), label="token")])

        @precondition(lambda self: len(self.tokens) + 6 <= max_len)
        @rule(data=st.data(), n=st.integers(2, 6))
        def append_chunk(self, data, n):  # a prefill piece or a (gamma+1)-token verify pass
            self._feed(data.draw(st.lists(st.integers(0, self.vocab - 1), min_size=n, max_size=n), label="chunk"))

        @precondition(lambda self: len(self.tokens) > 0)
        @rule(data=st.data())
        def truncate(self, data):  # roll back rejected drafts
            n = data.draw(st.integers(0, len(self.tokens)), label="keep")
            self.cache.truncate(n)
            self.tokens = self.tokens[:n]

        @invariant()
        def length_matches(self):
            if hasattr(self, "cache"):
                assert self.cache.length == len(self.tokens), \
                    f"cache.length = {self.cache.length}, but {len(self.tokens)} tokens are committed"

    return CacheMachine
