"""LazyDropMatch: DropMatch's decisions, doing only the dropout work a decision needs.

DropMatch (dropmatch.py) runs all K paths of all gamma+1 positions through the LM head and
evaluates every criterion everywhere: Algorithm 1 as written. Most of that work cannot change
the decision. This class keeps Algorithm 1's decisions and skips it, by three shortcuts that are
exact, not approximations:

1. Paths only where a verdict is needed. Position i's paths decide position i only. With
   or_base, a position the base accepts is accepted whatever the paths say; and the prefix rule
   discards everything after the first rejection. So decide() walks the drafted positions in
   order, scores a position's K path rows (one head call on [K, d]) only when the base has not
   accepted it, and stops at the first rejection. The bonus position never needs them.

2. Votes from row maxima (draft_votes). torch.argmax takes the lowest id among equal maxima, so
   y_k = d_i  <=>  l_k[d_i] = max_v l_k[v]  and  l_k[v] < l_k[d_i] for every v < d_i.
   The vote needs K row maxima and a look at the ids below d_i only where the first holds. With
   js_or_majority the criterion is an OR, so a position the vote accepts skips the JS test.

3. The radius by a bound (js_acceptance). "JS(q || pbar) <= max_k JS(p_k || pbar)" holds iff
   some path reaches JS(q || pbar), and
       JS(a || b) <= ln 2 * TV(a, b),   TV(a, b) = 1/2 sum_v |a_v - b_v|,
   since each entry f(a, b) = 1/2 a ln(2a/(a+b)) + 1/2 b ln(2b/(a+b)) is convex along a + b = s,
   0 at a = b and s ln 2 / 2 at a = 0 or b = 0, so below its chords, ln 2 |a - b| / 2. A path
   whose bound is below JS(q || pbar) cannot reach it; the others are tried largest TV first,
   with the exact JS, until one reaches. RADIUS_BOUND_SLACK keeps the bound above the computed
   JS whatever the round-off of the two sums, so no path the full computation would count is
   skipped. Both sides of the test are js_divergence, as in DropMatch, never a closed form: the
   test is non-strict (<=), and a draft whose q equals a head's p_k bitwise (an n-gram's one-hot
   draft and a head that is one-hot there) must tie exactly, as it does in the definition. (A
   closed form for JS(delta_d || pbar) from pbar[d] alone rounds 1-2 ulp differently, and to 0
   where the sum gives 1e-20 against a radius of 0: both flip verdicts.)

The same masks. The masks of a step are drawn for every (path, position), from the policy's own
generator, in the same order and shape as DropMatch draws them, also for the positions never
used: so after the same steps both classes hold the same generator state and see the same masks.

Round-off. The lazy class scores path rows in smaller head calls than DropMatch's one, and a
BLAS may sum a row's dot product in an order that depends on how many rows share the call; the
closed form of shortcut 4 also rounds differently from a sum over the vocabulary. So the two
classes can differ only at a verdict on a float tie: two of a head's top logits within the last
bits of each other, or JS(q || pbar) within round-off of the radius. Given the same logits for
the same rows, every other decision is DropMatch's.

Decision.info (integer counts): accepted_by_dropmatch_only as DropMatch; path_positions (drafted
positions whose verdict needed the paths) and path_head_calls (head calls beyond the verify's).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from minispec.acceptance.base import Decision, VerifyInput, first_rejection, register
from minispec.acceptance.dropmatch.rule import DropMatch, head_inputs, js_divergence, vote_acceptances
from minispec.model.sampling import greedy_token

LN2 = math.log(2.0)
RADIUS_BOUND_SLACK = 1e-4  # far above the round-off of a float32 JS or TV sum over the vocabulary


def draft_votes(path_logits: torch.Tensor, draft_token: int) -> int:
    """How many heads' argmax (lowest id on ties) is the draft: path_logits [K, V] -> int."""
    row_max = path_logits.amax(dim=-1)  # [K]
    chose = path_logits[:, draft_token] == row_max  # [K]: the draft holds the row's maximum
    for k in chose.nonzero()[:, 0].tolist():  # does a lower id tie it (and win the argmax)?
        if bool((path_logits[k, :draft_token] == row_max[k]).any()):
            chose[k] = False
    return int(chose.sum())


def js_acceptance(path_logits: torch.Tensor, centroid_logits: torch.Tensor, draft_probs: torch.Tensor,
                  temperature: float) -> bool:
    """JS(q || pbar) <= max_k JS(p_k || pbar), at one position (shortcut 3 in the module docstring).

    path_logits [K, V] (l_k), centroid_logits [V] (mean_k l_k), draft_probs [V] (q).
    """
    centroid_probs = torch.softmax(centroid_logits / temperature, dim=-1)  # [V]: pbar
    js_draft = float(js_divergence(draft_probs, centroid_probs))
    head_probs = torch.softmax(path_logits / temperature, dim=-1)  # [K, V]: p_k
    tv = 0.5 * (head_probs - centroid_probs).abs().sum(dim=-1)  # [K]: TV(p_k, pbar)
    for k in tv.argsort(descending=True).tolist():  # the likeliest path to reach it first
        if LN2 * float(tv[k]) + RADIUS_BOUND_SLACK < js_draft:
            return False  # this path's bound, and every later one's, is below JS(q || pbar)
        if float(js_divergence(head_probs[k], centroid_probs)) >= js_draft:
            return True
    return False


class DropoutPaths:
    """The K path logits of one step, position by position, each computed on first use.

    hidden [gamma+1, d] and masks [K, gamma+1, d] (the step's, all drawn up front) give path k at
    position i as head(h_i * m_ki / (1-p)). With p = 0 there are no masks: every path is the clean
    row of clean_logits [gamma+1, V]. `asked` counts the positions asked for, `head_calls` the
    head calls made here.
    """

    def __init__(self, hidden: torch.Tensor, masks: torch.Tensor | None, p: float,
                 head: Callable[[torch.Tensor], torch.Tensor], clean_logits: torch.Tensor, num_paths: int) -> None:
        self.hidden, self.masks, self.p, self.head = hidden, masks, p, head
        self.clean_logits, self.num_paths = clean_logits, num_paths
        self.asked = 0
        self.head_calls = 0

    def at(self, i: int) -> torch.Tensor:
        """Path logits [K, V] at position i."""
        self.asked += 1
        if self.masks is None:  # p = 0: the clean head, bitwise
            return self.clean_logits[i].expand(self.num_paths, -1)
        self.head_calls += 1
        return self.head(self.hidden[i] * self.masks[:, i] / (1.0 - self.p))  # [K, d] -> [K, V]


@register("dropmatch-lazy")
class LazyDropMatch(DropMatch):
    """DropMatch with exact shortcuts: the same decisions (see the module docstring); the same
    parameters."""

    def decide(self, inp: VerifyInput) -> Decision:
        hidden, head = head_inputs(inp, self.name)
        gamma = inp.gamma
        clean_tokens = greedy_token(inp.target_logits)  # [gamma+1]
        masks = None if self.p == 0 else self.draw_masks(hidden, inp.target_logits.shape[-1])  # [K, gamma+1, d]
        paths = DropoutPaths(hidden, masks, self.p, head, inp.target_logits, self.paths)
        base_accepted = self.base_acceptances(inp, clean_tokens)  # [gamma]
        accepted = base_accepted.clone() if self.or_base else torch.zeros_like(base_accepted)  # [gamma]
        for i in range(gamma):
            if not accepted[i]:
                accepted[i] = self.verdict_at(inp, i, paths.at(i))
                if not accepted[i]:
                    break  # the prefix rule: nothing after the first rejection counts
        num_accepted = first_rejection(accepted)
        info = {"accepted_by_dropmatch_only": ~base_accepted,  # per position: counted over the committed drafts
                "path_positions": paths.asked, "path_head_calls": paths.head_calls}
        return Decision(num_accepted, self.next_token(inp, num_accepted, base_accepted, clean_tokens), info)

    def verdict_at(self, inp: VerifyInput, i: int, path_logits: torch.Tensor) -> bool:
        """DropMatch's own verdict on drafted position i; path_logits [K, V] its paths."""
        path_logits = path_logits.to(torch.promote_types(path_logits.dtype, torch.float32))  # bf16 heads: upcast
        draft_token = int(inp.draft_tokens[i])
        votes = draft_votes(path_logits, draft_token)
        if self.criterion == "naive":
            return votes >= 1
        if self.criterion in ("majority", "js_or_majority"):
            if self.majority == "strict":
                if 2 * votes > self.paths:
                    return True
            elif votes and bool(vote_acceptances(greedy_token(path_logits)[:, None], inp.draft_tokens[i:i + 1],
                                                 "plurality")):  # head_tokens [K, 1]
                return True
        if self.criterion in ("js", "js_or_majority"):
            temperature = self.js_temperature if inp.params.greedy else inp.params.temperature
            centroid_logits = path_logits.mean(dim=0) if self.p > 0 else path_logits[0]  # [V]: mean_k l_k
            if inp.draft_logits is not None:
                draft_probs = torch.softmax(inp.draft_logits[i].to(path_logits.dtype) / temperature, dim=-1)  # [V]
            else:
                draft_probs = inp.q_draft[i].to(path_logits.dtype)  # [V], one-hot for an n-gram drafter
            return js_acceptance(path_logits, centroid_logits, draft_probs, temperature)
        return False
