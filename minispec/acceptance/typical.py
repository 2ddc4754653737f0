"""Typical acceptance (Medusa, Cai et al. 2024): keep a draft the target finds plausible enough.

For each drafted position i, with p the target's distribution at that position:

    H(p)       = -sum_v p(v) ln p(v)                         entropy, natural log, 0 ln 0 = 0
    threshold  = min(eps, delta * exp(-H(p)))
    accepted_i = [p(d_i) > threshold]                        strict
    next_token = argmax p (T = 0)  or  y ~ p_target (T > 0)  at num_accepted (correction or bonus)

A flat p (high entropy) lowers the bar, so many continuations pass where the target is unsure;
a peaked p raises it towards eps. Lossy: the output is not distributed as p_target.

Our decision (the paper only uses typical acceptance when sampling): at temperature 0 p_target
is one-hot and the rule would collapse into exact match, so the criterion then reads
softmax(target_logits / greedy_criterion_temperature), default temperature 1: a draft the target
ranks a close second can be accepted. The emitted correction / bonus stays the argmax.
"""

from __future__ import annotations

import math

import torch

from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput, first_rejection, is_number, register
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams, greedy_token, logits_to_probs, sample_token


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(p) = -sum_v p(v) ln p(v), zeros contributing 0: [..., V] -> [...]."""
    return -torch.xlogy(probs, probs).sum(dim=-1)


def typical_acceptances(criterion_probs: torch.Tensor, draft_tokens: torch.Tensor, eps: float, delta: float) -> torch.Tensor:
    """[gamma] bool: p_i(d_i) > min(eps, delta * exp(-H(p_i))), with p = criterion_probs [gamma(+1), V]."""
    gamma = draft_tokens.shape[0]
    probs = criterion_probs[:gamma]  # [gamma, V]
    p_draft = probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [gamma]: p_i(d_i)
    threshold = torch.clamp(delta * torch.exp(-entropy(probs)), max=eps)  # [gamma]
    return p_draft > threshold


@register("typical")
class TypicalAcceptance(AcceptancePolicy):
    """Medusa's typical acceptance: accept d_i iff p(d_i) > min(eps, delta * exp(-H(p))).

    eps=0.09 and delta=0.3 are Medusa's defaults (posterior_threshold, posterior_alpha).
    greedy_criterion_temperature: our decision, the temperature of the distribution the rule
    reads at T = 0 (see the module docstring). Lossy.
    """

    lossless = False

    def __init__(self, eps: float = 0.09, delta: float = 0.3, greedy_criterion_temperature: float = 1.0) -> None:
        if not (is_number(eps) and 0 < eps <= 1):
            raise MinispecError(f"typical eps = {eps!r}; expected 0 < eps <= 1")
        if not (is_number(delta) and 0 < delta < math.inf):
            raise MinispecError(f"typical delta = {delta!r}; expected a finite delta > 0")
        t = greedy_criterion_temperature
        if not (is_number(t) and 0 < t < math.inf):
            raise MinispecError(f"typical greedy_criterion_temperature = {t!r}; expected a finite number > 0")
        self.eps = eps
        self.delta = delta
        self.greedy_criterion_temperature = greedy_criterion_temperature

    def decide(self, inp: VerifyInput) -> Decision:
        if inp.params.greedy:
            raw = SamplingParams(temperature=self.greedy_criterion_temperature)  # plain softmax(logits / T)
            criterion_probs = logits_to_probs(inp.target_logits, raw)  # [gamma+1, V]
        else:
            criterion_probs = inp.p_target  # [gamma+1, V]
        accepted = typical_acceptances(criterion_probs, inp.draft_tokens, self.eps, self.delta)  # [gamma]
        num_accepted = first_rejection(accepted)
        if inp.params.greedy:
            next_token = int(greedy_token(inp.target_logits[num_accepted]))
        else:
            next_token = sample_token(inp.p_target[num_accepted], inp.generator)
        return Decision(num_accepted, next_token)
