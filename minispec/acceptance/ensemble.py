"""The static ensemble (DIVERSED's static form; transformers' `assistant_ensemble_weight`): a lossy rule with a known target.

Speculative sampling (sampling.py) makes the emitted tokens follow the target p exactly. The
static ensemble makes them follow a mixture of the draft and the target instead,

    v = (1 - w) q + w p                 w in [0, 1], the weight of the target

by running speculative sampling with v in the target's place at each drafted position i:

    accept d_i   iff  u_i < min(1, v(d_i) / q(d_i)) = min(1, (1 - w) + w p(d_i) / q(d_i))
    correction   y ~ norm(max(0, v - q)) = norm(max(0, w (p - q))) = norm(max(0, p - q))   (w > 0)
    bonus        y ~ p_target[gamma]   (there is no draft distribution at the bonus row to mix)

Sampling's proof, with v for p, gives P(y) = v(y) at every drafted position: the rule is
lossless with respect to v, and its distance from the target is exactly
TV(v, p) = (1 - w) TV(q, p). Every draft is kept with probability at least 1 - w, whatever the
target thinks of it. w = 1 is speculative sampling draw for draw (v = 0 q + 1 p = p, the same
uniforms and the same correction draw); w = 0 keeps every draft (v = q).

At temperature 0 both p and q are one-hot: a draft that is not the target's argmax is kept with
probability 1 - w, so unlike lenience the ensemble is lossy at T = 0 too.

Our decisions where the source is silent:
- the bonus row is drawn from p: the draft has not scored that position, so there is no q to
  mix (transformers also draws its bonus from the target);
- at w = 0 the correction residual max(0, q - q) is empty, and a rejection cannot happen
  (v(d)/q(d) = 1 wherever q(d) > 0); sampling.residual_distribution's rule keeps the draw
  defined: its first argument, here v = q;
- a draft token the drafter gave no mass (q(d) = 0): kept iff v(d) > 0, i.e. iff w p(d) > 0
  (sampling.acceptance_probability's rule).
"""

from __future__ import annotations

import torch

from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput, first_rejection, is_number, register
from minispec.acceptance.sampling import correction_or_bonus, sample_acceptances
from minispec.errors import MinispecError


def ensemble_target(p_target: torch.Tensor, q_draft: torch.Tensor, weight: float) -> torch.Tensor:
    """v = (1 - w) q + w p on the gamma drafted rows, then p's bonus row: [gamma+1, V]."""
    gamma = q_draft.shape[0]
    mixed = (1 - weight) * q_draft + weight * p_target[:gamma]  # [gamma, V]
    return torch.cat([mixed, p_target[gamma:]])  # [gamma+1, V]


@register("ensemble")
class StaticEnsemble(AcceptancePolicy):
    """Speculative sampling against v = (1 - w) q + w p: the output follows v, not p.

    weight: w, the target's share of the mixture (transformers' assistant_ensemble_weight).
    w = 1: speculative sampling, draw for draw. w < 1: lossy, TV(v, p) = (1 - w) TV(q, p).
    Randomness: gamma uniforms, then one draw, from `inp.generator` (sampling's order).
    """

    lossless = False

    def __init__(self, weight: float = 0.5) -> None:
        if not (is_number(weight) and 0 <= weight <= 1):
            raise MinispecError(f"ensemble weight = {weight!r}; expected a number in [0, 1] (1: lossless sampling)")
        self.weight = weight

    def decide(self, inp: VerifyInput) -> Decision:
        v_target = ensemble_target(inp.p_target, inp.q_draft, self.weight)  # [gamma+1, V]
        accepted = sample_acceptances(v_target, inp.q_draft, inp.draft_tokens, inp.generator)  # [gamma]
        num_accepted = first_rejection(accepted)
        next_token = correction_or_bonus(v_target, inp.q_draft, num_accepted, inp.generator)
        return Decision(num_accepted, next_token)
