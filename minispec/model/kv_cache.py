"""KVCache: preallocated per-layer key/value buffers that can roll back rejected drafts.

Speculative decoding writes the keys and values of gamma draft tokens, then learns that only
some of them were right. Rolling back must be O(1): we keep one `length` for the whole cache
and simply lower it. Entries beyond `length` are stale and are never read: every attention call
reads `[:, :, :length]`, and the next write overwrites them.

Layout (per layer), K and V stored *before* the grouped-query repeat, so the cache is
num_kv_heads wide, not num_heads wide:

    k[layer]: [B, n_kv_heads, max_seq_len, head_dim]
    v[layer]: [B, n_kv_heads, max_seq_len, head_dim]

A forward pass of T tokens at offset `start = cache.length` asks the cache where they go
(`positions`: start..start+T-1, and `mask`: causal from start), writes positions [start, start+T)
in every layer (`write`) and then advances `length` once (`advance`). Writing past max_seq_len
raises CacheOverflowError; it never wraps or silently drops entries.
"""

from __future__ import annotations

import torch

from minispec.errors import CacheOverflowError


def causal_mask(start: int, num_new: int, device: torch.device) -> torch.Tensor | None:
    """Which cached positions each new token may attend to: [T, start+T] bool, or None.

    New token i sits at absolute position start+i and sees keys j <= start+i. The first
    `start` columns (the cache) are all visible; only j > start+i is masked. A single new
    token sees everything, so no mask is needed (and SDPA takes its fastest path).
    """
    if num_new == 1:
        return None
    query_pos = torch.arange(start, start + num_new, device=device)[:, None]  # [T, 1]
    key_pos = torch.arange(start + num_new, device=device)[None, :]  # [1, S]
    return key_pos <= query_pos  # [T, S]


class KVCache:
    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if max_seq_len < 1:
            raise ValueError(f"KVCache: max_seq_len = {max_seq_len}; expected a positive integer")
        shape = (batch_size, num_kv_heads, max_seq_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_seq_len = max_seq_len
        self.length = 0  # number of valid positions, the same in every layer

    @classmethod
    def over(cls, k: list[torch.Tensor], v: list[torch.Tensor], length: int) -> "KVCache":
        """A cache over existing per-layer buffers [B, n_kv_heads, max_seq_len, head_dim], without
        a copy: writes land in them (RaggedKVCache.row hands out one row of a batch this way)."""
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.max_seq_len, cache.length = k, v, k[0].shape[2], length
        return cache

    @property
    def num_layers(self) -> int:
        return len(self.k)

    def check_room(self, num_new: int) -> None:
        """Raise CacheOverflowError unless `num_new` more positions fit."""
        if self.length + num_new > self.max_seq_len:
            raise CacheOverflowError(
                f"KV cache: {self.length} cached + {num_new} new tokens exceeds max_seq_len={self.max_seq_len}; "
                f"create the cache with a larger max_seq_len"
            )

    def positions(self, num_new: int) -> torch.Tensor:
        """Absolute positions of the next `num_new` tokens: [T] = length .. length+T-1 (what RoPE rotates by)."""
        return torch.arange(self.length, self.length + num_new, device=self.k[0].device)

    def mask(self, num_new: int) -> torch.Tensor | None:
        """Which keys the next `num_new` tokens may attend to: causal_mask(length, T)."""
        return causal_mask(self.length, num_new, self.k[0].device)

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys/values of one layer at [length, length+T); return all valid ones.

        k_new, v_new: [B, n_kv_heads, T, head_dim]
        returns k, v: [B, n_kv_heads, length+T, head_dim] (views into the buffers)
        `length` itself moves only in `advance`, once every layer has written.
        """
        start = self.length
        end = start + k_new.shape[2]
        if end > self.max_seq_len:  # the model checks first; this guards direct callers
            self.check_room(k_new.shape[2])
        self.k[layer].narrow(2, start, end - start).copy_(k_new)  # the positions dim: [start, end)
        self.v[layer].narrow(2, start, end - start).copy_(v_new)
        return self.k[layer].narrow(2, 0, end), self.v[layer].narrow(2, 0, end)

    def advance(self, num_new: int) -> None:
        """Mark `num_new` freshly written positions as valid (called once per forward pass)."""
        self.check_room(num_new)
        self.length += num_new

    def truncate(self, length: int) -> None:
        """Roll back to the first `length` positions (e.g. drop rejected draft tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"KVCache.truncate: length = {length}; expected 0 <= length <= {self.length}")
        self.length = length

    def __repr__(self) -> str:
        b, h, s, d = self.k[0].shape
        return f"KVCache(layers={self.num_layers}, batch={b}, kv_heads={h}, head_dim={d}, length={self.length}/{s})"
