"""DropMatch's whole decision against an implementation written from the definition alone.

The reference below re-derives Algorithm 1 (module docstring of minispec/acceptance/dropmatch/rule.py)
with plain loops over paths and positions and no code from minispec.acceptance: the masks drawn
as documented (uniforms [K, gamma+1, d] from a generator seeded with mask_seed(seed), m = u <
1-p), inverted dropout, the argmax with the lowest id on ties, the three vote rules, the JS test
through KL(a || m) (not the policy's regrouped sum), the OR with the base (exact at T = 0,
speculative sampling at T > 0 from the verify generator's first gamma uniforms), the prefix rule,
and the token that follows (argmax at T = 0; at T > 0 a draw from p_target where only DropMatch
rejected, else from the residual, or the bonus row).

Inputs are built to hit the boundaries: integer hidden states and weights with p = 1/2 (every
path logit an exact small integer in float64, so argmax ties and vote ties at K/2 are common),
and a scale that makes heads exactly one-hot (exp(-1000) underflows to 0), so one-hot n-gram
drafts tie a head's p_k bitwise. Both classes, every criterion and majority rule, or_base on and
off, T = 0 and T > 0, 1 to 3 steps in a row (the masks move on between steps).

Ties. The JS test compares two sums over the vocabulary. Where the definition itself ties only
through round-off (mathematically equal sides computed from different inputs, e.g. a pbar
symmetric in two tokens), the two implementations may round to different sides; the reference
then allows either verdict at that position: |JS(q || pbar) - radius| <= 1e-12 * the larger side
(the sums' relative round-off is below V * 2^-53 ~ 1e-15). Bitwise-equal sides (q = p_k) are not a
round-off tie: the non-strict test must accept, and the reference requires it.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minispec.acceptance import DropMatch, LazyDropMatch, VerifyInput
from minispec.acceptance.dropmatch.rule import vote_acceptances
from minispec.model.sampling import SamplingParams, logits_to_probs, sample_token


def mask_seed(seed: int) -> int:
    """The mask generator's seed as the rule's docstring writes it (not read from the code): another
    stream than the verify generator's, which is seeded with `seed` itself."""
    return (seed + 0x9E3779B97F4A7C15) % 2**64


F64 = torch.float64
JS_TIE = 1e-12  # relative: see the module docstring


# ============================================================================== the reference


def argmax_lowest(row: list[float]) -> int:
    best = max(row)
    return row.index(best)


def softmax(row: list[float], temperature: float) -> list[float]:
    scaled = [x / temperature for x in row]
    top = max(scaled)
    exps = [math.exp(x - top) for x in scaled]
    total = sum(exps)
    return [e / total for e in exps]


def kl(a: list[float], b: list[float]) -> float:
    return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)


def js(a: list[float], b: list[float]) -> float:
    m = [(x + y) / 2 for x, y in zip(a, b)]
    return 0.5 * kl(a, m) + 0.5 * kl(b, m)


def vote(head_tokens: list[int], draft: int, rule: str) -> bool:
    votes = head_tokens.count(draft)
    if rule == "naive":
        return votes >= 1
    if rule == "strict":
        return votes > len(head_tokens) / 2
    rivals = [head_tokens.count(t) for t in set(head_tokens) if t != draft]  # plurality: a unique mode
    return votes > max(rivals, default=0)


def reference_verdicts(options: dict, hidden: torch.Tensor, weight: torch.Tensor, masks: torch.Tensor,
                       draft_tokens: list[int], draft_rows: list[list[float]], temperature: float) -> list[set[bool]]:
    """DropMatch's own verdict per drafted position, as a set: {True}, {False}, or both at a round-off tie.

    masks [K, gamma+1, d] (0/1), draft_rows: q for each drafted position (one-hot, or softmax of
    the draft logits at the JS temperature).
    """
    p, num_paths, criterion = options["p"], options["paths"], options["criterion"]
    verdicts = []
    for i, draft in enumerate(draft_tokens):
        paths = []
        for k in range(num_paths):
            dropped = hidden[i] * masks[k, i] / (1 - p) if p > 0 else hidden[i]
            paths.append((weight @ dropped).tolist())  # l_k, [V]
        head_tokens = [argmax_lowest(l) for l in paths]
        if criterion == "naive":
            verdicts.append({vote(head_tokens, draft, "naive")})
            continue
        by_vote = criterion in ("majority", "js_or_majority") and vote(head_tokens, draft, options["majority"])
        if by_vote or criterion == "majority":
            verdicts.append({by_vote})
            continue
        centroid = [sum(column) / num_paths for column in zip(*paths)] if p > 0 else paths[0]
        pbar = softmax(centroid, temperature)
        heads = [softmax(l, temperature) for l in paths]
        q = draft_rows[i]
        js_draft = js(q, pbar)
        radius = max(js(h, pbar) for h in heads)
        if any(h == q for h in heads) or js_draft <= radius - JS_TIE * max(js_draft, radius):
            verdicts.append({True})
        elif js_draft > radius + JS_TIE * max(js_draft, radius):
            verdicts.append({False})
        else:
            verdicts.append({True, False})
    return verdicts


def reference_base(p_target: torch.Tensor, q_draft: torch.Tensor, draft_tokens: list[int], greedy: bool,
                   generator: torch.Generator) -> list[bool]:
    """Exact match at T = 0; speculative sampling's coins at T > 0 (u_i < min(1, p(d_i) / q(d_i)))."""
    if greedy:
        return [draft == argmax_lowest(p_target[i].tolist()) for i, draft in enumerate(draft_tokens)]
    uniforms = torch.rand(len(draft_tokens), generator=generator, dtype=F64).tolist()
    accepted = []
    for i, draft in enumerate(draft_tokens):
        p_x, q_x = float(p_target[i, draft]), float(q_draft[i, draft])
        accepted.append(uniforms[i] < (min(1.0, p_x / q_x) if q_x > 0 else float(p_x > 0)))
    return accepted


def reference_next_token(p_target, q_draft, target_logits, num_accepted: int, base: list[bool], greedy: bool,
                         generator: torch.Generator) -> int:
    gamma = q_draft.shape[0]
    if greedy:
        return argmax_lowest(target_logits[num_accepted].tolist())
    if num_accepted == gamma:
        return sample_token(p_target[gamma], generator)
    if base[num_accepted]:  # only DropMatch rejected it: a draw from the clean target itself
        return sample_token(p_target[num_accepted], generator)
    residual = (p_target[num_accepted] - q_draft[num_accepted]).clamp(min=0)
    return sample_token(residual / residual.sum(), generator)


# ============================================================================== inputs


@st.composite
def dropmatch_cases(draw):
    vocab, hidden_size = draw(st.integers(2, 6)), draw(st.sampled_from([1, 2, 3, 5]))  # small d: heads often tie
    num_paths = draw(st.sampled_from([2, 4, 6, 1, 3, 5]))  # even K first: a vote can tie at K/2
    options = dict(p=draw(st.sampled_from([0.0, 0.5])), paths=num_paths,
                   criterion=draw(st.sampled_from(["js_or_majority", "js", "majority", "naive"])),
                   majority=draw(st.sampled_from(["strict", "plurality"])), or_base=draw(st.booleans()),
                   seed=draw(st.integers(0, 2**64 - 1)), js_temperature=draw(st.sampled_from([1.0, 0.5, 2.0])))
    temperature = draw(st.sampled_from([0.0, 0.0, 0.7, 1.0, 1.6]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    scale = draw(st.sampled_from([1.0, 0.25, 500.0]))  # 0.25: soft heads (still exact); 500: exactly one-hot heads
    weight = torch.randint(-2, 3, (vocab, hidden_size), generator=gen).to(F64)  # [V, d]
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        gamma = draw(st.integers(1, 4))
        hidden = scale * torch.randint(-3, 4, (gamma + 1, hidden_size), generator=gen).to(F64)  # [gamma+1, d]
        clean = (hidden @ weight.T)  # [gamma+1, V]
        model_draft = draw(st.booleans())
        if model_draft:  # the target's logits plus integer noise: ties with the target now and then
            draft_logits = clean[:gamma] + torch.randint(-2, 3, (gamma, vocab), generator=gen).to(F64) * draw(
                st.sampled_from([0.0, 1.0, scale]))
        else:
            draft_logits = None
        steps.append((hidden, draft_logits, draw(st.integers(0, 2**31)), draw(st.integers(0, 2**31))))
    return options, temperature, weight, steps


def build_input(weight, hidden, draft_logits, draft_seed, verify_seed, params) -> VerifyInput:
    """The loop's VerifyInput for one step; drafts consistent with q (argmax at T = 0, a draw at T > 0)."""
    target_logits = hidden @ weight.T  # [gamma+1, V]
    gamma, vocab = hidden.shape[0] - 1, weight.shape[0]
    draft_gen = torch.Generator().manual_seed(draft_seed)
    if draft_logits is None:  # an n-gram draft: one-hot q on an arbitrary token (the target's argmax half the time)
        draft_tokens = torch.where(torch.rand(gamma, generator=draft_gen) < 0.5, target_logits[:gamma].argmax(-1),
                                   torch.randint(0, vocab, (gamma,), generator=draft_gen))
        q_draft = torch.nn.functional.one_hot(draft_tokens, vocab).to(F64)  # [gamma, V]
    else:
        q_draft = logits_to_probs(draft_logits, params)  # [gamma, V]
        draft_tokens = (draft_logits.argmax(-1) if params.greedy
                        else torch.multinomial(q_draft, 1, generator=draft_gen)[:, 0])
    return VerifyInput(draft_tokens, q_draft, target_logits, logits_to_probs(target_logits, params), params,
                       torch.Generator().manual_seed(verify_seed), draft_logits, hidden=hidden,
                       head=lambda rows: rows @ weight.T)


# ============================================================================== the properties


@given(num_paths=st.integers(1, 6), vocab=st.integers(1, 3), seed=st.integers(0, 2**31),
       rule=st.sampled_from(["strict", "plurality", "naive"]))
def test_vote_rules_as_defined_ties_included(num_paths, vocab, seed, rule):
    """The three vote rules on head tokens over 1-3 ids, where K/2 ties and tied modes are common."""
    gen = torch.Generator().manual_seed(seed)
    head_tokens = torch.randint(vocab, (num_paths, 4), generator=gen)  # [K, 4 positions]
    draft_tokens = torch.randint(vocab, (4,), generator=gen)  # [4]
    got = vote_acceptances(head_tokens, draft_tokens, rule).tolist()
    assert got == [vote(head_tokens[:, i].tolist(), int(draft_tokens[i]), rule) for i in range(4)]



@given(seed=st.integers(0, 2**31), temperature=st.sampled_from([0.0, 0.3, 0.7, 1.6, 3.0]),
       js_temperature=st.sampled_from([0.5, 1.0, 2.0]), num_paths=st.integers(1, 5), model_draft=st.booleans())
def test_js_test_reads_all_three_sides_at_one_temperature(seed, temperature, js_temperature, num_paths, model_draft):
    """JS(q || pbar) <= max_k JS(p_k || pbar) with q, pbar and every p_k at the sampling temperature
    (js_temperature at T = 0), on continuous random logits spread so that verdicts go both ways:
    a side read at another temperature flips some of the 8 positions."""
    gen = torch.Generator().manual_seed(seed)
    gamma, vocab = 8, 6
    t = js_temperature if temperature == 0 else temperature
    base = 2.0 * torch.randn(gamma, vocab, generator=gen, dtype=F64)  # [gamma, V]
    path_logits = base + torch.randn(num_paths, gamma, vocab, generator=gen, dtype=F64)  # [K, gamma, V]
    draft_logits = base + 1.5 * torch.randn(gamma, vocab, generator=gen, dtype=F64)  # [gamma, V]
    params = SamplingParams(temperature)
    draft_tokens = draft_logits.argmax(-1)
    q_draft = (logits_to_probs(draft_logits, params) if model_draft
               else torch.nn.functional.one_hot(draft_tokens, vocab).to(F64))
    target_logits = torch.cat([base, base[:1]])  # [gamma+1, V], not read by the JS test
    inp = VerifyInput(draft_tokens, q_draft, target_logits, logits_to_probs(target_logits, params), params,
                      torch.Generator(), draft_logits if model_draft else None)
    policy = DropMatch(p=0.3, paths=num_paths, criterion="js", js_temperature=js_temperature)
    got = policy.js_test(inp, path_logits).tolist()
    for i in range(gamma):
        paths = path_logits[:, i].tolist()
        q = softmax(draft_logits[i].tolist(), t) if model_draft else q_draft[i].tolist()
        pbar = softmax([sum(column) / num_paths for column in zip(*paths)], t)
        js_draft, radius = js(q, pbar), max(js(softmax(l, t), pbar) for l in paths)
        if abs(js_draft - radius) > JS_TIE * max(js_draft, radius):  # continuous inputs: ties have probability 0
            assert got[i] == (js_draft <= radius), f"position {i}: JS(q || pbar) {js_draft}, radius {radius}"


@pytest.mark.parametrize("cls", [DropMatch, LazyDropMatch])
@settings(max_examples=8 * settings.default.max_examples)  # ~30 ms an example; the boundaries need many
@given(case=dropmatch_cases())
def test_dropmatch_decides_as_its_definition(cls, case):
    options, temperature, weight, steps = case
    params = SamplingParams(temperature)
    greedy = params.greedy
    js_temperature = options["js_temperature"] if greedy else temperature
    policy = cls(**options)
    policy.reset()
    mask_gen = torch.Generator().manual_seed(mask_seed(options["seed"]))
    for hidden, draft_logits, draft_seed, verify_seed in steps:
        # the reference's masks for this step, drawn as documented (p = 0 draws none)
        if options["p"] > 0:
            masks = (torch.rand((options["paths"], *hidden.shape), generator=mask_gen) < 1 - options["p"]).to(F64)
        else:
            masks = None
        inp = build_input(weight, hidden, draft_logits, draft_seed, verify_seed, params)
        decision = policy(inp)

        draft_tokens = inp.draft_tokens.tolist()
        if draft_logits is None:
            draft_rows = inp.q_draft.tolist()
        else:
            draft_rows = [softmax(row, js_temperature) for row in draft_logits.tolist()]
        own = reference_verdicts(options, hidden, weight, masks, draft_tokens, draft_rows, js_temperature)
        ref_gen = torch.Generator().manual_seed(verify_seed)
        base = reference_base(inp.p_target, inp.q_draft, draft_tokens, greedy, ref_gen)
        allowed = set()  # num_accepted under every resolution of the round-off ties
        for choice in itertools.product(*[sorted(v) for v in own]):
            accepted = [b or d for b, d in zip(base, choice)] if options["or_base"] else list(choice)
            allowed.add(accepted.index(False) if False in accepted else len(accepted))
        assert decision.num_accepted in allowed, (
            f"num_accepted {decision.num_accepted}, the definition gives {sorted(allowed)}: base {base}, "
            f"DropMatch's own verdicts {own}, drafts {draft_tokens}")
        expected_next = reference_next_token(inp.p_target, inp.q_draft, inp.target_logits, decision.num_accepted,
                                             base, greedy, ref_gen)
        assert decision.next_token == expected_next
