"""Adapters: minispec's policies, transformers' sampler, and any function, behind the same door.

    minispec_engine("sampling")                  a registered policy, options as keyword arguments
    sample_then_match_engine()                   sample x ~ p, keep the draft iff it equals x
    transformers_engine()                        transformers.generation.utils._speculative_sampling
    transformers_engine(ensemble_weight=0.5)     the same with `assistant_ensemble_weight` (DIVERSED)
    Engine("mine", my_step, claims=...)          your own function (contract.Engine)

transformers' function takes the logits after its logits processors, uses torch's global random
state, and has no greedy mode (its greedy assisted decoding is another path). The adapter applies
transformers' own warpers (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper) to both
sides, as its assisted decoding does, and seeds the global state from the step's generator,
restoring it afterwards.

vLLM's rejection sampler has its own module, vllm_engine.py: it needs vLLM installed beside the
pinned CPU torch (docs/conformance.md).
"""

from __future__ import annotations

import torch

from minispec import acceptance
from minispec.acceptance.base import VerifyInput
from minispec.cli import extra
from minispec.testing.conform.contract import Engine, StepInput, StepOutput, global_state_from, lossless, overlap

# How each registered policy stands against the contract: its claimed distribution and closed-form
# acceptance, as in its docstring; None where the rule states none.
POLICY_CLAIMS = {
    "sampling": dict(claims=lossless, accepts=overlap),
    "block": dict(claims=lossless, accepts=None, note="lossless over the block: no per-token acceptance form"),
    "traversal": dict(claims=lossless, accepts=None, note="lossless over the block: no per-token acceptance form"),
    "exact": dict(claims=None, accepts=None, samples=False, note="greedy whatever the temperature"),
    "typical": dict(claims=None, accepts=None, greedy=False, note="lossy at T = 0 too; states no output distribution"),
    "lenience": dict(claims=None, accepts=None, greedy=False, note="lossy; states no output distribution"),
    "fly": dict(claims=None, accepts=None, greedy=False, note="lossy at T = 0 too; states no output distribution"),
    "kl-judge": dict(claims=None, accepts=None, greedy=False, note="lossy at T = 0 too; states no output distribution"),
    # "ensemble" claims (1 - w) q + w p, with w from its options: minispec_engine fills it in
}
NEEDS_THE_HEAD = {"dropmatch", "dropmatch-lazy"}  # they re-run the LM head: not a function of the step's tensors


def minispec_engine(name: str, **options) -> Engine:
    """A registered minispec policy (a fresh instance per step, as each of a batch's rows has its own)."""
    if name in NEEDS_THE_HEAD:
        raise ValueError(f"{name}: re-runs the LM head on its input, which the tensor contract does not carry")
    policy_class = type(acceptance.get(name, **options))  # unknown names and options fail here, once

    def step(inp: StepInput) -> StepOutput:
        decision = policy_class(**options)(VerifyInput(
            draft_tokens=inp.draft_tokens, q_draft=inp.q_draft, target_logits=inp.target_logits.double(),
            p_target=inp.p_target, params=inp.params, generator=inp.generator,
            draft_logits=inp.draft_logits.double()))
        return StepOutput(decision.num_accepted, decision.next_token)

    label = name + "".join(f":{k}={v}" for k, v in options.items())
    stance = POLICY_CLAIMS.get(name, dict(claims=None, accepts=None))
    if name == "ensemble":
        weight = policy_class(**options).weight
        stance = dict(claims=ensemble(weight), accepts=None, greedy=weight == 1.0,
                      note="claims (1 - w) q + w p; lossy at T = 0 unless w = 1")
    return Engine(f"minispec {label}", step, batch_step=lambda inputs: [step(i) for i in inputs],
                  options=options, **stance)


def transformers_sampler():
    """transformers' _speculative_sampling, as installed (an attribute, not an import of a private name)."""
    return extra("transformers.generation.utils", "bench", "the transformers engine")._speculative_sampling


def warp(logits: torch.Tensor, inp: StepInput) -> torch.Tensor:
    """transformers' own warpers, in the order its generation config applies them: [rows, V] -> [rows, V]."""
    warpers = extra("transformers.generation.logits_process", "bench", "the transformers engine")
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper = (
        warpers.TemperatureLogitsWarper, warpers.TopKLogitsWarper, warpers.TopPLogitsWarper)

    ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)  # the warpers do not read the ids
    if inp.temperature != 1.0:
        logits = TemperatureLogitsWarper(inp.temperature)(ids, logits)
    if inp.top_k is not None:
        logits = TopKLogitsWarper(inp.top_k)(ids, logits)
    if inp.top_p is not None and inp.top_p < 1.0:
        logits = TopPLogitsWarper(inp.top_p)(ids, logits)
    return logits


def ensemble(weight: float):
    """The static ensemble's claim (DIVERSED): v = (1 - w) q + w p."""
    return lambda p, q: (1 - weight) * q + weight * p


def sampler_step(sampler, inp: StepInput, ensemble_weight: float | None = None, warp_target: bool = True,
                 warp_draft: bool = True, warp_bonus: bool = True, seeded: bool = True) -> StepOutput:
    """One call of a sampler with transformers' signature on the contract's tensors. The global
    random state is seeded from the step's generator and restored afterwards (seeded=False: the
    sampler draws from the global state as it stands, as a caller that forgets to seed it).
    warp_bonus=False: the target's last row (the bonus position) is passed raw, unwarped."""
    gamma = inp.gamma
    target = warp(inp.target_logits, inp) if warp_target else inp.target_logits  # [gamma+1, V]
    if not warp_bonus:
        target = torch.cat([target[:gamma], inp.target_logits[gamma:]])
    draft = warp(inp.draft_logits, inp) if warp_draft else inp.draft_logits  # [gamma, V]
    candidates = torch.cat([torch.zeros(1, dtype=torch.long), inp.draft_tokens])[None]  # [1, 1 + gamma]
    if not seeded:
        tokens, n_matches = sampler(candidates, draft[None], gamma, target[None], ensemble_weight)
        return StepOutput(int(n_matches), int(tokens[0, -1]))
    with global_state_from(inp.generator):
        tokens, n_matches = sampler(candidates, draft[None], gamma, target[None], ensemble_weight)
    return StepOutput(int(n_matches), int(tokens[0, -1]))


def proposing_step(sampler, inp: StepInput, reuse_stream: bool = False) -> list[int]:
    """The whole step as transformers' assisted decoding runs it: the drafts drawn from the warped
    draft logits (torch.multinomial on the global state, seeded from the step's generator), then the
    sampler, which goes on drawing from the same stream. Returns the emitted tokens. reuse_stream:
    the verifier restarts the stream where the proposal started (the coins repeat the proposal's)."""
    gamma = inp.gamma
    target, draft = warp(inp.target_logits, inp), warp(inp.draft_logits, inp)  # [gamma+1, V], [gamma, V]
    with global_state_from(inp.generator) as seed:
        drafts = torch.multinomial(draft.softmax(-1), 1)[:, 0]  # [gamma]
        if reuse_stream:
            torch.manual_seed(seed)
        candidates = torch.cat([torch.zeros(1, dtype=torch.long), drafts])[None]  # [1, 1 + gamma]
        tokens, n_matches = sampler(candidates, draft[None], gamma, target[None], None)
    return drafts[: int(n_matches)].tolist() + [int(tokens[0, -1])]


def transformers_engine(ensemble_weight: float | None = None, sampler=None, name: str | None = None,
                        batch_step=None, proposes: bool = False, **step_options) -> Engine:
    """transformers' sampler (or a function with its signature: a patched copy) behind the contract;
    its batch form decides row after row, each seeded from its own generator (or `batch_step`).
    proposes: the engine draws its own drafts first (proposing_step; step_options go to it)."""
    sampler = sampler or transformers_sampler()
    label = name or ("transformers" if ensemble_weight is None else f"transformers ensemble w={ensemble_weight}")
    if proposes:
        step = lambda inp: proposing_step(sampler, inp, **step_options)  # noqa: E731
    else:
        step = lambda inp: sampler_step(sampler, inp, ensemble_weight, **step_options)  # noqa: E731
    claims = lossless if ensemble_weight is None else ensemble(ensemble_weight)
    return Engine(label, step, claims=claims, accepts=overlap, greedy=False, proposes=proposes,
                  batch_step=batch_step or (lambda inputs: [step(i) for i in inputs]),
                  note="sampling only: transformers' greedy assisted decoding does not call it")


def matching(c: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(accept) of sample-then-match: the draft x ~ q equals an independent y ~ c: sum_x c(x) q(x)."""
    return (c * q).sum()


def sample_then_match_step(inp: StepInput) -> StepOutput:
    """At each drafted position sample y ~ p_target and keep the draft iff it equals y; the first y
    that differs is the correction, and after gamma matches a y ~ p_target[gamma] is the bonus.
    Every emitted token is some y ~ p, so the rule is lossless; it accepts with probability
    sum_x p(x) q(x) <= sum_x min(p(x), q(x)), speculative sampling's."""
    for i in range(inp.gamma):
        y = int(torch.multinomial(inp.p_target[i], 1, generator=inp.generator))
        if y != int(inp.draft_tokens[i]):
            return StepOutput(i, y)
    return StepOutput(inp.gamma, int(torch.multinomial(inp.p_target[inp.gamma], 1, generator=inp.generator)))


def sample_then_match_engine() -> Engine:
    return Engine("sample-then-match", sample_then_match_step, claims=lossless, accepts=matching,
                  batch_step=lambda inputs: [sample_then_match_step(i) for i in inputs],
                  note="lossless; accepts sum p q, below speculative sampling's sum min(p, q)")
