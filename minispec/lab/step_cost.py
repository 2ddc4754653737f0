"""What a speculative step costs on this CPU, in plain decoding steps: the prices --draft-length auto
chooses its draft length from (minispec.lab.draft_length.Priced(gamma, costs(target, drafter,
gamma)), built above the chapters: this wing only measures).

A step of g drafts runs g draft forwards and one target pass of g + 1 rows:

    c(g) = (t_pass(g + 1) + g x t_draft) / t_pass(1)          c(0) = 1

t_pass(k) is the target's blocks and LM head over k new rows, on a cache of CONTEXT positions;
t_draft is one new row through the drafter's own model (its first `num_layers` blocks for an
early exit) and its head. All of them take turns within each of 5 repetitions (a drift in the
machine's speed moves them alike), and the medians count. A drafter without a model (n-gram
lookup) costs 0 here, its lookup being far below a forward. The loop's own bookkeeping and the
policy are left out: they are the same for every g to first order.

The costs depend on the CPU, the kernels and the model shapes, and are measured with a clock, so
two runs would price the lengths slightly differently; a lossy policy's output could then differ
from run to run. As with --draft-kernels auto, the first measurement on a machine is kept
(kernels/probe_cache.py, question: both models' shapes, kinds and dtypes, gamma) and reused, so the
same seed gives the same tokens run after run. Delete probe.json to measure again.
"""

from __future__ import annotations

import math

import torch

from minispec.kernels import kind_of, measure, probe_cache
from minispec.model.transformer import Transformer

CONTEXT = 32  # positions in the cache while timing: a short prompt (a prefill of the 1.5B's fp16 kind takes ~1 s)


def _describe(model: Transformer, num_layers: int | None) -> str:
    c = model.config
    layers = c.num_layers if num_layers is None else num_layers
    return f"{kind_of(model)}/{model.dtype}/d={c.hidden_size}/f={c.intermediate_size}/L={layers}/V={c.vocab_size}"


def _prefilled(model: Transformer, room: int, num_layers: int | None = None):
    """A cache of CONTEXT + room positions holding CONTEXT tokens (zeros), and the rollback to them."""
    cache = model.new_cache(1, CONTEXT + room, num_layers=num_layers)
    with torch.inference_mode():
        model.forward_hidden(torch.zeros(1, CONTEXT, dtype=torch.long, device=model.device), cache,
                             num_layers=num_layers)
    return cache, lambda: cache.truncate(CONTEXT)


def timings(target: Transformer, drafter, gamma: int, reps: int = 5) -> dict:
    """Median seconds of a target pass of k rows (keys 1..gamma+1) and, for a drafter with a model, of
    one draft token (key "draft": a one-row pass through its model, its first num_layers blocks for
    an early exit, and its head), all taking turns in each repetition (measure.time_interleaved), so
    a drift in the machine's speed moves them alike."""
    cache, rollback = _prefilled(target, gamma + 1)
    fns = {k: measure.one_pass(target, cache, k, rollback) for k in range(1, gamma + 2)}
    model = getattr(drafter, "model", None)
    if isinstance(model, Transformer):
        num_layers = getattr(drafter, "num_layers", None)
        draft_cache, draft_rollback = _prefilled(model, 1, num_layers)
        fns["draft"] = measure.one_pass(model, draft_cache, 1, draft_rollback, num_layers=num_layers)
    with torch.inference_mode():
        return measure.time_interleaved(fns, reps)


def from_timings(seconds: dict, gamma: int) -> list[float]:
    """c(0..gamma) from timings(): (pass(g + 1) + g x draft) / pass(1), a missing draft costing 0."""
    draft = seconds.get("draft", 0.0)
    return [(seconds[g + 1] + g * draft) / seconds[1] for g in range(gamma + 1)]


def measure_costs(target: Transformer, drafter, gamma: int, reps: int = 5) -> list[float]:
    """c(0..gamma) (module docstring), measured now."""
    return from_timings(timings(target, drafter, gamma, reps), gamma)


def question(target: Transformer, drafter, gamma: int) -> str:
    """The probe cache's question for these prices: everything c(g) depends on besides the machine
    (probe_cache.machine_key: the CPU, threads, torch): gamma, both models' kinds, dtypes and shapes,
    and the drafter's depth (an early exit's num_layers)."""
    model = getattr(drafter, "model", None)
    draft = _describe(model, getattr(drafter, "num_layers", None)) if isinstance(model, Transformer) else "none"
    return f"step costs gamma={gamma} target={_describe(target, None)} draft={draft}"


SLACK = 1.25  # round-off and timing noise allowed around what holds by construction


def draft_share_bound(target: Transformer, drafter) -> float:
    """The most t_draft / t_pass(1) can be: 0 without a draft model; else DRAFT_READS times the draft's
    weight bytes (its first num_layers blocks for an early exit) over the target's (decoding one row
    is reading the weights: time follows bytes)."""
    model = getattr(drafter, "model", None)
    if not isinstance(model, Transformer):
        return 0.0
    layers = getattr(drafter, "num_layers", None) or model.config.num_layers
    return DRAFT_READS * _weight_bytes(model) * layers / model.config.num_layers / _weight_bytes(target)


DRAFT_READS = 4.0  # a draft row may cost a few times its weight reads (a small model's fixed overheads)


def _weight_bytes(model: Transformer) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters()) or 1


def plausible(values: list[float] | None, gamma: int, draft_share: float = 0.0) -> bool:
    """Whether kept prices can be true, by construction of c(g) (module docstring): gamma + 1 finite
    values, c(0) = 1 exactly, and c(g) <= SLACK ((g + 1) + g draft_share): a pass of g + 1 rows
    costs at most g + 1 passes of one, and each draft at most draft_share (draft_share_bound). A
    hand edit of the kept prices that would switch speculation off (c(1) far above 2 with no draft
    model) is refused and measured anew. c need not grow with g: a longer pass may take a faster
    matmul path (docs/lab.md has a measured case)."""
    if values is None or len(values) != gamma + 1 or not all(math.isfinite(v) and v > 0 for v in values):
        return False
    if values[0] != 1.0:
        return False
    return all(v <= SLACK * ((g + 1) + g * draft_share) for g, v in enumerate(values))


def costs(target: Transformer, drafter, gamma: int) -> list[float]:
    """c(0..gamma) for this target and drafter on this machine: the kept answer if it is plausible(),
    else measured now and kept."""
    asked = question(target, drafter, gamma)
    kept = probe_cache.load(asked)
    try:
        values = [float(v) for v in kept.split(",")] if kept is not None else None
    except ValueError:
        values = None
    if not plausible(values, gamma, draft_share_bound(target, drafter)):
        values = [round(v, 4) for v in measure_costs(target, drafter, gamma)]  # as kept: the next run's prices
        probe_cache.store(asked, ",".join(f"{v:.4f}" for v in values))
    return values
