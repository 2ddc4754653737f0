"""The KL judge (Sun et al., arXiv 2601.04766): judge decoding with the draft-target divergence as the judge.

Judge decoding keeps a draft token the target would reject when a judge says the mismatch does
not matter. Trained judges (AutoJudge) learn a "criticality" score; the paper shows that score
tracks the KL divergence between the two models' distributions at that position, and replaces
the trained judge by a threshold on it, with a confidence mask: where the target is sure of
itself, the ordinary rule decides. For each drafted position i = 0..gamma-1, with d_i the draft
and c_i, e_i the target's and the draft's distributions there:

    base_i     the base rule's verdict: T = 0: d_i == argmax target_logits[i]     (exact match)
                                        T > 0: u_i < min(1, p(d_i) / q(d_i))      (sampling)
    KL_i       = sum_v c_i(v) ln(c_i(v) / e_i(v))        KL(target || draft), nats, 0 ln 0 = 0
    judge_i    = KL_i < threshold  and  max_v c_i(v) <= confidence  and  c_i(d_i) > 0
    accepted_i = base_i or judge_i;   num_accepted = the all-accepted prefix (first_rejection)
    next_token = the base rule's: T = 0: argmax at num_accepted; T > 0: y ~ norm(max(0, p - q)) at
                 the first still-rejected position, or the bonus y ~ p_target[gamma]

c and e are p_target and q_draft at T > 0 (after temperature, top-k and top-p), and the plain
softmax of the raw logits at T = 0, where one-hot distributions would make every divergence
0 or infinite. A drafter without logits (n-gram lookup) has a one-hot e: KL is infinite wherever
the target is not one-hot on the same token, so the judge never fires and the rule is its base.

Neutral setting: threshold = 0 never judges (KL_i < 0 is impossible), and the rule is its base
draw for draw (the base's uniforms, verdicts and correction draw, in the base's order). A
larger threshold keeps more drafts; confidence = 0 switches the judge off as well. Lossy.

Our decisions where the paper is silent:
- the direction KL(target || draft): the draft's distribution read as a stand-in for the
  target's, the direction in which a draft that misses the target's likely tokens costs most;
- the confidence mask reads the same distribution c as the divergence (the paper: top-1 > 0.9);
- a judged draft needs c_i(d_i) > 0: a token the target rules out (top-k, top-p) is never kept;
- the divergence is computed in float64; threshold 0.5 nats is our default, not the paper's
  (choose it by the distortion it costs: `minispec.lab.distortion`).
"""

from __future__ import annotations

import math

import torch

from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput, first_rejection, is_number, register
from minispec.acceptance.exact import greedy_acceptances
from minispec.acceptance.sampling import correction_or_bonus, sample_acceptances
from minispec.errors import MinispecError
from minispec.model.sampling import greedy_token

F64 = torch.float64


def kl_divergence(c_target: torch.Tensor, e_draft: torch.Tensor) -> torch.Tensor:
    """KL(c || e) = sum_v c ln(c / e), 0 ln 0 = 0, +inf where e = 0 < c: [..., V] -> [...] float64."""
    c, e = c_target.to(F64), e_draft.to(F64)
    return (torch.xlogy(c, c) - torch.xlogy(c, e)).sum(dim=-1)


def judge_acceptances(criterion_target: torch.Tensor, criterion_draft: torch.Tensor, draft_tokens: torch.Tensor,
                      threshold: float, confidence: float) -> torch.Tensor:
    """[gamma] bool: KL(c_i || e_i) < threshold, max c_i <= confidence and c_i(d_i) > 0.

    criterion_target [gamma(+1), V] (a trailing bonus row is ignored), criterion_draft [gamma, V]."""
    gamma = draft_tokens.shape[0]
    c = criterion_target[:gamma].to(F64)  # [gamma, V]
    divergence = kl_divergence(c, criterion_draft)  # [gamma]
    unsure = c.max(dim=-1).values <= confidence  # [gamma]
    has_mass = c.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1) > 0  # [gamma]
    return (divergence < threshold) & unsure & has_mass


@register("kl-judge")
class KLJudge(AcceptancePolicy):
    """Keep a base-rejected draft where KL(target || draft) < threshold and the target's top
    probability is at most `confidence` (base: exact at T = 0, sampling at T > 0).

    threshold: nats (0: never judge, the base draw for draw). confidence: the paper's mask, 0.9.
    Randomness (T > 0): the base's gamma uniforms, then one draw. Lossy.
    """

    lossless = False

    def __init__(self, threshold: float = 0.5, confidence: float = 0.9) -> None:
        if not (is_number(threshold) and 0 <= threshold <= math.inf):
            raise MinispecError(f"kl-judge threshold = {threshold!r}; expected a number of nats >= 0 (0: never judge)")
        if not (is_number(confidence) and 0 <= confidence <= 1):
            raise MinispecError(f"kl-judge confidence = {confidence!r}; expected a probability in [0, 1]")
        self.threshold = threshold
        self.confidence = confidence

    def criteria(self, inp: VerifyInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(c [gamma, V], e [gamma, V]): what the judge reads (module docstring)."""
        gamma = inp.gamma
        if not inp.params.greedy:
            return inp.p_target[:gamma], inp.q_draft
        c = torch.softmax(inp.target_logits[:gamma].to(F64), dim=-1)  # [gamma, V]
        e = inp.q_draft if inp.draft_logits is None else torch.softmax(inp.draft_logits.to(F64), dim=-1)  # [gamma, V]
        return c, e

    def decide(self, inp: VerifyInput) -> Decision:
        if inp.params.greedy:
            base = greedy_acceptances(inp.draft_tokens, inp.target_logits)  # [gamma]
        else:
            base = sample_acceptances(inp.p_target, inp.q_draft, inp.draft_tokens, inp.generator)  # [gamma]
        c, e = self.criteria(inp)
        judged = judge_acceptances(c, e, inp.draft_tokens, self.threshold, self.confidence).to(base.device)  # [gamma]
        num_accepted = first_rejection(base | judged)
        if inp.params.greedy:
            next_token = int(greedy_token(inp.target_logits[num_accepted]))
        else:
            next_token = correction_or_bonus(inp.p_target, inp.q_draft, num_accepted, inp.generator)
        return Decision(num_accepted, next_token, {"judged": judged & ~base})
