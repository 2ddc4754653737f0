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

Schedules priced by the CPU's measured costs, or that fall back to plain decoding once speculation
stops paying, are studies of the method and live in the lab (minispec.lab.draft_length); any
DraftLength object plugs into the loop the same way.

A schedule only chooses how many tokens to ask for, never which: the verify step and the policy
decide what is emitted, so with the exact policy at temperature 0 the output is plain greedy
decoding's under every schedule. It sees only (drafted, accepted) counts, so it works with every
drafter. Its state lives in the object and `reset()` clears it at the start of every generation:
the same seed gives the same tokens whatever ran before.

The loop sizes its KV caches for gamma + 1 extra positions (a verify pass scores the last token
and g drafts), so a schedule's `gamma` is its maximum and may not exceed the loop's.

Choosing one: `get("fixed" | "heuristic" | a DraftLength, gamma)`, the CLI's --draft-length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

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


SCHEDULES = {"fixed": Fixed, "heuristic": Heuristic}


def get(spec: str | DraftLength, gamma: int) -> DraftLength:
    """A schedule from its name ("fixed" or "heuristic"; at most gamma tokens), or the object itself,
    whose maximum may not exceed the loop's gamma."""
    if isinstance(spec, DraftLength):
        if spec.gamma > gamma:
            raise MinispecError(f"draft_length={spec!r}: drafts up to {spec.gamma} tokens; expected at most "
                                f"gamma={gamma} (the caches hold gamma + 1 extra positions)")
        return spec
    if not isinstance(spec, str) or spec not in SCHEDULES:
        raise MinispecError(f"draft_length={spec!r}: unknown draft length schedule; expected fixed, heuristic or a "
                            f"minispec.chain.draft_length.DraftLength (priced and fallback schedules: "
                            f"minispec.lab.draft_length)")
    return SCHEDULES[spec](gamma)
