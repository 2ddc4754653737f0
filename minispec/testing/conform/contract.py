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

An Engine wraps such a function with what it claims: the distribution each drafted position's
output follows (`claims(p, q)`: p for a lossless rule, (1 - w) q + w p for the static ensemble,
None for a lossy rule that states none) and the probability it accepts a draft there in closed
form (`accepts(c, q)`: sum_x min(c(x), q(x)) for speculative sampling). The invariants
(invariants.py) test the function against those claims.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

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

    def __call__(self, inp: StepInput) -> StepOutput:
        return as_output(self.step(inp))


def as_output(out) -> StepOutput:
    """A StepOutput from what an engine returned (a StepOutput, a pair, tensors of one element)."""
    if isinstance(out, StepOutput):
        return out
    num_accepted, next_token = out
    return StepOutput(int(num_accepted), int(next_token))


def step_input(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor,
               generator: torch.Generator, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None) -> StepInput:
    """A StepInput with the suite's float64 reference distributions filled in."""
    params = SamplingParams(temperature, top_k, top_p)
    return StepInput(target_logits, draft_logits, draft_tokens, generator, temperature, top_k, top_p,
                     p_target=logits_to_probs(target_logits.double(), params),
                     q_draft=logits_to_probs(draft_logits.double(), params))
