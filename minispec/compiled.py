"""The compiled path: minispec.fast's model with dense weights, its decoding steps compiled.

`minispec.fast` is as far as eager PyTorch goes here. Its bf16 decode step at 700 tokens of
context (~24 ms on the 2-core EPYC this was built on) is ~14-17 ms in 121 oneDNN matmuls and
~8-10 ms of "glue": ~400 small ops (norms, RoPE, cache writes, casts, SDPA), each with
dispatcher and Python overhead. Two things only a compiler gives on CPU:

1. A better one-row matmul. TorchInductor with `max_autotune` and `freezing` repacks each
   frozen weight into its own blocked layout and generates a C++ micro-GEMM for the actual
   shape (M = 1 rows for decoding); it beats oneDNN's packed inner product on every
   per-layer matrix here (autotune log: 0.015 vs 0.042 ms for 960x576). For a few rows
   (a verify pass) autotuning keeps oneDNN where oneDNN is faster.
2. Fused glue: the elementwise ops between matmuls become a few C++ loops.

Measured (docs/benchmarks.md, third session): decode tok/s 1.6-1.9x the eager fast path's;
plain greedy decoding 2.5-2.9x transformers' in bf16 and 2.0-2.7x in fp32, end to end.

What it costs, and why it is opt-in (`--kernels compiled` in the CLI, `compile_model` here):
- Compile time: the first decode step and the first verify pass each compile (tens of seconds
  to minutes with autotuning; inductor caches the results on disk for later processes).
- Memory: freezing turns the weights into constants of each compiled graph, repacked; with
  the dense weights the eager prefill uses and the compiler's own memory, generation peaks at
  3.5-3.7x weights + KV cache (measured), against 1.0-1.2x for the eager fast path.
- A C++ compiler on the machine.
- Dynamo specialises on the first shapes it sees: the verify graph's matmuls are tuned for the
  first verify row count, and a first cache whose size equals head_dim specialises the graphs
  to it. `warm_up` compiles everything first, for the run's gamma + 1, on caches of safe sizes
  (the CLI and the benchmarks call it).

What is compiled: `forward_hidden` for decoding steps only, i.e. T <= MAX_COMPILED_ROWS new
tokens appended to a non-empty cache through all layers (plain decoding T = 1, a verify pass
T = gamma + 1), and the LM head for up to MAX_COMPILED_ROWS rows. The prefill (hundreds of
rows: compute-bound, where oneDNN's GEMM on the dense weights is as fast as anything), early
exit (num_layers) and anything else run the same module eagerly. Same math as minispec.fast
(float32 activations around bf16 or float32 weights), up to summation order: tested against
the reference path like the fast path.
"""

from __future__ import annotations

import functools
import shutil
import time
from typing import Sequence

import torch

from minispec import fast
from minispec.errors import MinispecError
from minispec.model import Transformer

MAX_COMPILED_ROWS = 16  # new tokens per step: decoding and verify passes (gamma <= 15)

# TorchInductor options for the compiled steps (see the module docstring, points 1-2)
INDUCTOR_OPTIONS = {
    "freezing": True,  # weights become constants: inductor may repack them
    "max_autotune": True,  # benchmark candidate kernels per matmul shape
    "max_autotune_gemm_backends": "CPP,ATEN",  # its C++ micro-GEMM, or oneDNN/aten
    "max_autotune_report_choices_stats": False,  # no autotuning tables on stderr
    "autotune_num_choices_displayed": 0,
}


def compile_model(model: Transformer) -> Transformer:
    """Rewrite `model` in place: minispec.fast's blocks with dense weights, decoding steps
    compiled by TorchInductor. Returns the model. Compilation happens lazily, on the first
    step of each kind; see the module docstring for what that costs."""
    if getattr(model, "compiled", False):
        return model
    if getattr(model, "optimized", False):
        raise MinispecError("--kernels compiled: the model is already optimized by minispec.fast; compile a freshly loaded model")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise MinispecError("--kernels compiled: TorchInductor needs a C++ compiler (c++ or g++ on PATH); none was found")
    fast.optimize(model, weights="dense")
    eager_hidden, eager_head = model.forward_hidden, model.head  # bound methods of the class
    compiled_hidden = _compile(eager_hidden)
    compiled_head = _compile(eager_head)

    def forward_hidden(input_ids, cache=None, *, num_layers=None):
        if cache is not None and cache.length > 0 and num_layers is None and input_ids.shape[1] <= MAX_COMPILED_ROWS:
            return compiled_hidden(input_ids, cache)
        return eager_hidden(input_ids, cache, num_layers=num_layers)

    def head(hidden):  # [..., d] -> [..., V]; compiled on [rows, d] (one graph for any leading shape)
        rows = hidden.numel() // hidden.shape[-1]
        if rows > MAX_COMPILED_ROWS:
            return eager_head(hidden)
        return compiled_head(hidden.reshape(rows, hidden.shape[-1])).view(*hidden.shape[:-1], -1)

    model.forward_hidden, model.head = forward_hidden, head  # instance attributes shadow the methods
    model.compiled = True
    return model


def warm_up(model: Transformer, verify_rows: Sequence[int] = ()) -> float:
    """Compile the graphs a generation will use before it starts; returns the seconds it took.

    Dynamo specialises on the first shapes it sees, which matters three times here:
    - one graph serves every verify pass of 2..MAX_COMPILED_ROWS rows, and its matmuls are
      autotuned for the row count it first sees (bf16, ~850 tokens of context: tuned at 4 rows,
      passes of 6 / 9 rows took 30 / 44 ms; with graphs tuned per row count, 28 / 32 ms). So
      pass the run's gamma + 1 first in `verify_rows`;
    - a first cache of 64 positions, SmolLM2's head_dim, gave graphs specialised to that size,
      and the next size compiled a second, dynamic set (+460 MB in bf16, a minute more of
      compiling); first caches of 61 or 65 positions gave dynamic graphs at once, and no later
      size recompiled. Our reading: dynamo gives equal sizes of a tensor one symbol ("duck
      sizing"), so max_seq_len == head_dim in the cache's [B, kv_heads, max_seq_len, head_dim]
      is tied to the weights' fixed head_dim. So the warm-up's caches have sizes no config
      field has;
    - the steps then run on a second cache size too, which must not compile anything new.
    A decode step (1 row; its own graph) always runs. Everything happens on throwaway caches.
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


# Dynamo keeps compiled graphs per code object: every compiled model's forward_hidden shares
# Transformer.forward_hidden's, and each model needs its own graphs (decode, verify; one or two
# for the head). The default limit of 8 graphs per code object would silently send a third or
# fourth compiled model in one process (a benchmark, the tests) back to eager execution.
RECOMPILE_LIMIT = 64


def _compile(fn):
    """torch.compile(fn) run under INDUCTOR_OPTIONS and without autograd (freezing needs it)."""
    compiled = torch.compile(fn, dynamic=True)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch.no_grad(), torch._inductor.config.patch(INDUCTOR_OPTIONS), \
                torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return compiled(*args, **kwargs)

    return call
