"""litgpt's speculative step behind the contract: `litgpt.generate.speculative_decoding.speculative_decoding`,
the whole step (propose, verify, correct), run on the contract's logits.

    litgpt_engine()    a proposing engine: litgpt draws its own drafts (contract.py)

The function takes a draft model and a target model and calls them itself: the draft gamma times
(one token each, sampling each draft with litgpt's `sample` and the request's temperature, top_k
and top_p), then the target once over the token and the drafts, then the draft once more after a
fully accepted step (a cache update). The adapter hands it two stand-in models that return the
step's logits: the draft's k-th call row k of draft_logits ([1, 1, V]; the cache update gets the
last row, and its output is unused), the target's call target_logits ([1, gamma+1, V]). Everything
else is litgpt's code: the sampling of the drafts, the processing of both sides, the acceptance
test, the residual and its draw, the bonus token.

Randomness: litgpt draws from torch's global state (torch.multinomial, torch.rand); the adapter
seeds it from the step's generator and restores it afterwards. litgpt decodes one sequence at a
time, so the engine has no batch form.
"""

from __future__ import annotations

import torch

from minispec.testing.conform.contract import Engine, StepInput, global_state_from, lossless, overlap
from minispec.testing.conform.public import modules, version


class StandIn:
    """A model that returns given logits, in litgpt's calling convention (idx, input_pos, input_pos_maxp1)."""

    def __init__(self, rows: torch.Tensor, one_at_a_time: bool) -> None:
        self.rows, self.one_at_a_time, self.calls = rows, one_at_a_time, 0

    def __call__(self, idx: torch.Tensor, input_pos=None, input_pos_maxp1=None) -> torch.Tensor:
        if self.one_at_a_time:  # the draft: row k on call k (the cache update after the last gets the last row)
            row = self.rows[min(self.calls, self.rows.shape[0] - 1)]
            self.calls += 1
            return row[None, None].clone()  # [1, 1, V]
        return self.rows[None].clone()  # [1, gamma+1, V]


def litgpt_engine() -> Engine:
    """litgpt's speculative_decoding: claims the target's distribution (its docstring cites Leviathan
    et al.), and greedy decoding at temperature 0."""
    found = modules("litgpt", {"speculative": "litgpt.generate.speculative_decoding"})
    speculative_decoding = found["speculative"].speculative_decoding

    def step(inp: StepInput) -> list[int]:
        options = dict(temperature=inp.temperature, top_k=inp.top_k, top_p=1.0 if inp.top_p is None else inp.top_p)
        with global_state_from(inp.generator):
            tokens = speculative_decoding(StandIn(inp.draft_logits.float(), True), StandIn(inp.target_logits.float(), False),
                                          torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 1,
                                          inp.gamma, **options)
        return tokens.tolist()

    return Engine(f"litgpt {version('litgpt')}", step, claims=lossless, accepts=overlap, proposes=True,
                  note="speculative_decoding with stand-in models returning the step's logits; no batch form")
