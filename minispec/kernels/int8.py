"""The int8 kind: the fast rewrite with weight-only int8 linear layers (lossy).

This is the self:int8 draft's kind (drafters.self_draft): a copy of the target whose matrices
are quantized, so a draft step reads a quarter of the float32 bytes (half of bfloat16's). It
is not the target's function, only close to it; the acceptance policy decides what it is worth.
Everything else is kernels/packed.py's rewrite: fused projections, float32 activations between
the matmuls, the same embedding and K/V cache handling.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.errors import MinispecError
from minispec.kernels import packed
from minispec.model.transformer import Transformer

KERNEL_WIDTH = 16  # torch._weight_int8pack_mm with bfloat16 input needs in_features % 16 == 0


class Int8Linear(nn.Module):
    """Weight-only int8: y = (x @ q^T) * s + b.

    Symmetric per output row: s[j] = max_i |W[j, i]| / 127, q = round(W / s) in [-127, 127], so
    each weight is off by at most s[j] / 2 (1/254 of its row's largest entry). Activations are
    rounded to bfloat16 (PyTorch's CPU int8-weight kernel, torch._weight_int8pack_mm, takes
    bfloat16 activations). weight: [out, in] -> q int8 [out, in], s bfloat16 [out].

    That kernel is built for a few rows (decode and verify steps); above `max_kernel_rows` rows
    (a prefill) the weight is dequantized (q * s, in bfloat16) and an ordinary GEMM runs instead.
    """

    max_kernel_rows = 32

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        if self.in_features % KERNEL_WIDTH:  # the kernel returns garbage otherwise, unchecked there
            raise MinispecError(f"kind='int8': a linear layer has in_features = {self.in_features}; "
                                f"expected a multiple of {KERNEL_WIDTH}")
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # [out]
        self.qweight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()  # [out, in]
        self.scale = scale.to(torch.bfloat16)  # [out]
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [N, in]
        if rows.shape[0] <= self.max_kernel_rows:
            y = torch._weight_int8pack_mm(rows, self.qweight, self.scale)  # [N, out]
        else:
            y = F.linear(rows, self.qweight.to(torch.bfloat16) * self.scale[:, None])  # [N, out]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


class Int8Transformer(packed.FastTransformer):
    """A FastTransformer whose linear layers are Int8Linear. `dtype` is the dtype the model had
    before quantization (its embedding table's)."""

    kind = "int8"


def apply(model: Transformer, checkpoint: str | Path | None = None) -> Int8Transformer:
    """The int8 kind (module docstring); in place, returns the model."""
    packed.check_supported(model, "int8")
    c = model.config
    for name, width in (("hidden_size", c.hidden_size), ("intermediate_size", c.intermediate_size),
                        ("num_heads * head_dim", c.num_heads * c.head_dim)):
        if width % KERNEL_WIDTH:  # checked before any layer is rewritten
            raise MinispecError(f"kind='int8': {name} = {width}; expected a multiple of {KERNEL_WIDTH}")
    return packed.rewrite(model, Int8Linear, Int8Transformer, checkpoint)
