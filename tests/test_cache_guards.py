"""What the caches refuse, as properties: a rollback never moves a cache forward, a write never lands
past max_seq_len, a row index is a row, and a cache holds at least one position. Each refusal leaves
the cache as it was. (The state machines in minispec.testing drive the valid operations; these are
the invalid ones a direct caller can make, which the loops never do.)"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from minispec.batch.ragged_cache import RaggedKVCache
from minispec.errors import CacheOverflowError
from minispec.model.kv_cache import KVCache


def filled(max_len: int, length: int) -> KVCache:
    cache = KVCache(1, 1, 1, max_len, 2)
    cache.write(0, torch.ones(1, 1, length, 2), torch.ones(1, 1, length, 2))
    cache.advance(length)
    return cache


@given(max_len=st.integers(1, 12), data=st.data())
def test_a_kv_cache_rolls_back_never_forward_and_writes_never_past_its_end(max_len, data):
    length = data.draw(st.integers(0, max_len))
    cache = filled(max_len, length)
    target = data.draw(st.integers(-3, max_len + 3))
    if 0 <= target <= length:
        cache.truncate(target)
        assert cache.length == target
        return
    with pytest.raises(ValueError, match=r"^KVCache.truncate: length = "):
        cache.truncate(target)
    assert cache.length == length  # refused: unchanged
    extra = max_len - length + data.draw(st.integers(1, 3))
    with pytest.raises(CacheOverflowError, match="exceeds max_seq_len"):
        cache.write(0, torch.ones(1, 1, extra, 2), torch.ones(1, 1, extra, 2))
    with pytest.raises(CacheOverflowError):
        cache.advance(extra)
    assert cache.length == length


@pytest.mark.parametrize("cls", [KVCache, RaggedKVCache])
@pytest.mark.parametrize("max_len", [0, -1])
def test_a_cache_holds_at_least_one_position(cls, max_len):
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: max_seq_len = {max_len}"):
        cls(1, 2, 1, max_len, 2)


@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=4), data=st.data())
def test_a_ragged_cache_refuses_what_would_grow_a_row_or_name_no_row(lengths, data):
    rows, max_len = len(lengths), 8
    cache = RaggedKVCache(1, rows, 1, max_len, 2)
    cache.set_length(0, lengths[0])  # set_length: each row its own length, as a pass through row(b) leaves it
    for b, n in enumerate(lengths):
        cache.set_length(b, n)
    assert cache.lengths == lengths
    grown = list(lengths)
    b = data.draw(st.integers(0, rows - 1))
    grown[b] += data.draw(st.integers(1, 3))
    for bad in (grown, lengths + [0], lengths[:-1], [-1] + lengths[1:]):
        if bad == lengths[:-1] and rows == 1:
            bad = []
        with pytest.raises(ValueError, match=r"^RaggedKVCache.truncate: lengths = "):
            cache.truncate(bad)
        assert cache.lengths == lengths
    for bad in ([rows], [-1], list(range(rows)) + [rows]):
        with pytest.raises(ValueError, match=r"^RaggedKVCache.keep_rows: rows = "):
            cache.keep_rows(bad)
        assert cache.lengths == lengths
    for bad in (-1, max_len + 1):
        with pytest.raises(ValueError, match=r"^RaggedKVCache.set_length: length = "):
            cache.set_length(b, bad)
    assert cache.lengths == lengths
    longest = max(lengths)
    with pytest.raises(CacheOverflowError, match="exceeds max_seq_len"):
        cache.check_room(max_len - longest + 1)
    cache.check_room(max_len - longest)  # exactly full fits
    extra = max_len - longest + 1
    with pytest.raises(CacheOverflowError, match="exceeds max_seq_len"):
        cache.write(0, torch.ones(rows, 1, extra, 2), torch.ones(rows, 1, extra, 2))
    assert cache.lengths == lengths
