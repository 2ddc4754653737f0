"""Rule definitions drawn over the slices where they differ from what a slip would compute:
temperatures far from 1 with top-k and top-p (where p_target is not softmax(target_logits)),
thresholds drawn near each input's own criterion value, and rows in plain Python. Each rule's
num_accepted equals its written definition (the module docstrings), read here from the input's
own fields (p_target, q_draft, the logits), never from the rule's helpers."""

from __future__ import annotations

import math

import torch
from hypothesis import assume, given, strategies as st

from minispec.acceptance import KLJudge, TypicalAcceptance
from minispec.testing import seeds
from minispec.testing.checks import verify_inputs


def softmax_row(logits: list[float], temperature: float = 1.0) -> list[float]:
    top = max(logits)
    e = [math.exp((x - top) / temperature) for x in logits]
    return [v / sum(e) for v in e]


def prefix(verdicts: list[bool]) -> int:
    n = 0
    while n < len(verdicts) and verdicts[n]:
        n += 1
    return n


def entropy(row: list[float]) -> float:
    return -sum(p * math.log(p) for p in row if p > 0)


@given(inp=verify_inputs(), eps=st.floats(1e-6, 1.0), delta=st.floats(1e-6, 1.0), near=st.booleans())
def test_typical_acceptance_is_its_definition_on_every_slice(inp, eps, delta, near):
    """accepted_i = c_i(d_i) > min(eps, delta exp(-H(c_i))), c = p_target at T > 0 (after the
    filters), softmax(logits / 1) at T = 0; `near` puts eps just above or below the first draft's c."""
    assume(inp.gamma > 0)
    rows = [softmax_row(r) for r in inp.target_logits.tolist()] if inp.params.greedy else inp.p_target.tolist()
    drafts = inp.draft_tokens.tolist()
    if near:  # the threshold at the first draft's own value: the strict inequality decides
        eps, delta = min(1.0, max(1e-12, rows[0][drafts[0]] * (1 + (eps - 0.5) * 1e-9))), 1.0
    want = prefix([rows[i][d] > min(eps, delta * math.exp(-entropy(rows[i]))) for i, d in enumerate(drafts)])
    got = TypicalAcceptance(eps=eps, delta=delta)(inp).num_accepted
    if near and abs(rows[0][drafts[0]] - eps) < 1e-12:
        return  # within round-off of the threshold: either verdict is the definition's
    assert got == want, (inp.params, got, want)


@given(inp=verify_inputs(), threshold=st.floats(0.0, 3.0), confidence=st.floats(0.5, 1.0), seed=seeds,
       at=st.none() | st.integers(0, 4), above=st.booleans())
def test_the_kl_judge_is_its_definition_on_every_slice(inp, threshold, confidence, seed, at, above):
    """accepted_i = base_i or (KL(c_i || e_i) < threshold and max c_i <= confidence and c_i(d_i) > 0);
    c, e = p_target, q_draft at T > 0 (filters applied), softmax of the raw logits at T = 0; base:
    argmax at T = 0, u_i < min(1, p/q) with the step's first gamma uniforms at T > 0. With `at`, the
    threshold sits 1e-7 (relative) above or below position at's own KL, and the confidence is 1."""
    assume(inp.gamma > 0)
    gamma, drafts = inp.gamma, inp.draft_tokens.tolist()
    inp.generator = torch.Generator().manual_seed(seed)
    if inp.params.greedy:
        c = [softmax_row(r) for r in inp.target_logits[:gamma].tolist()]
        e = [softmax_row(r) for r in inp.draft_logits.tolist()]
        base = [d == max(range(len(r)), key=lambda v: (r[v], -v)) for d, r in zip(drafts, inp.target_logits.tolist())]
    else:
        c, e = inp.p_target[:gamma].tolist(), inp.q_draft.tolist()
        u = torch.rand(gamma, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).tolist()
        base = [u[i] < min(1.0, c[i][d] / e[i][d]) if e[i][d] > 0 else False for i, d in enumerate(drafts)]

    def kl(ci, ei):
        if any(p > 0 and q == 0 for p, q in zip(ci, ei)):
            return math.inf
        return sum(p * math.log(p / q) for p, q in zip(ci, ei) if p > 0)

    if at is not None and at < gamma and 0 < kl(c[at], e[at]) < math.inf:
        threshold, confidence = kl(c[at], e[at]) * (1 + (1e-7 if above else -1e-7)), 1.0
    judged = [kl(c[i], e[i]) < threshold and max(c[i]) <= confidence and c[i][d] > 0 for i, d in enumerate(drafts)]
    def margin(a, b):  # relative: float64 sums over a few tokens carry ~1e-15 of round-off
        return abs(a - b) / max(abs(a), abs(b), 1e-300) if math.isfinite(a) else 1.0

    margins = [margin(kl(c[i], e[i]), threshold) for i in range(gamma)] + [margin(max(c[i]), confidence) for i in range(gamma)]
    assume(min(margins) > 1e-9)  # away from round-off at either threshold
    want = prefix([b or j for b, j in zip(base, judged)])
    assert KLJudge(threshold=threshold, confidence=confidence)(inp).num_accepted == want
