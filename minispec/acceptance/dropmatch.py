"""DropMatch (arXiv 2603.03333): accept a draft the target still backs under dropout on its LM head.

The target computes its final hidden state h_i (the LM-head input, after the final RMSNorm)
once per verified position; only the LM head is re-run, on K dropped-out copies of it. The
transformer blocks and the KV cache are never perturbed. Algorithm 1, per drafted position i:

    K paths    m_k ~ Bernoulli(1-p)^d,   l_k = W (h_i * m_k / (1-p))        k = 1..K, inverted dropout
    centroid   pbar = softmax(mean_k l_k / T)                               the mean of the LOGITS
    heads      p_k  = softmax(l_k / T),   y_k = argmax_v l_k[v]             lowest id on ties
    JS test    JS(q || pbar) <= max_k JS(p_k || pbar)                       an adaptive radius
    majority   #{k : y_k = d_i} > K/2          ("strict", default)
               d_i is the unique mode of {y_k} ("plurality"; a tie is not a majority)
    naive      d_i in {y_k}                     (the paper's rule on top of EAGLE3 trees)

    JS(a || b) = 1/2 KL(a || m) + 1/2 KL(b || m),  m = (a + b) / 2,  natural log, 0 ln 0 = 0

criterion = "js_or_majority" (Algorithm 1: JS test, else majority), "js", "majority" or "naive".
With or_base (default) a position is accepted if the base policy accepts it OR DropMatch does:
the base is exact match at T = 0 and speculative sampling at T > 0, so DropMatch never accepts
less than its base. Then the prefix rule: num_accepted = the first rejected position. The JS
test looks at the draft's whole distribution q, not at which token it drew. Lossy: there is no
distribution guarantee; measure the effect (tau up, quality change).

Our decisions where the paper is silent, each a parameter or stated here:
- or_base=True, as above.
- The correction (first rejected position) and the bonus come from the clean target, as the base
  emits them: argmax at T = 0; at T > 0 a draw from norm(max(0, p - q)) or from p_target[gamma].
- js_temperature=1.0: T = params.temperature when it is > 0, else js_temperature. At T = 0 the
  post-processed distributions are one-hot, so every JS is 0 or ln 2 and the radius says
  nothing; the JS test then reads the raw softmax at temperature js_temperature.
- The draft side of the JS test is softmax(draft_logits / T) when the drafter has logits, else
  q_draft (one-hot for n-gram). top-k / top-p are not applied to the JS distributions.
- Masks come from this policy's own torch.Generator (seeded with `seed`, re-seeded by reset()),
  fresh for every path, position and step; the verify generator is untouched, so at T > 0 the
  base draws exactly what SpeculativeSampling would.
- p = 0 skips the dropout work: every path is the clean head, bitwise, and the centroid is the
  clean logits rather than their float mean (a mean of K equal rows can be one ulp off, which
  would turn the radius from 0 into ~1e-17). So at T = 0, DropMatch(p=0) == exact match whenever
  or_base is set or the criterion has a token vote ("js" alone with or_base=False rejects a
  correct one-hot draft: JS(q || pbar) > 0 = radius).
- The base decision is always computed, also with or_base=False, for the diagnostic below; so
  the random stream never depends on or_base.

Decision.info: heads_all_agree (fraction of the gamma+1 positions where every head's argmax is
the clean argmax; the paper reports 98.4% on HumanEval) and accepted_by_dropmatch_only (accepted
positions the base alone would have rejected).

Cost: all K paths and the clean row, for all gamma+1 positions, go through the head in ONE call,
[(K+1)(gamma+1), d] @ W^T, so W is read once. That matters on small models: SmolLM2-135M's tied
LM head (49152 x 576) is ~21% of its weights, and K separate matmuls would nearly double a verify
step (the paper's 1.64% overhead was on a 70B model, where the head is ~0.05% of the work).
"""

from __future__ import annotations

from typing import Callable

import torch

from minispec.acceptance.base import (AcceptancePolicy, Decision, PolicyInputError, VerifyInput, first_rejection,
                                      register)
from minispec.acceptance.exact import greedy_acceptances
from minispec.acceptance.sampling import correction_or_bonus, sample_acceptances
from minispec.errors import MinispecError
from minispec.sampling import greedy_token

CRITERIA = ("js_or_majority", "js", "majority", "naive")
MAJORITY_RULES = ("strict", "plurality")


def js_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence over the last dim, natural log: [..., V] x [..., V] -> [...].

    JS(a || b) = 1/2 sum a ln(a/m) + 1/2 sum b ln(b/m), m = (a + b)/2; xlogy makes 0 ln 0 = 0.
    JS(a || a) is exactly 0 (m == a bitwise); round-off below 0 is clamped to 0.
    """
    m = (a + b) / 2  # broadcast [..., V]
    kl_am = (torch.xlogy(a, a) - torch.xlogy(a, m)).sum(dim=-1)  # [...]
    kl_bm = (torch.xlogy(b, b) - torch.xlogy(b, m)).sum(dim=-1)  # [...]
    return (0.5 * (kl_am + kl_bm)).clamp(min=0)


def js_acceptances(path_logits: torch.Tensor, centroid_logits: torch.Tensor, draft_probs: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    """[gamma] bool: JS(q || pbar) <= max_k JS(p_k || pbar), all positions and paths at once.

    path_logits [K, gamma, V], centroid_logits [gamma, V] (mean_k l_k), draft_probs [gamma, V] (q).
    """
    centroid_probs = torch.softmax(centroid_logits / temperature, dim=-1)  # [gamma, V]: pbar
    head_probs = torch.softmax(path_logits / temperature, dim=-1)  # [K, gamma, V]: p_k
    radius = js_divergence(head_probs, centroid_probs.unsqueeze(0)).amax(dim=0)  # [gamma]
    return js_divergence(draft_probs, centroid_probs) <= radius  # [gamma], non-strict


def vote_acceptances(head_tokens: torch.Tensor, draft_tokens: torch.Tensor, rule: str) -> torch.Tensor:
    """[gamma] bool: does the heads' vote back d_i? head_tokens [K, gamma], draft_tokens [gamma].

    "strict":    more than K/2 heads chose d_i
    "plurality": d_i got more votes than any other token (a tie is not a win)
    "naive":     at least one head chose d_i
    """
    num_paths = head_tokens.shape[0]
    votes = (head_tokens == draft_tokens).sum(dim=0)  # [gamma]: heads that chose d_i
    if rule == "strict":
        return 2 * votes > num_paths
    if rule == "naive":
        return votes >= 1
    same = head_tokens.unsqueeze(1) == head_tokens.unsqueeze(0)  # [K, K, gamma]: head j chose head k's token
    votes_each = same.sum(dim=1)  # [K, gamma]: votes for head k's token
    rival_votes = votes_each.masked_fill(head_tokens == draft_tokens, 0).amax(dim=0)  # [gamma]: best other token
    return votes > rival_votes


@register("dropmatch")
class DropMatch(AcceptancePolicy):
    """DropMatch: K dropout paths through the LM head vote on each draft (see the module docstring).

    p: dropout probability on the hidden state, 0 <= p < 1 (paper: 0.3)
    paths: K, the number of dropout paths (paper: 5)
    criterion: "js_or_majority" (Algorithm 1), "js", "majority" or "naive"
    majority: "strict" (> K/2 votes) or "plurality" (unique mode)
    or_base: also accept what the base accepts (exact at T = 0, sampling at T > 0); ours
    seed: seeds the policy's own mask generator; reset() re-seeds it
    js_temperature: the JS test's softmax temperature when params.temperature is 0; ours
    """

    lossless = False

    def __init__(self, p: float = 0.3, paths: int = 5, criterion: str = "js_or_majority", majority: str = "strict",
                 or_base: bool = True, seed: int = 0, js_temperature: float = 1.0) -> None:
        if not 0 <= p < 1:
            raise MinispecError(f"dropout p = {p}; expected 0 <= p < 1")
        if isinstance(paths, bool) or not isinstance(paths, int) or paths < 1:
            raise MinispecError(f"dropmatch paths = {paths!r}; expected an integer >= 1")
        if criterion not in CRITERIA:
            raise MinispecError(f"dropmatch criterion = {criterion!r}; expected one of {list(CRITERIA)}")
        if majority not in MAJORITY_RULES:
            raise MinispecError(f"dropmatch majority = {majority!r}; expected one of {list(MAJORITY_RULES)}")
        if not js_temperature > 0:
            raise MinispecError(f"dropmatch js_temperature = {js_temperature}; expected > 0")
        self.p = p
        self.paths = paths
        self.criterion = criterion
        self.majority = majority
        self.or_base = or_base
        self.seed = seed
        self.js_temperature = js_temperature
        self._generator = torch.Generator().manual_seed(seed)  # the masks' only source of randomness

    def reset(self) -> None:
        self._generator.manual_seed(self.seed)

    def head_logits(self, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Clean logits [gamma+1, V] and K dropout-path logits [K, gamma+1, V], from ONE head call.

        hidden [gamma+1, d] is the LM-head input. Rows: the clean hidden state, then K copies
        h * m_k / (1-p) with fresh masks m_k ~ Bernoulli(1-p) per path, position and coordinate.
        """
        if hidden.dim() != 2:
            raise PolicyInputError(f"dropmatch: hidden shape {list(hidden.shape)}; expected [gamma+1, d]")
        num_positions, hidden_size = hidden.shape
        if self.p == 0:  # no dropout: every path is the clean head, bitwise (and no extra head rows)
            clean_logits = head(hidden)  # [gamma+1, V]
            return clean_logits, clean_logits.unsqueeze(0).expand(self.paths, -1, -1)  # [K, gamma+1, V], a view
        keep = torch.full((self.paths, num_positions, hidden_size), 1.0 - self.p)  # [K, gamma+1, d]
        masks = torch.bernoulli(keep, generator=self._generator).to(hidden.device, hidden.dtype)  # [K, gamma+1, d]
        dropped = hidden * masks / (1.0 - self.p)  # [K, gamma+1, d], inverted dropout
        rows = torch.cat([hidden.unsqueeze(0), dropped])  # [K+1, gamma+1, d]: clean first
        logits = head(rows.reshape(-1, hidden_size))  # [(K+1)(gamma+1), V]: W read once
        logits = logits.reshape(self.paths + 1, num_positions, -1)  # [K+1, gamma+1, V]
        return logits[0], logits[1:]

    def decide(self, inp: VerifyInput) -> Decision:
        gamma = inp.gamma
        path_logits = self._path_logits(inp)  # [K, gamma+1, V]
        head_tokens = greedy_token(path_logits)  # [K, gamma+1]: y_k
        clean_tokens = greedy_token(inp.target_logits)  # [gamma+1]

        # The base policy's verdict on each position (always computed; see the module docstring).
        if inp.params.greedy:
            base_accepted = greedy_acceptances(inp.draft_tokens, inp.target_logits)  # [gamma]
        else:
            base_accepted = sample_acceptances(inp.p_target, inp.q_draft, inp.draft_tokens, inp.generator)  # [gamma]

        # DropMatch's own verdict.
        if self.criterion == "naive":
            dropmatch_accepted = vote_acceptances(head_tokens[:, :gamma], inp.draft_tokens, "naive")  # [gamma]
        else:
            dropmatch_accepted = torch.zeros(gamma, dtype=torch.bool, device=inp.draft_tokens.device)  # [gamma]
            if self.criterion in ("js", "js_or_majority"):
                dropmatch_accepted |= self._js_acceptances(inp, path_logits)
            if self.criterion in ("majority", "js_or_majority"):
                dropmatch_accepted |= vote_acceptances(head_tokens[:, :gamma], inp.draft_tokens, self.majority)

        accepted = dropmatch_accepted | base_accepted if self.or_base else dropmatch_accepted  # [gamma]
        num_accepted = first_rejection(accepted)
        if inp.params.greedy:
            next_token = int(clean_tokens[num_accepted])
        else:
            next_token = correction_or_bonus(inp.p_target, inp.q_draft, num_accepted, inp.generator)
        info = {
            "heads_all_agree": float((head_tokens == clean_tokens).all(dim=0).double().mean()),
            "accepted_by_dropmatch_only": int((~base_accepted[:num_accepted]).sum()),
        }
        return Decision(num_accepted, next_token, info)

    def _path_logits(self, inp: VerifyInput) -> torch.Tensor:
        """inp.head_extras, checked: the K path logits [K, gamma+1, V] from `head_logits`."""
        extras = inp.head_extras
        if extras is None:
            raise PolicyInputError("dropmatch: inp.head_extras is None; get the target logits from "
                                   "policy.head_logits(hidden, head), which also returns the dropout paths")
        expected = (self.paths, inp.gamma + 1, inp.target_logits.shape[1])
        if not isinstance(extras, torch.Tensor) or tuple(extras.shape) != expected:
            got = list(extras.shape) if isinstance(extras, torch.Tensor) else type(extras).__name__
            raise PolicyInputError(f"dropmatch: head_extras {got}; expected [K, gamma+1, V] = {list(expected)}")
        return extras

    def _js_acceptances(self, inp: VerifyInput, path_logits: torch.Tensor) -> torch.Tensor:
        """The JS test at the drafted positions: [gamma] bool."""
        gamma = inp.gamma
        temperature = inp.params.temperature if not inp.params.greedy else self.js_temperature
        compute_dtype = torch.promote_types(path_logits.dtype, torch.float32)  # bf16 logits -> fp32 JS
        paths = path_logits[:, :gamma].to(compute_dtype)  # [K, gamma, V]
        # With p = 0 the paths are the clean head bitwise; their float mean could be an ulp off.
        centroid_logits = paths[0] if self.p == 0 else paths.mean(dim=0)  # [gamma, V]
        if inp.draft_logits is not None:
            draft_probs = torch.softmax(inp.draft_logits.to(compute_dtype) / temperature, dim=-1)  # [gamma, V]
        else:
            draft_probs = inp.q_draft.to(compute_dtype)  # [gamma, V], one-hot for n-gram
        return js_acceptances(paths, centroid_logits, draft_probs, temperature)
