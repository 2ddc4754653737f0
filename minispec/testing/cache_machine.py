"""A hypothesis state machine that drives a KV cache through appends, verify-sized chunks and
rollbacks, checking every model output against a from-scratch forward over the token list.

Works with any cache class that has KVCache's constructor and the methods the model calls
(check_room, positions, mask, write, advance, truncate) plus `length` and `max_seq_len`: pass it as
`cache_factory` to `make_cache_machine`, or use `minispec.testing.check_cache`.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minispec.model.kv_cache import KVCache
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


def make_ragged_cache_machine(cache_factory=None, batch_size: int = 3,
                              max_len: int = 40) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class testing a ragged batch cache (minispec.batch.ragged_cache's
    interface: lengths, check_room, positions, mask, write, advance, truncate(lengths), keep_rows,
    row, set_length)
    built by `cache_factory(num_layers, batch_size, num_kv_heads, max_seq_len, head_dim, dtype=...,
    device=...)`, default RaggedKVCache.

    Rules: a ragged append (row r gets its own 0..6 new tokens, right-padded to the longest and
    rolled back to its own count, as a catch-up or verify pass does), one row fed alone through
    `row(r)` (as a prefill is), a per-row rollback, and rows leaving the batch. After every append, each row's logits must equal a
    from-scratch forward over that row's tokens alone; after every rule, each row's keys and
    values must equal those of a single-row KVCache built from scratch on that row's tokens.
    """
    from minispec.batch.ragged_cache import PAD_ID, RaggedKVCache

    factory = cache_factory or RaggedKVCache

    class RaggedCacheMachine(RuleBasedStateMachine):
        @initialize(cfg=model_configs(), seed=seeds)
        def setup(self, cfg, seed):
            self.model = random_model(cfg, seed)
            self.cache = factory(cfg.num_layers, batch_size, cfg.num_kv_heads, max_len, cfg.head_dim,
                                 dtype=torch.float64, device="cpu")
            self.rows: list[list[int]] = [[] for _ in range(batch_size)]  # each row's committed tokens
            self.vocab = cfg.vocab_size

        def room(self) -> int:
            return max_len - max(map(len, self.rows))  # a padded pass needs it in every row

        @precondition(lambda self: self.room() > 0)
        @rule(data=st.data())
        def append_ragged(self, data):  # a catch-up or a padded verify pass
            most = min(6, self.room())
            counts = data.draw(st.lists(st.integers(0, most), min_size=len(self.rows), max_size=len(self.rows))
                               .map(lambda c: c if max(c) > 0 else [most] + c[1:]), label="new tokens per row")
            new = [data.draw(st.lists(st.integers(0, self.vocab - 1), min_size=c, max_size=c), label=f"row {r}")
                   for r, c in enumerate(counts)]
            longest = max(counts)
            ids = torch.tensor([chunk + [PAD_ID] * (longest - len(chunk)) for chunk in new])  # [R, T]
            before = list(self.cache.lengths)
            got = self.model(ids, self.cache)  # [R, T, V]
            self.cache.truncate([n + c for n, c in zip(before, counts)])
            for r, chunk in enumerate(new):
                self.rows[r] += chunk
                if chunk:
                    want = self.model(torch.tensor([self.rows[r]]))[0, -len(chunk):]  # row r alone, no cache
                    err = (got[r, :len(chunk)] - want).abs().max().item()
                    assert err <= ATOL, (f"row {r}: after feeding {chunk} (batch counts {counts}) its logits "
                                         f"differ from a from-scratch forward over its {len(self.rows[r])} tokens "
                                         f"by {err:.3g}")

        @precondition(lambda self: min(map(len, self.rows)) < max_len)
        @rule(data=st.data())
        def append_one_row(self, data):  # a prompt fed to its own row alone, through row(r)
            r = data.draw(st.sampled_from([r for r, row in enumerate(self.rows) if len(row) < max_len]), label="row")
            most = min(6, max_len - len(self.rows[r]))
            chunk = data.draw(st.lists(st.integers(0, self.vocab - 1), min_size=1, max_size=most), label="chunk")
            view = self.cache.row(r)
            got = self.model(torch.tensor([chunk]), view)[0]  # [T, V]
            self.cache.set_length(r, view.length)
            self.rows[r] += chunk
            want = self.model(torch.tensor([self.rows[r]]))[0, -len(chunk):]
            err = (got - want).abs().max().item()
            assert err <= ATOL, (f"row {r}: after feeding {chunk} through row({r}) its logits differ from a "
                                 f"from-scratch forward over its {len(self.rows[r])} tokens by {err:.3g}")

        @precondition(lambda self: max(map(len, self.rows)) > 0)
        @rule(data=st.data())
        def truncate(self, data):  # each row rolls back its own rejected drafts
            keep = [data.draw(st.integers(0, len(row)), label=f"keep row {r}") for r, row in enumerate(self.rows)]
            self.cache.truncate(keep)
            self.rows = [row[:n] for row, n in zip(self.rows, keep)]

        @precondition(lambda self: len(self.rows) > 1)
        @rule(data=st.data())
        def finish_rows(self, data):  # rows that finished leave the batch
            keep = data.draw(st.lists(st.integers(0, len(self.rows) - 1), min_size=1, unique=True)
                             .map(sorted), label="rows kept")
            self.cache.keep_rows(keep)
            self.rows = [self.rows[r] for r in keep]

        @invariant()
        def rows_equal_fresh_single_caches(self):
            if not hasattr(self, "cache"):
                return
            assert list(self.cache.lengths) == [len(row) for row in self.rows], \
                f"cache.lengths = {list(self.cache.lengths)}, but the rows hold {[len(r) for r in self.rows]} tokens"
            for r, row in enumerate(self.rows):
                if not row:
                    continue
                fresh = self.model.new_cache(1, max_len)
                self.model(torch.tensor([row]), fresh)
                for layer in range(self.cache.num_layers):
                    for name in ("k", "v"):
                        mine = getattr(self.cache, name)[layer][r, :, :len(row)]
                        theirs = getattr(fresh, name)[layer][0, :, :len(row)]
                        err = (mine - theirs).abs().max().item()
                        assert err <= ATOL, (f"row {r}, layer {layer}: cached {name} differ from a single-row "
                                             f"cache built from scratch on its {len(row)} tokens by {err:.3g}")

    return RaggedCacheMachine
