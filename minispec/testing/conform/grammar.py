"""Speculation under a grammar: a toy grammar, the masks engines apply, and the two laws it could give.

Constrained decoding masks, at each position, the tokens a grammar forbids after the tokens so
far (logits set far below the rest, so softmax gives them probability exactly 0). Under
speculation the mask follows the drafted path: the target's row i is masked for the grammar's
state after d_1..d_i ("target only"), and an engine that constrains the draft too samples each
d_i from the draft's masked row ("both sides").

Two distributions could be meant by "the target under the grammar", over sentences x_0..x_{H-1}
of the grammar (H positions, here a step's gamma + 1):

    locally projected     x_i ~ p_i masked to the tokens allowed after x_0..x_{i-1}, renormalised:
                          what plain constrained decoding samples, and what a lossless rule keeps
    grammar-conditional   P(x) = prod_i p_i(x_i) 1[x in the grammar] / Z: the target conditioned on
                          its whole sentence being in the grammar (FVO-Spec, arXiv 2605.07698)

They differ wherever the mass the target puts on a prefix's completions differs between
prefixes. The first emitted token separates them: locally projected, P(x_0 = x) ∝ p_0(x) 1[x
allowed]; grammar-conditional, P(x_0 = x) ∝ p_0(x) Z_1(state after x), where Z_i(s) = sum over
allowed x of p_i(x) Z_{i+1}(state after x) is the target's mass on the completions from state s
at position i (Z_H = 1 on an accepting state). The target's rows do not depend on the context (as
everywhere in the suite), so both laws are exact here.

TOY: 4 tokens, 3 positions; the sentences are 0 3 3 and any three of {1, 2, 0} that do not start
with 0, i.e. a start of 0 commits to the rare token 3 twice. With a target that rarely says 3,
the locally projected law starts with 0 about a third of the time and the grammar-conditional law
almost never (a total variation of ~0.3 between them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec import checks
from minispec.errors import MinispecError

MASKED = -1e4  # a masked logit: exp underflows to exactly 0 at T = 1 in float32 and float64


@dataclass(frozen=True)
class Grammar:
    """A deterministic automaton over token ids: `moves[state][token]` -> the next state (a token with
    no move is forbidden there), sentences of exactly `horizon` tokens ending in `accepting`."""

    vocab: int
    horizon: int
    moves: dict
    accepting: frozenset
    start: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.vocab, int) and self.vocab >= 1 and isinstance(self.horizon, int) and self.horizon >= 1):
            raise MinispecError(f"Grammar: vocab = {self.vocab!r}, horizon = {self.horizon!r}; expected integers >= 1")
        for state, moves in self.moves.items():
            bad = [(t, n) for t, n in moves.items() if not (isinstance(t, int) and 0 <= t < self.vocab) or n not in self.moves]
            if bad:
                raise MinispecError(f"Grammar: moves[{state!r}] holds {bad[0]}; expected token ids in [0, {self.vocab}) "
                                    "leading to states of `moves`")
        if self.start not in self.moves or not set(self.accepting) <= set(self.moves):
            raise MinispecError("Grammar: start and accepting must be states of `moves`")

    def completions(self, position: int) -> dict:
        """{state: whether some sentence completes from it at `position`} for every state."""
        if position == self.horizon:
            return {s: s in self.accepting for s in self.moves}
        after = self.completions(position + 1)
        return {s: any(after[t] for t in self.moves[s].values()) for s in self.moves}

    def allowed(self, state: int | None, position: int) -> torch.Tensor:
        """[V] bool: the tokens allowed at `position` from `state` (those after which the sentence can
        still complete); None, a state off the grammar (after a forbidden draft): every token."""
        if state is None:
            return torch.ones(self.vocab, dtype=torch.bool)
        after = self.completions(position + 1)
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        for token, nxt in self.moves[state].items():
            mask[token] = after[nxt]
        return mask

    def step(self, state: int | None, token: int) -> int | None:
        return None if state is None else self.moves[state].get(token)

    def states_along(self, tokens) -> list:
        """The state before each position of `tokens` (and after the last): None once off the grammar."""
        states = [self.start]
        for token in tokens:
            states.append(self.step(states[-1], int(token)))
        return states

    def mask(self, logits: torch.Tensor, tokens) -> torch.Tensor:
        """logits [R, V], row r at position r after tokens[:r], with the tokens forbidden there set to
        MASKED (a row after a state off the grammar left as it is)."""
        states = self.states_along(tokens)
        out = logits.clone()
        for r in range(logits.shape[0]):
            out[r][~self.allowed(states[r], r)] = MASKED
        return out

    def conditional_first(self, p: torch.Tensor) -> torch.Tensor:
        """The grammar-conditional law of the first token, [V] float64, from the target's rows p
        [horizon, V] (unmasked distributions): p_0(x) Z_1(state after x), normalised."""
        if not isinstance(p, torch.Tensor) or p.shape != (self.horizon, self.vocab):
            raise MinispecError(f"Grammar.conditional_first: p is {type(p).__name__} of shape "
                                f"{list(getattr(p, 'shape', []))}; expected [horizon={self.horizon}, vocab={self.vocab}]")
        for i in range(self.horizon):
            checks.distribution(p[i], f"Grammar.conditional_first: p[{i}]")
        mass = {s: float(s in self.accepting) for s in self.moves}  # Z_H
        for i in range(self.horizon - 1, 0, -1):
            mass = {s: sum(float(p[i, t]) * mass[n] for t, n in self.moves[s].items()) for s in self.moves}
        first = torch.zeros(self.vocab, dtype=torch.float64)
        for token, nxt in self.moves[self.start].items():
            first[token] = float(p[0, token]) * mass[nxt]
        if float(first.sum()) == 0:
            raise MinispecError("Grammar.conditional_first: the target gives every sentence of the grammar "
                                "probability 0; expected some mass on it")
        return first / first.sum()


TOY = Grammar(vocab=4, horizon=3, moves={
    0: {0: 1, 1: 3, 2: 3},  # start: 0 commits to "3 3"; 1 or 2 frees the rest; 3 is forbidden
    1: {3: 2}, 2: {3: 5},  # after 0: 3, then 3
    3: {0: 4, 1: 4, 2: 4}, 4: {0: 5, 1: 5, 2: 5},  # after 1 or 2: any two of 0, 1, 2
    5: {},  # the end
}, accepting=frozenset({5}))
