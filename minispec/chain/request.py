"""What a decoding call gives and gets: its results and callbacks, and its input checks.

The chain (minispec.chain.speculative), the tree (minispec.trees.speculative) and the batch
(minispec.batch.speculative) loops take the same request and return the same result:

    check:    prompt, params, generator, eos = check_request(...)    one-line errors, then the run's state
    result:   GenerationResult(tokens, stats)                          stats: minispec.chain.stats.run_stats
    stream:   on_tokens(tokens, num_accepted, num_proposed)            a TokenCallback, as tokens are known
    stop:     stop_when(tokens) -> bool                                a StopCondition, after every token

The parts of a step that the loops share (prefill, verify_input, commit) are chapter 1's,
minispec.chain.speculative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

import torch

from minispec.acceptance.base import Decision, VerifyInput
from minispec.checks import is_int, positive_int
from minispec.errors import CacheOverflowError, MinispecError
from minispec.model.transformer import Transformer
from minispec.model.sampling import SamplingParams

# Called with each batch of newly emitted tokens, as soon as they are known (for streaming):
# on_tokens(tokens, num_accepted, num_proposed). The first num_accepted tokens are accepted
# drafts; a token after them is the target's own (a correction if num_accepted < num_proposed,
# a bonus if all num_proposed drafts were accepted). Plain decoding reports (token, 0, 0).
TokenCallback = Callable[[list[int], int, int], None]

# Called with all tokens generated so far, after each new token: True ends the generation there
# (finish_reason "stop"), e.g. when the decoded text contains a stop string.
StopCondition = Callable[[list[int]], bool]


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids (an eos token, if one ended the run, is included)
    stats: dict = field(default_factory=dict)  # minispec.chain.stats.run_stats; each figure in docs/metrics.md

    @property
    def finish_reason(self) -> str:
        """Why it ended: "eos" (an end token), "length" (max_new_tokens) or "stop" (stop_when said so)."""
        return self.stats["finish_reason"]


@dataclass
class StepRecord:
    """One verify step of the chain as the loop saw it, handed to `on_step` (minispec.generate.trace prints these)."""

    index: int  # 0-based verify step
    inp: VerifyInput  # what the policy saw: drafts, q_draft, target logits, p_target
    decision: Decision  # what it decided
    emitted: list[int]  # the tokens committed by this step (cut at eos / max_new_tokens)
    target_cache: tuple[int, int]  # the target cache's length after the verify pass, after the rollback
    draft_cache: int | None  # the drafter's cache length after its rollback; None if it keeps none


# ---------------------------------------------------------------- checks (one-line errors)


def check_request(target: Transformer, prompt_ids, max_new_tokens: int, temperature: float, top_k: int | None,
                  top_p: float | None, seed: int, eos_token_ids) -> tuple[list[int], SamplingParams, torch.Generator,
                                                                           set[int]]:
    """A loop's arguments checked, as the run's state: (prompt, params, generator, eos ids).

    The generator is the run's one source of randomness (draws and a policy's coins), seeded
    with `seed`; eos_token_ids None means the checkpoint's own (config.json).
    """
    params = SamplingParams(temperature, top_k, top_p)
    generator = torch.Generator(device="cpu").manual_seed(check_seed(seed))
    prompt = check_prompt(target, prompt_ids, max_new_tokens)
    return prompt, params, generator, check_eos(target, eos_token_ids)


def check_prompt(target: Transformer, prompt_ids, max_new_tokens: int) -> list[int]:
    """Validate the prompt and max_new_tokens with one-line errors; return the prompt as a list of ints.

    prompt_ids: a sequence of ints or a 1-D integer tensor (one prompt), each 0 <= id < vocab_size.
    """
    vocab = target.config.vocab_size
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1 or prompt_ids.dtype.is_floating_point or prompt_ids.dtype.is_complex \
                or prompt_ids.dtype == torch.bool:
            raise MinispecError(f"prompt_ids: a {prompt_ids.dim()}-D {prompt_ids.dtype} tensor; expected a 1-D integer "
                                f"tensor or a list of token ids (several prompts: a list of lists or a 2-D tensor)")
        if prompt_ids.device.type == "meta":
            raise MinispecError("prompt_ids: a tensor on the meta device holds no values; expected token ids on a "
                                "device with data (any device: the ids are read into a list)")
        prompt_ids = prompt_ids.tolist()  # from any device
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
        raise MinispecError(f"prompt_ids: {type(prompt_ids).__name__}; expected a list of token ids "
                            f"(encode text with the tokenizer first: tokenizer.encode(text))")
    bad = next((t for t in prompt_ids if not is_int(t)), None)
    if bad is not None:
        several = " (several prompts: minispec.decode.generate or minispec.generate_batch)" \
            if isinstance(bad, (Sequence, torch.Tensor)) and not isinstance(bad, (str, bytes)) else ""
        raise MinispecError(f"prompt_ids: {bad!r} ({type(bad).__name__}); expected integer token ids{several}")
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise MinispecError("prompt_ids: empty; expected at least one token id")
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise MinispecError(f"prompt_ids: token id {bad} out of range; expected 0 <= id < vocab_size={vocab}")
    positive_int(max_new_tokens, "max_new_tokens")
    limit = target.config.max_position_embeddings
    if len(prompt) + max_new_tokens > limit:
        raise CacheOverflowError(
            f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
            f"max_position_embeddings={limit} (config.json)"
        )
    return prompt


def check_seed(seed) -> int:
    """A run's seed: an integer 0 <= seed < 2**64 (what torch.Generator.manual_seed takes)."""
    if not is_int(seed) or not 0 <= seed < 2**64:
        raise MinispecError(f"seed = {seed!r}; expected an integer 0 <= seed < 2**64")
    return int(seed)


def check_eos(target: Transformer, eos_token_ids) -> set[int]:
    """The ids that end a run: None = the checkpoint's own (config.json), [] = never stop early."""
    if eos_token_ids is None:
        return set(target.config.eos_token_ids)
    vocab = target.config.vocab_size
    ids = list(eos_token_ids) if isinstance(eos_token_ids, (list, tuple, set, frozenset)) else None
    if ids is None or any(not is_int(t) or not 0 <= t < vocab for t in ids):
        raise MinispecError(f"eos_token_ids = {eos_token_ids!r}; expected a list of token ids, "
                            f"each 0 <= id < vocab_size={vocab} ([] never stops early)")
    return {int(t) for t in ids}
