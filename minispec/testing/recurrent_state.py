"""Rollback of recurrent state: a small recurrent model, the state checkpoints hybrid models keep, and a
state machine that drives them through verify passes and zero-draft steps.

An attention cache rolls back by forgetting positions. A recurrent layer (Mamba, linear attention,
the recurrent half of a hybrid model) has no positions to forget: its state after the last token is
all it keeps, and a rejected draft has already been folded into it. Hybrid engines therefore keep
the state after each token of the last pass and continue from the one after the last kept token.
The most frequent correctness bug of 2026 in speculative decoding lives there: the state read after
a step that kept several drafts is the wrong slot when the next step has no drafts (a one-token
pass through the plain decode path).

    RecurrentModel         h_t = a * h_{t-1} + E[x_t] (a in (0, 1)^d, elementwise), logits_t = W tanh(h_t);
                           float64, so a pass in pieces equals one pass to round-off
    CheckpointedState      the state before the last pass and after each of its tokens; truncate(n)
                           keeps a prefix of the last pass (n >= the length before it)
    check_recurrent_state  a hypothesis state machine: verify passes of 2..5 tokens that keep 1..all
                           of them, and one-token (zero-draft) steps, every output checked against a
                           pass over the committed tokens from the zero state
"""

from __future__ import annotations

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from minispec.errors import MinispecError
from minispec.testing.strategies import seeds

ATOL = 1e-9  # float64: the same sums in the same order, up to the tanh's round-off


class RecurrentModel:
    """A diagonal linear recurrence read out through tanh: the smallest model whose output depends on
    every earlier token through a state, not a cache of positions."""

    def __init__(self, vocab: int, dim: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.decay = 0.5 + 0.45 * torch.rand(dim, generator=gen, dtype=torch.float64)  # [d] in (0.5, 0.95)
        self.embed = torch.randn(vocab, dim, generator=gen, dtype=torch.float64)  # [V, d]
        self.head = torch.randn(vocab, dim, generator=gen, dtype=torch.float64)  # [V, d]
        self.vocab, self.dim = vocab, dim

    def run(self, tokens: list[int], state: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(logits [T, V], the state after each token) from `state` [d]."""
        states = []
        for token in tokens:
            state = self.decay * state + self.embed[token]
            states.append(state)
        return torch.tanh(torch.stack(states)) @ self.head.T, states

    def __call__(self, tokens: list[int], cache: "CheckpointedState | None" = None) -> torch.Tensor:
        """logits [T, V] of `tokens`, continuing the cache's state (and writing it) or from zero."""
        if cache is None:
            return self.run(tokens, torch.zeros(self.dim, dtype=torch.float64))[0]
        start = cache.start(len(tokens))
        logits, states = self.run(tokens, start)
        cache.record(start, states)
        return logits


class CheckpointedState:
    """What a hybrid model keeps of a recurrent layer for rollback: the state before the last pass
    (`before`, after `committed_before` tokens) and the state after each token of that pass; `kept`
    of them are committed. The model continues from the state after the last kept token."""

    def __init__(self, dim: int, max_len: int) -> None:
        self.dim, self.max_len = dim, max_len
        self.before = torch.zeros(dim, dtype=torch.float64)  # [d]
        self.states: list[torch.Tensor] = []  # [d] each: after each token of the last pass
        self.committed_before, self.kept = 0, 0

    @property
    def length(self) -> int:
        return self.committed_before + self.kept

    def start(self, num_new: int) -> torch.Tensor:
        """The state a pass of `num_new` tokens starts from: after the last committed token, whatever
        num_new is (an engine's one-token decode path and its verify path must read the same slot)."""
        if self.length + num_new > self.max_len:
            raise MinispecError(f"recurrent state: {self.length} + {num_new} tokens > max_len {self.max_len}")
        return self.states[self.kept - 1] if self.kept else self.before

    def record(self, start: torch.Tensor, states: list[torch.Tensor]) -> None:
        """A pass of len(states) tokens ran from `start`: it becomes the last pass, all of it kept."""
        self.before, self.committed_before = start, self.length
        self.states, self.kept = list(states), len(states)

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens: the rollback reaches back into the last pass only."""
        if not self.committed_before <= length <= self.length:
            raise MinispecError(f"recurrent state: truncate({length}); expected {self.committed_before}..{self.length} "
                                "(within the last pass)")
        self.kept = length - self.committed_before


def make_state_machine(cache_factory=CheckpointedState, max_len: int = 40,
                       zero_draft_steps: bool = True) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class testing states built by `cache_factory(dim, max_len)`: verify
    passes that keep a prefix, and (unless `zero_draft_steps` is False) one-token steps."""

    class StateMachine(RuleBasedStateMachine):
        @initialize(vocab=st.integers(2, 6), dim=st.integers(1, 4), seed=seeds)
        def setup(self, vocab, dim, seed):
            self.model = RecurrentModel(vocab, dim, seed)
            self.cache = cache_factory(dim, max_len)
            self.tokens: list[int] = []

        def feed(self, new: list[int]) -> None:
            got = self.model(new, self.cache)  # [T, V]
            want = self.model(self.tokens + new)[-len(new):]  # the committed tokens and these, from zero
            err = (got - want).abs().max().item()
            assert err <= ATOL, (f"after {len(self.tokens)} committed tokens, the pass {new} differs from a pass "
                                 f"over all of them from the zero state by {err:.3g}")
            self.tokens += new

        @precondition(lambda self: hasattr(self, "model") and len(self.tokens) + 5 <= max_len)
        @rule(data=st.data())
        def verify_step(self, data):  # a pass of the last token and gamma drafts; a prefix is kept
            new = data.draw(st.lists(st.integers(0, self.model.vocab - 1), min_size=2, max_size=5), label="pass")
            self.feed(new)
            kept = data.draw(st.integers(1, len(new)), label="kept")
            self.cache.truncate(len(self.tokens) - len(new) + kept)
            self.tokens = self.tokens[: len(self.tokens) - len(new) + kept]

        @precondition(lambda self: zero_draft_steps and hasattr(self, "model") and len(self.tokens) < max_len)
        @rule(data=st.data())
        def zero_draft_step(self, data):  # a step with no drafts: one token through the decode path
            self.feed([data.draw(st.integers(0, self.model.vocab - 1), label="token")])

        @invariant()
        def length_matches(self):
            if hasattr(self, "cache"):
                assert self.cache.length == len(self.tokens), \
                    f"state length {self.cache.length}, but {len(self.tokens)} tokens are committed"

    return StateMachine


def check_recurrent_state(cache_factory=CheckpointedState, *, max_len: int = 40, zero_draft_steps: bool = True,
                          max_examples: int | None = None) -> None:
    """Run the state machine on `cache_factory`; raises AssertionError with the shortest failing
    sequence of steps hypothesis finds, and MinispecError (one line) for arguments it cannot run:
    a factory that is not callable, raises, or builds an object without start / record /
    truncate / length; a max_len below 5 (one verify pass) or a max_examples below 1."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 5:
        raise MinispecError(f"check_recurrent_state: max_len = {max_len!r}; expected an integer >= 5")
    if max_examples is not None and (isinstance(max_examples, bool) or not isinstance(max_examples, int)
                                     or max_examples < 1):
        raise MinispecError(f"check_recurrent_state: max_examples = {max_examples!r}; expected None or an integer >= 1")
    check_factory(cache_factory, max_len)
    machine = make_state_machine(cache_factory, max_len, zero_draft_steps)
    options = {} if max_examples is None else {"max_examples": max_examples}
    run_state_machine_as_test(machine, settings=settings(settings.default, stateful_step_count=12, **options))


def check_factory(cache_factory, max_len: int) -> None:
    """One line (MinispecError) unless cache_factory(dim, max_len) builds an object with the interface."""
    name = getattr(cache_factory, "__name__", type(cache_factory).__name__)
    if not callable(cache_factory):
        raise MinispecError(f"check_recurrent_state: cache_factory = {cache_factory!r} is not callable; expected "
                            "a function (dim, max_len) -> a state with start, record, truncate and length")
    try:
        cache = cache_factory(2, max_len)
    except Exception as error:  # user code: whatever it raises becomes the one line
        raise MinispecError(f"check_recurrent_state: cache_factory {name}(2, {max_len}) raised "
                            f"{type(error).__name__}: {error}; expected a state") from None
    missing = [attr for attr in ("start", "record", "truncate", "length") if not hasattr(cache, attr)]
    if missing:
        raise MinispecError(f"check_recurrent_state: cache_factory {name}(2, {max_len}) returned a "
                            f"{type(cache).__name__} without {', '.join(missing)}; expected CheckpointedState's interface")
