"""Choosing DropMatch's dropout p for a model: by the heads' agreement with the clean argmax.

DropMatch's behaviour is set by how often its K dropout heads still pick the clean head's token.
If they always do, it adds nothing over exact match; if they rarely do, its JS radius grows wide
and its vote is noise. How often depends on p AND on the model: on how the gaps between its top
logits compare with what dropping coordinates of the LM-head input moves them by (outlier
coordinates, near-ties; not the width d as such: docs/dropmatch.md). So p is chosen per model,
for a level of

    agreement(p) = mean over positions t of  P(all K heads keep a_t)      a_t = argmax_v l_v(h_t)

Two ways to compute it, on the LM-head inputs h_t of a few calibration positions:

measured   K masks per position, drawn once from a seeded generator as uniforms u; a mask keeps
           coordinate j iff u_j < 1 - p (so the kept sets shrink as p grows: common random
           numbers across p). The share of positions where every head's argmax is a_t.

estimate   from W and h alone, no sampling (EstimatedAgreement gives the formulas). To first
           order in p a head flips the argmax only by dropping a "spike": a coordinate j whose
           share (W_a - W_b)_j h_j of a clean gap g_b = l_a - l_b exceeds the whole gap. So
               keep_t = (1-p)^S_t,     agreement = mean_t keep_t ** K,     S_t = spikes at t
           (given h_t the K masks are independent, so the K heads keep a_t independently). The
           "gaussian" variant is the other limit, many dropped coordinates: the logit noise is
           Gaussian with variance p/(1-p) * sum_j (W_vj h_j)^2: a model with many near-ties
           among its top logits needs a smaller p for the same agreement.

calibrate_p(agreement, level) bisects p in [0, p_max] for agreement(p) = level (agreement falls
with p; the measured one only on average, so the bisection finds a crossing: bracket_p).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from minispec.errors import MinispecError

CALIBRATION_TOKENS = 32  # how much of the target's greedy continuation `p=auto` calibrates on
DEFAULT_LEVEL = 0.8  # the agreement `p=auto` aims for (docs/dropmatch.md: why)
DEFAULT_COMPETITORS = 32


class EstimatedAgreement:
    """agreement(p) estimated from the LM head W and the hidden states, without sampling.

    hidden [n, d] the LM-head inputs h_t, weight [V, d] the LM head W (logits = W h). Per
    position, with a its argmax and b over the `competitors` closest tokens, c_bj = (W_a - W_b)_j h_j
    is coordinate j's share of the clean gap g_b = sum_j c_bj. Two estimates:

    "first-order" (default): exact to first order in p. A head flips the argmax with one dropped
        coordinate only if that coordinate is a spike: c_bj > g_b for some b (LLM hidden states
        have a few outlier coordinates that carry the gaps). A head keeps a iff it drops no spike
        (flips that need two or more dropped coordinates are O(p^2)):
            keep_t = (1-p)^S_t,        S_t = #{j : max_b (c_bj - g_b) > 0}
        Accurate while few coordinates are dropped (p d small); overestimates at large p.

    "gaussian": the large-p d limit. With t = sqrt(p / (1-p)) the noise of logit v is
        e_v = sum_j W_vj h_j (m_j/(1-p) - 1): Var e_v = t^2 v_v (v_v = sum_j W_vj^2 h_j^2),
        Cov(e_a, e_b) = t^2 c_b (c_b = sum_j W_aj W_bj h_j^2), Gaussian by the central limit
        theorem. Every gap G_b = g_b + e_a - e_b shares e_a; conditioning on e_a = t sqrt(v_a) x,
            G_b | x ~ N(g_b + (1 - c_b / v_a) t sqrt(v_a) x,  t^2 (v_b - c_b^2 / v_a)),
            keep_t = E_x [ prod_b Phi( (g_b + (1 - c_b/v_a) t sqrt(v_a) x) / (t sqrt(v_b - c_b^2/v_a)) ) ]
        (competitors independent given x, E_x by quadrature on a grid of x ~ N(0, 1)). Ignoring
        the shared e_a (the product of the marginals Phi(g_b / (t |c_b|))) underestimates.

    Both are 1 at p = 0 and fall monotonically in p (the Gaussian's every mean over sd falls as
    sqrt((1-p) / p) since g_b >= 0). scripts/dropmatch/dropmatch_calibration.py measures both against a
    Monte Carlo of the dropout on this model and on random models of several widths.
    """

    METHODS = ("first-order", "gaussian")
    GRID = torch.linspace(-6.0, 6.0, 97, dtype=torch.float64)  # x nodes; weights: the normal density, normalised

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, paths: int, method: str = "first-order",
                 competitors: int = DEFAULT_COMPETITORS, chunk: int = 128) -> None:
        if method not in self.METHODS:
            raise MinispecError(f"agreement estimate method = {method!r}; expected one of {list(self.METHODS)}")
        self.paths, self.method = paths, method
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("gap", "slope", "spread", "spikes")}
        with torch.inference_mode():
            weight = weight.double()
            for part in hidden.double().split(chunk):
                logits = part @ weight.T  # [c, V]
                top = logits.topk(min(competitors + 1, logits.shape[1]), dim=-1).indices  # [c, M+1]: a_t first
                a_h, b_h = weight[top[:, :1]] * part.unsqueeze(1), weight[top[:, 1:]] * part.unsqueeze(1)  # [c,1|M,d]
                shares = a_h - b_h  # [c, M, d]: c_bj
                gap = shares.sum(dim=-1)  # [c, M]: g_b >= 0
                parts["spikes"].append((shares > gap.unsqueeze(-1)).any(dim=1).sum(dim=-1).double())  # [c]: S_t
                v_a = (a_h * a_h).sum(dim=-1).clamp(min=1e-300)  # [c, 1]
                c_b, v_b = (a_h * b_h).sum(dim=-1), (b_h * b_h).sum(dim=-1)  # [c, M]
                parts["gap"].append(gap)
                parts["slope"].append((1 - c_b / v_a) * v_a.sqrt())  # [c, M]
                parts["spread"].append((v_b - c_b * c_b / v_a).clamp(min=0).sqrt())  # [c, M]
        self.gap, self.slope, self.spread, self.spikes = (torch.cat(parts[k]) for k in ("gap", "slope", "spread",
                                                                                         "spikes"))
        density = torch.exp(-self.GRID ** 2 / 2)
        self.grid_weights = density / density.sum()  # [G]

    def keep_probability(self, p: float, chunk: int = 512) -> torch.Tensor:
        """P(one dropout head keeps the clean argmax) per position: [n]."""
        if not 0 <= p < 1:
            raise MinispecError(f"dropout p = {p}; expected 0 <= p < 1")
        if p == 0:
            return torch.ones(self.gap.shape[0], dtype=torch.float64)
        if self.method == "first-order":
            return (1 - p) ** self.spikes  # [n]
        t = math.sqrt(p / (1 - p))
        keep = []
        for rows in torch.arange(self.gap.shape[0]).split(chunk):
            mean = self.gap[rows, :, None] + t * self.slope[rows, :, None] * self.GRID  # [c, M, G]
            keep.append((_phi(mean, t * self.spread[rows, :, None]).prod(dim=1) * self.grid_weights).sum(dim=-1))
        return torch.cat(keep).clamp(0.0, 1.0)  # [n]

    def __call__(self, p: float) -> float:
        """mean_t keep_t ** K: the share of positions where all K heads keep the clean argmax."""
        return float((self.keep_probability(p) ** self.paths).mean())


def _phi(mean: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    """P(N(mean, sd^2) > 0) elementwise; sd = 0: 1 if mean > 0, 1/2 if mean = 0 (a tie), else 0."""
    return torch.where(sd > 0, torch.special.ndtr(mean / sd.clamp(min=1e-300)),
                       (mean > 0).double() + 0.5 * (mean == 0).double())


class MeasuredAgreement:
    """agreement(p) by Monte Carlo on fixed positions, with the same uniforms for every p.

    hidden [n, d], head: LM-head input -> logits. Calling the object with p gives the share of
    positions where all `paths` dropped heads' argmax equals the clean argmax (ties: lowest id).
    """

    def __init__(self, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], paths: int,
                 seed: int = 0, chunk: int = 64) -> None:
        self.hidden, self.head, self.paths, self.chunk = hidden, head, paths, chunk
        generator = torch.Generator().manual_seed(seed)
        self.uniforms = torch.rand((paths, *hidden.shape), generator=generator)  # [K, n, d]
        with torch.inference_mode():
            self.clean = torch.cat([head(part).argmax(dim=-1) for part in hidden.split(chunk)])  # [n]

    @torch.inference_mode()
    def __call__(self, p: float) -> float:
        if p == 0:
            return 1.0
        kept = 0
        for rows in torch.arange(self.hidden.shape[0]).split(self.chunk):
            masks = (self.uniforms[:, rows] < 1.0 - p).to(self.hidden.device, self.hidden.dtype)  # [K, c, d]
            dropped = self.hidden[rows] * masks / (1.0 - p)  # [K, c, d]
            tokens = self.head(dropped.reshape(-1, dropped.shape[-1])).argmax(dim=-1).view(self.paths, -1)  # [K, c]
            kept += int((tokens == self.clean[rows]).all(dim=0).sum())
        return kept / self.hidden.shape[0]


def calibrate_p(agreement: Callable[[float], float], level: float, p_max: float = 0.9, steps: int = 20) -> float:
    """The p in [0, p_max] where agreement(p) crosses `level`, by bisection (agreement falls with p):
    the lower end of bracket_p's bracket, where agreement is still >= level; p_max if agreement
    never drops below the level."""
    return bracket_p(agreement, level, p_max, steps)[0]


def bracket_p(agreement: Callable[[float], float], level: float, p_max: float = 0.9,
              steps: int = 20) -> tuple[float, float]:
    """(lo, hi) with agreement(lo) >= level > agreement(hi) and hi - lo = p_max / 2**steps, by
    bisection from (0, p_max); (p_max, p_max) if agreement(p_max) >= level."""
    if not 0 < level <= 1:
        raise MinispecError(f"agreement level = {level}; expected 0 < level <= 1")
    if agreement(p_max) >= level:
        return p_max, p_max
    lo, hi = 0.0, p_max  # agreement(0) = 1 >= level > agreement(p_max)
    for _ in range(steps):
        mid = (lo + hi) / 2
        if agreement(mid) >= level:
            lo = mid
        else:
            hi = mid
    return lo, hi


def auto_dropout_p(model, prompt_ids: list[int], paths: int, level: float = DEFAULT_LEVEL, *,
                   continuation: list[int], seed: int = 0, steps: int = 16) -> float:
    """`p=auto`: the p whose measured all-K head agreement is `level` at the positions
    DropMatch will judge: those of the target's own greedy `continuation` of the prompt (the CLI
    takes its first CALIBRATION_TOKENS tokens, decoded plainly), whose LM-head inputs come from
    one forward.

    Measured (MeasuredAgreement, seeded: the same prompt gives the same p), not estimated: the
    first-order estimate is exact only while few coordinates are dropped, and a calibration of
    a few dozen positions costs about a second. The caller decodes the continuation (this module
    sits below the decoding loops, which import the acceptance policies).
    """
    ids = prompt_ids + continuation
    with torch.inference_mode():
        hidden = model.forward_hidden(torch.tensor([ids], device=model.device))[0]  # [P + n, d]
    hidden = hidden[len(prompt_ids) - 1:-1] if continuation else hidden[-1:]  # the rows that predict the continuation
    return calibrate_p(MeasuredAgreement(hidden, model.head, paths, seed=seed), level, steps=steps)
