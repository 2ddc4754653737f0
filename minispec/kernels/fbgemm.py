"""The fp16 and int8-dynamic kinds: fewer bytes per token through torch's own fbgemm kernels (lossy).

A decoding step reads every weight once, so its time is about bytes / bandwidth. float32 reads 4
bytes a weight, bfloat16 2; these kinds read fewer through kernels torch ships for x86 CPUs
(fbgemm, with AVX2 and AVX-512 paths alike):

    fp16           weights stored as float16, packed once (quantized.linear_prepack_fp16); each
                   matmul converts a tile to float32 and multiplies in float32:
                   y = x @ fp16(W)^T + b        2 bytes a weight, every rounding error of W <= 2^-11 |W|
    int8-dynamic   weights int8 per output row, s[j] = max_i |W[j, i]| / 127, q = round(W / s);
                   activations quantized per call (quantized.linear_dynamic: x's own range, uint8,
                   reduce_range) and multiplied in int32:
                   y ~ (x_q @ q^T) * s_x * s + b   1 byte a weight; the activations' rounding too

Both keep packed.py's rewrite (fused projections, float32 activations between the matmuls, the
embedding and K/V cache as they were); only the linear layers differ. Neither is the model's
function: greedy output can part from float32's, and docs/benchmarks.md measures how often.

Rows. fp16 treats every row of x alone: a verify pass of k rows gives each row what a one-row
step would (up to float32 summation order). int8-dynamic does not: s_x is one scale over the
whole call, so a row's output depends on the other rows beside it (a large row coarsens the
rest). A verify pass or a batch therefore rounds a row differently from a step, and a speculative
or batched int8-dynamic target need not reproduce its own plain greedy output. As a draft this
costs nothing but acceptance (the target decides); as a target, choose it knowingly.

torch 2.13 deprecates its quantized-tensor constructors (torch.quantize_per_channel), which
int8-dynamic needs to hand fbgemm a per-channel qint8 weight. They are used here and nowhere
else; tests/test_kernels_fbgemm.py fails the day they or the ops below are gone (available()
then also says no, and the kinds are refused in one line instead of running).
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from minispec.errors import MinispecError
from minispec.kernels import packed
from minispec.model.transformer import Transformer

OPS = ("linear_prepack_fp16", "linear_dynamic_fp16", "linear_prepack", "linear_dynamic")


@functools.cache
def available() -> bool:
    """Whether this torch build runs fbgemm's packed fp16 and dynamic int8 linear ops on this CPU
    (probed once on a 16 x 16 weight)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    if not all(hasattr(torch.ops.quantized, op) for op in OPS):
        return False
    try:
        Fp16Linear(torch.ones(16, 16), None)(torch.ones(1, 16))
        DynamicInt8Linear(torch.ones(16, 16), None)(torch.ones(1, 16))
    except (RuntimeError, AttributeError):
        return False
    return True


class Fp16Linear(nn.Module):
    """y = x @ fp16(W)^T + b, W packed once in fbgemm's fp16 layout. weight: [out, in]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        b = None if bias is None else bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.detach().float().contiguous(), b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # [N, in]
        y = torch.ops.quantized.linear_dynamic_fp16(rows, self.packed)  # [N, out]
        return y.view(*x.shape[:-1], self.out_features)


class DynamicInt8Linear(nn.Module):
    """y ~ x @ W^T + b with W int8 per output row and x quantized per call (module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).double()  # [out]
        zero = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # the deprecated constructor: the one use, see the module docstring
            warnings.simplefilter("ignore", category=UserWarning)
            warnings.simplefilter("ignore", category=DeprecationWarning)
            qweight = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)  # [out, in]
        b = None if bias is None else bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack(qweight, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()  # [N, in]
        y = torch.ops.quantized.linear_dynamic(rows, self.packed, True)  # [N, out]; reduce_range: fbgemm's
        return y.view(*x.shape[:-1], self.out_features)


class Fp16Transformer(packed.FastTransformer):
    """A FastTransformer whose linear layers are Fp16Linear."""

    kind = "fp16"


class DynamicInt8Transformer(packed.FastTransformer):
    """A FastTransformer whose linear layers are DynamicInt8Linear."""

    kind = "int8-dynamic"


def check_available(kind: str) -> None:
    if not available():
        raise MinispecError(f"kind={kind!r}: this torch build or CPU has no fbgemm packed linear ops "
                            f"(torch.ops.quantized.{OPS[0]}, ...); expected an x86 CPU build of torch, "
                            "or kind='fast'")


def apply_fp16(model: Transformer, checkpoint: str | Path | None = None) -> Fp16Transformer:
    """The fp16 kind (module docstring); in place, returns the model."""
    packed.check_supported(model, "fp16")
    check_available("fp16")
    return packed.rewrite(model, Fp16Linear, Fp16Transformer, checkpoint)


def apply_int8_dynamic(model: Transformer, checkpoint: str | Path | None = None) -> DynamicInt8Transformer:
    """The int8-dynamic kind (module docstring); in place, returns the model."""
    packed.check_supported(model, "int8-dynamic")
    check_available("int8-dynamic")
    return packed.rewrite(model, DynamicInt8Linear, DynamicInt8Transformer, checkpoint)
