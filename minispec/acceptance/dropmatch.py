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

Cost. SmolLM2-135M's tied LM head (49152 x 576) is ~21% of its weights, so K separate head
matmuls would nearly double a verify step (the paper's 1.64% overhead was on a 70B model, where
the head is ~0.05% of the work). Two ways to pay for the paths, both giving the same decisions:

- lazy=False (the spec's way): all K paths and the clean row, for all gamma+1 positions, in ONE
  head call, [(K+1)(gamma+1), d] @ W^T, so W is read once. The K(gamma+1) extra rows are pure
  arithmetic: 1.7 GFLOP at K=5, gamma=5, ~14% of a bf16 verify step on the fast path.
- lazy=True (default; ours): the paths of position i are needed only to decide position i, and
  with or_base only where the base rejects (the prefix rule stops at the first rejection DropMatch
  confirms). So the verify's head call takes the clean rows plus the K rows of the first
  `prefetch` drafted positions (default 1: with an n-gram or a weak drafter the first draft is
  the one most often rejected by the base), and any other position that needs a verdict costs
  one more head call on its K rows, which reads W again (~3 ms in bf16 here).
  The masks are still drawn for every (path, position) of the step, from the same generator in
  the same order, so lazy and eager see the same masks and reach the same decisions (up to the
  last bit of the head's matmul, whose summation order may depend on its row count).
  heads_all_agree needs every position's paths, so only lazy=False reports it; lazy=True reports
  path_positions (positions whose verdict needed the paths) and path_head_calls instead.

A verdict's arithmetic, over K rows of the vocabulary, is kept to what the decision needs, with
decisions equal to Algorithm 1's (tested against the definitions):
- the vote counts the heads whose row maximum sits at d_i (draft_votes) instead of taking K
  argmaxes; with js_or_majority a position the vote accepts skips the JS test (it is an OR);
- JS(q || pbar) for a one-hot q (n-gram drafts) is a formula in pbar[d_i] (js_to_one_hot);
- the radius test computes a path's exact JS only if JS <= ln 2 * TV lets it reach JS(q || pbar)
  (js_acceptances): on real n-gram steps, ~1 in 9 of the K divergences.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from minispec.acceptance.base import (AcceptancePolicy, Decision, PolicyInputError, VerifyInput, first_rejection,
                                      register)
from minispec.acceptance.sampling import correction_or_bonus, sample_acceptances
from minispec.errors import MinispecError
from minispec.sampling import greedy_token

CRITERIA = ("js_or_majority", "js", "majority", "naive")
LN2 = math.log(2.0)
RADIUS_BOUND_SLACK = 1e-4  # see js_acceptances: far above float32 round-off of a JS or TV sum
MAJORITY_RULES = ("strict", "plurality")


def js_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence over the last dim, natural log: [..., V] x [..., V] -> [...].

    JS(a || b) = 1/2 sum a ln(a/m) + 1/2 sum b ln(b/m), m = (a + b)/2, computed per entry as
    1/2 a ln a + 1/2 b ln b - m ln m (the same sum, regrouped), with 0 ln 0 = 0.
    JS(a || a) is exactly 0 (m == a bitwise); round-off below 0 is clamped to 0.
    Why not torch.xlogy: it is ~3.5x slower than log + multiply on CPU (0.67 vs 0.19 ms for a
    [5, 49152] tensor), and DropMatch evaluates this on K rows of the vocabulary per position.
    """
    m = (a + b) / 2  # broadcast [..., V]
    terms = 0.5 * (_x_log_x(a) + _x_log_x(b)) - _x_log_x(m)  # [..., V]
    return terms.sum(dim=-1).clamp(min=0)


def _x_log_x(x: torch.Tensor) -> torch.Tensor:
    """x ln x elementwise for x >= 0, exactly 0 at x == 0 (its limit): the log's argument is raised
    to the dtype's smallest normal number, which changes only entries whose term is below 1e-35."""
    return x * torch.log(x.clamp(min=torch.finfo(x.dtype).tiny))


def js_to_one_hot(prob_at_draft: torch.Tensor) -> torch.Tensor:
    """JS(delta_d || b) from a = b[d] alone, for a one-hot draft distribution (n-gram drafts): [...] -> [...].

    Every entry v != d has m_v = b_v / 2, so its terms sum to (1 - a) ln 2; with the entry at d:
    JS(delta_d || b) = ln 2 + 1/2 (a ln a - (1 + a) ln(1 + a)),   0 at a = 1, ln 2 at a = 0.
    One number per position instead of a pass over the vocabulary.
    """
    a = prob_at_draft
    return (LN2 + 0.5 * (_x_log_x(a) - _x_log_x(1 + a))).clamp(min=0)


def js_acceptances(path_logits: torch.Tensor, centroid_logits: torch.Tensor, draft_probs: torch.Tensor,
                   temperature: float, draft_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """[n] bool: JS(q || pbar) <= max_k JS(p_k || pbar), i.e. some path's JS reaches the draft's.

    path_logits [K, n, V], centroid_logits [n, V] (mean_k l_k), draft_probs [n, V] (q),
    draft_tokens [n] (d_i; when given and q is one-hot at d_i, JS(q || pbar) is js_to_one_hot's).

    The radius takes K JS divergences over the vocabulary, mostly logarithms. A cheap bound
    decides most paths without theirs (exactly, not approximately):

        JS(a || b) <= ln 2 * TV(a, b),   TV(a, b) = 1/2 sum_v |a_v - b_v|

    Per entry, f(a, b) = 1/2 a ln(2a/(a+b)) + 1/2 b ln(2b/(a+b)) is convex along a + b = s, 0 at
    a = b and 1/2 ln 2 * s at a = 0 or b = 0; so f lies below its chords, 1/2 ln 2 |a - b|.
    A path whose bound is below JS(q || pbar) cannot reach it. So paths are taken largest TV
    first, and the exact JS is computed only while the bound still reaches; the first path that
    reaches JS(q || pbar) accepts. RADIUS_BOUND_SLACK keeps the shortcut on the side of the full
    float computation (whose round-off is ~1e-6 at V = 49152). On real n-gram steps (SmolLM2,
    RAG prompts) ~1 in 9 of the K divergences is computed.
    """
    centroid_probs = torch.softmax(centroid_logits / temperature, dim=-1)  # [n, V]: pbar
    if draft_tokens is not None and bool((draft_probs.gather(-1, draft_tokens[:, None]) == 1).all()):
        js_draft = js_to_one_hot(centroid_probs.gather(-1, draft_tokens[:, None])[:, 0])  # [n]
    else:
        js_draft = js_divergence(draft_probs, centroid_probs)  # [n]
    head_probs = torch.softmax(path_logits / temperature if temperature != 1 else path_logits, dim=-1)  # [K, n, V]: p_k
    tv = 0.5 * (head_probs - centroid_probs).abs_().sum(dim=-1)  # [K, n]: TV(p_k, pbar)
    reachable = LN2 * tv + RADIUS_BOUND_SLACK >= js_draft  # [K, n]: paths whose JS could reach JS(q || pbar)
    accepted = torch.zeros_like(js_draft, dtype=torch.bool)  # [n]
    for i in reachable.any(dim=0).nonzero()[:, 0].tolist():  # other positions: every radius is too small
        for k in tv[:, i].argsort(descending=True).tolist():  # the likeliest path to reach it first
            if not reachable[k, i]:
                break
            if js_divergence(head_probs[k, i], centroid_probs[i]) >= js_draft[i]:  # radius >= JS(q || pbar)
                accepted[i] = True
                break
    return accepted  # [n]: JS(q || pbar) <= max_k JS(p_k || pbar), non-strict


def draft_votes(path_logits: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """[n] int: how many heads' argmax (lowest id on ties) is the draft. path_logits [K, n, V], draft_tokens [n].

    Without an argmax over the vocabulary (CPU argmax is ~15x slower than max here): head k chose
    d_i iff l_k[d_i] is its row's maximum and no lower id reaches that maximum too.
    """
    num_paths, n, _ = path_logits.shape
    row_max = path_logits.amax(dim=-1)  # [K, n]
    at_draft = path_logits.gather(-1, draft_tokens.expand(num_paths, n)[..., None])[..., 0]  # [K, n]
    chose = at_draft == row_max  # [K, n]
    for k, i in chose.nonzero().tolist():  # where d_i holds the maximum: does a lower id tie it (and win)?
        if bool((path_logits[k, i, : int(draft_tokens[i])] == row_max[k, i]).any()):
            chose[k, i] = False
    return chose.sum(dim=0)  # [n]


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


class DropoutPaths:
    """The K dropout-path logits of one verify step, each position computed when first asked for.

    hidden [gamma+1, d] is the LM-head input, masks [K, gamma+1, d] the step's 0/1 masks (all drawn
    up front, see DropMatch.head_logits), head the LM head. `at(i)` returns [K, V] for position i,
    from one head call on the K rows h_i * m_k / (1-p), unless it was prefetched (`fill`).
    `asked` lists the positions a verdict needed; `head_calls` counts the extra head calls.
    """

    def __init__(self, hidden: torch.Tensor, masks: torch.Tensor, p: float,
                 head: Callable[[torch.Tensor], torch.Tensor], vocab_size: int) -> None:
        self.hidden, self.masks, self.p, self.head, self.vocab_size = hidden, masks, p, head, vocab_size
        self._logits: dict[int, torch.Tensor] = {}  # position -> [K, V]
        self.asked: list[int] = []
        self.head_calls = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        """[K, gamma+1, V] as if every position were computed."""
        return self.masks.shape[0], self.masks.shape[1], self.vocab_size

    def dropped(self, positions: slice | int) -> torch.Tensor:
        """The K dropped-out copies of the hidden states at `positions`: [K, ..., d]."""
        return self.hidden[positions] * self.masks[:, positions] / (1.0 - self.p)  # inverted dropout

    def fill(self, position: int, logits: torch.Tensor) -> None:
        """Store a position's path logits [K, V] computed elsewhere (the verify's head call)."""
        self._logits[position] = logits

    def at(self, position: int) -> torch.Tensor:
        if position not in self.asked:
            self.asked.append(position)
        if position not in self._logits:
            self._logits[position] = self.head(self.dropped(position))  # [K, d] -> [K, V]
            self.head_calls += 1
        return self._logits[position]

    def all(self) -> torch.Tensor:
        """[K, gamma+1, V], every position (for tests and diagnostics)."""
        return torch.stack([self.at(i) for i in range(self.masks.shape[1])], dim=1)


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
    lazy: compute a position's dropout paths only when its verdict is needed (default), instead
      of all positions in the verify's head call; same decisions, see "Cost" in the module docstring
    prefetch: lazy only: the paths of the first `prefetch` drafted positions go into the verify's
      head call anyway (default 1: the first draft is where a verdict is most often needed)
    """

    lossless = False

    def __init__(self, p: float = 0.3, paths: int = 5, criterion: str = "js_or_majority", majority: str = "strict",
                 or_base: bool = True, seed: int = 0, js_temperature: float = 1.0, lazy: bool = True,
                 prefetch: int = 1) -> None:
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
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise MinispecError(f"dropmatch prefetch = {prefetch!r}; expected an integer >= 0")
        self.lazy = lazy
        self.prefetch = prefetch
        self._generator = torch.Generator().manual_seed(seed)  # the masks' only source of randomness

    def reset(self) -> None:
        self._generator.manual_seed(self.seed)

    def head_logits(self, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, object]:
        """Clean logits [gamma+1, V] and the K dropout paths: [K, gamma+1, V], or DropoutPaths if lazy.

        hidden [gamma+1, d] is the LM-head input. Path k at position i is the head of
        h_i * m_ki / (1-p), with fresh masks m_ki ~ Bernoulli(1-p)^d per path, position and step.
        Eager (lazy=False): the clean rows and all K(gamma+1) path rows go through ONE head call.
        Lazy: the head runs on the clean rows and the K rows of the first `prefetch` drafted
        positions now; DropoutPaths runs it on another position's K rows when `decide` first
        needs them. The masks are drawn here either way, in the same order.
        """
        if hidden.dim() != 2:
            raise PolicyInputError(f"dropmatch: hidden shape {list(hidden.shape)}; expected [gamma+1, d]")
        num_positions, hidden_size = hidden.shape
        if self.p == 0:  # no dropout: every path is the clean head, bitwise (and no extra head rows)
            clean_logits = head(hidden)  # [gamma+1, V]
            return clean_logits, clean_logits.unsqueeze(0).expand(self.paths, -1, -1)  # [K, gamma+1, V], a view
        uniform = torch.rand((self.paths, num_positions, hidden_size), generator=self._generator)  # [K, gamma+1, d]
        masks = (uniform < 1.0 - self.p).to(hidden.device, hidden.dtype)  # [K, gamma+1, d]: Bernoulli(1-p)
        if self.lazy:
            n = min(self.prefetch, num_positions - 1)  # prefetched: drafted positions only, not the bonus row
            prefetched = (hidden[:n] * masks[:, :n] / (1.0 - self.p)).reshape(-1, hidden_size)  # [K*n, d]
            logits = head(torch.cat([hidden, prefetched]))  # [gamma+1 + K*n, V]: W read once
            clean_logits = logits[:num_positions]  # [gamma+1, V]
            paths = DropoutPaths(hidden, masks, self.p, head, clean_logits.shape[-1])
            prefetched_logits = logits[num_positions:].view(self.paths, n, -1) if n else None  # [K, n, V]
            for i in range(n):
                paths.fill(i, prefetched_logits[:, i])
            return clean_logits, paths
        dropped = hidden * masks / (1.0 - self.p)  # [K, gamma+1, d], inverted dropout
        rows = torch.cat([hidden.unsqueeze(0), dropped])  # [K+1, gamma+1, d]: clean first
        logits = head(rows.reshape(-1, hidden_size))  # [(K+1)(gamma+1), V]: W read once
        logits = logits.reshape(self.paths + 1, num_positions, -1)  # [K+1, gamma+1, V]
        return logits[0], logits[1:]

    def decide(self, inp: VerifyInput) -> Decision:
        gamma = inp.gamma
        paths = self._path_logits(inp)  # [K, gamma+1, V] tensor, or DropoutPaths (lazy)
        clean_tokens = greedy_token(inp.target_logits)  # [gamma+1]

        # The base policy's verdict on each position (always computed; see the module docstring).
        if inp.params.greedy:  # exact match: greedy_acceptances, from the argmax already taken
            base_accepted = inp.draft_tokens == clean_tokens[:gamma]  # [gamma]
        else:
            base_accepted = sample_acceptances(inp.p_target, inp.q_draft, inp.draft_tokens, inp.generator)  # [gamma]

        if isinstance(paths, DropoutPaths):  # position by position, only where a verdict is needed
            accepted = base_accepted.clone() if self.or_base else torch.zeros_like(base_accepted)  # [gamma]
            for i in range(gamma):
                if not accepted[i]:
                    accepted[i] = bool(self._verdicts(inp, paths.at(i).unsqueeze(1), i, i + 1)[0])
                    if not accepted[i]:
                        break  # the prefix rule: nothing after the first rejection counts
            info = {"path_positions": len(paths.asked), "path_head_calls": paths.head_calls}
        else:  # every position at once, from the paths the verify's head call computed
            dropmatch_accepted = self._verdicts(inp, paths[:, :gamma], 0, gamma)  # [gamma]
            accepted = dropmatch_accepted | base_accepted if self.or_base else dropmatch_accepted  # [gamma]
            head_tokens = greedy_token(paths)  # [K, gamma+1]: y_k
            info = {"heads_all_agree": float((head_tokens == clean_tokens).all(dim=0).double().mean())}

        num_accepted = first_rejection(accepted)
        if inp.params.greedy:
            next_token = int(clean_tokens[num_accepted])
        else:
            next_token = correction_or_bonus(inp.p_target, inp.q_draft, num_accepted, inp.generator)
        info["accepted_by_dropmatch_only"] = int((~base_accepted[:num_accepted]).sum())
        return Decision(num_accepted, next_token, info)

    def _verdicts(self, inp: VerifyInput, path_logits: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """DropMatch's own verdict on drafted positions start..end-1: [end-start] bool.

        path_logits [K, end-start, V]: the K paths at those positions. bf16 logits are upcast to
        float32 first (for the JS test's precision, and CPU argmax on bf16 is ~4x slower).
        """
        path_logits = path_logits.to(torch.promote_types(path_logits.dtype, torch.float32))  # [K, n, V]
        draft_tokens = inp.draft_tokens[start:end]  # [n]
        num_paths = path_logits.shape[0]
        votes = draft_votes(path_logits, draft_tokens)  # [n]: heads whose y_k is d_i
        if self.criterion == "naive":
            return votes >= 1
        verdict = torch.zeros(end - start, dtype=torch.bool, device=draft_tokens.device)  # [n]
        if self.criterion in ("majority", "js_or_majority"):
            if self.majority == "strict":
                verdict |= 2 * votes > num_paths
            else:
                verdict |= vote_acceptances(greedy_token(path_logits), draft_tokens, "plurality")
        if self.criterion in ("js", "js_or_majority") and not bool(verdict.all()):  # an OR: skip it if decided
            verdict |= self._js_acceptances(inp, path_logits, start, end)
        return verdict

    def _path_logits(self, inp: VerifyInput) -> torch.Tensor | DropoutPaths:
        """inp.head_extras, checked: the K path logits [K, gamma+1, V] from `head_logits`."""
        extras = inp.head_extras
        if extras is None:
            raise PolicyInputError("dropmatch: inp.head_extras is None; get the target logits from "
                                   "policy.head_logits(hidden, head), which also returns the dropout paths")
        expected = (self.paths, inp.gamma + 1, inp.target_logits.shape[1])
        if not isinstance(extras, (torch.Tensor, DropoutPaths)) or tuple(extras.shape) != expected:
            got = list(extras.shape) if isinstance(extras, (torch.Tensor, DropoutPaths)) else type(extras).__name__
            raise PolicyInputError(f"dropmatch: head_extras {got}; expected [K, gamma+1, V] = {list(expected)}")
        return extras

    def _js_acceptances(self, inp: VerifyInput, path_logits: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """The JS test at drafted positions start..end-1: [end-start] bool. path_logits [K, end-start, V]."""
        temperature = inp.params.temperature if not inp.params.greedy else self.js_temperature
        paths = path_logits  # [K, n, V], float32 or float64 (see _verdicts)
        compute_dtype = paths.dtype
        # With p = 0 the paths are the clean head bitwise; their float mean could be an ulp off.
        centroid_logits = paths[0] if self.p == 0 else paths.mean(dim=0)  # [n, V]
        if inp.draft_logits is not None:
            draft_probs = torch.softmax(inp.draft_logits[start:end].to(compute_dtype) / temperature, dim=-1)  # [n, V]
        else:
            draft_probs = inp.q_draft[start:end].to(compute_dtype)  # [n, V], one-hot for n-gram
        return js_acceptances(paths, centroid_logits, draft_probs, temperature, inp.draft_tokens[start:end])
