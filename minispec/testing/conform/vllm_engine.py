"""vLLM's rejection sampler behind the contract: `vllm.v1.sample.rejection_sampler.RejectionSampler`,
called as vLLM's model runner calls it.

    vllm_engine()                   draft probabilities passed (a draft model, EAGLE): speculative
                                    sampling at T > 0, exact match at T = 0
    vllm_engine(draft_probs=False)  none passed (n-gram and suffix drafts): vLLM takes q one-hot at
                                    the draft, keeps it with probability p(d) and otherwise samples
                                    from p without d. Whatever drew the draft, the output follows p
                                    (P(y) = q(y) p(y) + sum over d != y of q(d) p(y) = p(y)), and a
                                    draft is kept with probability sum_x q(x) p(x)

One call of RejectionSampler.forward decides a whole batch, each row a request with its own
settings and its own torch.Generator (a seeded request), exactly as the model runner builds them
(vllm/v1/worker/gpu_input_batch.py): temperature 0 for a greedy row, top_k = V where a row has
none, top_p = 1.0 where it has none; the target's logits of every row stacked [sum(gamma+1), V]
with the draft positions' indices and the bonus row's; the drafts' probabilities [sum(gamma), V]
as the contract's q_draft (the draft side after temperature, top-k and top-p, as the drafter
samples from). vLLM then processes the target side itself (temperature, top-k, top-p), samples
the bonus token with its own Sampler, and returns [rows, gamma+1] tokens padded with -1 after the
first rejection: num_accepted = the valid tokens - 1, next_token = the last valid one.

Running it on a CPU (vLLM's wheels are CUDA builds; the sampler is Triton):
- install it without its dependencies into an environment that keeps the pinned CPU torch
  (docs/conformance.md has the recipe: vllm and triton --no-deps, plus the pure-Python modules
  its imports reach);
- TRITON_INTERPRET=1 runs its Triton kernels on CPU tensors, and an empty CUDA_VISIBLE_DEVICES
  keeps vllm.triton_utils on Triton rather than its placeholder; this module sets both (unless
  already set) before the first import of vLLM. Triton takes the setting when it is first
  imported: where something imported it before (transformers does), the engine is one line
  asking for TRITON_INTERPRET=1 in the environment;
- the top-k / top-p filter: vLLM's Triton filter asks the platform for its number of compute
  units, which an unknown platform does not answer; the filter is routed to vLLM's own non-Triton
  filter (apply_top_k_top_p_pytorch, what vLLM runs where Triton is absent) by clearing the
  HAS_TRITON flag of vllm.v1.sample.ops.topk_topp_sampler. Every other kernel stays Triton.
"""

from __future__ import annotations

from typing import Sequence

import torch

from minispec.errors import MinispecError
from minispec.testing.conform.contract import Engine, StepInput, StepOutput, lossless, overlap
from minispec.testing.conform.engines import matching
from minispec.testing.conform.public import modules, need, triton_on_cpu, version


def vllm_modules() -> dict:
    """vLLM's modules the adapter calls, imported for a CPU (module docstring); one line if missing."""
    need("vllm")
    triton_on_cpu("vllm")  # before vLLM's first import: its kernels are made then
    found = modules("vllm", {"rejection": "vllm.v1.sample.rejection_sampler", "sampler": "vllm.v1.sample.sampler",
             "metadata": "vllm.v1.sample.metadata", "spec": "vllm.v1.spec_decode.metadata",
             "processors": "vllm.v1.sample.logits_processor", "filters": "vllm.v1.sample.ops.topk_topp_sampler"})
    found["filters"].HAS_TRITON = False  # vLLM's own non-Triton top-k / top-p filter (module docstring)
    return found


class VllmBatch:
    """RejectionSampler.forward on a list of contract steps: one request per step."""

    def __init__(self, draft_probs: bool = True) -> None:
        self.vllm, self.draft_probs = vllm_modules(), draft_probs
        self.sampler = self.vllm["rejection"].RejectionSampler(self.vllm["sampler"].Sampler())

    def metadata(self, inputs: Sequence[StepInput]):
        """vLLM's SamplingMetadata for these requests, as its input batch builds it."""
        rows, vocab = len(inputs), inputs[0].target_logits.shape[1]
        temperature = torch.tensor([inp.temperature for inp in inputs], dtype=torch.float32)  # [rows]; 0 = greedy
        top_k = [inp.top_k if inp.top_k is not None and 0 < inp.top_k < vocab else vocab for inp in inputs]
        top_p = [inp.top_p if inp.top_p is not None else 1.0 for inp in inputs]
        return self.vllm["metadata"].SamplingMetadata(
            temperature=temperature, all_greedy=all(t == 0 for t in temperature.tolist()),
            all_random=all(t > 0 for t in temperature.tolist()),
            top_p=None if all(p >= 1 for p in top_p) else torch.tensor(top_p, dtype=torch.float32),
            top_k=None if all(k == vocab for k in top_k) else torch.tensor(top_k, dtype=torch.int32),
            generators={i: inp.generator for i, inp in enumerate(inputs)}, max_num_logprobs=None,
            no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(rows),
            presence_penalties=torch.zeros(rows), repetition_penalties=torch.ones(rows),
            output_token_ids=[[] for _ in inputs], allowed_token_ids_mask=None, bad_words_token_ids={},
            logitsprocs=self.vllm["processors"].LogitsProcessors())

    def spec_metadata(self, inputs: Sequence[StepInput]):
        """vLLM's SpecDecodeMetadata: the drafts flattened, and where each row's logits sit in the stack."""
        spec = self.vllm["spec"].SpecDecodeMetadata.make_dummy([inp.draft_tokens.tolist() for inp in inputs],
                                                               torch.device("cpu"))
        target, bonus, start = [], [], 0
        for inp in inputs:  # row i's logits: gamma_i draft positions, then its bonus row
            target += range(start, start + inp.gamma)
            bonus.append(start + inp.gamma)
            start += inp.gamma + 1
        spec.target_logits_indices = torch.tensor(target, dtype=torch.int32)
        spec.bonus_logits_indices = torch.tensor(bonus, dtype=torch.int32)
        spec.logits_indices = torch.arange(start, dtype=torch.int32)
        return spec

    def __call__(self, inputs: Sequence[StepInput]) -> list[StepOutput]:
        if any(inp.gamma == 0 for inp in inputs):  # vLLM calls its plain sampler for a request with no drafts
            raise MinispecError("vllm: a step with no drafts goes through vLLM's plain sampler, not this one")
        logits = torch.cat([inp.target_logits.float() for inp in inputs])  # [sum(gamma+1), V]
        draft_probs = torch.cat([inp.q_draft.float() for inp in inputs]).contiguous() if self.draft_probs else None
        # [sum(gamma), V], or None: the n-gram path
        out = self.sampler(self.spec_metadata(inputs), draft_probs, logits, self.metadata(inputs))
        results = []
        for inp, row in zip(inputs, out.sampled_token_ids.tolist()):  # [gamma+1] each, -1 after the first rejection
            valid = [t for t in row[: inp.gamma + 1] if t != -1]
            results.append(StepOutput(len(valid) - 1, valid[-1]))
        return results


def vllm_engine(draft_probs: bool = True) -> Engine:
    """vLLM's RejectionSampler: lossless at T > 0, greedy at T = 0; without draft probabilities it
    accepts sum_x q(x) p(x) (module docstring)."""
    batch = VllmBatch(draft_probs)
    name = f"vllm {version('vllm')}" + ("" if draft_probs else " no-probs")
    return Engine(name, lambda inp: batch([inp])[0], claims=lossless, accepts=overlap if draft_probs else matching,
                  batch_step=batch, note=f"RejectionSampler.forward {'with' if draft_probs else 'without'} draft "
                                         "probabilities; top-k/top-p through vLLM's non-Triton filter, its Triton "
                                         "kernels interpreted on the CPU")
