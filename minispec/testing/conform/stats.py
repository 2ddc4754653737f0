"""A goodness-of-fit test that proves its own power: chi-square, with a planted bias as its control.

A statistical check that passes says little unless it would have failed on a wrong engine. So
each check here comes with two numbers, computed at the very sample size it used:

    power        how often the same test rejects outcomes drawn from a planted bias of total
                 variation delta (the control); the check fails itself below MIN_POWER
    false alarm  how often it rejects outcomes drawn from the reference itself (expected: ALPHA)

The planted bias is the hardest one of its size for this test. A bias r - p of total variation
delta moves the chi-square statistic by (in expectation, over N samples) N sum_x (r - p)^2 / p,
which by Cauchy-Schwarz is at least N (2 delta)^2; the tilt that scales a set A of the cells up
by delta / P(A) and the rest down by delta / (1 - P(A)) reaches N delta^2 (1 / P(A) + 1 / (1 -
P(A))), that bound when P(A) = 1/2 (A: the most probable cells up to half the mass). So the reported power is (up
to how evenly the cells split) a lower bound on the power against any bias of total variation
delta. Both rates are estimated by simulation: REPS samples of N outcomes each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec.checks import counts as check_counts, distribution, same_shape
from minispec.errors import MinispecError

ALPHA = 1e-4  # a correct engine fails a check with probability 1e-4
MIN_POWER = 0.99
REPS = 300
MIN_EXPECTED = 5.0  # cells expected fewer times are pooled (the chi-square approximation's rule)


@dataclass(frozen=True)
class Fit:
    statistic: float
    dof: int
    p_value: float
    samples: int


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> Fit:
    """Pearson's chi-square of counts [C] against probs [C]; cells expected fewer than MIN_EXPECTED
    times pooled into one; an outcome of probability 0 that occurred gives p-value 0."""
    same_shape(counts, probs, "chi_square(counts, probs)")
    counts, probs = check_counts(counts, "chi_square: counts"), distribution(probs, "chi_square: probs")
    n = int(counts.sum())
    if n == 0:
        raise MinispecError("chi_square: no outcomes counted; expected at least one")
    if bool(((probs == 0) & (counts > 0)).any()):
        return Fit(float("inf"), 0, 0.0, n)
    expected = probs * n  # [C]
    small = (expected < MIN_EXPECTED) & (probs > 0)
    observed = torch.cat([counts[~small & (probs > 0)], counts[small].sum().reshape(1)])
    expected = torch.cat([expected[~small & (probs > 0)], expected[small].sum().reshape(1)])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = max(int(keep.sum()) - 1, 1)
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return Fit(statistic, dof, p_value, n)


def tilt(probs: torch.Tensor, delta: float) -> torch.Tensor:
    """probs with a bias of total variation delta in the direction hardest for the chi-square test:
    the cells split in two sets, A (filled from the most probable down while it holds at most half
    the mass, at least one cell) and the rest; the lighter set scaled up by delta / its mass, the
    heavier down by delta / its mass (which, holding half the mass or more, always has room for it)."""
    probs = distribution(probs, "tilt: probs")
    order = torch.argsort(probs, descending=True)
    cumulative = torch.cumsum(probs[order], 0)
    in_a = torch.zeros_like(probs, dtype=torch.bool)
    in_a[order[: max(int((cumulative <= 0.5).sum()), 1)]] = True
    mass_a = float(probs[in_a].sum())
    light = in_a if mass_a <= 0.5 else ~in_a
    light_mass = float(probs[light].sum())
    if light_mass == 0 or not 0 < delta <= 1 - light_mass:
        raise ValueError(f"delta = {delta}: a bias this large does not fit these probabilities")
    return torch.where(light, probs * (1 + delta / light_mass), probs * (1 - delta / (1 - light_mass)))


def rejection_rate(probs_true: torch.Tensor, probs_ref: torch.Tensor, samples: int, reps: int,
                   generator: torch.Generator) -> float:
    """How often chi_square rejects (p < ALPHA) `samples` outcomes drawn from probs_true, against probs_ref."""
    rejected = 0
    for _ in range(reps):
        draws = torch.multinomial(probs_true.float(), samples, replacement=True, generator=generator)
        counts = torch.bincount(draws, minlength=probs_true.numel())
        rejected += chi_square(counts, probs_ref).p_value < ALPHA
    return rejected / reps


@dataclass(frozen=True)
class Control:
    delta: float
    power: float
    false_alarm: float
    reps: int


def control(probs: torch.Tensor, samples: int, delta: float, seed: int = 0, reps: int = REPS) -> Control:
    """The power of chi_square at `samples` against the tilt of size delta, and its false-alarm rate."""
    generator = torch.Generator().manual_seed(seed)
    return Control(delta, rejection_rate(tilt(probs, delta), probs, samples, reps, generator),
                   rejection_rate(probs, probs, samples, reps, generator), reps)


def samples_for_power(probs: torch.Tensor, delta: float, start: int, limit: int, seed: int = 0) -> tuple[int, Control]:
    """The smallest of start, 2 start, 4 start, ... (at most limit) at which the control's power
    reaches MIN_POWER, with that control; at limit if none does (the check then fails itself)."""
    samples = start
    while True:
        found = control(probs, samples, delta, seed)
        if found.power >= MIN_POWER or samples >= limit:
            return samples, found
        samples = min(2 * samples, limit)
