"""From logits to a distribution, and from a distribution to a token.

Every decoding path in minispec -- plain decoding, the draft model, the target in a verify
step -- turns logits into probabilities with the same `logits_to_probs`, so temperature,
top-k and top-p are applied identically to the target's p_target and the draft's q_draft.
(Applying them to one and not the other silently breaks the losslessness of speculative
sampling.)

Temperature 0 means greedy: the distribution is one-hot on argmax, ties going to the lowest
token id (what torch.argmax returns). It is not faked as a tiny temperature.

A temperature above 0 must be finite and at least MIN_TEMPERATURE: every path divides logits by
T (here, and the DropMatch policies' JS test), and a smaller T can overflow logits / T to inf and
the softmax to nan; T = inf would silently sample uniformly. Both are a MinispecError instead,
here in SamplingParams, so the Python API and the CLI refuse the same values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch

from minispec.checks import positive_int
from minispec.errors import MinispecError


# The smallest temperature above 0: logits / T stays finite for float32 logits below 3.4e35 in
# size (any real model's), and below it sampling is greedy in all but name (use 0).
MIN_TEMPERATURE = 1e-3


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax, lowest id on ties); else MIN_TEMPERATURE <= T < inf
    top_k: int | None = None  # keep the k most likely tokens
    top_p: float | None = None  # keep the smallest set of tokens with total probability >= top_p

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_real(t) or not (t == 0 or MIN_TEMPERATURE <= t < math.inf):
            raise MinispecError(f"temperature = {t!r}; expected 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}")
        if self.top_k is not None:
            positive_int(self.top_k, "top_k")
        if self.top_p is not None and not (_is_real(self.top_p) and 0 < self.top_p <= 1):  # nan fails too
            raise MinispecError(f"top_p = {self.top_p!r}; expected a number 0 < top_p <= 1")
        if t == 0 and (self.top_k is not None or self.top_p is not None):
            given = "top_k" if self.top_k is not None else "top_p"
            raise MinispecError(f"{given} = {getattr(self, given)!r} at temperature 0 (--{given.replace('_', '-')}): "
                                "greedy decoding takes the argmax, which no truncation changes, so it would be "
                                f"ignored; expected {given} None at temperature 0, or a temperature above 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary, the lowest id on ties: [..., V] -> [...] (int64)."""
    return torch.argmax(logits, dim=-1)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Post-processed next-token distribution: [..., V] logits -> [..., V] probabilities.

    temperature 0:  one_hot(argmax(logits))
    otherwise:      softmax(filter(logits / T)), where top-k then top-p set the logits of
                    excluded tokens to -inf: top-k keeps every token tied with the k-th largest;
                    top-p keeps x while the tokens strictly more probable than x hold less than
                    top_p (the token that crosses it stays, with any token tied with it). The most
                    likely token is never excluded.
    Low-precision logits are upcast to float32 first; float64 stays float64.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if params.greedy:
        probs = torch.zeros_like(logits)
        return probs.scatter_(-1, greedy_token(logits).unsqueeze(-1), 1.0)

    logits = logits / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p is not None and params.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., V] mass of the tokens sorted before
        # a tie group shares the mass before its first member: the mass of strictly MORE probable tokens,
        # so tied tokens are kept or dropped together, whatever order the sort gave them
        ascending = -sorted_logits.contiguous()  # [..., V] what searchsorted needs
        first_of_tie = torch.searchsorted(ascending, ascending)  # [..., V] index of each tie group's first
        mass_greater = mass_before.gather(-1, first_of_tie)
        drop_sorted = mass_greater >= params.top_p  # the strictly better tokens already reach top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a [V] distribution with an explicit generator (same seed, same draw).

    The draw happens on the generator's device (the loop's is a CPU generator): probabilities on
    another device are copied there first, so a seed draws the same token on every device for
    the same probabilities.
    """
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator))


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from one row of logits [V]: argmax at temperature 0, else a seeded draw."""
    if params.greedy:
        return int(greedy_token(logits))
    return sample_token(logits_to_probs(logits, params), generator)
