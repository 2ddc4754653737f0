"""What a rule emits at one position, in closed form: pi = q . a + (1 - sum q a) r, per rule.

At drafted position i a token-level rule sees the target's p_i and the draft's q_i, keeps the
draft token x ~ q_i with some probability a_i(x), and otherwise emits y ~ r_i. The token it emits
at that position is therefore distributed as

    pi_i(y) = q_i(y) a_i(y) + (1 - sum_x q_i(x) a_i(x)) r_i(y)                       (1)

a distribution over the whole vocabulary, computable from one verify step's tensors. A lossless
rule has pi_i = p_i (speculative sampling: q min(1, p/q) + sum max(0, p - q) norm(max(0, p - q)) = p);
a lossy rule's distance from p_i is its distortion at that position (meter.py). The bonus row
(i = gamma, after a fully accepted draft) is (1) with q = 0: pi = r, the distribution the rule
draws the bonus from.

A form gives a (the acceptance probability of every token x as the draft) and r for one row:

    rule             a(x)                                           r
    exact            1{x = argmax}                                   one-hot argmax
    sampling         min(1, p(x)/q(x))                               norm(max(0, p - q))
    lenience         min(1, p(x)/(beta q(x)))                        norm(max(0, p - beta q))
    ensemble         min(1, v(x)/q(x)),  v = (1 - w) q + w p         norm(max(0, v - q))
    typical          1{c(x) > min(eps, delta exp(-H(c)))}           one-hot argmax (T = 0), p (T > 0)
    kl-judge         a_base + (1 - a_base) 1{judged(x)}             the base's
    dropmatch        a_base + (1 - a_base) P_masks(DropMatch keeps x)   the base's      (Monte Carlo)
    fly              T > 0: an upper bound, the window assumed to    the base's          (a bound)
                     pass; T = 0: exact (the window read off the step)

where a(x) for x with q(x) = 0 does not matter (weight 0). The base is exact match at T = 0 and
speculative sampling at T > 0, with its coin independent of the judge's or the masks' verdict.

Two rules are not of this form:
- FLy keeps a rejected draft when the next W drafts pass; those drafts follow x, and one verify
  step holds them for the drawn x only. At T > 0 its form assumes the window passes for every x
  (a_upper), and meter.py reports the bound TV(pi, p) <= sum_x q(x) (a_upper(x) - a_base(x))
  (below). At T = 0 the draft is one-hot on the drawn token and the drafts after it are its
  greedy continuation, so the step holds the window's verdict: exact.
- DropMatch's verdict depends on K dropout masks; a(x) is a mean over `draws` mask draws, made
  from the form's own generator (the policy's stream is never touched), kept per draw so the
  meter can give the estimate's error.

Block verification and traversal are lossless over the whole block (a theorem, enumerated exactly
in tests/test_policy_block.py): their output has no per-position form; the meter reports them as
lossless without measuring.

Why FLy's bound holds: with a lossless base (pi_base = p), adding acceptance delta(x) =
a(x) - a_base(x) >= 0 at the same residual r moves pi by sum_x q(x) delta(x) (e_x - r), whose L1
norm is at most 2 sum_x q(x) delta(x); TV is half the L1 norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from minispec.acceptance.base import AcceptancePolicy, VerifyInput
from minispec.acceptance.block import BlockVerification
from minispec.acceptance.dropmatch.lazy import LazyDropMatch
from minispec.acceptance.dropmatch.rule import DropMatch, head_inputs, vote_acceptances
from minispec.acceptance.ensemble import StaticEnsemble
from minispec.acceptance.exact import ExactMatch
from minispec.acceptance.fly import FLy, top_k_entropy
from minispec.acceptance.kl_judge import KLJudge, kl_divergence
from minispec.acceptance.lenience import Lenience
from minispec.acceptance.sampling import SpeculativeSampling, residual_distribution
from minispec.acceptance.typical import TypicalAcceptance, entropy
from minispec.model.sampling import SamplingParams, greedy_token, logits_to_probs

F64 = torch.float64


@dataclass
class Form:
    """One row's rule in the form (1): accept [V] a(x), residual [V] r, float64.

    kind: "exact" (closed form), "bound" (FLy: accept is an upper bound, base_accept the base's a)
    or "monte-carlo" (DropMatch: accept is the mean of draws [M, V], each draw's a(x))."""

    accept: torch.Tensor  # [V]
    residual: torch.Tensor  # [V]
    kind: str = "exact"
    base_accept: torch.Tensor | None = None  # [V], kind "bound"
    draws: torch.Tensor | None = None  # [M, V], kind "monte-carlo"


class NotCovered(Exception):
    """The rule (or this setting of it) has no form here; the meter records it as not measured."""


LOSSLESS_BY_THEOREM = (BlockVerification,)  # and its subclasses (traversal): lossless over the block

FormFunction = Callable[[AcceptancePolicy, VerifyInput, int, "FormContext"], Form]
_FORMS: dict[type, FormFunction] = {}


@dataclass
class FormContext:
    """What a Monte Carlo form needs beyond the step: its own generator and how many draws."""

    generator: torch.Generator
    draws: int = 16


def register_form(policy_class: type):
    """Decorator: `fn(policy, inp, row, context) -> Form` is the form of `policy_class` (exact class)."""

    def add(fn: FormFunction) -> FormFunction:
        _FORMS[policy_class] = fn
        return fn

    return add


def form_of(policy: AcceptancePolicy, inp: VerifyInput, row: int, context: FormContext) -> Form:
    """The form (1) of `policy` at row `row` (0..gamma; gamma: the bonus row), or NotCovered."""
    fn = _FORMS.get(type(policy))  # the exact class: a subclass may decide differently
    if fn is None:
        raise NotCovered(f"{type(policy).__name__}: no per-position form")
    return fn(policy, inp, row, context)


def rows(inp: VerifyInput, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(p [V], q [V]) float64 at `row`; q = 0 at the bonus row (nothing was drafted there)."""
    p_row = inp.p_target[row].to(F64)  # [V]
    q_row = inp.q_draft[row].to(F64) if row < inp.gamma else torch.zeros_like(p_row)  # [V]
    return p_row, q_row


def ratio_acceptance(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """a(x) = min(1, p(x)/q(x)) where q(x) > 0, else 1{p(x) > 0}: [V] (sampling.acceptance_probability, every x)."""
    ratio = p_row / torch.where(q_row > 0, q_row, torch.ones_like(q_row))
    return torch.where(q_row > 0, ratio.clamp(max=1.0), (p_row > 0).to(F64))


def one_hot(index: int, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like, dtype=F64)
    out[index] = 1.0
    return out


def base_form(inp: VerifyInput, row: int) -> Form:
    """The base of the lossy rules: exact match at T = 0, speculative sampling at T > 0."""
    if inp.params.greedy:
        top = one_hot(int(greedy_token(inp.target_logits[row])), inp.target_logits[row])
        return Form(top, top)
    p_row, q_row = rows(inp, row)
    return Form(ratio_acceptance(p_row, q_row), residual_distribution(p_row, q_row))


def either(base: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """P(base or other) for independent verdicts: a_base + (1 - a_base) a_other."""
    return base + (1 - base) * other


@register_form(ExactMatch)
def exact_form(policy, inp, row, context) -> Form:
    top = one_hot(int(greedy_token(inp.target_logits[row])), inp.target_logits[row])
    return Form(top, top)


@register_form(SpeculativeSampling)
def sampling_form(policy, inp, row, context) -> Form:
    p_row, q_row = rows(inp, row)
    return Form(ratio_acceptance(p_row, q_row), residual_distribution(p_row, q_row))


@register_form(Lenience)
def lenience_form(policy, inp, row, context) -> Form:
    p_row, q_row = rows(inp, row)
    scaled = policy.beta * q_row
    return Form(ratio_acceptance(p_row, scaled), residual_distribution(p_row, scaled))


@register_form(StaticEnsemble)
def ensemble_form(policy, inp, row, context) -> Form:
    p_row, q_row = rows(inp, row)
    v_row = (1 - policy.weight) * q_row + policy.weight * p_row if row < inp.gamma else p_row  # [V]
    return Form(ratio_acceptance(v_row, q_row), residual_distribution(v_row, q_row))


@register_form(TypicalAcceptance)
def typical_form(policy, inp, row, context) -> Form:
    if inp.params.greedy:
        criterion = logits_to_probs(inp.target_logits[row], SamplingParams(policy.greedy_criterion_temperature))
        residual = one_hot(int(greedy_token(inp.target_logits[row])), inp.target_logits[row])
    else:
        criterion = inp.p_target[row]
        residual = inp.p_target[row].to(F64)
    criterion = criterion.to(F64)  # [V]
    threshold = torch.clamp(policy.delta * torch.exp(-entropy(criterion)), max=policy.eps)
    return Form((criterion > threshold).to(F64), residual)


@register_form(KLJudge)
def kl_judge_form(policy, inp, row, context) -> Form:
    base = base_form(inp, row)
    if row == inp.gamma:
        return base
    c, e = (t[row].to(F64) for t in policy.criteria(inp))  # [V] each
    # KL and the confidence mask do not depend on the draft token; only c(x) > 0 does
    row_judged = bool(kl_divergence(c, e) < policy.threshold) and float(c.max()) <= policy.confidence
    judged = ((c > 0) & row_judged).to(F64)  # [V]: judge_acceptances' verdict for every x as the draft
    return Form(either(base.accept, judged), base.residual)


@register_form(FLy)
def fly_form(policy, inp, row, context) -> Form:
    """T > 0: the bound (the window assumed to pass for every x). T = 0: exact, since q is one-hot on
    the drawn token d and the drafts after it are the drafter's greedy continuation of d, in the
    step: the window's verdict for d is read off them (the base's verdicts at rows row+1..row+W)."""
    base = base_form(inp, row)
    kind = "exact" if inp.params.greedy else "bound"
    if row == inp.gamma or row + policy.window_size >= inp.gamma:  # no window fits: FLy is its base here
        return Form(base.accept, base.residual, kind, base_accept=base.accept)
    criterion = (torch.softmax(inp.target_logits[row].to(F64), dim=-1) if inp.params.greedy
                 else inp.p_target[row].to(F64))  # [V]
    gate = float(top_k_entropy(criterion, policy.entropy_top_k)) >= policy.entropy_threshold
    window = True
    if inp.params.greedy:
        later = range(row + 1, row + 1 + policy.window_size)
        window = all(int(inp.draft_tokens[j]) == int(greedy_token(inp.target_logits[j])) for j in later)
    defer = ((criterion > 0) & gate & window).to(F64)  # [V]: T > 0, the window assumed to pass
    return Form(either(base.accept, defer), base.residual, kind, base_accept=base.accept)


@register_form(DropMatch)
@register_form(LazyDropMatch)  # the same decisions, by exact shortcuts
def dropmatch_form(policy, inp, row, context) -> Form:
    """a(x) = a_base + (1 - a_base) mean_m keep_m(x), keep_m the verdict under draw m's K masks."""
    if not policy.or_base:
        raise NotCovered("dropmatch with or_base=False: its correction depends on which verdict rejected")
    base = base_form(inp, row)
    if row == inp.gamma:
        return base
    hidden, head = head_inputs(inp, policy.name)
    vocab = inp.p_target.shape[1]
    everyone = torch.arange(vocab)  # [V]
    keeps = []
    for _ in range(context.draws):
        if policy.p == 0:
            path_logits = inp.target_logits[row].expand(policy.paths, 1, -1)  # [K, 1, V]
        else:
            uniform = torch.rand((policy.paths, hidden.shape[1]), generator=context.generator)  # [K, d]
            masks = (uniform < 1.0 - policy.p).to(hidden.device, hidden.dtype)
            path_logits = head(hidden[row] * masks / (1.0 - policy.p)).unsqueeze(1)  # [K, 1, V]
        path_logits = path_logits.to(torch.promote_types(path_logits.dtype, torch.float32))
        head_tokens = greedy_token(path_logits)[:, 0]  # [K]
        keep = torch.zeros(vocab, dtype=torch.bool)
        if policy.criterion in ("majority", "js_or_majority", "naive"):
            rule = "naive" if policy.criterion == "naive" else policy.majority
            keep |= vote_acceptances(head_tokens.unsqueeze(1).expand(-1, vocab), everyone, rule).cpu()
        if policy.criterion in ("js", "js_or_majority"):
            one_row = VerifyInput(inp.draft_tokens[row:row + 1], inp.q_draft[row:row + 1],
                                  inp.target_logits[row:row + 2], inp.p_target[row:row + 2], inp.params,
                                  inp.generator, None if inp.draft_logits is None else inp.draft_logits[row:row + 1])
            keep |= bool(policy.js_test(one_row, path_logits))
        keeps.append(keep.to(F64))
    draws = torch.stack(keeps)  # [M, V]
    accept_draws = either(base.accept.unsqueeze(0), draws)  # [M, V]
    return Form(accept_draws.mean(dim=0), base.residual, "monte-carlo", draws=accept_draws)

