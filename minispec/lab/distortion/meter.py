"""How far a rule's output is from the target's, measured per position during a real run.

For each position a rule judged in a verify step (rows 0..num_accepted: the accepted drafts, then
the rejected position or the bonus row), forms.py gives the distribution pi the rule emits
there; its distance from the target's p at that position is

    TV(pi, p) = 1/2 sum_y |pi(y) - p(y)|              in [0, 1]
    KL(p || pi) = sum_y p(y) ln(p(y) / pi(y))          nats; infinite where pi misses p's support

A lossless rule has pi = p, so both are 0 up to float64 rounding (tested). At T = 0, p is the
target's one-hot argmax and TV is the probability that the rule emits another token there.
The three kinds of form give three kinds of figure:

    exact         TV and KL computed
    bound         FLy: TV <= sum_x q(x) (a_upper(x) - a_base(x)) (forms.py); no KL
    monte-carlo   DropMatch: TV and KL of the mean over M mask draws; its error is the standard
                  deviation of TV over B bootstrap resamples of the draws

Per-position distortion is what the rule does to one token given its context; a sequence's
distortion compounds over its positions and is not measured here.

`DistortionMeter(policy)` is an AcceptancePolicy that hands every decision to `policy` unchanged
and records each judged position's figures; `summary()` gives their mean and 95th percentile.
The meter draws DropMatch's extra masks from its own generator, so the run's tokens are the ones
the policy alone would give (tested); reset(seed) at each run's start seeds it from the meter's
seed and the run's, (meter seed x 2^32 + run seed + METER_STREAM) mod 2^64, so a batch row (each
row reset with its own seed) measures what the same prompt run alone measures (tested). It
measures chains (the chain and batch loops: the batch loop copies the policy per row, and a copied
meter records into its original's list); a tree
walk is looked up by the policy's class and does not see the meter. `seconds` is the meter's own
time, inside the loop's policy time: a benchmark takes it out of its timings.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch

from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput
from minispec.checks import distribution, is_int, same_shape
from minispec.errors import MinispecError
from minispec.lab.distortion.forms import (LOSSLESS_BY_THEOREM, Form, FormContext, NotCovered, form_of,
                                                  rows)

F64 = torch.float64
METER_STREAM = 0x5DEECE66D  # keeps the meter's mask draws apart from every other stream


def total_variation(pi: torch.Tensor, p: torch.Tensor) -> float:
    """TV = 1/2 sum |pi - p| over the last dim, float64 (two distributions of one shape)."""
    same_shape(pi, p, "total_variation(pi, p)")
    return 0.5 * float((distribution(pi, "total_variation: pi") - distribution(p, "total_variation: p")).abs().sum())


def kl_from_target(p: torch.Tensor, pi: torch.Tensor) -> float:
    """KL(p || pi) = sum p ln(p / pi), 0 ln 0 = 0; inf where pi = 0 < p. Round-off below 0 is clamped."""
    same_shape(p, pi, "kl_from_target(p, pi)")
    p, pi = distribution(p, "kl_from_target: p"), distribution(pi, "kl_from_target: pi")  # no nan reaches the clamp
    if bool(((pi <= 0) & (p > 0)).any()):
        return math.inf
    return max(0.0, float((torch.xlogy(p, p) - torch.xlogy(p, pi)).sum()))


def output_distribution(form: Form, q_row: torch.Tensor, accept: torch.Tensor | None = None) -> torch.Tensor:
    """pi = q . a + (1 - sum q a) r: [V] float64 (accept defaults to the form's)."""
    kept = q_row.to(F64) * (form.accept if accept is None else accept)  # [V]
    return kept + (1 - kept.sum()) * form.residual


@dataclass
class PositionDistortion:
    tv: float  # TV(pi, p), or its upper bound (kind "bound")
    kl: float  # KL(p || pi); nan where not measured (kind "bound")
    kind: str  # "exact", "bound", "monte-carlo" or "lossless" (block, traversal: by theorem)
    tv_error: float = 0.0  # Monte Carlo: the bootstrap standard deviation of tv


def position_distortion(policy: AcceptancePolicy, inp: VerifyInput, row: int, context: FormContext,
                        bootstrap: int = 50) -> PositionDistortion:
    """The rule's distortion at `row` of this verify step (0..gamma; gamma: the bonus row)."""
    if isinstance(policy, LOSSLESS_BY_THEOREM):
        return PositionDistortion(0.0, 0.0, "lossless")
    form = form_of(policy, inp, row, context)
    p_row, q_row = rows(inp, row)
    if form.kind == "bound":
        extra = float((q_row * (form.accept - form.base_accept)).sum())
        if not math.isfinite(extra):  # a clamp would turn nan into the best possible answer, 0
            raise MinispecError(f"distortion bound at row {row}: {extra}; expected a finite acceptance gap")
        return PositionDistortion(min(1.0, max(0.0, extra)), math.nan, "bound")
    pi = output_distribution(form, q_row)
    tv, kl = total_variation(pi, p_row), kl_from_target(p_row, pi)
    if form.kind != "monte-carlo":
        return PositionDistortion(tv, kl, form.kind)
    draws = form.draws.shape[0]
    resampled = []
    for _ in range(bootstrap):
        pick = torch.randint(draws, (draws,), generator=context.generator)
        resampled.append(total_variation(output_distribution(form, q_row, form.draws[pick].mean(dim=0)), p_row))
    return PositionDistortion(tv, kl, "monte-carlo", float(torch.tensor(resampled, dtype=F64).std()))


class DistortionMeter(AcceptancePolicy):
    """`policy`'s decisions, unchanged, with the distortion of every judged position recorded.

    draws: DropMatch's mask draws per position (Monte Carlo forms); seed: the meter's own stream.
    records: one PositionDistortion per judged position, in order; uncovered: positions whose
    rule has no form (counted, not guessed).
    """

    def __init__(self, policy: AcceptancePolicy, draws: int = 16, seed: int = 0) -> None:
        if not isinstance(policy, AcceptancePolicy):
            raise MinispecError(f"DistortionMeter: policy = {policy!r}; expected an AcceptancePolicy")
        if not is_int(draws) or not 1 <= draws <= 1024:
            raise MinispecError(f"DistortionMeter: draws = {draws!r}; expected an integer in 1..1024")
        if not is_int(seed) or not 0 <= seed < 2**63:
            raise MinispecError(f"DistortionMeter: seed = {seed!r}; expected an integer 0 <= seed < 2**63")
        self.policy = policy
        self.name = policy.name
        self.lossless = policy.lossless
        self.draws = draws
        self.records: list[PositionDistortion] = []
        self.uncovered = 0
        self.seconds = 0.0
        self.seed = seed
        self._context = FormContext(torch.Generator(), draws)
        self._reseed(0)
        self._original = self  # where a copy's records go

    def __deepcopy__(self, memo: dict) -> "DistortionMeter":
        """A copy of the policy (own state, as the batch loop wants) that records into this meter; its
        stream is reseeded from its row's seed when the loop resets it."""
        twin = DistortionMeter(copy.deepcopy(self.policy, memo), self.draws, self.seed)
        twin._original = self._original
        return twin

    def _reseed(self, run_seed: int) -> None:
        self._context.generator.manual_seed((self.seed * 2**32 + run_seed + METER_STREAM) % 2**64)

    def reset(self, seed: int | None = None, gamma: int | None = None) -> None:
        self.policy.reset(seed, gamma)
        self._reseed(seed or 0)

    def decide(self, inp: VerifyInput) -> Decision:
        decision = self.policy(inp)
        start, sink = time.perf_counter(), self._original
        for row in range(decision.num_accepted + 1):
            try:
                sink.records.append(position_distortion(self.policy, inp, row, self._context))
            except NotCovered:
                sink.uncovered += 1
        sink.seconds += time.perf_counter() - start
        return decision

    def summary(self) -> dict:
        """mean and 95th percentile of TV over the judged positions, mean KL over those with a finite
        one (and the share infinite), the kind of figure, positions measured and not covered."""
        return summarise(self.records, self.uncovered)


def summarise(records: list[PositionDistortion], uncovered: int = 0) -> dict:
    if not records:
        return {"positions": 0, "uncovered": uncovered}
    tv = torch.tensor([r.tv for r in records], dtype=F64)
    kl = [r.kl for r in records if not math.isnan(r.kl)]
    finite = [k for k in kl if math.isfinite(k)]
    errors = [r.tv_error for r in records]
    return {
        "positions": len(records), "uncovered": uncovered, "kind": "/".join(sorted({r.kind for r in records})),
        "tv_mean": float(tv.mean()), "tv_p95": float(torch.quantile(tv, 0.95)),
        # the mean's Monte Carlo error: independent per-position errors, sqrt(sum e^2) / n
        "tv_mean_error": math.sqrt(sum(e * e for e in errors)) / len(records),
        "kl_mean": sum(finite) / len(finite) if finite else math.nan,
        "kl_infinite_share": (len(kl) - len(finite)) / len(kl) if kl else math.nan,
    }
