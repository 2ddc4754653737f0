"""Opt-in speed for the same model: one call rewrites a loaded Transformer in place.

    model = minispec.load_model(folder, dtype=torch.bfloat16)
    minispec.kernels.apply(model, "fast", checkpoint=folder)

Kinds (KINDS):
  reference  model.py as written: no change.
  fast       kernels/packed.py: fused q/k/v and gate/up projections, weights packed once into
             oneDNN's layout, float32 activations between the matmuls. Same function.
  compiled   kernels/compiled.py: fast's blocks with dense weights, the decoding steps compiled
             by TorchInductor (call kernels.compiled.warm_up before a timed run). Same function.
  int8       kernels/int8.py: fast's blocks with weight-only int8 linear layers. Lossy: the
             self:int8 draft's kind, not a way to run a target.
  fp16       kernels/fbgemm.py: fast's blocks with float16 weights in fbgemm's packed layout
             (half of float32's bytes, on AVX2 and AVX-512 alike). Lossy (weights rounded).
  int8-dynamic  kernels/fbgemm.py: int8 weights and per-call int8 activations through fbgemm
             (a quarter of float32's bytes). Lossy: the cheapest draft, a target only with its
             quality measured (docs/benchmarks.md).
  nf4        kernels/nf4.py: 4-bit NormalFloat weights (4.25 bits a weight) through the kernel
             bitsandbytes ships (the nf4 extra; AVX512-BF16 CPUs). Lossy; each row on its own, so
             a speculative nf4 target reproduces its own plain greedy output.
  nf4-compiled  nf4's layers with the decoding steps compiled around the kernel calls, as in
             compiled (call kernels.compiled.warm_up before a timed run). Same function as nf4.

The rewrite swaps modules (blocks, final norm, LM head, embedding) and turns the object into a
subclass of model.Transformer that overrides only what differs; model.py itself holds no kernel
state. It happens in place and returns the same object, because others may hold it: an
early-exit drafter drafts with the target itself. It cannot be undone: load the model again for
another kind.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minispec.errors import MinispecError
from minispec.kernels import compiled, fbgemm, int8, measure, nf4, packed, probe_cache
from minispec.model.config import ModelConfig
from minispec.model.transformer import Transformer

KINDS = ("reference", "fast", "compiled", "int8", "fp16", "int8-dynamic", "nf4", "nf4-compiled")

NF4_MIN_WEIGHTS = 10**9  # --dtype auto picks nf4 only for targets this large (auto_weights)

_APPLY = {"fast": packed.apply, "compiled": compiled.apply, "int8": int8.apply, "fp16": fbgemm.apply_fp16,
          "int8-dynamic": fbgemm.apply_int8_dynamic, "nf4": nf4.apply, "nf4-compiled": nf4.apply_compiled}


def kind_of(model: Transformer) -> str:
    """Which kind `model` is: "reference" for a Transformer as loaded, else the kind applied."""
    return model.kind if isinstance(model, packed.FastTransformer) else "reference"


def auto_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """--dtype auto: bfloat16 where this CPU runs a 16-bit path through maintained kernels (oneDNN's
    packed bfloat16, or fbgemm's float16 weights that auto_kind gives a bfloat16 model on AVX2),
    else float32; float32 off the CPU (minispec's kernels are CPU kernels). bfloat16 halves the
    bytes a step reads, at the price of its rounding: greedy output may part from float32's at a
    near-tie (docs/benchmarks.md measures how often)."""
    if torch.device(device).type != "cpu":
        return torch.float32
    return torch.bfloat16 if packed.packs(torch.bfloat16) or fbgemm.available() else torch.float32


def auto_weights(config: ModelConfig, device: torch.device | str = "cpu") -> tuple[torch.dtype, str]:
    """--dtype auto with --kernels auto: the dtype to load a target in and the kind to apply, the fastest
    whose quality holds on this CPU. nf4 where its kernel runs and takes the model's sizes (nf4.fits)
    and the model has at least NF4_MIN_WEIGHTS linear weights, loaded in float32 (the weights it
    quantizes): the Qwen2.5-Coder 1.5B keeps its HumanEval pass@1 within 3 points of float32's in nf4
    (docs/benchmarks.md), while a small model loses more to 4-bit weights (SmolLM2-135M's nf4 greedy
    text leaves float32's several times sooner, and not at near-ties: the same page). Elsewhere
    auto_dtype() and "auto", for auto_kind to choose on the loaded model."""
    if torch.device(device).type == "cpu" and nf4.fits(config) and nf4.linear_weights(config) >= NF4_MIN_WEIGHTS:
        return torch.float32, "nf4"
    return auto_dtype(device), "auto"


def auto_kind(model: Transformer) -> str:
    """--kernels auto for a target: the fastest kind that keeps its weights. "fast" where oneDNN packs
    the model's dtype here (packed.packs: float32 anywhere, bfloat16 with AVX-512); a bfloat16 model
    on a CPU that does not pack it (AVX2 only) runs "fp16", whose float16 weights hold every bfloat16
    weight exactly but those below 2^-14 in magnitude (float16's subnormals); else "reference"."""
    if model.device.type != "cpu":
        return "reference"
    if packed.packs(model.dtype):
        return "fast"
    if model.dtype == torch.bfloat16 and fbgemm.available():
        return "fp16"
    return "reference"


def auto_draft_kind(model: Transformer, target_kind: str = "reference") -> str:
    """--draft-kernels auto for a separate draft model beside a target of `target_kind`.

    Beside a 4-bit target (nf4, nf4-compiled) the draft runs nf4 too where the kernel takes its
    sizes: a draft pays only if its step reads a fraction of the target's bytes, and a 16-bit 0.5B
    reads more than the 1.5B target in nf4 (1.0 GB a step against 0.8 GB). Its rounding costs
    acceptance only, never the output (the verify keeps the target's). Not compiled: a compiled
    draft's steps measured no faster (docs/benchmarks.md) and cost half a minute or more to compile.

    Otherwise: of the kinds that keep its weights to within float16 ("fast", "fp16") and that this
    CPU runs, the one whose one-row step is fastest here, measured once per machine and layer
    shape (measure.fastest_kind) and kept on disk (probe_cache), so that the same seed drafts with
    the same kind, and gives the same text, run after run. int8-dynamic is faster still but rounds
    the activations too, which costs a small draft much of its acceptance (SmolLM2's own copy: 0.2
    at the first position): it is there to choose, by measurement, not by default."""
    if model.device.type != "cpu":
        return "reference"
    if target_kind in ("nf4", "nf4-compiled") and nf4.fits(model.config):
        return "nf4"
    candidates = [kind for kind in ("fast", "fp16")
                  if (kind == "fast" and packed.packs(model.dtype)) or (kind == "fp16" and fbgemm.available())]
    if not candidates:
        return "reference"
    if len(candidates) == 1:
        return candidates[0]
    shape = (model.config.hidden_size, model.config.intermediate_size, model.dtype)
    question = f"draft kind of {'/'.join(candidates)} for d={shape[0]} f={shape[1]} {shape[2]}"
    kind = probe_cache.load(question, tuple(candidates))
    if kind is None:
        kind = measure.fastest_kind(tuple(candidates), *shape)
        probe_cache.store(question, kind)
    return kind


def apply(model: Transformer, kind: str, *, checkpoint: str | Path | None = None) -> Transformer:
    """Rewrite `model` in place to `kind` (one of KINDS) and return it (the same object).

    checkpoint: the folder the model was loaded from; the fast kinds then map the embedding
    table from the file instead of keeping a second resident copy of it (kernels/packed.py,
    point 5). Applying the kind a model already has does nothing. Raises MinispecError (one
    line, naming --kernels) for an unknown kind, a model already rewritten to another kind, a
    dtype other than float32 / bfloat16, a model not on the CPU, a torch build without oneDNN
    or a CPU whose oneDNN does not pack the model's dtype (fast), no C++ compiler (compiled),
    layer widths the int8 kernel cannot take, or a checkpoint that does not hold the model's
    embedding table. Every check runs before anything is changed.
    """
    if kind not in KINDS:
        raise MinispecError(f"kind={kind!r}: unknown kind; expected one of {', '.join(KINDS)}")
    current = kind_of(model)
    if current == kind:
        return model
    if current != "reference":
        raise MinispecError(f"kind={kind!r}: the model was already rewritten to '{current}'; "
                            "expected a freshly loaded (reference) model")
    if kind == "reference":
        return model
    return _APPLY[kind](model, checkpoint)


def apply_drafter(drafter, kind: str) -> None:
    """Apply `kind` to the drafter's own model (`drafter.model`), if it has one that is still a
    reference model; `drafter` None (plain decoding) is nothing to do.

    Nothing to do for a drafter without a model (n-gram: model None), for one drafting with the
    target itself (early exit: apply the target first, which rewrites it for both) or for a
    self:int8 copy (already int8). A separate draft model gets a private embedding table (no
    checkpoint).
    """
    model = None if drafter is None else drafter.model
    if isinstance(model, Transformer) and kind_of(model) == "reference":
        apply(model, kind)
