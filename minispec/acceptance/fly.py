"""FLy (Li et al., arXiv 2511.22972): training-free loose verification, an entropy gate and a deferred window.

Exact match (or speculative sampling) stops at the first draft the target does not take. FLy
asks whether that mismatch is a real error or a different wording: where the target itself is
unsure (its top-k entropy is high) and the next W drafts are all accepted by the base rule, the
target has gone on agreeing with the draft after it, so the mismatch is accepted too. For each
drafted position i = 0..gamma-1, with d_i the draft and c_i the target's distribution there:

    base_i     the base rule's verdict: T = 0: d_i == argmax target_logits[i]   (exact match)
                                        T > 0: u_i < min(1, p(d_i) / q(d_i))    (sampling)
    H_i        = -sum over the k largest c_i(v) of c_i(v) ln c_i(v)     (top-k entropy, not renormalised)
    defer_i    = not base_i  and  H_i >= theta  and  c_i(d_i) > 0
                 and  i + W < gamma  and  base_{i+1}, ..., base_{i+W} all hold
    accepted_i = base_i or defer_i;   num_accepted = the all-accepted prefix (first_rejection)
    next_token = the base rule's: T = 0: argmax at num_accepted; T > 0: y ~ norm(max(0, p - q)) at
                 the first still-rejected position, or the bonus y ~ p_target[gamma]

c_i is p_target[i] at T > 0 (after temperature, top-k and top-p) and softmax(target_logits[i])
at T = 0 (a one-hot p would make every entropy 0). The window reads the base verdicts only, so a
deferred position never vouches for another: two deferrals are at least W accepted drafts apart.
Lossy: a deferred draft was rejected by the base rule.

Settings (vLLM's rejection_sample_method "fly" names them): window_size W (fly_window_size,
default 6), entropy_threshold theta (fly_entropy_threshold, default 0.3), entropy_top_k k
(fly_entropy_top_k, default 3). The top-k entropy is at most ln k (1.10 nats for k = 3).
Neutral settings: entropy_threshold = inf never defers, and FLy is its base draw for draw (the
base's uniforms, verdicts and correction draw, in the base's order); so is any W >= gamma.

Our decisions where the paper is silent (we follow vLLM's reading of it):
- the entropy is over the top-k probabilities of the full distribution, natural log, not
  renormalised over the k, and computed in float64;
- a deferred draft needs c_i(d_i) > 0: a token masked by top-k or top-p (or with zero target
  probability) is never accepted;
- W = 0 is allowed: the entropy gate alone, with no window;
- the window must fit inside the draft (i + W < gamma): the bonus row is not a draft to agree on.
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


def top_k_entropy(probs: torch.Tensor, k: int) -> torch.Tensor:
    """H = -sum over the k largest probabilities of p ln p (0 ln 0 = 0): [..., V] -> [...] float64."""
    top = probs.to(F64).topk(min(k, probs.shape[-1]), dim=-1).values  # [..., k]
    return -torch.xlogy(top, top).sum(dim=-1)


def deferred(base: torch.Tensor, entropy: torch.Tensor, has_mass: torch.Tensor, window: int,
             threshold: float) -> torch.Tensor:
    """[gamma] bool: defer_i = not base_i, H_i >= threshold, mass on d_i, and base_{i+1..i+W} all true.

    base, has_mass [gamma] bool; entropy [gamma]. The window must fit: i + W < gamma.
    """
    gamma = base.shape[0]
    window_ok = torch.zeros(gamma, dtype=torch.bool)
    for i in range(gamma - window):  # i + W < gamma
        window_ok[i] = bool(base[i + 1:i + 1 + window].all())
    return ~base & (entropy >= threshold) & has_mass & window_ok


@register("fly")
class FLy(AcceptancePolicy):
    """Accept a base-rejected draft where the target's top-k entropy is >= theta and the next W
    drafts pass the base rule (exact at T = 0, sampling at T > 0); see the module docstring.

    window_size, entropy_threshold, entropy_top_k: vLLM's fly_window_size, fly_entropy_threshold,
    fly_entropy_top_k. Randomness (T > 0): the base's gamma uniforms, then one draw. Lossy.
    """

    lossless = False

    def __init__(self, window_size: int = 6, entropy_threshold: float = 0.3, entropy_top_k: int = 3) -> None:
        if not (isinstance(window_size, int) and not isinstance(window_size, bool) and window_size >= 0):
            raise MinispecError(f"fly window_size = {window_size!r}; expected an integer >= 0")
        if not (is_number(entropy_threshold) and 0 <= entropy_threshold <= math.inf):
            raise MinispecError(f"fly entropy_threshold = {entropy_threshold!r}; expected a number >= 0 (inf: never "
                                "defer)")
        if not (isinstance(entropy_top_k, int) and not isinstance(entropy_top_k, bool) and entropy_top_k >= 1):
            raise MinispecError(f"fly entropy_top_k = {entropy_top_k!r}; expected an integer >= 1")
        self.window_size = window_size
        self.entropy_threshold = entropy_threshold
        self.entropy_top_k = entropy_top_k

    def reset(self, seed: int | None = None, gamma: int | None = None) -> None:
        """A run whose steps hold at most `gamma` drafts: a window W >= 1 must fit inside one (i + W <
        gamma for some i), else no rejection is ever deferred and FLy is its base rule: refused."""
        if gamma is not None and 0 < self.window_size and self.window_size >= gamma:
            raise MinispecError(f"fly window_size = {self.window_size}: FLy defers a rejection only when the "
                                f"{self.window_size} drafts after it are in the same step, and a step of this run "
                                f"drafts at most {gamma} (gamma, and 2 fewer than max_new_tokens); expected a window "
                                f"below {max(gamma, 1)}")

    def decide(self, inp: VerifyInput) -> Decision:
        gamma = inp.gamma
        if inp.params.greedy:
            base = greedy_acceptances(inp.draft_tokens, inp.target_logits)  # [gamma]
            criterion = torch.softmax(inp.target_logits[:gamma].to(F64), dim=-1)  # [gamma, V]
        else:
            base = sample_acceptances(inp.p_target, inp.q_draft, inp.draft_tokens, inp.generator)  # [gamma]
            criterion = inp.p_target[:gamma].to(F64)  # [gamma, V]
        base = base.cpu()  # the window is read on the CPU, position by position
        entropy = top_k_entropy(criterion, self.entropy_top_k).cpu()  # [gamma]
        has_mass = criterion.gather(-1, inp.draft_tokens.unsqueeze(-1)).squeeze(-1).cpu() > 0  # [gamma]
        defer = deferred(base, entropy, has_mass, self.window_size, self.entropy_threshold)  # [gamma]
        num_accepted = first_rejection(base | defer)
        if inp.params.greedy:
            next_token = int(greedy_token(inp.target_logits[num_accepted]))
        else:
            next_token = correction_or_bonus(inp.p_target, inp.q_draft, num_accepted, inp.generator)
        return Decision(num_accepted, next_token, {"deferred": defer})
