"""Draft length: how many tokens to draft in the next verify step.

A fixed gamma wastes draft forwards when the drafter is often wrong (every draft after the first
rejection is thrown away) and leaves tokens on the table when it is nearly always right. A
schedule adapts it from what the target accepted:

    each step:   g = min(schedule.next(), tokens left)       at most the loop's gamma
                 ... draft g tokens, verify, the policy accepts n of the g' actually drafted ...
                 schedule.update(g', n)                      g' <= g: a drafter may propose fewer

    Fixed(gamma)       g = gamma every step (the default; minispec's behaviour without a schedule)
    Heuristic(gamma)   transformers' assisted-generation "heuristic" schedule: +2 after a step
                       that accepted every draft, -1 after one that rejected any, never below 1
                       and, here, never above gamma
    Fallback(gamma, break_even)
                       gamma while this request's speculation pays, 0 (plain decoding) once its
                       recent tokens per step fall below the break-even, with a probe now and then
    Priced(gamma, costs)
                       the g that maximises expected tokens per unit of time, from what a step of
                       g drafts costs on this CPU (measured: kernels/step_cost.py) and this
                       request's acceptance so far: the CLI's --draft-length auto

A schedule only chooses how many tokens to ask for, never which: the verify step and the policy
decide what is emitted, so with the exact policy at temperature 0 the output is plain greedy
decoding's under every schedule. It sees only (drafted, accepted) counts, so it works with every
drafter. Its state lives in the object and `reset()` clears it at the start of every generation:
the same seed gives the same tokens whatever ran before.

The loop sizes its KV caches for gamma + 1 extra positions (a verify pass scores the last token
and g drafts), so a schedule's `gamma` is its maximum and may not exceed the loop's.

Choosing one: `get("fixed" | "heuristic" | "fallback:TAU" | a DraftLength, gamma)`, the CLI's
--draft-length.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

from minispec.checks import check_gamma, is_int
from minispec.errors import MinispecError


class DraftLength(ABC):
    """Interface: the loop calls reset() once per generation, then next() and update() every step."""

    name = "?"  # how stats name it

    def __init__(self, gamma: int) -> None:
        self.gamma = check_gamma(gamma)  # the most tokens next() ever returns

    def reset(self) -> None:
        """A new generation starts: forget what earlier ones taught."""

    @abstractmethod
    def next(self) -> int:
        """How many tokens to draft next: 0..gamma (0 makes the step a plain decode step)."""

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """The step drafted num_drafted tokens and the policy accepted the first num_accepted."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gamma={self.gamma})"


class Fixed(DraftLength):
    """gamma tokens every step, whatever happened before."""

    name = "fixed"

    def next(self) -> int:
        return self.gamma


class Heuristic(DraftLength):
    """transformers' "heuristic" schedule (`num_assistant_tokens_schedule`), capped at gamma:

        every one of the num_drafted > 0 drafts accepted:   length = min(length + 2, gamma)
        any draft rejected:                                 length = max(length - 1, 1)
        nothing drafted (an n-gram miss, a confidence cut): length unchanged

    Growing by 2 and shrinking by 1 probes for longer runs quickly and backs off slowly. It
    starts at `start` (default gamma: the fixed schedule's length, then it adapts). transformers
    starts at 20 with no cap, and its "heuristic" carries the length over to the next generate
    call; this one starts afresh every generation (transformers' "heuristic_transient").
    """

    name = "heuristic"

    def __init__(self, gamma: int, start: int | None = None) -> None:
        super().__init__(gamma)
        self.start = gamma if start is None else start
        if not is_int(self.start) or not 1 <= self.start <= gamma:
            raise MinispecError(f"heuristic draft length: start = {start!r}; expected an integer in 1..gamma={gamma}")
        self.length = self.start

    def reset(self) -> None:
        self.length = self.start

    def next(self) -> int:
        return self.length

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:  # no evidence either way
            return
        if num_accepted == num_drafted:
            self.length = min(self.length + 2, self.gamma)
        else:
            self.length = max(self.length - 1, 1)

    def __repr__(self) -> str:
        return f"Heuristic(gamma={self.gamma}, start={self.start})"


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


SCHEDULES = {"fixed": Fixed, "heuristic": Heuristic, "fallback": Fallback}


def get(spec: str | DraftLength, gamma: int) -> DraftLength:
    """A schedule from its name ("fixed", "heuristic", "fallback:BREAK_EVEN"; at most gamma tokens), or
    the object itself, whose maximum may not exceed the loop's gamma."""
    if isinstance(spec, DraftLength):
        if spec.gamma > gamma:
            raise MinispecError(f"draft_length={spec!r}: drafts up to {spec.gamma} tokens; expected at most "
                                f"gamma={gamma} (the caches hold gamma + 1 extra positions)")
        return spec
    name, colon, value = spec.partition(":") if isinstance(spec, str) else (spec, "", "")
    if name == "fallback":
        try:
            break_even = float(value)
        except ValueError:
            raise MinispecError(f"draft_length={spec!r}: expected fallback:BREAK_EVEN, the tokens per step below "
                                f"which speculation loses (e.g. fallback:1.5)") from None
        return Fallback(gamma, break_even)
    if spec == "auto":
        raise MinispecError("draft_length='auto': needs this CPU's step costs; expected a Priced(gamma, costs) "
                            "(minispec.kernels.step_cost.costs(target, drafter, gamma) measures them)")
    if spec not in SCHEDULES:
        raise MinispecError(f"draft_length={spec!r}: unknown draft length schedule; expected one of "
                            f"fixed, heuristic, fallback:BREAK_EVEN (or a minispec.chain.draft_length.DraftLength)")
    return SCHEDULES[spec](gamma)
