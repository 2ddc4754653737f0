"""Block verification (Sun et al. 2024, arXiv 2403.10444): the draft judged as one block, lossless.

Token-level speculative sampling (sampling.py) stops at the first position whose coin fails,
even when the drafts after it are ones the target likes more than the draft does. Block
verification keeps, along the draft, how much target mass the prefix has left over and decides
the accepted length jointly, from the last position back. With x_1..x_gamma the drafts, p_i and
q_i the target's and the draft's distributions at position i (0-based rows of p_target and
q_draft; p_gamma is the bonus row):

    weights     w_0 = 1,   w_{i+1} = min(1, w_i p_i(x_{i+1}) / q_i(x_{i+1}))      i = 0..gamma-1
    residual    m_j = sum_v max(0, w_j p_j(v) - q_j(v))                            j = 1..gamma-1
    stop prob.  h_j = m_j / (m_j + 1 - w_j)   (0 when m_j + 1 - w_j = 0),   h_gamma = w_gamma
    length      tau = the largest j in 1..gamma with u_j < h_j (u_j ~ U[0, 1) independent), else 0
    next token  tau = gamma: a draw from p_gamma (the bonus);
                tau < gamma: a draw from norm(max(0, w_tau p_tau - q_tau)) (w_0 = 1: the usual residual)

What the paper proves, and what the tests here check (exactly, on small vocabularies):
- lossless: the emitted tokens are distributed as sampling from the target alone, at any
  temperature (p and q post-processed identically by minispec.model.sampling.logits_to_probs);
- optimal for one draft chain: no valid verification of the same draft accepts more tokens in
  expectation, so never fewer than token-level verification (E[tau] >= E[tau_token]);
- at gamma = 1 it is token-level verification: h_1 = w_1 = min(1, p(x)/q(x)). Here, draw for
  draw: the same uniform (one per drafted position, drawn up front) and the same strict `<`.
- at T = 0 (one-hot p and q) it is exact match: w_j is 1 along the argmax prefix and 0 after;
  h_j = 1 at the first mismatch (m_j = 1, w_j = 1), 0 after it (m_j = 0, w_j = 0); the residual
  of a one-hot p is p itself.

The 0/0 case, m_j + 1 - w_j = 0, needs w_j = 1 and m_j = 0, so p_j <= q_j everywhere, hence
p_j = q_j and w_{j+1} = 1 whatever x_{j+1} is. By induction some later j then stops with
certainty (h = 1, or h_gamma = w_gamma = 1), so tau > j and the value given to h_j never
changes a decision; we take 0 ("do not stop here").

Our decisions where the paper is silent:
- a draft token the drafter gave no mass (q_i(x) = 0, which a consistent drafter never does):
  w_{i+1} = 1 if p_i(x) > 0 and w_i > 0, else 0 (the limit of the min; sampling.py's rule);
- the stop probabilities are computed in float64 whatever the logits' dtype, so a probability 1
  always stops and a probability 0 never does;
- randomness: gamma uniforms (float64) from the verify generator, then one token draw, the order
  token-level verification uses, so that gamma = 1 reproduces it exactly.

Its cost over token-level verification is one [gamma, V] pass for the residual masses.
"""

from __future__ import annotations

import torch

from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput, register
from minispec.acceptance.sampling import residual_distribution
from minispec.model.sampling import sample_token

F64 = torch.float64


def block_weights(p_target: torch.Tensor, q_draft: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """w_0..w_gamma: [gamma+1] float64, w_0 = 1, w_{i+1} = min(1, w_i p_i(x_{i+1}) / q_i(x_{i+1}))."""
    gamma = draft_tokens.shape[0]
    index = draft_tokens.unsqueeze(-1)  # [gamma, 1]
    p_x = p_target[:gamma].gather(-1, index).squeeze(-1).to(F64).tolist()  # [gamma]
    q_x = q_draft.gather(-1, index).squeeze(-1).to(F64).tolist()  # [gamma]
    weights = [1.0]
    for p, q in zip(p_x, q_x):
        w = weights[-1]
        weights.append(min(1.0, w * p / q) if q > 0 else float(p > 0 and w > 0))
    return torch.tensor(weights, dtype=F64)


def stop_probabilities(p_target: torch.Tensor, q_draft: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """h_1..h_gamma: [gamma] float64; h_j = m_j / (m_j + 1 - w_j) for j < gamma, h_gamma = w_gamma."""
    gamma = q_draft.shape[0]
    w = weights[1:gamma]  # [gamma-1]: w_1..w_{gamma-1}
    mass = (w[:, None] * p_target[1:gamma].to(F64) - q_draft[1:gamma].to(F64)).clamp(min=0).sum(-1)  # [gamma-1]
    denominator = mass + (1 - w)  # [gamma-1]
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    inner = torch.where(denominator > 0, mass / safe, torch.zeros_like(mass)).clamp(max=1.0)
    return torch.cat([inner, weights[gamma:]])  # [gamma]


def accepted_length(stop: torch.Tensor, uniforms: torch.Tensor) -> int:
    """tau: the largest j (1-based) with uniforms[j-1] < stop[j-1], else 0."""
    hits = (uniforms < stop).nonzero()
    return int(hits[-1]) + 1 if len(hits) else 0


def next_distribution(p_target: torch.Tensor, q_draft: torch.Tensor, weights: torch.Tensor, tau: int) -> torch.Tensor:
    """What the token after the accepted prefix is drawn from: [V] float64 (sample_token
    normalises it). An empty residual max(0, w_tau p_tau - q_tau) can only come at a tau of
    probability 0 (a stop needs m_tau > 0); residual_distribution then returns its first argument."""
    gamma = q_draft.shape[0]
    if tau == gamma:
        return p_target[gamma].to(F64)
    return residual_distribution(weights[tau] * p_target[tau].to(F64), q_draft[tau].to(F64))


@register("block")
class BlockVerification(AcceptancePolicy):
    """Sun et al.'s block verification: accept the longest prefix a backward joint rule allows.

    Lossless at any temperature, and optimal in expected accepted tokens for a single draft
    chain (module docstring). Randomness: gamma uniforms, then one token, from `inp.generator`.
    """

    lossless = True

    def decide(self, inp: VerifyInput) -> Decision:
        weights = block_weights(inp.p_target, inp.q_draft, inp.draft_tokens)  # [gamma+1]
        stop = stop_probabilities(inp.p_target, inp.q_draft, weights)  # [gamma]
        uniforms = torch.rand(inp.gamma, generator=inp.generator, dtype=F64, device=inp.generator.device)  # [gamma]
        tau = accepted_length(stop, uniforms.cpu())
        token = sample_token(next_distribution(inp.p_target, inp.q_draft, weights, tau), inp.generator)
        return Decision(tau, token)


@register("traversal")
class TraversalVerification(BlockVerification):
    """Traversal verification (Weng et al., arXiv 2505.12398), the tree counterpart of block
    verification: on a tree, minispec.trees.walks.traversal_walk (leaf to root, lossless);
    on a chain it is block verification itself, draw for draw, so `decide` is inherited."""

    lossless = True
