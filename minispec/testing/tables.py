"""Policy inputs from plain lists, for table-style tests (as in vLLM's rejection-sampler tests).

    inp = verify_input([1, 0], [[0, 9, 0], [0, 0, 9], [9, 0, 0]])   # drafts, target logits per row
    assert decided(ExactMatch()(inp)) == (1, 2)                      # d_1 kept, correction 2

Rows of `target_logits` are the verified positions, the last one the bonus position. Without
q_draft the draft is one-hot on each draft token (an n-gram drafter) unless draft_logits are
given (then q_draft is their post-processed softmax). Everything is float64.
"""

from __future__ import annotations

import torch

from minispec.acceptance.base import Decision, VerifyInput
from minispec.model.sampling import SamplingParams, logits_to_probs

F64 = torch.float64


def verify_input(draft, target_logits, params: SamplingParams = SamplingParams(), *, q_draft=None, draft_logits=None,
                 p_target=None, seed: int = 0, hidden=None, head=None) -> VerifyInput:
    """A VerifyInput from lists: draft [gamma] ids, target_logits [gamma+1][V]; see the module docstring."""
    draft_tokens = torch.tensor(draft, dtype=torch.int64)  # [gamma]
    target_logits = torch.as_tensor(target_logits, dtype=F64)  # [gamma+1, V]
    vocab = target_logits.shape[1]
    if draft_logits is not None:
        draft_logits = torch.as_tensor(draft_logits, dtype=F64)  # [gamma, V]
    if q_draft is None:
        q_draft = (logits_to_probs(draft_logits, params) if draft_logits is not None
                   else torch.nn.functional.one_hot(draft_tokens, vocab).to(F64))
    q_draft = torch.as_tensor(q_draft, dtype=F64).reshape(len(draft), vocab)  # [gamma, V]
    p_target = logits_to_probs(target_logits, params) if p_target is None else torch.as_tensor(p_target, dtype=F64)
    return VerifyInput(draft_tokens, q_draft, target_logits, p_target, params, torch.Generator().manual_seed(seed),
                       draft_logits, hidden=hidden, head=head)


def decided(decision: Decision) -> tuple[int, int]:
    """(num_accepted, next_token): what a table row compares."""
    return decision.num_accepted, decision.next_token
