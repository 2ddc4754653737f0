"""lmdeploy's portable rejection sampler behind the contract:
`lmdeploy.pytorch.backends.default.rejection_sampling.DefaultRejectionSamplingImpl` (torch only,
no CUDA), the implementation its PyTorch engine uses where no device-specific one is registered.

    lmdeploy_engine()   a batch of steps in one forward(); all-greedy batches in forward_greedy

Its forward takes what lmdeploy's engine hands it: the target's logits after its logits processors
(temperature, top-k, top-p), [rows, gamma, V]; the drafts [rows, gamma]; the bonus tokens [rows],
sampled beforehand by lmdeploy's sampler; a per-row greedy mask; the drafts' probabilities
[rows, gamma, V]. It returns [rows, gamma+1] tokens padded with -1 after the first rejection.

What the adapter supplies, since the function does not: the processing of the target's logits
(log of the contract's p_target, which went through temperature, top-k and top-p in float64: its
softmax is p_target) and the bonus token (a draw from p_target[gamma]). So `both_sides_processed`
tests the adapter, not lmdeploy; the rest test lmdeploy's rule.

Randomness: the function draws from torch's global random state (torch.rand, Tensor.exponential_);
no request carries a generator. The adapter seeds that state once per call from the first row's
generator and restores it afterwards, as lmdeploy's engine would seed it once for a batch. A row's
decision therefore depends on which rows share its call: `batch_independent` reports it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from minispec.testing.conform.contract import Engine, StepInput, StepOutput, global_state_from, lossless, overlap
from minispec.testing.conform.public import modules, version


class LmdeployBatch:
    """DefaultRejectionSamplingImpl on a list of contract steps of one gamma: one row per step."""

    def __init__(self) -> None:
        found = modules("lmdeploy", {"default": "lmdeploy.pytorch.backends.default.rejection_sampling"})
        self.impl = found["default"].DefaultRejectionSamplingImpl()

    def __call__(self, inputs: Sequence[StepInput]) -> list[StepOutput]:
        gammas = {inp.gamma for inp in inputs}
        if len(gammas) != 1 or 0 in gammas:
            raise ValueError(f"lmdeploy: a batch verifies one draft length >= 1; got {sorted(gammas)}")
        greedy = torch.tensor([inp.temperature == 0 for inp in inputs])  # [rows]
        with global_state_from(inputs[0].generator):  # one stream for the call, as lmdeploy's engine has
            if bool(greedy.all()):
                target_ids = torch.stack([inp.target_logits.argmax(-1) for inp in inputs])  # [rows, gamma+1]
                tokens, _, _ = self.impl.forward_greedy(target_ids, torch.stack([inp.draft_tokens for inp in inputs]))
            else:
                tokens, _, _ = self.impl.forward(
                    torch.stack([self.processed(inp)[:-1] for inp in inputs]),  # [rows, gamma, V]
                    torch.stack([inp.draft_tokens for inp in inputs]),  # [rows, gamma]
                    torch.stack([self.bonus(inp) for inp in inputs]),  # [rows]
                    is_greedy=None if not bool(greedy.any()) else greedy,
                    draft_probs=torch.stack([inp.q_draft.float() for inp in inputs]))  # [rows, gamma, V]
        results = []
        for row in tokens.tolist():  # [gamma+1] each, -1 after the first rejection
            valid = [t for t in row if t != -1]
            results.append(StepOutput(len(valid) - 1, valid[-1]))
        return results

    @staticmethod
    def processed(inp: StepInput) -> torch.Tensor:
        """The target's logits as lmdeploy's processors leave them: [gamma+1, V] float32 whose softmax
        is p_target (a greedy row: its raw logits, which the function takes the argmax of)."""
        if inp.temperature == 0:
            return inp.target_logits.float()
        return inp.p_target.log().float()

    @staticmethod
    def bonus(inp: StepInput) -> torch.Tensor:
        """The bonus token lmdeploy's sampler would hand in: argmax at T = 0, else a draw from p_target[gamma]."""
        if inp.temperature == 0:
            return inp.target_logits[inp.gamma].argmax()
        return torch.multinomial(inp.p_target[inp.gamma], 1)[0]


def lmdeploy_engine() -> Engine:
    """lmdeploy's portable rejection sampler: lossless at T > 0, greedy at T = 0."""
    batch = LmdeployBatch()
    return Engine(f"lmdeploy {version('lmdeploy')}", lambda inp: batch([inp])[0], claims=lossless,
                  accepts=overlap, batch_step=batch,
                  note="DefaultRejectionSamplingImpl; target processing and bonus token by the adapter")
