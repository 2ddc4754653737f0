"""The compiled kind: the fast rewrite with dense weights, its decoding steps compiled.

The eager fast kind (kernels/packed.py) spends a decode step in two places: its matmuls, and
the glue between them (norms, RoPE, cache writes, casts, attention), hundreds of small ops each
paying dispatcher and Python overhead. A compiler helps both on CPU:

1. A one-row matmul of its own. TorchInductor with `max_autotune` and `freezing` repacks each
   frozen weight into a blocked layout and generates a C++ micro-GEMM for the actual shape (one
   row for a decode step); autotuning picks, per matrix, between it and oneDNN.
2. Fused glue: the elementwise ops between the matmuls become a few C++ loops.

That is why this kind keeps the weights dense (`DenseLinear`, frozen Parameters the compiler can
see and repack) instead of oneDNN-packed ones.

What is compiled: `forward_hidden` for decoding steps only, i.e. T <= MAX_COMPILED_ROWS new
tokens appended to a non-empty cache through all layers (plain decoding T = 1, a verify pass
T = gamma + 1), and the LM head for up to MAX_COMPILED_ROWS rows. The prefill (many rows:
compute-bound, where a GEMM on the dense weights does as well), early exit (num_layers), draft
trees' passes (their own positions and mask), ragged batches (RaggedKVCache) and everything else run the same modules
eagerly. The math is the fast kind's (float32 activations around float32 or bfloat16 weights),
up to summation order.

What it costs, and why it is opt-in:
- compile time: the first decode step and the first verify pass each compile, with autotuning
  (inductor caches the results on disk for later processes); `warm_up` does it before a run;
- memory: freezing makes the weights constants of each compiled graph, repacked, next to the
  dense weights the eager prefill uses;
- a C++ compiler on the machine.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.errors import MinispecError
from minispec.kernels import packed
from minispec.model.kv_cache import KVCache
from minispec.model.transformer import Transformer

MAX_COMPILED_ROWS = 16  # new tokens per compiled step: decode steps and verify passes (gamma <= 15)

# TorchInductor options for the compiled steps (module docstring, points 1-2)
INDUCTOR_OPTIONS = {
    "freezing": True,  # weights become constants: inductor may repack them
    "max_autotune": True,  # benchmark candidate kernels per matmul shape
    "max_autotune_gemm_backends": "CPP,ATEN",  # its C++ micro-GEMM, or oneDNN/aten
    "max_autotune_report_choices_stats": False,  # no autotuning tables on stderr
    "autotune_num_choices_displayed": 0,
}

# Dynamo keeps compiled graphs per code object: every compiled model's steps share
# Transformer.forward_hidden's and Transformer.head's, and each model needs its own graphs (its
# weights are constants in them). The default limit of 8 graphs per code object would silently
# send the third or fourth compiled model in one process (a benchmark, the tests) back to eager.
RECOMPILE_LIMIT = 64


class DenseLinear(nn.Module):
    """y = x @ W^T + b with W kept dense, as a frozen Parameter: the form torch.compile can see
    and repack. Eagerly it is F.linear (the input rounded to the weight's dtype)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.weight = nn.Parameter(weight.detach().contiguous().clone(), requires_grad=False)  # [out, in]
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)  # [..., in] -> [..., out]


class CompiledTransformer(packed.FastTransformer):
    """A FastTransformer (with DenseLinear layers) whose decoding steps run compiled graphs.

    `forward_hidden` and `head` send the steps named in the module docstring to their compiled
    versions (compiled from the eager methods of this same object, set up by `apply`) and
    everything else to the eager methods.
    """

    kind = "compiled"
    compiled_hidden: Callable[..., torch.Tensor]  # set by `apply`
    compiled_head: Callable[[torch.Tensor], torch.Tensor]

    def forward_hidden(self, input_ids: torch.Tensor, cache: KVCache | None = None, *,
                       num_layers: int | None = None, positions: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(cache, KVCache) and cache.length > 0 and num_layers is None and positions is None \
                and input_ids.shape[1] <= MAX_COMPILED_ROWS:
            return self.compiled_hidden(input_ids, cache)
        # prefill, early exit, draft trees (their own positions and mask) and ragged batches run eagerly
        return super().forward_hidden(input_ids, cache, num_layers=num_layers, positions=positions, mask=mask)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., V]; compiled on [rows, d], one graph for any leading shape."""
        rows = hidden.numel() // hidden.shape[-1]
        if rows > MAX_COMPILED_ROWS:
            return super().head(hidden)
        return self.compiled_head(hidden.reshape(rows, hidden.shape[-1])).view(*hidden.shape[:-1], -1)


def apply(model: Transformer, checkpoint: str | Path | None = None) -> CompiledTransformer:
    """The compiled kind (module docstring); in place, returns the model. Compilation happens
    lazily, on the first step of each kind, or in `warm_up`."""
    packed.check_supported(model, "compiled")
    check_compiler("compiled", "fast")
    return compile_steps(packed.rewrite(model, DenseLinear, CompiledTransformer, checkpoint))


def check_compiler(kind: str, instead: str) -> None:
    """Raise MinispecError unless TorchInductor finds a C++ compiler."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise MinispecError(f"kind={kind!r}: TorchInductor needs a C++ compiler (c++ or g++ on PATH); "
                            f"none was found; expected one, or kind={instead!r}")


def compile_steps(model: CompiledTransformer) -> CompiledTransformer:
    """Set up the compiled decoding steps of a model already rewritten to a CompiledTransformer
    (with any linear layer torch.compile can trace: DenseLinear here, a custom op for nf4)."""
    eager = super(CompiledTransformer, model)  # the eager methods, bound to this model
    model.compiled_hidden = _compile(eager.forward_hidden)
    model.compiled_head = _compile(eager.head)
    return model


DRAFT_ROWS = (2,)  # a draft model's passes besides one-row steps: 2 rows after a step that kept every draft


def warm_up(model: CompiledTransformer, verify_rows: Sequence[int] = ()) -> float:
    """Compile the graphs a generation will use before it starts; returns the seconds it took.

    Dynamo specialises on the first shapes it sees, which matters three times here:
    - one graph serves every verify pass of 2..MAX_COMPILED_ROWS rows, and its matmuls are
      autotuned for the row count it first sees: pass the run's gamma + 1 first in `verify_rows`;
    - dynamo gives equal sizes one symbol ("duck sizing"). A first cache whose max_seq_len equals
      an integer of the config, such as head_dim, ties the cache's [B, kv_heads, max_seq_len,
      head_dim] to the weights' fixed sizes and specialises the graphs to it, so the next cache
      size compiles a second set. The warm-up's caches have sizes no config integer has;
    - the steps then run on a second cache size too, which must not compile anything new.
    A decode step (one row; its own graph) always runs. Everything happens on throwaway caches.
    """
    rows_each = (1, 1, *verify_rows)  # decode steps, then verify-shaped passes
    t0 = time.perf_counter()
    with torch.inference_mode():
        for max_len in _cache_sizes_unlike_the_model(model, 4 + sum(rows_each) + 37, count=2):
            cache = model.new_cache(1, max_len)
            model.head(model.forward_hidden(torch.ones(1, 4, dtype=torch.long), cache)[0, -1])  # the prefill: eager
            for rows in rows_each:
                model(torch.ones(1, rows, dtype=torch.long), cache)
    return time.perf_counter() - t0


def _cache_sizes_unlike_the_model(model: Transformer, start: int, count: int) -> list[int]:
    """`count` cache sizes >= start, 16 apart or more, none equal to an integer of the model's config."""
    taken = {value for value in vars(model.config).values() if isinstance(value, int)}
    sizes, size = [], start
    while len(sizes) < count:
        if size not in taken:
            sizes.append(size)
            size += 16
        else:
            size += 1
    return sizes


def _compile(fn):
    """torch.compile(fn) run under INDUCTOR_OPTIONS and without autograd (freezing needs it)."""
    compiled = torch.compile(fn, dynamic=True)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch.no_grad(), torch._inductor.config.patch(INDUCTOR_OPTIONS), \
                torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return compiled(*args, **kwargs)

    return call
