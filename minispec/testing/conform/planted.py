"""The bug classes the field shipped in 2026, planted one at a time into copies of transformers' sampler.

Each Plant is a textual change to the source of the installed
transformers.generation.utils._speculative_sampling (compiled into a fresh function: the
installed package is never touched), or a change to how its caller drives it, and names the
invariant that should catch it. `planted_engine(plant)` is the engine under test;
`python -m minispec.testing.conform --planted` runs the suite on each and tabulates what caught what.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from minispec.testing.conform.contract import Engine, StepInput, StepOutput, global_state_from
from minispec.testing.conform.engines import sampler_step, transformers_engine, transformers_sampler


@dataclass(frozen=True)
class Plant:
    name: str
    bug: str  # the class, in words
    seen_in: str  # where the field shipped it
    catches: str  # the invariant that should fail
    old: str = ""  # the source text replaced (once) ...
    new: str = ""  # ... by this
    step_options: dict = field(default_factory=dict)  # how the caller drives the sampler
    shared_stream: bool = False  # the batch form draws every row's coins from one stream
    proposes: bool = False  # the engine draws its own drafts (step_options go to proposing_step)


PLANTS = (
    Plant("judged-in-bfloat16", "the draft sampled from one q and judged with another (a low-precision copy)",
          "DeepSpec #31", "judged_as_sampled",
          "q = candidate_logits.softmax(dim=-1)",
          "q = candidate_logits.to(torch.bfloat16).softmax(dim=-1).float()"),
    Plant("draft-not-warped", "temperature and top-k/top-p applied to the target's logits only",
          "lattice #388, vLLM #10198", "both_sides_processed", step_options={"warp_draft": False}),
    Plant("bonus-not-warped", "the bonus token after the last draft drawn from the raw logits: temperature and "
          "top-k/top-p skipped at that position", "eagle-llm 1.2.1 (docs/conformance.md)", "both_sides_processed",
          step_options={"warp_bonus": False}),
    Plant("never-samples", "the correction taken as the residual's argmax: no sampling at T > 0",
          "mistral.rs #2424", "claimed_distribution",
          "t = torch.multinomial(p_prime, num_samples=1).squeeze(1)[None, :]",
          "t = p_prime.argmax(dim=-1, keepdim=True)"),
    Plant("batch-shares-a-stream", "a batch's rows drawing their coins from one random stream",
          "1Cat-vLLM #656, vLLM #17498", "batch_independent", shared_stream=True),
    Plant("global-state-unseeded", "the step's randomness taken from unseeded global state",
          "vLLM #13196", "seeded", step_options={"seeded": False}),
    Plant("residual-not-clamped", "the residual abs(p - q) instead of max(0, p - q)",
          "(the residual's textbook slip)", "zero_probability",
          "p_prime = torch.clamp((p_n_plus_1 - q_n_plus_1), min=0)",
          "p_prime = (p_n_plus_1 - q_n_plus_1).abs()"),
    Plant("verifier-reuses-the-proposal-stream", "the verifier's coins drawn from where the draft's sampling "
          "started: one stream shared between proposal and verification", "vLLM PR #54282", "claimed_distribution",
          proposes=True, step_options={"reuse_stream": True}),
    Plant("accepts-past-a-rejection", "every accepted draft counted, not the prefix before the first rejection",
          "(the prefix rule's slip)", "claimed_distribution",
          "n_matches = ((~is_accepted).cumsum(dim=-1) < 1).sum()",
          "n_matches = is_accepted.sum()"),
)


def patched_sampler(old: str, new: str):
    """A copy of transformers' _speculative_sampling with `old` replaced by `new` (exactly once)."""
    original = transformers_sampler()
    source = inspect.getsource(original)
    if old:
        if source.count(old) != 1:
            raise ValueError(f"the installed transformers' sampler does not hold {old!r} exactly once")
        source = source.replace(old, new)
    namespace = dict(original.__globals__)
    exec(compile(source, f"<patched {original.__qualname__}>", "exec"), namespace)
    return namespace[original.__name__]


def planted_engine(plant: Plant) -> Engine:
    sampler = patched_sampler(plant.old, plant.new)
    batch_step = None
    if plant.shared_stream:
        def batch_step(inputs: list[StepInput]) -> list[StepOutput]:
            with global_state_from(inputs[0].generator):  # one seed, from the first row's generator, for all
                return [sampler_step(sampler, inp, seeded=False) for inp in inputs]
    return transformers_engine(sampler=sampler, name=f"transformers + {plant.name}", batch_step=batch_step,
                               proposes=plant.proposes, **plant.step_options)
