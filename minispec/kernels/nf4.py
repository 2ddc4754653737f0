"""The nf4 kind: 4-bit NormalFloat weights through the matrix-vector kernel bitsandbytes ships (lossy).

A decoding step reads every weight once, so its time is about bytes / bandwidth. This kind reads
4.25 bits a weight: each block of 64 consecutive weights of an output row keeps its largest
magnitude m (bfloat16) and, per weight, the index of the nearest of 16 levels:

    w ~ m * LEVELS[i],   i = argmin_j |w / m - LEVELS[j]|

LEVELS is NormalFloat4 (Dettmers et al., QLoRA, 2023): the quantiles of a standard normal,
chosen so that each level is equally likely for normally distributed weights, with an exact 0,
scaled to [-1, 1]. With delta = 0.9677083 (the outermost quantile kept) and Phi^-1 the normal
quantile function,

    positive: Phi^-1(linspace(delta, 1/2, 9)[:-1])   8 levels
    negative: -Phi^-1(linspace(delta, 1/2, 8)[:-1])  7 levels, and 0
    LEVELS = sorted(all 16) / max |.|

A row of x times the quantized weight runs in bitsandbytes' CPU kernel (AVX512-BF16): it holds
the levels and the maxima in bfloat16, so the weight it multiplies by is bf16(LEVELS[i]) * m;
activations in bfloat16, float32 accumulation, a bfloat16 result, which this layer turns back
into float32. Each row of x is computed on its own, so a verify pass of k rows gives each row
exactly what a one-row step gives it: a speculative nf4 target reproduces its own plain greedy
output, unlike int8-dynamic (tests/test_kernels_nf4.py checks this bit for bit).

The kernel wants the indices in its own tiled layout (`tile`): output rows in tiles of 32, and
within a tile, for each pair of input columns (2c, 2c+1), the 64 indices of its 32 rows in row
order, the first 32 in the low nibbles of 32 bytes and the last 32 in the high nibbles; the
block maxima transposed, [in / 64, out]. Hence the sizes it takes: out % 32 == 0, in % 64 == 0.

How the library is reached. minispec loads `libbitsandbytes_cpu.so` from the installed
bitsandbytes wheel (the `nf4` extra pins the version whose C interface is used here) and calls
its exported functions through ctypes, without importing the Python package: that import
registers its CPU ops and, when the `kernels` package is installed, first tries to fetch a
kernel from the model hub. Nothing here downloads. The kernel exists only for CPUs with
AVX512-BF16 (the library's own `has_avx512bf16_cpu` says); elsewhere `available()` is False
and the kind is refused in one line.

Everything else is kernels/packed.py's rewrite (fused projections, float32 activations between
the matmuls, the embedding and K/V cache as they were); only the linear layers differ.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

import torch
import torch.nn as nn

from minispec.errors import MinispecError
from minispec.kernels import compiled, packed
from minispec.model.config import ModelConfig
from minispec.model.transformer import Transformer

BLOCK = 64  # weights per block maximum
TILE = 32  # output rows per tile of the kernel's layout
LIBRARY = "libbitsandbytes_cpu.so"
DELTA = 0.9677083  # QLoRA's outermost normal quantile


def _levels() -> torch.Tensor:
    """The 16 NF4 levels from their definition (module docstring), float64, ascending."""
    positive = torch.special.ndtri(torch.linspace(DELTA, 0.5, 9, dtype=torch.float64)[:-1])  # [8]
    negative = -torch.special.ndtri(torch.linspace(DELTA, 0.5, 8, dtype=torch.float64)[:-1])  # [7]
    levels = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).sort().values  # [16]
    return levels / levels.abs().max()


LEVELS = _levels().float()  # [16]
KERNEL_LEVELS = LEVELS.to(torch.bfloat16).float()  # [16]: the table the kernel multiplies by


@functools.cache
def library() -> ctypes.CDLL | None:
    """bitsandbytes' CPU library where it is installed and its NF4 kernel runs on this CPU, else None."""
    try:
        spec = importlib.util.find_spec("bitsandbytes")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / LIBRARY
    try:
        lib = ctypes.CDLL(str(path))
        has_kernel, gemv = lib.has_avx512bf16_cpu, lib.gemv_4bit_inference_cpu_nf4_bf16
    except (OSError, AttributeError):
        return None
    has_kernel.restype = ctypes.c_bool
    if not has_kernel():
        return None
    gemv.restype = None
    gemv.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
    return lib


def available() -> bool:
    """Whether the nf4 kind runs here: bitsandbytes installed and an AVX512-BF16 CPU."""
    return library() is not None


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (indices uint8 [out, in] in 0..15, block maxima float32 [out, in / 64]),
    the nearest level per weight (module docstring). A block of zeros keeps maximum 0."""
    out_features, in_features = weight.shape
    blocks = weight.detach().float().reshape(out_features, in_features // BLOCK, BLOCK)  # [out, in/64, 64]
    maxima = blocks.abs().amax(-1)  # [out, in/64]
    scaled = blocks / maxima.clamp(min=torch.finfo(torch.float32).tiny)[..., None]  # in [-1, 1]
    midpoints = (LEVELS[1:] + LEVELS[:-1]) / 2  # [15]: nearest level = how many midpoints lie below
    indices = torch.bucketize(scaled, midpoints).to(torch.uint8)  # [out, in/64, 64]
    return indices.reshape(out_features, in_features), maxima


def dequantize(indices: torch.Tensor, maxima: torch.Tensor, levels: torch.Tensor = LEVELS) -> torch.Tensor:
    """levels[i] * m, float32 [out, in]: the NF4 weight (levels=KERNEL_LEVELS: the kernel's)."""
    out_features, in_features = indices.shape
    blocks = levels[indices.long()].reshape(out_features, in_features // BLOCK, BLOCK)  # [out, in/64, 64]
    return (blocks * maxima[..., None]).reshape(out_features, in_features)


def tile(indices: torch.Tensor) -> torch.Tensor:
    """indices uint8 [out, in] -> the kernel's packed layout, uint8 [out, in / 2] (module docstring)."""
    out_features, in_features = indices.shape
    pairs = indices.reshape(out_features // TILE, TILE, in_features // 2, 2).transpose(1, 2)  # [out/32, in/2, 32, 2]
    groups = pairs.reshape(-1, 2 * TILE)  # [out * in / 64, 64]: one column pair of one tile
    return (groups[:, TILE:] << 4 | groups[:, :TILE]).reshape(out_features, in_features // 2).contiguous()


def check_shape(out_features: int, in_features: int, name: str) -> None:
    if out_features % TILE or in_features % BLOCK:
        raise MinispecError(f"kind='nf4': {name} is [{out_features}, {in_features}] ([out, in]); expected out a "
                            f"multiple of {TILE} and in a multiple of {BLOCK} (the kernel's tiles and blocks)")


@torch.library.custom_op("minispec::nf4_matmul", mutates_args=())
def nf4_matmul(rows: torch.Tensor, tiles: torch.Tensor, maxima: torch.Tensor) -> torch.Tensor:
    """rows [N, in] bfloat16, tiles [out, in/2] uint8 (`tile`), maxima [in/64, out] bfloat16 ->
    [N, out] bfloat16: each row through the kernel. A custom op, so that torch.compile keeps the
    call opaque and compiles the rest of a step around it (the nf4-compiled kind)."""
    out_features, in_features = tiles.shape[0], rows.shape[1]
    y = torch.empty(rows.shape[0], out_features, dtype=torch.bfloat16)  # [N, out]
    library().gemv_4bit_inference_cpu_nf4_bf16(
        rows.shape[0], out_features, in_features, rows.data_ptr(), tiles.data_ptr(), maxima.data_ptr(),
        y.data_ptr(), BLOCK, rows.stride(0), y.stride(0))
    return y


@nf4_matmul.register_fake
def _nf4_matmul_shape(rows: torch.Tensor, tiles: torch.Tensor, maxima: torch.Tensor) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], tiles.shape[0])  # what the compiler needs to know: [N, out]


class Nf4Linear(nn.Module):
    """y ~ x @ W^T + b with W in NF4 (module docstring). weight: [out, in]; x: [..., in] -> y: [..., out] float32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        check_shape(self.out_features, self.in_features, "a linear layer")
        indices, maxima = quantize(weight)
        self.packed = tile(indices)  # [out, in/2] uint8
        self.maxima = maxima.t().contiguous().to(torch.bfloat16)  # [in/64, out]
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [N, in]
        y = torch.ops.minispec.nf4_matmul(rows, self.packed, self.maxima).float()  # [N, out]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def weight(self) -> torch.Tensor:
        """The dense weight this layer multiplies by, float32 [out, in] (for tests and error studies)."""
        low, high = (self.packed & 15).reshape(-1, TILE), (self.packed >> 4).reshape(-1, TILE)  # undo `tile`
        groups = torch.cat([low, high], -1)  # [out * in / 64, 64]
        indices = groups.reshape(self.out_features // TILE, self.in_features // 2, TILE, 2).transpose(1, 2)
        return dequantize(indices.reshape(self.out_features, self.in_features), self.maxima.t().float(), KERNEL_LEVELS)


class Nf4Transformer(packed.FastTransformer):
    """A FastTransformer whose linear layers are Nf4Linear."""

    kind = "nf4"


class CompiledNf4Transformer(compiled.CompiledTransformer):
    """The nf4 kind with its decoding steps compiled (kernels/compiled.py): the kernel calls stay
    opaque (nf4_matmul), the norms, RoPE, attention and casts between them are fused."""

    kind = "nf4-compiled"


def apply(model: Transformer, checkpoint: str | Path | None = None) -> Nf4Transformer:
    """The nf4 kind (module docstring); in place, returns the model. Every size is checked first."""
    check(model, "nf4")
    return packed.rewrite(model, Nf4Linear, Nf4Transformer, checkpoint)


def apply_compiled(model: Transformer, checkpoint: str | Path | None = None) -> CompiledNf4Transformer:
    """The nf4-compiled kind: nf4's layers, the decoding steps compiled (on first use, or in
    compiled.warm_up)."""
    check(model, "nf4-compiled")
    compiled.check_compiler("nf4-compiled", "nf4")
    return compiled.compile_steps(packed.rewrite(model, Nf4Linear, CompiledNf4Transformer, checkpoint))


def check(model: Transformer, kind: str) -> None:
    """Raise MinispecError (one line) unless the kernel runs here and takes every projection's size."""
    packed.check_supported(model, kind)
    if not available():
        raise MinispecError(f"kind={kind!r}: needs bitsandbytes (pip install 'minispec[nf4]') and a CPU with "
                            "AVX512-BF16 (its NF4 kernel); expected kind='int8-dynamic' or 'fast' here")
    for name, (out_features, in_features) in projections(model.config).items():
        check_shape(out_features, in_features, name)


def projections(c: ModelConfig) -> dict[str, tuple[int, int]]:
    """Each linear layer's [out, in] after the fast rewrite's fusing."""
    q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return {"the fused q/k/v projection": (q_width + 2 * kv_width, c.hidden_size), "o_proj": (c.hidden_size, q_width),
            "the fused gate/up projection": (2 * c.intermediate_size, c.hidden_size),
            "down_proj": (c.hidden_size, c.intermediate_size), "the LM head": (c.vocab_size, c.hidden_size)}


def linear_weights(config: ModelConfig) -> int:
    """How many weights the linear layers hold (the blocks' and the LM head's): what nf4 rounds."""
    head = config.vocab_size * config.hidden_size
    return head + config.num_layers * sum(out * in_ for name, (out, in_) in projections(config).items()
                                          if name != "the LM head")


def fits(config: ModelConfig) -> bool:
    """Whether the kernel runs here and takes every projection of a model with `config`."""
    return available() and all(out % TILE == 0 and in_ % BLOCK == 0 for out, in_ in projections(config).values())
