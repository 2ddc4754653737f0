"""Speculative sampling (Leviathan et al. 2022; Chen et al. 2023): lossless at any temperature.

For each drafted position i = 0..gamma-1, with x = d_i drawn by the drafter from q = q_draft[i]
and p = p_target[i]:

    accept x with probability   a(x) = min(1, p(x) / q(x))             (a(x) = 1{p(x) > 0} if q(x) = 0)
    at the first rejection emit y ~ r = norm(max(0, p - q))              the residual distribution
    if all gamma are accepted   y ~ p_target[gamma]                      the bonus token

Why the output is distributed exactly as p (one position; the rest follows by induction, since
an accepted x leaves the target's next row as the next distribution):

    P(y) = q(y) a(y) + P(reject) r(y) = min(p(y), q(y)) + max(0, p(y) - q(y)) = p(y),
    because P(reject) = 1 - sum_x min(p(x), q(x)) = sum_z max(0, p(z) - q(z)), r's normaliser.

p and q must be the post-processed distributions (temperature, top-k, top-p applied identically
to both, which minispec.model.sampling.logits_to_probs guarantees). At temperature 0 both are one-hot,
a(x) is 1 iff x is the target's argmax, and the residual of a one-hot p is p itself, so this
policy then reduces exactly to exact match.

The two rules are module-level functions so that other policies (DropMatch uses this one as its
base at T > 0) and tests can compose them without running `decide`.
"""

from __future__ import annotations

import torch

from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput, first_rejection, register
from minispec.model.sampling import sample_token


def acceptance_probability(p_target: torch.Tensor, q_draft: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """a_i = min(1, p_i(d_i) / q_i(d_i)) for each drafted position: [gamma].

    p_target [gamma, V] (a trailing bonus row, [gamma+1, V], is ignored), q_draft [gamma, V],
    draft_tokens [gamma]. Where q_i(d_i) = 0 (the drafter proposed a token it gave no mass,
    which a consistent drafter never does), a_i = 1 if p_i(d_i) > 0 else 0.
    """
    gamma = draft_tokens.shape[0]
    index = draft_tokens.unsqueeze(-1)  # [gamma, 1]
    p_x = p_target[:gamma].gather(-1, index).squeeze(-1)  # [gamma]
    q_x = q_draft.gather(-1, index).squeeze(-1)  # [gamma]
    ratio = p_x / torch.where(q_x > 0, q_x, torch.ones_like(q_x))  # [gamma], no 0/0
    return torch.where(q_x > 0, ratio.clamp(max=1.0), (p_x > 0).to(ratio.dtype))


def residual_distribution(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """r = max(0, p - q) / sum(max(0, p - q)): [V] (or [..., V] row by row).

    If p <= q everywhere (so p == q) the residual is empty; p itself is returned then. A
    rejection cannot happen in that case when q is consistent with the draft, so this only
    keeps the draw well defined.
    """
    excess = (p_row - q_row).clamp(min=0)  # [..., V]
    mass = excess.sum(dim=-1, keepdim=True)  # [..., 1]
    return torch.where(mass > 0, excess / torch.where(mass > 0, mass, torch.ones_like(mass)), p_row)


def sample_acceptances(p_target: torch.Tensor, q_draft: torch.Tensor, draft_tokens: torch.Tensor,
                       generator: torch.Generator) -> torch.Tensor:
    """[gamma] bool: accepted_i = u_i < a_i with u_i ~ U[0, 1), all gamma drawn up front.

    The gamma uniforms are the first thing drawn from `generator` in a verify step (float64, so
    a_i = 1 always accepts and a_i = 0 never does).
    """
    gamma = draft_tokens.shape[0]
    uniforms = torch.rand(gamma, generator=generator, dtype=torch.float64, device=generator.device)  # [gamma]
    accept_prob = acceptance_probability(p_target, q_draft, draft_tokens)  # [gamma]
    return uniforms.to(accept_prob.device) < accept_prob


def correction_or_bonus(p_target: torch.Tensor, q_draft: torch.Tensor, num_accepted: int,
                        generator: torch.Generator) -> int:
    """The token after the accepted prefix: a draw from the residual at the first rejected
    position (num_accepted < gamma), else the bonus, a draw from p_target[gamma]."""
    gamma = q_draft.shape[0]
    if num_accepted < gamma:
        return sample_token(residual_distribution(p_target[num_accepted], q_draft[num_accepted]), generator)
    return sample_token(p_target[gamma], generator)


@register("sampling")
class SpeculativeSampling(AcceptancePolicy):
    """Accept d_i with probability min(1, p(d_i)/q(d_i)); correct from norm(max(0, p - q)).

    Lossless: the emitted tokens are distributed exactly as sampling from the target alone
    (see the module docstring for the proof). Randomness: gamma uniforms, then one draw for
    the correction or bonus, all from `inp.generator`.
    """

    lossless = True

    def decide(self, inp: VerifyInput) -> Decision:
        accepted = sample_acceptances(inp.p_target, inp.q_draft, inp.draft_tokens, inp.generator)  # [gamma]
        num_accepted = first_rejection(accepted)
        next_token = correction_or_bonus(inp.p_target, inp.q_draft, num_accepted, inp.generator)
        return Decision(num_accepted, next_token)
