"""DropMatch (arXiv 2603.03333): accept a draft the target still backs under dropout on its LM head.

The target computes its final hidden state h_i (the LM-head input, after the final RMSNorm)
once per verified position; only the LM head W is re-run, on K dropped-out copies of it. The
transformer blocks and the KV cache are never perturbed. Algorithm 1, per drafted position i:

    K paths    m_k ~ Bernoulli(1-p)^d,   l_k = W (h_i * m_k / (1-p))        k = 1..K, inverted dropout
    centroid   pbar = softmax(mean_k l_k / T)                               the mean of the LOGITS
    heads      p_k  = softmax(l_k / T),   y_k = argmax_v l_k[v]             lowest id on ties
    JS test    JS(q || pbar) <= max_k JS(p_k || pbar)                       an adaptive radius
    majority   #{k : y_k = d_i} > K/2          ("strict", default)
               d_i is the unique mode of {y_k} ("plurality"; a tie is not a majority)
    naive      d_i in {y_k}                     (the paper's rule on top of EAGLE3 trees)

    JS(a || b) = 1/2 KL(a || m) + 1/2 KL(b || m),  m = (a + b) / 2,  natural log, 0 ln 0 = 0

criterion = "js_or_majority" (Algorithm 1: the JS test, else the majority), "js", "majority" or
"naive". Then the prefix rule: num_accepted = the first rejected position. The JS test looks at
the draft's whole distribution q, not at which token it drew. Lossy: there is no distribution
guarantee; measure the effect (tau up, quality change).

Our decisions where the paper is silent, each a parameter or stated here:
- or_base=True: a position is accepted if the base policy accepts it OR DropMatch does; the base
  is exact match at T = 0 and speculative sampling at T > 0, so DropMatch never accepts less
  than its base. The base verdict is computed also with or_base=False, so the verify
  generator's stream never depends on or_base.
- The correction (first rejected position) and the bonus come from the clean target, as the
  base emits them: argmax at T = 0; at T > 0 a draw from norm(max(0, p - q)), or p_target[gamma]
  for the bonus. With or_base=False at T > 0, a position only DropMatch rejected (the base
  accepted it) draws its correction from p_target itself: the residual belongs to a rejection
  the base did not make (and is normalised round-off when q is close to p).
- js_temperature=1.0: T is params.temperature when it is > 0, else js_temperature. At T = 0 the
  post-processed distributions are one-hot, every JS is 0 or ln 2 and the radius says nothing,
  so the JS test reads the raw softmax at temperature js_temperature.
- The draft side of the JS test is softmax(draft_logits / T) when the drafter has logits, else
  q_draft (one-hot for an n-gram drafter). top-k / top-p are not applied to the JS distributions.
- The masks come from this policy's own torch.Generator, fresh for every path, position and step;
  the verify generator is untouched, so at T > 0 the base draws exactly what SpeculativeSampling
  would. reset(seed) reseeds it at the start of every run: from the run's seed (generate(seed=...))
  unless the policy was built with a seed of its own. Its seed is mask_seed(seed) = (seed +
  0x9E3779B97F4A7C15) mod 2^64, not seed itself: a generator seeded with the same integer as the
  verify generator would draw the same words.
- p = 0 draws no masks: every path IS the clean head, bitwise, and the centroid is the clean
  logits (a float mean of K equal rows can be one ulp off, turning a radius of 0 into ~1e-17).
  So at T = 0, DropMatch(p=0) == exact match whenever or_base is set or the criterion has a
  token vote ("js" alone with or_base=False rejects a correct one-hot draft: JS(q || pbar) > 0).

All K paths of all gamma+1 positions go through ONE head call, [K(gamma+1), d] @ W^T, so W is
read once more per step; dropmatch_lazy.py reaches the same decisions with fewer head rows.
Decision.info (integer counts): accepted_by_dropmatch_only (accepted positions the base alone
would have rejected), heads_agree (positions of the step's gamma+1 where every head's argmax is
the clean argmax), positions (gamma+1).
"""

from __future__ import annotations

from typing import Callable

import torch

from minispec.acceptance.base import (AcceptancePolicy, Decision, PolicyInputError, VerifyInput, first_rejection,
                                      is_number, register)
from minispec.acceptance.sampling import correction_or_bonus, sample_acceptances
from minispec.checks import is_int, positive_int
from minispec.errors import MinispecError
from minispec.model.memory import check_fits
from minispec.model.sampling import greedy_token, sample_token

CRITERIA = ("js_or_majority", "js", "majority", "naive")
MASK_STREAM = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: keeps the mask stream apart from the verify stream
MAJORITY_RULES = ("strict", "plurality")


def mask_seed(seed: int) -> int:
    """The mask generator's seed for a run seeded with `seed`: a different stream than the verify's."""
    return (seed + MASK_STREAM) % 2**64


def js_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence over the last dim, natural log: [..., V] x [..., V] -> [...].

    Per entry 1/2 a ln a + 1/2 b ln b - m ln m with m = (a + b)/2 (the definition, regrouped) and
    0 ln 0 = 0. JS(a || a) is exactly 0 (m == a bitwise); round-off below 0 is clamped to 0.
    """
    m = (a + b) / 2  # broadcast [..., V]
    return (0.5 * (torch.xlogy(a, a) + torch.xlogy(b, b)) - torch.xlogy(m, m)).sum(dim=-1).clamp(min=0)


def vote_acceptances(head_tokens: torch.Tensor, draft_tokens: torch.Tensor, rule: str) -> torch.Tensor:
    """[n] bool: does the heads' vote back d_i? head_tokens [K, n] (y_k), draft_tokens [n].

    "strict":    more than K/2 heads chose d_i
    "plurality": d_i got more votes than any other token (a tie is not a win)
    "naive":     at least one head chose d_i
    """
    num_paths = head_tokens.shape[0]
    votes = (head_tokens == draft_tokens).sum(dim=0)  # [n]: heads that chose d_i
    if rule == "strict":
        return 2 * votes > num_paths
    if rule == "naive":
        return votes >= 1
    same = head_tokens.unsqueeze(1) == head_tokens.unsqueeze(0)  # [K, K, n]: head j chose head k's token
    rival_votes = same.sum(dim=1).masked_fill(head_tokens == draft_tokens, 0).amax(dim=0)  # [n]: best other token
    return votes > rival_votes


def head_inputs(inp: VerifyInput, name: str) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """inp.hidden [gamma+1, d] and inp.head, or a PolicyInputError naming what is missing."""
    missing = [field for field in ("hidden", "head") if getattr(inp, field) is None]
    if missing:
        raise PolicyInputError(f"{name}: VerifyInput.{' and .'.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                               f"None; expected the LM-head input [gamma+1, d] and the LM head, as the loop fills them")
    return inp.hidden, inp.head


@register("dropmatch")
class DropMatch(AcceptancePolicy):
    """DropMatch: K dropout paths through the LM head vote on each draft (see the module docstring).

    p: dropout probability on the hidden state, 0 <= p < 1 (paper: 0.3)
    paths: K, the number of dropout paths (paper: 5)
    criterion: "js_or_majority" (Algorithm 1), "js", "majority" or "naive"
    majority: "strict" (> K/2 votes) or "plurality" (unique mode)
    or_base: also accept what the base accepts (exact at T = 0, sampling at T > 0); ours
    seed: None (default): the masks follow the run's seed (reset(seed)); an int: always this seed
    js_temperature: the JS test's softmax temperature when params.temperature is 0; ours
    """

    lossless = False

    def __init__(self, p: float = 0.3, paths: int = 5, criterion: str = "js_or_majority", majority: str = "strict",
                 or_base: bool = True, seed: int | None = None, js_temperature: float = 1.0) -> None:
        if not (is_number(p) and 0 <= p < 1):
            raise MinispecError(f"dropmatch p = {p}; expected 0 <= p < 1")
        positive_int(paths, "dropmatch paths")
        if criterion not in CRITERIA:
            raise MinispecError(f"dropmatch criterion = {criterion!r}; expected one of {list(CRITERIA)}")
        if majority not in MAJORITY_RULES:
            raise MinispecError(f"dropmatch majority = {majority!r}; expected one of {list(MAJORITY_RULES)}")
        if seed is not None and (not is_int(seed) or not 0 <= seed < 2**64):
            raise MinispecError(f"dropmatch seed = {seed!r}; expected None or an integer 0 <= seed < 2**64")
        if not (is_number(js_temperature) and 0 < js_temperature < float("inf")):
            raise MinispecError(f"dropmatch js_temperature = {js_temperature!r}; expected a finite number > 0")
        self.p, self.paths, self.criterion, self.majority = p, paths, criterion, majority
        self.or_base, self.seed, self.js_temperature = or_base, seed, js_temperature
        self._generator = torch.Generator()  # the masks' only source of randomness
        self._fits = None  # the last (K, rows, d, V) checked to fit in memory
        self.reset()

    def reset(self, seed: int | None = None, gamma: int | None = None) -> None:
        """Reseed the masks: with the policy's own seed if it has one, else the run's (0 if None)."""
        run_seed = self.seed if self.seed is not None else (seed or 0)
        self._generator.manual_seed(mask_seed(run_seed))

    def decide(self, inp: VerifyInput) -> Decision:
        """The K paths of every position in one head call, the criterion on every drafted position, OR the base."""
        hidden, head = head_inputs(inp, self.name)
        gamma = inp.gamma
        clean_tokens = greedy_token(inp.target_logits)  # [gamma+1]
        path_logits = self.path_logits(hidden, head, inp.target_logits)  # [K, gamma+1, V]
        head_tokens = greedy_token(path_logits)  # [K, gamma+1]: y_k

        base_accepted = self.base_acceptances(inp, clean_tokens)  # [gamma]
        dropmatch_accepted = self.verdicts(inp, path_logits[:, :gamma], head_tokens[:, :gamma])  # [gamma]
        accepted = dropmatch_accepted | base_accepted if self.or_base else dropmatch_accepted  # [gamma]
        num_accepted = first_rejection(accepted)
        info = {"accepted_by_dropmatch_only": ~base_accepted,  # per position: counted over the committed drafts
                "heads_agree": int((head_tokens == clean_tokens).all(dim=0).sum()), "positions": gamma + 1}
        return Decision(num_accepted, self.next_token(inp, num_accepted, base_accepted, clean_tokens), info)

    def path_logits(self, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                    clean_logits: torch.Tensor) -> torch.Tensor:
        """l_k = W (h_i * m_k / (1-p)) for every path and position, in ONE head call: [K, rows, V].

        hidden [rows, d] (the LM-head input), clean_logits [rows, V] = head(hidden), used as every
        path at p = 0. Draws this step's masks. bf16 logits are upcast to float32.
        """
        if self.p == 0:  # every path is the clean head, bitwise
            path_logits = clean_logits.expand(self.paths, -1, -1)  # [K, rows, V], a view
        else:
            dropped = hidden * self.draw_masks(hidden, clean_logits.shape[-1]) / (1.0 - self.p)  # [K, rows, d], inverted dropout
            path_logits = head(dropped.reshape(-1, hidden.shape[1])).view(self.paths, hidden.shape[0], -1)
        return path_logits.to(torch.promote_types(path_logits.dtype, torch.float32))

    def draw_masks(self, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """This step's 0/1 masks m_ki ~ Bernoulli(1-p)^d for every path and position: [K, gamma+1, d].

        Before anything is allocated, K paths x rows must fit: the uniforms and dropped rows
        [K, rows, d] and the logits and softmax [K, rows, V] in float32 (checked once per shape).
        """
        shape = (self.paths, *hidden.shape, vocab_size)
        if shape != self._fits:
            rows, hidden_size = hidden.shape
            check_fits(4 * self.paths * rows * (2 * hidden_size + 2 * vocab_size),
                       f"dropmatch paths={self.paths}: {self.paths} x {rows} rows of logits per verify",
                       hidden.device, "fewer paths (the paper: 5)")
            self._fits = shape
        uniform = torch.rand((self.paths, *hidden.shape), generator=self._generator)  # [K, gamma+1, d]
        return (uniform < 1.0 - self.p).to(hidden.device, hidden.dtype)

    def base_acceptances(self, inp: VerifyInput, clean_tokens: torch.Tensor) -> torch.Tensor:
        """The base policy's verdict per drafted position: [gamma] bool (exact at T = 0, sampling at T > 0)."""
        if inp.params.greedy:
            return inp.draft_tokens == clean_tokens[:inp.gamma]
        return sample_acceptances(inp.p_target, inp.q_draft, inp.draft_tokens, inp.generator)

    def next_token(self, inp: VerifyInput, num_accepted: int, base_accepted: torch.Tensor,
                   clean_tokens: torch.Tensor) -> int:
        """The correction or bonus, from the clean target (see the module docstring)."""
        if inp.params.greedy:
            return int(clean_tokens[num_accepted])
        if num_accepted < inp.gamma and bool(base_accepted[num_accepted]):  # only DropMatch rejected it
            return sample_token(inp.p_target[num_accepted], inp.generator)
        return correction_or_bonus(inp.p_target, inp.q_draft, num_accepted, inp.generator)

    def verdicts(self, inp: VerifyInput, path_logits: torch.Tensor, head_tokens: torch.Tensor) -> torch.Tensor:
        """DropMatch's own verdict on every drafted position: [gamma] bool.

        path_logits [K, gamma, V] (l_k), head_tokens [K, gamma] (y_k = argmax l_k).
        """
        if self.criterion == "naive":
            return vote_acceptances(head_tokens, inp.draft_tokens, "naive")
        verdict = torch.zeros(inp.gamma, dtype=torch.bool, device=inp.draft_tokens.device)  # [gamma]
        if self.criterion in ("majority", "js_or_majority"):
            verdict |= vote_acceptances(head_tokens, inp.draft_tokens, self.majority)
        if self.criterion in ("js", "js_or_majority"):
            verdict |= self.js_test(inp, path_logits)
        return verdict

    def js_test(self, inp: VerifyInput, path_logits: torch.Tensor) -> torch.Tensor:
        """[gamma] bool: JS(q || pbar) <= max_k JS(p_k || pbar). path_logits [K, gamma, V]."""
        temperature = self.js_temperature if inp.params.greedy else inp.params.temperature
        centroid_logits = path_logits.mean(dim=0) if self.p > 0 else path_logits[0]  # [gamma, V]: mean_k l_k
        centroid_probs = torch.softmax(centroid_logits / temperature, dim=-1)  # [gamma, V]: pbar
        head_probs = torch.softmax(path_logits / temperature, dim=-1)  # [K, gamma, V]: p_k
        if inp.draft_logits is not None:
            draft_probs = torch.softmax(inp.draft_logits.to(path_logits.dtype) / temperature, dim=-1)  # [gamma, V]
        else:
            draft_probs = inp.q_draft.to(path_logits.dtype)  # [gamma, V], one-hot for an n-gram drafter
        radius = js_divergence(head_probs, centroid_probs).amax(dim=0)  # [gamma]: max_k JS(p_k || pbar)
        return js_divergence(draft_probs, centroid_probs) <= radius
