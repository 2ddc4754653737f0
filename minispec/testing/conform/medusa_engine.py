"""Medusa's acceptance behind the contract: `medusa.model.utils.evaluate_posterior` (medusa-llm), the
typical acceptance its generation loop calls after the target scores the candidates.

    medusa_engine()    the step's drafts as Medusa's one candidate path; defaults 0.09 and 0.3

evaluate_posterior takes the target's logits [1, gamma+1, V] and the candidates [1, 1 + gamma]
(the last emitted token, then the drafts): at T = 0 it keeps the drafts equal to the target's
argmax; at T > 0 it keeps d_i while softmax(logits_i / T)(d_i) > min(posterior_threshold,
posterior_alpha exp(-H_i)) (typical acceptance, lossy: it states no output distribution). It
applies the temperature only, no top-k or top-p. The token after the kept drafts comes from
Medusa's next call of generate_candidates, which takes the argmax of the target's logits at that
position at every temperature; the adapter takes that argmax. Medusa decides one sequence at a
time: no batch form, and no randomness at all.
"""

from __future__ import annotations

import torch

from minispec.testing.conform.contract import Engine, StepInput, StepOutput
from minispec.testing.conform.public import modules, version


def medusa_engine(posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> Engine:
    """Medusa's evaluate_posterior (lossy at T > 0: claims nothing there; greedy at T = 0)."""
    evaluate_posterior = modules("medusa", {"utils": "medusa.model.utils"})["utils"].evaluate_posterior

    def step(inp: StepInput) -> StepOutput:
        candidates = torch.cat([torch.zeros(1, dtype=torch.long), inp.draft_tokens])[None]  # [1, 1 + gamma]
        logits = inp.target_logits.float()[None]  # [1, gamma+1, V]
        _, accept_length = evaluate_posterior(logits, candidates, inp.temperature, posterior_threshold, posterior_alpha)
        n = int(accept_length)
        return StepOutput(n, int(inp.target_logits[n].argmax()))

    return Engine(f"medusa {version('medusa-llm')}", step, claims=None, accepts=None,
                  note="typical acceptance (lossy, no claimed distribution); the next token is the argmax")
