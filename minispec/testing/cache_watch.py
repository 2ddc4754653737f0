"""Watch a model's KV caches during a run and compare them with a from-scratch recomputation.

`watch_caches(model)` wraps `model.forward_hidden` so that every cache it is called with is
shadowed by the plain list of tokens written at each position. Before every call, the cached
keys and values [:length] must equal those of a fresh cache filled by one forward pass over
the shadow tokens [:length]: stale entries from rejected drafts, an off-by-one rollback or a
missing catch-up all show up as a mismatch at the first step after the bug.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from minispec.model.kv_cache import KVCache


class CacheMismatch(AssertionError):
    pass


def recompute_cache(model, tokens: list[int], num_layers: int | None, max_seq_len: int) -> KVCache:
    """A fresh cache holding tokens [0, len) of one from-scratch forward pass."""
    fresh = model.new_cache(1, max_seq_len, num_layers=num_layers)
    if tokens:
        type(model).forward_hidden(model, torch.tensor([tokens], device=model.device), fresh, num_layers=num_layers)
    return fresh


def assert_cache_matches(model, cache: KVCache, tokens: list[int], num_layers: int | None = None, atol: float = 1e-9) -> None:
    """The cache's valid region equals a from-scratch recomputation over `tokens`.

    With num_layers = N (an early-exit call) only the first N layers are compared: that call
    reads no others (an early-exit draft sharing the target's cache leaves the deeper layers of
    its draft positions unwritten; the target's next pass writes them before reading them).
    """
    if cache.length != len(tokens):
        raise CacheMismatch(f"cache.length = {cache.length}, but {len(tokens)} tokens were committed")
    fresh = recompute_cache(model, tokens, num_layers, cache.max_seq_len)
    for layer in range(num_layers or cache.num_layers):
        for name, got, want in (("k", cache.k[layer], fresh.k[layer]), ("v", cache.v[layer], fresh.v[layer])):
            diff = (got[:, :, : cache.length] - want[:, :, : cache.length]).abs()
            if diff.numel() and diff.max().item() > atol:
                pos = int(diff.amax(dim=(0, 1, 3)).argmax())
                raise CacheMismatch(f"layer {layer} {name}: position {pos} differs from recomputation by {diff.max().item():.3g}")


@contextmanager
def watch_caches(model, atol: float = 1e-9):
    """Check every cache passed to model.forward_hidden before each call (see module doc).

    Yields the dict {id(cache): shadow token list} so a test can also compare the committed
    sequence with what the caches hold at the end.
    """
    shadows: dict[int, list[int]] = {}
    original = model.forward_hidden

    def checked(input_ids, cache=None, *, num_layers=None):
        if cache is not None:
            shadow = shadows.setdefault(id(cache), [])
            if cache.length > len(shadow):
                raise CacheMismatch(f"cache.length = {cache.length} but only {len(shadow)} positions were ever written")
            del shadow[cache.length:]  # whatever lies beyond length was rolled back
            assert_cache_matches(model, cache, shadow, num_layers, atol)
            shadow.extend(input_ids[0].tolist())
        return original(input_ids, cache, num_layers=num_layers)

    model.forward_hidden = checked
    try:
        yield shadows
    finally:
        del model.forward_hidden  # back to the class method
