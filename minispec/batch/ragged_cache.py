"""RaggedKVCache: one KV cache for a batch of sequences that each have their own length.

Batched speculative decoding is ragged by nature: every row accepts its own number of drafts,
so after each step every row has its own length. This cache keeps one `lengths[b]` per row and
places each row's tokens at that row's own positions. No left padding: a row's token at position
t is rotated by RoPE as t, as it would be decoded alone.

Layout (per layer), as KVCache's:

    k[layer], v[layer]: [B, n_kv_heads, max_seq_len, head_dim]
    lengths:            [B]   valid positions of each row, 0 <= lengths[b] <= max_seq_len

A forward pass of T tokens per row writes row b's tokens at positions [lengths[b], lengths[b]+T)
(`write`, through `positions`), then every row advances by T (`advance`). Rows that need fewer
than T new tokens (a shorter prompt, a shorter draft) are padded on the right and rolled back
after the pass with a per-row `truncate`: a pad only ever comes after a row's real tokens, and
attention is causal, so no real token sees one. A long chunk (a prompt) can instead go through
one row alone, `row(b)`: a single-sequence KVCache over row b's memory (`feed_ragged` does this
for prefills, where pads would cost compute).

Attention reads the first S = max(lengths) + T positions of every row. Row b's query i (position
lengths[b] + i) may attend to key j iff

    j <= lengths[b] + i                                          (`mask`: [B, 1, T, S])

which covers its own cached positions and its earlier new tokens, and nothing at or beyond its
own end: another row is longer, so row b's columns past its end hold stale keys (rolled-back
drafts, pads). A row never reads another row's keys at all: the batch dim is never mixed.

Rows that finish (eos, max_new_tokens) stop costing work: `keep_rows` drops them from the
buffers, once, when they finish, and every later pass runs only the rows still going.
Rolling back is O(1) per row, as in KVCache: entries past lengths[b] are never read and the
next write overwrites them.
"""

from __future__ import annotations

from typing import Sequence

import torch

from minispec.errors import CacheOverflowError
from minispec.model.kv_cache import KVCache

PAD_ID = 0  # the token fed where a row has nothing to feed; rolled back before anyone reads it


class RaggedKVCache:
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
            raise ValueError(f"RaggedKVCache: max_seq_len = {max_seq_len}; expected a positive integer")
        shape = (batch_size, num_kv_heads, max_seq_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_seq_len = max_seq_len
        self._set_lengths([0] * batch_size)  # lengths: valid positions per row (and _lengths, as a tensor)

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    def _set_lengths(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self._lengths = torch.tensor(lengths, dtype=torch.long, device=self.k[0].device)
        self._write_index = None  # (rows [B, 1], positions [B, T]) of the next pass, built by its first write

    def check_room(self, num_new: int) -> None:
        """Raise CacheOverflowError unless `num_new` more positions fit in every row."""
        longest = max(self.lengths, default=0)
        if longest + num_new > self.max_seq_len:
            raise CacheOverflowError(
                f"ragged KV cache: a row of {longest} cached + {num_new} new tokens exceeds "
                f"max_seq_len={self.max_seq_len}; create the cache with a larger max_seq_len"
            )

    def positions(self, num_new: int) -> torch.Tensor:
        """Absolute positions of the next `num_new` tokens of every row: [B, T] = lengths[b] + i."""
        return self._lengths[:, None] + torch.arange(num_new, device=self._lengths.device)

    def mask(self, num_new: int) -> torch.Tensor:
        """Which keys each new token may attend to: [B, 1, T, S] bool, S = max(lengths) + T.

        Row b's query i sits at position lengths[b] + i and sees keys j <= lengths[b] + i: its own
        past and nothing past its own end (module docstring). The 1 broadcasts over heads.
        """
        span = max(self.lengths, default=0) + num_new
        key_pos = torch.arange(span, device=self._lengths.device)  # [S]
        return (key_pos[None, None, :] <= self.positions(num_new)[:, :, None])[:, None]  # [B, 1, T, S]

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's new keys/values at each row's own positions; return the span attention reads.

        k_new, v_new: [B, n_kv_heads, T, head_dim]
        returns k, v: [B, n_kv_heads, S, head_dim], S = max(lengths) + T (views into the buffers;
        `mask` hides what a row must not see). `lengths` moves only in `advance`.
        """
        num_new = k_new.shape[2]
        span = max(self.lengths, default=0) + num_new
        if span > self.max_seq_len:  # the model checks first; this guards direct callers
            self.check_room(num_new)
        if self._write_index is None or self._write_index[1].shape[1] != num_new:  # once per pass, not per layer
            self._write_index = (torch.arange(self.batch_size, device=k_new.device)[:, None],  # [B, 1]
                                 self.positions(num_new))  # [B, T]
        rows, cols = self._write_index
        # advanced indices on dims 0 and 2 put them first: the target is [B, T, n_kv_heads, head_dim]
        self.k[layer][rows, :, cols] = k_new.transpose(1, 2)
        self.v[layer][rows, :, cols] = v_new.transpose(1, 2)
        return self.k[layer].narrow(2, 0, span), self.v[layer].narrow(2, 0, span)

    def advance(self, num_new: int) -> None:
        """Mark `num_new` freshly written positions of every row as valid (once per forward pass)."""
        self.check_room(num_new)
        self._set_lengths([n + num_new for n in self.lengths])

    def truncate(self, lengths: Sequence[int]) -> None:
        """Roll row b back to its first lengths[b] positions (drop its rejected drafts and pads)."""
        lengths = [int(n) for n in lengths]
        if len(lengths) != self.batch_size or not all(0 <= new <= old for new, old in zip(lengths, self.lengths)):
            raise ValueError(f"RaggedKVCache.truncate: lengths = {lengths}; expected {self.batch_size} values, "
                             f"each 0 <= lengths[b] <= the row's current length {self.lengths}")
        self._set_lengths(lengths)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these rows, in this order (the others finished): later passes run B' = len(rows)."""
        rows = [int(r) for r in rows]
        if rows == list(range(self.batch_size)):
            return
        if not all(0 <= r < self.batch_size for r in rows):
            raise ValueError(f"RaggedKVCache.keep_rows: rows = {rows}; expected indices in [0, {self.batch_size})")
        index = torch.tensor(rows, dtype=torch.long, device=self.k[0].device)
        self.k = [k.index_select(0, index) for k in self.k]  # one copy per finish event, not per step
        self.v = [v.index_select(0, index) for v in self.v]
        self._set_lengths([self.lengths[r] for r in rows])

    def row(self, index: int) -> KVCache:
        """Row `index` alone, as a single-sequence KVCache over this cache's memory (no copy):
        a pass through it writes that row only. Set the row's new length with `set_length`."""
        return KVCache.over([k[index:index + 1] for k in self.k], [v[index:index + 1] for v in self.v],
                            self.lengths[index])

    def set_length(self, index: int, length: int) -> None:
        """Row `index` now holds `length` valid positions (after a pass through `row(index)`)."""
        if not 0 <= length <= self.max_seq_len:
            raise ValueError(f"RaggedKVCache.set_length: length = {length}; expected 0..{self.max_seq_len}")
        self._set_lengths([length if r == index else n for r, n in enumerate(self.lengths)])

    def __repr__(self) -> str:
        b, h, s, d = self.k[0].shape
        return f"RaggedKVCache(layers={self.num_layers}, batch={b}, kv_heads={h}, head_dim={d}, lengths={self.lengths}/{s})"


ROW_BY_ROW_ABOVE = 8  # chunks longer than this (prompts) are fed one row at a time


def feed_ragged(model, chunks: list[list[int]], cache: RaggedKVCache, num_layers: int | None = None) -> torch.Tensor:
    """Feed chunks[r] at the end of cache row r, each row its own number of tokens; the logits
    after each row's last token: [R, V] (a batched prefill, or a draft model's catch-up).

    `model` is a minispec Transformer. Short chunks (a catch-up of a token or two) go in one pass,
    right-padded to the longest and then rolled back (module docstring): that pass is memory-bound,
    so the batch shares one read of the weights. Long ones (prompts, more than ROW_BY_ROW_ABOVE
    tokens somewhere) go one row at a time through `row(r)`: such a pass is compute-bound, so pads
    would cost their full share, and a single row from position 0 takes attention's causal path.
    Every chunk must be non-empty. Only each row's last real position goes through the LM head.
    """
    device = model.device
    if max(len(chunk) for chunk in chunks) > ROW_BY_ROW_ABOVE:
        last_hidden = []
        for r, chunk in enumerate(chunks):
            row = cache.row(r)
            last_hidden.append(model.forward_hidden(torch.tensor([chunk], device=device), row,
                                                    num_layers=num_layers)[0, -1])  # [d]
            cache.set_length(r, row.length)
        return model.head(torch.stack(last_hidden))  # [R, V]
    longest = max(len(chunk) for chunk in chunks)
    ids = torch.tensor([chunk + [PAD_ID] * (longest - len(chunk)) for chunk in chunks], device=device)
    before = list(cache.lengths)
    hidden = model.forward_hidden(ids, cache, num_layers=num_layers)  # [R, longest, d]
    cache.truncate([n + len(chunk) for n, chunk in zip(before, chunks)])
    last = torch.tensor([len(chunk) - 1 for chunk in chunks], device=hidden.device)  # each row's last real token
    return model.head(hidden[torch.arange(len(chunks), device=hidden.device), last])  # [R, V]
