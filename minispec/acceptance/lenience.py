"""Lenience (Leviathan et al. 2022, their lossy variant): speculative sampling against a scaled draft.

Token-level speculative sampling (sampling.py) accepts d_i with probability min(1, p(d_i)/q(d_i)).
Lenience divides the draft's probability by a factor beta in [0, 1] before the test:

    accept d_i   iff  u_i < min(1, p(d_i) / (beta q(d_i)))          u_i ~ U[0, 1), one per position
    correction   y ~ norm(max(0, p - beta q))   at the first rejected position
    bonus        y ~ p_target[gamma]            after a fully accepted draft

that is, sampling.py's two rules with q replaced by the sub-probability beta q. beta = 1 is
speculative sampling itself (lossless), draw for draw: the same uniforms, the same comparisons
(beta q = q exactly), the same correction draw. beta = 0 accepts every draft the target gives
any mass (p(d_i) > 0) and emits the draft's own distribution there. In between, a draft token is
accepted with probability min(1, p/(beta q)) >= min(1, p/q): more tokens per step, and an output
distribution that leans towards the draft's. Lossy for beta < 1.

At temperature 0 p_target is one-hot, p(d_i) = 0 for every draft that is not the argmax, and the
test never passes for those: lenience at T = 0 is exact match whatever beta. It is a knob for
sampling only; its effect shows at T > 0.

Our decisions where the paper is silent:
- the residual at a rejection is norm(max(0, p - beta q)): the residual that makes the test and
  the correction one rule (at beta = 1, the lossless one); where it has no mass (p <= beta q
  everywhere, possible only for beta < 1 with a rounding-level p), p itself is drawn
  (sampling.residual_distribution's rule);
- beta is a number in [0, 1]: above 1 the test would be stricter than the lossless one.
"""

from __future__ import annotations

from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput, first_rejection, is_number, register
from minispec.acceptance.sampling import correction_or_bonus, sample_acceptances
from minispec.errors import MinispecError


@register("lenience")
class Lenience(AcceptancePolicy):
    """Accept d_i with probability min(1, p(d_i) / (beta q(d_i))); correct from norm(max(0, p - beta q)).

    beta = 1: speculative sampling, draw for draw. beta < 1: lossy, more accepted drafts.
    Randomness: gamma uniforms, then one draw, from `inp.generator` (sampling's order).
    """

    lossless = False

    def __init__(self, beta: float = 0.5) -> None:
        if not (is_number(beta) and 0 <= beta <= 1):
            raise MinispecError(f"lenience beta = {beta!r}; expected a number in [0, 1] (1: lossless sampling)")
        self.beta = beta

    def decide(self, inp: VerifyInput) -> Decision:
        q_scaled = self.beta * inp.q_draft  # [gamma, V] beta q: a sub-probability for beta < 1
        accepted = sample_acceptances(inp.p_target, q_scaled, inp.draft_tokens, inp.generator)  # [gamma]
        num_accepted = first_rejection(accepted)
        next_token = correction_or_bonus(inp.p_target, q_scaled, num_accepted, inp.generator)
        return Decision(num_accepted, next_token)
