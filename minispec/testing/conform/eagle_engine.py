"""EAGLE's acceptance behind the contract: `eagle.model.utils.evaluate_posterior` (eagle-llm), the
verification its generation loop (`EaModel.eagenerate`) calls after the target scores the tree,
then the token `update_inference_inputs` draws from what it returns.

    eagle_engine()    the step's drafts as EAGLE's tree of one path

evaluate_posterior takes the target's raw logits [paths, depth+1, V], the candidates [paths, 1 +
depth] (the last emitted token, then the drafts), a logits processor (EAGLE builds a transformers
LogitsProcessorList with `prepare_logits_processor(temperature, top_p, top_k)`; None at T = 0:
greedy), each drafted token's draft probability (`cart_candidates_prob`) and the draft's processed
distributions (`op`, one [nodes, V] per depth). At T > 0 it keeps d_i with probability min(1,
p_i(d_i) / q_i(d_i)), p_i the processed target (Python's `random.random()` as the coin); at the
first rejection it returns the residual norm([p_i - q_i]+); after the last draft it returns
softmax of the raw logits. update_inference_inputs then draws the next token from what it returns
with `torch.multinomial` on torch's global state (the argmax at T = 0). For one path the sibling
bookkeeping (`b_indices`) is empty.

The processor the adapter passes applies the contract's processing (temperature, then top-k, then
top-p: `logits_to_probs`), the one the drafts were sampled with: EAGLE's own list applies top-p
before top-k, a convention of its own (docs/conformance.md), so with it the suite would judge the
order rather than the acceptance. Both global states (Python's random, torch's) are seeded from
the step's generator and restored afterwards. One sequence at a time: no batch form.
"""

from __future__ import annotations

import random

import torch

from minispec.model.sampling import logits_to_probs
from minispec.testing.conform.contract import Engine, StepInput, StepOutput, global_state_from, lossless, overlap
from minispec.testing.conform.public import modules, version


def eagle_engine() -> Engine:
    """EAGLE 1's evaluate_posterior on a chain (lossless as claimed: speculative sampling)."""
    utils = modules("eagle", {"utils": "eagle.model.utils"})["utils"]
    evaluate_posterior = utils.evaluate_posterior

    def step(inp: StepInput) -> StepOutput:
        gamma = inp.gamma
        candidates = torch.cat([torch.zeros(1, dtype=torch.long), inp.draft_tokens])[None]  # [1, 1 + gamma]
        logits = inp.target_logits.float()[None]  # [1, gamma+1, V]
        if inp.temperature == 0:
            _, n, chosen = evaluate_posterior(logits, candidates, None, None, None, None, None, None)
            return StepOutput(int(n), int(torch.argmax(chosen)))

        def processor(_ids, rows: torch.Tensor) -> torch.Tensor:  # [rows, V] -> log of the processed law
            return logits_to_probs(rows, inp.params).log()

        q_draft = inp.q_draft.float()  # [gamma, V]: the processed draft law the drafts came from (cnets' sample)
        q_drafted = q_draft.gather(1, inp.draft_tokens[:, None])[:, 0]  # [gamma]
        cart_candidates_prob = torch.cat([torch.ones(1), q_drafted])[None]  # [1, 1 + gamma]
        op = [q_draft[i][None] for i in range(gamma)]  # per depth: [1 node, V]
        p_indices = [[0] * (gamma + 1)]
        b_indices = [[[] for _ in range(gamma + 1)]]
        with global_state_from(inp.generator) as seed:
            saved = random.getstate()
            random.seed(seed)
            try:
                _, n, sample_p = evaluate_posterior(logits, candidates, processor, cart_candidates_prob, op,
                                                    p_indices, candidates, b_indices)
                next_token = int(torch.multinomial(sample_p, 1))
            finally:
                random.setstate(saved)
        return StepOutput(int(n), next_token)

    return Engine(f"eagle {version('eagle-llm')}", step, claims=lossless, accepts=overlap, greedy=True,
                  note="EAGLE-1's chain, processed as the contract processes (EAGLE's own order: top-p, then top-k)")
