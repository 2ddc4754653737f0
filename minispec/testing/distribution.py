"""Exact target distributions and a chi-square goodness-of-fit test, for losslessness checks.

A lossless policy must leave the distribution of the generated text exactly that of sampling
from the target alone. On a tiny model with a tiny vocabulary we can write that distribution
down (enumerate every continuation of n tokens) and test observed counts against it.
"""

from __future__ import annotations

import math
from itertools import product

import torch

from minispec.checks import is_int
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams, logits_to_probs


@torch.inference_mode()
def sequence_distribution(target, prompt: list[int], num_tokens: int, params: SamplingParams) -> dict[tuple, float]:
    """P(continuation) under plain sampling from `target`, for every continuation of num_tokens
    tokens: {tuple of ids: probability}. Costs vocab**num_tokens forwards: keep both tiny."""
    vocab = target.config.vocab_size
    probs = {}
    for seq in product(range(vocab), repeat=num_tokens):
        logits = target(torch.tensor([prompt + list(seq)]))[0].double()  # [T, V]
        p = logits_to_probs(logits, params)  # [T, V]
        rows = torch.arange(len(prompt) - 1, len(prompt) - 1 + num_tokens)
        probs[seq] = float(p[rows, torch.tensor(seq)].prod())
    return probs


def chi_square_p_value(counts: dict, probs: dict, num_samples: int) -> float:
    """Pearson chi-square goodness of fit of `counts` to `probs`; cells whose expected count is
    below 5 are pooled into one (the usual validity rule for the chi-square approximation).
    An observed outcome of probability 0 gives p-value 0."""
    values = list(probs.values())
    if not values or any(not math.isfinite(p) or p < 0 for p in values) or abs(sum(values) - 1) > 1e-6:
        raise MinispecError("chi_square_p_value: probs are not a distribution (finite, >= 0, summing to 1)")
    # counts may be a weighted mix of multinomial counts (check_policy's one-step test): finite, >= 0,
    # summing to num_samples
    ok = all((is_int(c) or isinstance(c, float) and math.isfinite(c)) and c >= 0 for c in counts.values())
    if not ok or not math.isclose(sum(counts.values()), num_samples, rel_tol=1e-9):
        raise MinispecError(f"chi_square_p_value: counts are not numbers >= 0 summing to num_samples = {num_samples}")
    if any(probs.get(k, 0.0) == 0.0 and c > 0 for k, c in counts.items()):
        return 0.0
    small = [k for k in probs if probs[k] * num_samples < 5]
    cells = [([k], probs[k]) for k in probs if k not in small]
    if small:
        cells.append((small, sum(probs[k] for k in small)))
    cells = [(keys, p) for keys, p in cells if p > 0]
    stat = sum((sum(counts.get(k, 0) for k in keys) - p * num_samples) ** 2 / (p * num_samples) for keys, p in cells)
    dof = max(len(cells) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
