"""Exact match: keep a draft token only if it is the target's greedy choice.

    accepted_i   = [d_i == argmax_v target_logits[i, v]]           i = 0..gamma-1
    num_accepted = length of the all-accepted prefix
    next_token   = argmax_v target_logits[num_accepted, v]          the correction, or the bonus
                                                                    when num_accepted == gamma

Ties go to the lowest token id (torch.argmax), the same rule plain greedy decoding uses, so the
emitted tokens are exactly the target's plain greedy tokens: "lossless" at temperature 0.

Exact match is greedy decoding, whatever the temperature: at T > 0 it still compares with, and
emits, the argmax, and ignores the temperature (argmax is unchanged by temperature, top-k and
top-p, so it reads the raw logits). Use "sampling" to sample losslessly at T > 0.
"""

from __future__ import annotations

import torch

from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput, first_rejection, register
from minispec.model.sampling import greedy_token


def greedy_acceptances(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """[gamma] bool: which drafts equal the target's argmax at their position.

    draft_tokens [gamma] int64, target_logits [gamma+1, V] (the bonus row is not looked at).
    Every position is judged on its own; the prefix rule is `first_rejection`'s job.
    """
    gamma = draft_tokens.shape[0]
    return draft_tokens == greedy_token(target_logits[:gamma])  # [gamma]


@register("exact")
class ExactMatch(AcceptancePolicy):
    """Accept d_i iff d_i == argmax target_logits[i]; correction and bonus are argmaxes too.

    lossless = True here means "emits exactly the target's greedy tokens". At temperature > 0
    this policy is still greedy decoding (it ignores the temperature); see the module docstring.
    """

    lossless = True

    def decide(self, inp: VerifyInput) -> Decision:
        accepted = greedy_acceptances(inp.draft_tokens, inp.target_logits)  # [gamma]
        num_accepted = first_rejection(accepted)
        next_token = int(greedy_token(inp.target_logits[num_accepted]))
        return Decision(num_accepted, next_token)
