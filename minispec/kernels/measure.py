"""What this CPU does: timing that survives a drifting machine, the memory bandwidth, and the cost of
a pass of k rows against a decode step. The benchmarks in scripts/ and the kernel choice share them.

    time_interleaved({name: fn}, reps)   median seconds of each fn, the fns taking turns per repetition
    bandwidth()                          GB/s streaming weights through a matrix-vector product:
                                         the bound B on plain decoding is B / (bytes read per token)
    pass_costs(model, cache, widths)     seconds of one pass of k new tokens per row, for each k
    fastest_kind(kinds, d, f, dtype)     the kernel kind whose one-row [f, d] product is fastest here
                                         (what --draft-kernels auto picks; once per process and shape)

A verify pass scores gamma + 1 rows; decoding is bound by reading the weights, so on a machine with
arithmetic to spare pass(gamma + 1) ~ pass(1), and speculation pays tau x pass(1) / (gamma x
draft + pass(gamma + 1)).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from minispec.kernels.fbgemm import DynamicInt8Linear, Fp16Linear
from minispec.kernels.fbgemm import available as fbgemm_available
from minispec.kernels.nf4 import Nf4Linear
from minispec.kernels.nf4 import available as nf4_available
from minispec.kernels.packed import PackedLinear, packs


def time_interleaved(fns: dict, reps: int, warmup: int = 1) -> dict:
    """Median seconds of each function over `reps` repetitions, after `warmup` untimed ones.

    Within a repetition the functions take turns, so a drift in the machine's speed (another process,
    a frequency change) moves them all alike and their ratios stay meaningful.
    """
    samples: dict = {name: [] for name in fns}
    for repetition in range(warmup + reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
            if repetition >= warmup:
                samples[name].append(seconds)
    return {name: statistics.median(values) for name, values in samples.items()}


def timed(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Median seconds of fn() over `reps` calls after `warmup` untimed ones."""
    return time_interleaved({"fn": fn}, reps, warmup)["fn"]


def bandwidth(mib: int = 256, reps: int = 12) -> dict:
    """GB/s of a one-row matrix-vector product streaming `mib` MiB of weights (far more than the
    caches hold), through every kernel this CPU runs: F.linear in float32 and bfloat16, oneDNN's
    packed kernel for each dtype it packs here, fbgemm's float16 and int8 weights where torch has
    them, and the nf4 kind's 4-bit weights where it runs (some CPUs stream these faster than any
    float32 or bfloat16 kernel: the bound must read at least what the fastest kernel reads). bandwidth_gbps is
    the fastest: the rate weights can be read at. A kernel the CPU lacks is left out, never an error."""
    result = {}
    x = torch.randn(1, 4096)  # [1, in]
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            rows = mib * 2**20 // (4096 * dtype.itemsize)
            weight = torch.randn(rows, 4096).to(dtype)  # [out, in]
            nbytes = weight.numel() * dtype.itemsize
            name = str(dtype).removeprefix("torch.")
            dense = lambda w=weight: torch.nn.functional.linear(x.to(dtype), w)  # noqa: E731
            result[f"f_linear_{name}_gbps"] = nbytes / timed(dense, reps) / 1e9
            if packs(dtype):
                packed = PackedLinear(weight, None)
                result[f"packed_{name}_gbps"] = nbytes / timed(lambda: packed(x), reps) / 1e9
                del packed
            del weight
        if fbgemm_available():
            for name, layer, itemsize in (("fbgemm_fp16", Fp16Linear, 2), ("fbgemm_int8", DynamicInt8Linear, 1)):
                rows = mib * 2**20 // (4096 * itemsize)
                packed = layer(torch.randn(rows, 4096) / 64, None)  # [out, in], packed in its own format
                result[f"{name}_gbps"] = rows * 4096 * itemsize / timed(lambda: packed(x), reps) / 1e9
                del packed
        if nf4_available():  # 4.25 bits a weight: 4, and a bfloat16 maximum per 64 weights
            rows = mib * 2**20 * 32 // (4096 * 17) // 32 * 32
            packed = Nf4Linear(torch.randn(32, 4096), None)  # then random codes of the full size: the
            packed.out_features = rows  # kernel's speed does not depend on them, and quantizing
            packed.packed = torch.randint(0, 256, (rows, 2048), dtype=torch.uint8)  # rows this many costs GBs
            packed.maxima = torch.rand(4096 // 64, rows).to(torch.bfloat16)
            result["nf4_gbps"] = rows * 4096 * 17 / 32 / timed(lambda: packed(x), reps) / 1e9
            del packed
    result["bandwidth_gbps"] = max(result.values())
    return result


def pass_costs(model, cache, widths: Sequence[int], rollback: Callable[[], None], batch_size: int = 1,
               reps: int = 10) -> dict[int, float]:
    """Median seconds of one target pass of [batch_size, k] new tokens (the blocks, then the LM head on
    all batch_size x k rows, as a verify scores them) for each k in widths, on `cache` as it stands;
    rollback() puts the cache back after each pass, so every pass sees the same context. The tokens
    are zeros: what they are does not change the cost. k = 1 is a decode step."""
    with torch.inference_mode():
        return time_interleaved({k: one_pass(model, cache, k, rollback, batch_size) for k in widths}, reps)


def one_pass(model, cache, k: int, rollback: Callable[[], None], batch_size: int = 1,
             num_layers: int | None = None) -> Callable[[], None]:
    """A function that runs one pass of [batch_size, k] new tokens (zeros) through the model's first
    num_layers blocks (all if None) and its LM head on every row, then rollback(): what pass_costs
    times. Call it under torch.inference_mode()."""
    def run():
        hidden = model.forward_hidden(torch.zeros(batch_size, k, dtype=torch.long, device=model.device), cache,
                                      num_layers=num_layers)  # [B, k, d]
        model.head(hidden.reshape(batch_size * k, -1))  # [B*k, V]
        rollback()
    return run


LINEARS = {"fast": PackedLinear, "fp16": Fp16Linear, "int8-dynamic": DynamicInt8Linear, "nf4": Nf4Linear}  # kind -> its linear layer


@functools.cache
def fastest_kind(kinds: tuple[str, ...], hidden_size: int, intermediate_size: int, dtype: torch.dtype,
                 reps: int = 7) -> str:
    """The kind among `kinds` (keys of LINEARS) whose one-row product with a [intermediate_size,
    hidden_size] weight in `dtype` is fastest (median of `reps`). A decode step is a few hundred such
    products, so this is the kind whose step is fastest; the probe costs well under a second."""
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(intermediate_size, hidden_size, generator=generator) / hidden_size ** 0.5).to(dtype)
    x = torch.randn(1, hidden_size, generator=generator)  # [1, d]
    with torch.inference_mode():
        seconds = {kind: timed(lambda layer=LINEARS[kind](weight, None): layer(x), reps) for kind in kinds}
    return min(kinds, key=seconds.__getitem__)
