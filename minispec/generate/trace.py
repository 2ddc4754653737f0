"""A worked trace of the draft-then-verify loop: every step printed as it happens (`--trace`).

For each verify step (a `minispec.chain.request.StepRecord`) it prints what the loop in
speculative.py did, with the real numbers:

    step 2: context 51 tokens, drafter ngram:3 proposed 3
      row 0  draft ' the'       p_target 0.394  q_draft 1.000 | target's top ' lazy'      (0.598)  rejected
      row 1  draft ' lazy'      p_target 1.000  q_draft 1.000 | -                                  not reached
      row 2  draft ' dog'       p_target 0.999  q_draft 1.000 | -                                  not reached
      row 3  bonus row                                        | target's top '.'          (0.898)
      decision exact: 0 of 3 accepted; the correction ' lazy' comes from row 0
      rollback: target cache 54 -> 51 (keeps the context); draft cache none
      emitted ' lazy'

Row i of the verify pass scores draft i+1 (its p_target is the target's probability of that
draft token, its q_draft the draft's); the last row is the bonus position. `p_target` and the
target's top token use the post-processed distribution; at temperature 0, where that is one-hot
on the argmax, the raw softmax probability is shown instead so that the numbers say how sure the
target was. Rows after the first rejection were computed too (one pass scores them all) but
decide nothing. Under speculative sampling a draft is kept with
probability min(1, p_target / q_draft), shown as `keep`.
"""

from __future__ import annotations

import sys
from typing import TextIO

import torch

from minispec.chain.request import StepRecord
from minispec.chain.stats import info_counts


class Tracer:
    """Print each StepRecord; use as `generate(..., on_step=Tracer(tokenizer, drafter, policy))`."""

    def __init__(self, tokenizer, drafter_name: str, policy_name: str, out: TextIO | None = None) -> None:
        self.tokenizer, self.drafter_name, self.policy_name = tokenizer, drafter_name, policy_name
        self.out = out  # None: whatever sys.stdout is when a step is printed

    def piece(self, token: int) -> str:
        """One token as readable text, quoted (whitespace and control characters escaped)."""
        return repr(self.tokenizer.decode([token]))

    def __call__(self, record: StepRecord) -> None:
        inp, decision = record.inp, record.decision
        g, n = inp.gamma, decision.num_accepted
        greedy = inp.params.greedy
        # what the target believes at each row: softmax of the raw logits at T = 0, else p_target
        belief = torch.softmax(inp.target_logits.double(), dim=-1) if greedy else inp.p_target.double()  # [g+1, V]
        choice = inp.target_logits.argmax(dim=-1) if greedy else inp.p_target.argmax(dim=-1)  # [g+1]
        context = record.target_cache[0] - g  # the committed sequence's length: cache + last token
        lines = [f"step {record.index}: context {context} tokens, drafter {self.drafter_name} proposed {g}"]
        width = 48 if greedy else 60  # the draft side of a row: token, p_target, q_draft (and keep)
        for i in range(g + 1):
            best = int(choice[i])
            target_side = f"target's top {self.piece(best):<12} ({float(belief[i, best]):.3f})"
            if i == g:
                lines.append(f"  row {i}  {'bonus row':<{width}} | {target_side}")
                continue
            d = int(inp.draft_tokens[i])
            p_d, q_d = float(belief[i, d]), float(inp.q_draft[i, d])
            verdict = "accepted" if i < n else ("rejected" if i == n else "not reached")
            keep = f"  keep {min(1.0, float(inp.p_target[i, d]) / q_d):.3f}" if not greedy and q_d > 0 else ""
            draft_side = f"draft {self.piece(d):<12} p_target {p_d:.3f}  q_draft {q_d:.3f}{keep}"
            shown = target_side if i <= n else f"{'-':<{len(target_side)}}"
            lines.append(f"  row {i}  {draft_side:<{width}} | {shown}  {verdict}")
        if g == 0:
            decided = f"nothing drafted; the target's token {self.piece(decision.next_token)} comes from row 0"
        else:
            decided = (f"{n} of {g} accepted; the {'correction' if n < g else 'bonus'} "
                       f"{self.piece(decision.next_token)} comes from row {n}")
        counts = info_counts(decision.info, min(n, len(record.emitted)))  # as the run's stats count them
        lines.append(f"  decision {self.policy_name}: {decided}" + _info(counts))
        before, kept = record.target_cache
        draft_cache = "none" if record.draft_cache is None else str(record.draft_cache)
        kept_drafts = f" and d_1..d_{n}" if n > 1 else (" and d_1" if n == 1 else "")
        lines.append(f"  rollback: target cache {before} -> {kept} (keeps the context{kept_drafts}); "
                     f"draft cache {draft_cache}")
        lines.append(f"  emitted {self.piece_list(record.emitted)}")
        print("\n".join(lines), file=self.out or sys.stdout, flush=True)

    def piece_list(self, tokens: list[int]) -> str:
        return repr(self.tokenizer.decode(tokens))


def _info(info: dict) -> str:
    """A policy's own counts for this step (e.g. DropMatch's), as `; key value, ...`."""
    shown = [f"{key} {value}" for key, value in info.items() if isinstance(value, (int, float))]
    return f"; {', '.join(shown)}" if shown else ""
