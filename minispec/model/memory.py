"""What the machine can hold: every size a user gives is checked against it before it allocates.

    available_bytes(device)            memory free for new tensors: /proc/meminfo's MemAvailable on
                                       the CPU, torch.cuda.mem_get_info on a GPU; None if unknown
    check_fits(nbytes, what, device)   a one-line MinispecError when `what` needs more than that
    kv_cache_bytes(config, ...)        what Transformer.new_cache(batch, positions) allocates
    verify_bytes(config, rows, ...)    one verify pass of `rows` new rows: their logits, attention
                                       scores and mask, and MLP activations

The estimates count the large tensors (the KV cache, [rows, V] logits, [rows, L] masks and
scores) and not Python's own overhead: a run they pass can still run short of memory when the
machine is shared, but no single flag can ask for a 77 GB tensor and end in a traceback.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minispec.model.config import ModelConfig
from minispec.errors import MinispecError

__all__ = ["available_bytes", "check_fits", "kv_cache_bytes", "verify_bytes", "gib"]


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Bytes free for new tensors on `device`, or None where the platform does not say."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def check_fits(nbytes: int, what: str, device: torch.device | str = "cpu", expected: str = "a smaller size") -> None:
    """MinispecError "<what> needs about X GiB; Y GiB is available on <device>; expected <expected>"
    when nbytes exceeds what `device` has free (no check where that is unknown)."""
    free = available_bytes(device)
    if free is not None and nbytes > free:
        raise MinispecError(f"{what} needs about {gib(nbytes)}; {gib(free)} is available on {torch.device(device)}; "
                            f"expected {expected}")


def kv_cache_bytes(config: ModelConfig, batch_size: int, positions: int, dtype: torch.dtype,
                   num_layers: int | None = None) -> int:
    """Bytes of a KVCache of `positions` positions for `batch_size` rows: K and V per layer,
    each [batch, kv_heads, positions, head_dim] in `dtype`."""
    element = torch.empty((), dtype=dtype).element_size()
    layers = num_layers or config.num_layers
    return 2 * layers * batch_size * config.num_kv_heads * positions * config.head_dim * element


def verify_bytes(config: ModelConfig, rows: int, context: int, dtype: torch.dtype, batch_size: int = 1) -> int:
    """Bytes one verify pass of `rows` new rows over `context` cached positions allocates beyond
    the weights: its [rows, V] float32 logits (and their softmax), the attention's [heads, rows,
    context + rows] scores and [rows, context + rows] mask, and the MLP's [rows, intermediate]
    activations, per batch row."""
    element = torch.empty((), dtype=dtype).element_size()
    width = context + rows
    per_row = (2 * 4 * config.vocab_size + (config.num_heads * 4 + 1) * width
               + 3 * element * config.intermediate_size + 4 * element * config.hidden_size)
    return batch_size * rows * per_row
