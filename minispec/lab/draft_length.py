"""Draft-length schedules that study when speculation pays: a fallback to plain decoding and a
length priced by this CPU's measured step costs. Both are DraftLength objects
(minispec.chain.draft_length): the loop takes them as it takes Fixed or Heuristic.

    Fallback(gamma, break_even)   gamma while this request's speculation pays, 0 (plain decoding) once
                                  its recent tokens per step fall below the break-even, with a probe
                                  now and then (docs/security.md: tau under attack)
    Priced(gamma, costs)          the g that maximises expected tokens per unit of time, from what a
                                  step of g drafts costs on this CPU (minispec.lab.step_cost) and this
                                  request's acceptance so far: the CLI's --draft-length auto
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from minispec.chain.draft_length import DraftLength
from minispec.checks import is_int
from minispec.errors import MinispecError


class Fallback(DraftLength):
    """Plain decoding for the rest of a request once its speculation stops paying.

    A speculative step of g drafts costs t_verify(g+1 rows) + g t_draft; a plain step costs t_step.
    Speculation is faster while this request's tokens per step exceed the break-even

        tau* = (t_verify(g+1) + g t_draft) / t_step                 measured per CPU, pair and gamma

    (scripts/security/attack_tau.py measures it). The schedule keeps the tokens per drafted step,
    n + 1, of this request's last `window` drafted steps:

        on:   draft gamma; once `window` drafted steps are in and their mean < tau*, turn off
        off:  draft 0 (the step is a plain decode step: a one-row verify pass), except every
              `probe`-th step, which drafts gamma and adds its n + 1 to the window;
              a window mean >= tau* turns it back on

    Each request decides from its own counts alone (a batch gives each row its own copy), so one
    user's prompts cannot switch speculation off for another's, as a server-wide switch on the
    rolling acceptance (TensorRT-LLM's) lets them. It reads counts, never the clock: same seed,
    same tokens; and like every schedule it only chooses how many tokens to draft, so greedy
    exact decoding emits plain greedy's tokens with it.
    """

    name = "fallback"

    def __init__(self, gamma: int, break_even: float, window: int = 4, probe: int = 8) -> None:
        super().__init__(gamma)
        if isinstance(break_even, bool) or not isinstance(break_even, (int, float)) or \
                not 1.0 <= break_even <= gamma + 1:
            raise MinispecError(f"fallback draft length: break_even = {break_even!r}; expected a number of tokens per "
                                f"step in 1..gamma+1={gamma + 1} (a speculative step's cost in plain steps)")
        for label, value in (("window", window), ("probe", probe)):
            if not is_int(value) or not 1 <= value <= 10_000:
                raise MinispecError(f"fallback draft length: {label} = {value!r}; expected an integer in 1..10000")
        self.break_even, self.window, self.probe = float(break_even), int(window), int(probe)
        self.reset()

    def reset(self) -> None:
        self.recent: list[int] = []  # n + 1 of the last `window` drafted steps
        self.on = True
        self.steps_off = 0  # steps since speculation was last turned off or probed

    def next(self) -> int:
        if self.on:
            return self.gamma
        return self.gamma if self.steps_off + 1 >= self.probe else 0  # the probe-th step off drafts again

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:  # a plain step: no evidence, one step closer to the next probe
            self.steps_off += 1
            return
        self.steps_off = 0
        self.recent = (self.recent + [num_accepted + 1])[-self.window:]
        if len(self.recent) == self.window or not self.on:
            self.on = sum(self.recent) / len(self.recent) >= self.break_even

    def __repr__(self) -> str:
        return f"Fallback(gamma={self.gamma}, break_even={self.break_even}, window={self.window}, probe={self.probe})"


def expected_tokens(g: int, alpha: float) -> float:
    """Tokens a step of g drafts emits on average when each draft is accepted with probability alpha,
    independently of the others, until the first rejection (Leviathan et al., 2023):

        E(g) = 1 + alpha + ... + alpha^g = (1 - alpha^(g+1)) / (1 - alpha)      (g + 1 at alpha = 1)

    the accepted drafts plus the one token the target always adds (a correction or the bonus)."""
    return float(g + 1) if alpha >= 1.0 else (1.0 - alpha ** (g + 1)) / (1.0 - alpha)


def best_length(costs: Sequence[float], alpha: float, lowest: int = 0) -> int:
    """The g in lowest..len(costs)-1 with the most expected tokens per unit of time, E(g) / costs[g]
    (costs[g]: a step of g drafts, in any unit; the smallest such g where two tie)."""
    return max(range(lowest, len(costs)), key=lambda g: (expected_tokens(g, alpha) / costs[g], -g))


class Priced(DraftLength):
    """The draft length with the most expected tokens per second, from measured step costs.

    A step of g drafts costs c(g) = (t_verify(g + 1 rows) + g t_draft) / t_step, in plain decoding
    steps (c(0) = 1: a step without drafts is a plain step); how steeply t_verify climbs with its
    rows is the CPU's (docs/benchmarks.md: 0.8-2.2 steps for 6 rows by CPU and format), so the
    best g is too. With alpha the chance that a draft is accepted, each step drafts

        g* = argmax_{g in 0..gamma}  E(g, alpha) / c(g)          E: expected_tokens

    alpha comes from this request's own counts: a step that drafted g and accepted n made n + 1
    trials of which n succeeded (n if all g were accepted), so over the last `window` drafted steps

        alpha = (accepted + prior x start) / (trials + prior)

    (`start` is the guess before any evidence, worth `prior` trials). When g* = 0 (no length
    pays at this alpha) the step is a plain step, and every `probe`-th such step drafts the best
    g > 0 instead, so that alpha can recover. Like every schedule it reads counts, never the
    clock: the costs are fixed when it is built, so the same seed gives the same tokens.
    """

    name = "auto"

    def __init__(self, gamma: int, costs: Sequence[float], start: float = 0.8, prior: float = 2.0,
                 window: int = 8, probe: int = 8) -> None:
        super().__init__(gamma)
        costs = list(costs) if isinstance(costs, (list, tuple)) else costs
        if not isinstance(costs, list) or len(costs) != gamma + 1 or not all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0 for c in costs):
            raise MinispecError(f"auto draft length: costs = {costs!r}; expected gamma + 1 = {gamma + 1} finite "
                                "positive numbers, the cost of a step of 0..gamma drafts")
        for label, value, ok in (("start", start, isinstance(start, (int, float)) and 0.0 <= start <= 1.0),
                                 ("prior", prior, isinstance(prior, (int, float)) and 0.0 < prior <= 1e6),
                                 ("window", window, is_int(window) and 1 <= window <= 10_000),
                                 ("probe", probe, is_int(probe) and 1 <= probe <= 10_000)):
            if isinstance(value, bool) or not ok:
                raise MinispecError(f"auto draft length: {label} = {value!r}; expected "
                                    + ("a probability in [0, 1]" if label == "start" else
                                       "a number in (0, 1e6]" if label == "prior" else "an integer in 1..10000"))
        self.costs = [float(c) / float(costs[0]) for c in costs]  # in plain steps: costs[0] = 1
        self.start, self.prior, self.window, self.probe = float(start), float(prior), int(window), int(probe)
        self.reset()

    def reset(self) -> None:
        self.recent: list[tuple[int, int]] = []  # (accepted, trials) of the last `window` drafted steps
        self.steps_off = 0  # plain steps since the last drafted one

    @property
    def alpha(self) -> float:
        """This request's acceptance estimate (class docstring)."""
        accepted = sum(n for n, _ in self.recent)
        trials = sum(t for _, t in self.recent)
        return (accepted + self.prior * self.start) / (trials + self.prior)

    def next(self) -> int:
        g = best_length(self.costs, self.alpha)
        if g == 0 and self.steps_off + 1 >= self.probe:  # a probe: the best length that drafts
            g = best_length(self.costs, self.alpha, lowest=1)
        return g

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            self.steps_off += 1
            return
        self.steps_off = 0
        trials = num_accepted + (num_accepted < num_drafted)  # the first rejection is a trial too
        self.recent = (self.recent + [(num_accepted, trials)])[-self.window:]

    def __repr__(self) -> str:
        costs = ", ".join(f"{c:.3g}" for c in self.costs)
        return f"Priced(gamma={self.gamma}, costs=[{costs}], start={self.start}, prior={self.prior}, " \
               f"window={self.window}, probe={self.probe})"
