"""Decoding: plain autoregressive generation (and, built on it, the draft-then-verify loop).

Plain decoding, the baseline every speculative result is compared with:

    prefill:  logits = target(prompt)            one pass over the whole prompt, cache filled
    repeat:   token  = pick(logits[-1])           argmax at temperature 0, else a seeded draw
              logits = target([token])            one position, the cache grows by one
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from minispec.errors import CacheOverflowError, MinispecError
from minispec.model import Transformer
from minispec.sampling import SamplingParams, next_token

# Called with each batch of newly emitted tokens, as soon as they are known (for streaming).
# `num_drafted` says how many of them (a prefix) were accepted draft tokens; 0 in plain decoding.
TokenCallback = Callable[[list[int], int], None]


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids (an eos token, if one ended the run, is included)
    stats: dict = field(default_factory=dict)


@torch.inference_mode()
def generate(
    target: Transformer,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    on_tokens: TokenCallback | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` (a list of ints, batch size 1).

    eos_token_ids: None = the checkpoint's own (config.json), [] = never stop early.
    Randomness comes only from a torch.Generator seeded with `seed`: same seed, same tokens.
    """
    params = SamplingParams(temperature, top_k, top_p)
    prompt = _check_prompt(target, prompt_ids, max_new_tokens, extra=0)
    eos = set(target.config.eos_token_ids if eos_token_ids is None else eos_token_ids)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    cache = target.new_cache(1, len(prompt) + max_new_tokens)

    t0 = time.perf_counter()
    logits = target(torch.tensor([prompt], device=target.device), cache)[0, -1]  # [V]
    t_prefill = time.perf_counter() - t0
    tokens: list[int] = []
    while True:
        token = next_token(logits, params, generator)
        tokens.append(token)
        if on_tokens is not None:
            on_tokens([token], 0)
        if token in eos or len(tokens) == max_new_tokens:
            break
        logits = target(torch.tensor([[token]], device=target.device), cache)[0, -1]
    total = time.perf_counter() - t0

    stats = {
        "num_prompt_tokens": len(prompt),
        "num_generated_tokens": len(tokens),
        "target_forwards": len(tokens),  # the prefill plus one per token after the first
        "prefill_seconds": t_prefill,
        "total_seconds": total,
        "prefill_tokens_per_second": len(prompt) / t_prefill if t_prefill > 0 else float("inf"),
        # end to end: generated tokens over prefill + decode time
        "tokens_per_second": len(tokens) / total if total > 0 else float("inf"),
        "tau": 1.0,  # plain decoding emits exactly one token per target forward
    }
    return GenerationResult(tokens=tokens, stats=stats)


def _check_prompt(target: Transformer, prompt_ids: Sequence[int], max_new_tokens: int, extra: int) -> list[int]:
    """Validate inputs with one-line errors; return the prompt as a list of ints."""
    prompt = [int(t) for t in prompt_ids]
    vocab = target.config.vocab_size
    if not prompt:
        raise MinispecError("prompt_ids: empty; expected at least one token id")
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise MinispecError(f"prompt_ids: token id {bad} out of range; expected 0 <= id < vocab_size={vocab}")
    if max_new_tokens < 1:
        raise MinispecError(f"max_new_tokens = {max_new_tokens}; expected an integer >= 1")
    limit = target.config.max_position_embeddings
    if len(prompt) + max_new_tokens + extra > limit:
        raise CacheOverflowError(
            f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
            f"max_position_embeddings={limit} (config.json)"
        )
    return prompt
