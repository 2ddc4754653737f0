"""SGLang's chain rejection sampler behind the contract: `chain_speculative_sampling_triton` of
sglang.kernels.ops.speculative.reject_sampling (SGLang 0.5.23), the kernel its EAGLE verify
(`srt/speculative/eagle_utils.py`) calls with `speculative_use_rejection_sampling`, and with
`speculative_use_block_verification` its block-verification form (arXiv 2403.10444, Algorithm 2).

    sglang_engine()                   token-level speculative sampling: lossless, accepts sum min(p, q)
    sglang_engine(block=True)         block verification: lossless, keeps at least as many drafts

What SGLang's verify hands the kernel, for a batch of requests with gamma drafts each:
    candidates      [B, gamma+1]     the last verified token, then the drafts
    retrive_index   [B, gamma+1]     where each slot's token goes in the flat output: b (gamma+1) + j
    uniform_samples [B, gamma+1]     the rejection coins (column j - 1 judges draft j)
    uniform_samples_for_final_sampling [B]   the coin that draws the correction or bonus token
    target_probs    [B, gamma+1, V]  softmax(logits / T), then top-k and top-p renormalised (SGLang's
                                     own ops; here the contract's p_target, which is the same law)
    draft_probs     [B, gamma, V]    the drafter's probabilities (the contract's q_draft)
The kernel writes each row's kept drafts and its final token into `predicts` [B (gamma+1)] and the
number kept into `accept_token_num` [B]; next_token = predicts[b (gamma+1) + num_accepted].

The coins: SGLang draws them with torch.rand, or, for a request with a sampling seed, hashes the
seed with the sequence length; either way a row's coins come from its own request. The adapter
draws each row's gamma + 1 uniforms from that row's generator. A greedy row (T = 0) is a one-hot
p and q here, as SGLang runs a greedy request inside a sampled batch (top-k 1); an all-greedy
batch takes SGLang's separate argmax kernel, which this adapter does not call. So the
`both_sides_processed`, `seeded` and `batch_independent` verdicts are the adapter's; the kernel's
own are the acceptance, the residual and the final draw.

Running it on a CPU: the kernel is Triton, run by the interpreter (TRITON_INTERPRET=1, set before
Triton's first import; public.triton_on_cpu). Importing the package `sglang` brings in its whole
runtime, so the adapter loads the kernel's file alone (it imports only triton).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Sequence

import torch

from minispec.errors import MinispecError
from minispec.testing.conform.contract import Engine, StepInput, StepOutput, lossless, overlap
from minispec.testing.conform.public import INSTALL, need, triton_on_cpu, version

KERNEL_FILE = Path("kernels", "ops", "speculative", "reject_sampling.py")


def reject_sampling_module():
    """SGLang's reject_sampling.py loaded alone (module docstring); one line where it cannot be."""
    need("sglang")
    triton_on_cpu("sglang")
    name = "sglang_reject_sampling"
    if name in sys.modules:
        return sys.modules[name]
    origin = importlib.util.find_spec("sglang").origin  # None for a namespace package: no sglang install
    path = Path(origin or ".").parent / KERNEL_FILE
    spec = importlib.util.spec_from_file_location(name, path)
    if origin is None or spec is None or not path.is_file():
        raise MinispecError(f"sglang: {path} not found; expected SGLang 0.5.23's kernel file; {INSTALL}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton reads a kernel's source through its module
    try:
        spec.loader.exec_module(module)
    except ImportError as err:
        del sys.modules[name]
        raise MinispecError(f"sglang: cannot load its kernel ({type(err).__name__}: {err}); {INSTALL}") from None
    return module


class SglangBatch:
    """chain_speculative_sampling_triton on a list of contract steps: one request per step."""

    def __init__(self, block: bool = False) -> None:
        self.kernel, self.block = reject_sampling_module().chain_speculative_sampling_triton, block

    def __call__(self, inputs: Sequence[StepInput]) -> list[StepOutput]:
        by_gamma: dict[int, list[int]] = {}  # one kernel call per draft length
        for i, inp in enumerate(inputs):
            by_gamma.setdefault(inp.gamma, []).append(i)
        results: list[StepOutput | None] = [None] * len(inputs)
        for gamma, rows in by_gamma.items():
            for i, out in zip(rows, self.call([inputs[i] for i in rows], gamma)):
                results[i] = out
        return results

    def call(self, inputs: Sequence[StepInput], gamma: int) -> list[StepOutput]:
        batch, slots = len(inputs), gamma + 1
        if gamma == 0:
            raise MinispecError("sglang: a step with no drafts goes through SGLang's plain sampler, not this kernel")
        candidates = torch.stack([torch.cat([torch.zeros(1, dtype=torch.long), inp.draft_tokens])
                                  for inp in inputs])  # [B, gamma+1]
        retrive_index = torch.arange(batch * slots, dtype=torch.long).reshape(batch, slots)  # [B, gamma+1]
        coins = torch.stack([torch.rand(slots + 1, generator=inp.generator) for inp in inputs])  # [B, gamma+2]
        predicts = torch.zeros(batch * slots, dtype=torch.int32)
        accept_index = torch.full((batch, slots), -1, dtype=torch.int32)
        accept_token_num = torch.zeros(batch, dtype=torch.int32)
        self.kernel(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_index,
                    retrive_index, coins[:, :slots].contiguous(), coins[:, slots].contiguous(),
                    torch.stack([inp.p_target.float() for inp in inputs]).contiguous(),  # [B, gamma+1, V]
                    torch.stack([inp.q_draft.float() for inp in inputs]).contiguous(),  # [B, gamma, V]
                    1.0, 1.0, True, block_verification=self.block)
        return [StepOutput(int(n), int(predicts[b * slots + int(n)]))
                for b, n in enumerate(accept_token_num.tolist())]


def sglang_engine(block: bool = False) -> Engine:
    """SGLang's chain rejection sampler (module docstring): lossless; token-level accepts sum min(p, q)."""
    batch = SglangBatch(block)
    name = f"sglang {version('sglang')}" + (" block" if block else "")
    return Engine(name, lambda inp: batch([inp])[0], claims=lossless, accepts=None if block else overlap,
                  batch_step=batch, note="chain_speculative_sampling_triton" + (" with block_verification" if block
                                                                                else "") +
                  ", interpreted on the CPU; p, q and the coins supplied by the adapter")
