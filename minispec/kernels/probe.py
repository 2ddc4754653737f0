"""Which kernel kind is fastest on this CPU, measured: one-row matrix-vector products of a model's
layer shape through each kind's linear layer, the median of a few calls, once per process.

    fastest_kind(("fast", "fp16", "int8-dynamic"), d, f, dtype)   -> the kind with the fastest step

A decode step is a few hundred such products, so the kind that streams a [f, d] weight fastest
is the kind whose step is fastest; the probe costs well under a second.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from minispec.kernels import fbgemm, packed

LINEARS = {"fast": packed.PackedLinear, "fp16": fbgemm.Fp16Linear, "int8-dynamic": fbgemm.DynamicInt8Linear}


@functools.cache
def fastest_kind(kinds: tuple[str, ...], hidden_size: int, intermediate_size: int, dtype: torch.dtype,
                 reps: int = 7) -> str:
    """The kind among `kinds` (keys of LINEARS) whose one-row product with a [intermediate_size,
    hidden_size] weight in `dtype` takes the least time (median of `reps` after one warm-up)."""
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(intermediate_size, hidden_size, generator=generator) / hidden_size ** 0.5).to(dtype)
    x = torch.randn(1, hidden_size, generator=generator)  # [1, d]
    seconds = {}
    with torch.inference_mode():
        for kind in kinds:
            layer = LINEARS[kind](weight, None)
            times = []
            for _ in range(reps + 1):
                t0 = time.perf_counter()
                layer(x)
                times.append(time.perf_counter() - t0)
            seconds[kind] = statistics.median(times[1:])
    return min(kinds, key=seconds.__getitem__)
