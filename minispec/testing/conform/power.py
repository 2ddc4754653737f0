"""A check on the checks: how many steps a statistical invariant needs to catch each planted bug.

For a plant whose invariant is a chi-square test, its output law on that invariant's fixed step is
estimated from `samples` runs of the planted engine (the extended sequences of `observe`, as the
suite counts them), and then

    N_99 = the smallest N at which chi_square(N draws from the estimated law, claimed law) rejects
           at alpha = ALPHA in at least MIN_POWER of REPS simulated samples

found by doubling from 8 and bisecting. The estimate carries its own noise (a cell of mass m is
off by about sqrt(m / samples)); against the plants' biases here (total variation 0.07 and more)
that moves N_99 little, and `samples` is reported beside it. The suite's own N is what its
control needs against a bias of total variation `delta` in the direction hardest for the test
(stats.tilt): enough for any bug of that size, so a plant with a larger bias needs fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec import checks
from minispec.errors import MinispecError
from minispec.testing.conform import stats
from minispec.testing.conform.invariants import Budget, observe, sequence_probs, settings
from minispec.testing.conform.planted import PLANTS, Plant, planted_engine

SAMPLES = 65536  # steps of a planted engine that estimate its law
SETTING_OF = {"claimed_distribution": "claimed", "both_sides_processed": "processed", "judged_as_sampled": "rounding"}


@dataclass(frozen=True)
class Power:
    plant: str
    invariant: str
    cells: int  # outcomes the chi-square test counts: V^(gamma + 1)
    total_variation: float  # between the estimated law and the claim
    samples_to_catch: int | None  # N_99; None: not reached by `limit`
    suite_samples: int  # the suite's N at `delta`
    estimated_from: int


def samples_to_catch(law: torch.Tensor, claim: torch.Tensor, seed: int = 0, limit: int = 2**21) -> int | None:
    """N_99 (module docstring) for draws from `law` tested against `claim`, two distributions over
    the same cells; None if above `limit` (at least 8)."""
    law, claim = checks.distribution(law, "samples_to_catch: law"), checks.distribution(claim, "samples_to_catch: claim")
    if law.dim() != 1 or law.shape != claim.shape:
        raise MinispecError(f"samples_to_catch: law {list(law.shape)} and claim {list(claim.shape)}; expected two "
                            "distributions over the same cells, [cells] each")
    if not (checks.is_int(limit) and limit >= 8):
        raise MinispecError(f"samples_to_catch: limit = {limit!r}; expected an integer >= 8")

    def caught(n: int) -> bool:
        rate = stats.rejection_rate(law, claim, n, stats.REPS, torch.Generator().manual_seed(seed))
        return rate >= stats.MIN_POWER

    low, high = 0, 8  # caught(low) is False (or low = 0), caught(high) is what we look for
    while not caught(high):
        if high >= limit:
            return None
        low, high = high, min(2 * high, limit)
    while high - low > max(1, high // 64):  # bisect to within 1/64
        middle = (low + high) // 2
        low, high = (low, middle) if caught(middle) else (middle, high)
    return high


def plant_power(plant: Plant, budget: Budget = Budget(), samples: int = SAMPLES) -> Power | None:
    """N_99 for a plant caught by a chi-square invariant (None for one caught by an exact check)."""
    name = SETTING_OF.get(plant.catches)
    if name is None:
        return None
    engine, setting = planted_engine(plant), settings(budget.seed)[name]
    claim = sequence_probs(engine, setting)
    counts, _ = observe(engine, setting, samples, budget.seed + 7)  # another stream than the suite's
    law = counts.double() / samples
    suite, _ = stats.samples_for_power(claim, budget.delta, budget.start, budget.limit, budget.seed)
    return Power(plant.name, plant.catches, claim.numel(), 0.5 * float((law - claim).abs().sum()),
                 samples_to_catch(law, claim, budget.seed), suite, samples)


def power_table(budget: Budget = Budget(), samples: int | None = None) -> str:
    """--power's table: one row per plant (module docstring); `samples` defaults to SAMPLES."""
    samples = SAMPLES if samples is None else samples
    rows = ["| planted | invariant | cells | TV to the claim (estimated) | steps to catch 99% (alpha "
            f"{stats.ALPHA:g}) | the suite's steps at delta {budget.delta} |", "|---|---|---|---|---|---|"]
    for plant in PLANTS:
        found = plant_power(plant, budget, samples)
        if found is None:
            rows.append(f"| `{plant.name}` | {plant.catches} | | | exact check | |")
            continue
        needed = "above 2^21" if found.samples_to_catch is None else f"{found.samples_to_catch:,}"
        rows.append(f"| `{found.plant}` | {found.invariant} | {found.cells} | {found.total_variation:.3f} | {needed} | "
                    f"{found.suite_samples:,} |")
    return "\n".join(rows) + f"\n\nEach law estimated from {samples:,} steps of the planted engine.\n"
