"""The acceptance step as a function of tensors: the one door any engine's verification comes through.

After the target has scored gamma drafted tokens, every engine (minispec, transformers, vLLM,
yours) decides the same thing from the same tensors:

    StepInput
      target_logits  [gamma+1, V] float32  the target's raw logits at each drafted position and the bonus
      draft_logits   [gamma, V]   float32  the draft's raw logits at each drafted position
      draft_tokens   [gamma]      int64    d_1..d_gamma, sampled by the suite from q_draft
      temperature, top_k, top_p            to be applied by the engine to both sides (T = 0: greedy)
      generator                            the step's only source of randomness
      p_target [gamma+1, V], q_draft [gamma, V]   the same, post-processed in float64 by the suite
                                           (for an engine that takes probabilities)
    StepOutput
      num_accepted in 0..gamma             the kept prefix d_1..d_num_accepted
      next_token   in 0..V-1               the correction, or the bonus after d_gamma
      emitted                              an engine that proposes (below): the tokens it emitted

An engine that proposes (`proposes=True`) draws its own drafts from the draft logits with its own
randomness (the step's generator, or global state seeded from it), ignoring draft_tokens, and
returns the tokens it emitted: its kept drafts and then one more, 1..gamma+1 of them. That is the
whole step a user runs, so a stream shared between proposal and verification, or draft
probabilities lost between them, shows in the output's law.

An Engine wraps such a function with what it claims: the distribution each drafted position's
output follows (`claims(p, q)`: p for a lossless rule, (1 - w) q + w p for the static ensemble,
None for a lossy rule that states none) and the probability it accepts a draft there in closed
form (`accepts(c, q)`: sum_x min(c(x), q(x)) for speculative sampling). The invariants
(invariants.py) test the function against those claims.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from minispec import checks
from minispec.acceptance.base import returned_index
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams, logits_to_probs

Distribution = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (p [V], q [V]) -> [V]


@dataclass
class StepInput:
    target_logits: torch.Tensor  # [gamma+1, V] float32 (or the dtype under test)
    draft_logits: torch.Tensor  # [gamma, V]
    draft_tokens: torch.Tensor  # [gamma] int64
    generator: torch.Generator
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    p_target: torch.Tensor | None = None  # [gamma+1, V] float64, filled by `step_input`
    q_draft: torch.Tensor | None = None  # [gamma, V] float64

    @property
    def gamma(self) -> int:
        return self.draft_tokens.shape[0]

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True)
class StepOutput:
    num_accepted: int
    next_token: int
    emitted: tuple[int, ...] | None = None  # a proposing engine's tokens: its kept drafts, then next_token

    def __repr__(self) -> str:
        emitted = "" if self.emitted is None else f", emitted={self.emitted}"
        return f"StepOutput(num_accepted={self.num_accepted}, next_token={self.next_token}{emitted})"

    def tokens(self, drafts: torch.Tensor) -> list[int]:
        """The emitted tokens: the engine's own, or the kept prefix of `drafts` and next_token."""
        return list(self.emitted) if self.emitted is not None else drafts[: self.num_accepted].tolist() + [self.next_token]


@contextmanager
def global_state_from(generator: torch.Generator):
    """For an engine that draws from torch's global random state: that state seeded from the step's
    generator (one draw of it), restored afterwards, so the generator stays the step's only source of
    randomness. Yields the seed (an engine that reseeds mid-step, as a planted bug does, needs it)."""
    seed = int(torch.randint(2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield seed


def lossless(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The claim of a lossless rule: each position's output follows the target's p."""
    return p


def overlap(c: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(accept) of speculative sampling towards c: sum_x q(x) min(1, c(x) / q(x)) = sum_x min(c, q)."""
    return torch.minimum(c, q).sum()


@dataclass
class Engine:
    """An acceptance step under test, and what it claims.

    step:        StepInput -> StepOutput (or a (num_accepted, next_token) pair)
    claims:      (p, q) -> the distribution a drafted position's output follows; None: states none
    accepts:     (c, q) -> P(a draft is kept) at a position, c = claims(p, q); None: states none
    greedy:      takes temperature 0 (emits the target's argmax tokens); False: n/a at T = 0
    samples:     samples at T > 0; False (a greedy-only rule): only the T = 0 invariants apply
    batch_step:  [StepInput] -> [StepOutput] for an engine that decides a batch in one call
    proposes:    draws its own drafts; step returns the emitted tokens (module docstring)
    """

    name: str
    step: Callable[[StepInput], StepOutput | tuple[int, int]]
    claims: Distribution | None = lossless
    accepts: Distribution | None = overlap
    greedy: bool = True
    samples: bool = True
    batch_step: Callable[[Sequence[StepInput]], Sequence[StepOutput | tuple[int, int]]] | None = None
    note: str = ""
    options: dict = field(default_factory=dict)
    proposes: bool = False

    # Every call into the engine goes through these four: what it returns is checked by one rule
    # (minispec.checks.returned_index for ids and counts, `distribution` and `probability` below),
    # and what it raises or returns outside the contract is Broken, which the suite turns into a
    # FAIL verdict naming it. Its inputs are copies: an engine that writes into them changes nothing.

    def __call__(self, inp: StepInput) -> StepOutput:
        return as_output(plugin(lambda: self.step(inp), f"{self.name}: step"), inp.gamma, inp.target_logits.shape[1],
                         self.proposes)

    def batch(self, inputs: Sequence[StepInput]) -> list[StepOutput]:
        outs = plugin(lambda: self.batch_step(list(inputs)), f"{self.name}: batch_step")
        if isinstance(outs, (str, bytes)) or not isinstance(outs, Sequence) or len(outs) != len(inputs):
            raise Broken(f"{self.name}: batch_step returned {describe(outs)} for {len(inputs)} inputs; expected "
                         f"a list of {len(inputs)} outputs, one per input")
        return [as_output(o, i.gamma, i.target_logits.shape[1], self.proposes) for o, i in zip(outs, inputs)]

    def claim(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """claims(p, q), checked: a distribution over p's vocabulary, [V] float64."""
        c = plugin(lambda: self.claims(p.clone(), q.clone()), f"{self.name}: claims")
        return distribution(c, p.shape[0], f"{self.name}: claims(p, q)")

    def accept(self, c: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """accepts(c, q), checked: a probability, a 0-d float64 tensor."""
        a = plugin(lambda: self.accepts(c.clone(), q.clone()), f"{self.name}: accepts")
        return probability(a, f"{self.name}: accepts(c, q)")


class Broken(Exception):
    """The engine raised, or returned something outside the contract: a FAIL verdict, not a crash."""


def plugin(call: Callable[[], object], where: str):
    """call(), with anything it raises as Broken naming `where` (the engine's code is not ours)."""
    try:
        return call()
    except Broken:
        raise
    except Exception as err:  # noqa: BLE001 - user code
        raise Broken(f"{where} raised {type(err).__name__}: {' '.join(str(err).split())}") from err


def describe(value) -> str:
    shape = f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
    return f"{type(value).__name__}{shape}"


def as_output(out, gamma: int, vocab: int, proposes: bool = False) -> StepOutput:
    """A StepOutput from what an engine returned (a StepOutput, or a pair of ints or one-element integer
    tensors; a proposing engine: its 1..gamma+1 emitted tokens), each field checked by
    minispec.checks.returned_index: no float truncated, no string parsed."""
    if proposes:
        if isinstance(out, torch.Tensor) and out.dim() == 1:
            out = list(out)
        if not isinstance(out, (tuple, list)) or not 1 <= len(out) <= gamma + 1:
            raise Broken(f"step returned {describe(out)}; expected the 1..{gamma + 1} tokens it emitted")
        try:
            emitted = tuple(returned_index(t, f"emitted[{i}]", vocab) for i, t in enumerate(out))
        except MinispecError as err:
            raise Broken(f"step returned {err}") from None
        return StepOutput(len(emitted) - 1, emitted[-1], emitted)
    if isinstance(out, StepOutput):
        num_accepted, next_token = out.num_accepted, out.next_token
    elif isinstance(out, (tuple, list)) and len(out) == 2:
        num_accepted, next_token = out
    else:
        raise Broken(f"step returned {describe(out)}; expected a StepOutput or a (num_accepted, next_token) pair")
    try:
        return StepOutput(returned_index(num_accepted, "num_accepted", gamma + 1),
                          returned_index(next_token, "next_token", vocab))
    except MinispecError as err:
        raise Broken(f"step returned {err}") from None


def distribution(value, vocab: int, where: str) -> torch.Tensor:
    """A claimed distribution: a real tensor [vocab], finite, >= 0, summing to 1 within 1e-6 -> float64."""
    if not isinstance(value, torch.Tensor) or value.shape != (vocab,):
        raise Broken(f"{where} returned {describe(value)}; expected a real tensor of shape [{vocab}]")
    try:
        return checks.distribution(value.detach().cpu(), f"{where} returned {value.tolist()}")
    except MinispecError as err:
        raise Broken(str(err)) from None


def probability(value, where: str) -> torch.Tensor:
    """A closed-form acceptance: a number or one-element real tensor in [0, 1] -> a 0-d float64 tensor."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool:
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:  # also nan
        raise Broken(f"{where} returned {value!r}; expected a probability in [0, 1]")
    return torch.tensor(float(value), dtype=torch.float64)


def step_input(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor,
               generator: torch.Generator, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None) -> StepInput:
    """A StepInput with the suite's float64 reference distributions filled in."""
    params = SamplingParams(temperature, top_k, top_p)
    return StepInput(target_logits, draft_logits, draft_tokens, generator, temperature, top_k, top_p,
                     p_target=logits_to_probs(target_logits.double(), params),
                     q_draft=logits_to_probs(draft_logits.double(), params))
