"""Decoding: plain autoregressive generation and the draft-then-verify loop.

Plain decoding, the baseline every speculative result is compared with:

    prefill:  logits = target(prompt)             one pass over the whole prompt, cache filled
    repeat:   token  = pick(logits[-1])            argmax at temperature 0, else a seeded draw
              logits = target([token])             one position, the cache grows by one

Speculative decoding (Leviathan et al. 2022; Chen et al. 2023) replaces the repeat with:

    draft:    d_1..d_g = drafter.propose(seq)      cheap guesses (a small model, an n-gram lookup)
    verify:   logits   = target([last, d_1..d_g])  ONE target pass scores all g guesses (g+1 rows)
    decide:   n, y     = policy(...)               keep d_1..d_n, then y (correction or bonus)
    rollback: both caches truncated to the accepted prefix
    stats:    tau = tokens emitted per verify step, counting y (minispec.chain.stats defines each figure)

A target pass over g+1 tokens costs about as much as over 1 when decoding is memory-bound
(the weights are read once either way), so every accepted draft is a token for free.

This file is chapter 1's loop: the parts of a step (prefill, verify_input, commit; the trees and
batches reuse them), speculative_decode (the loop), plain_decode (the baseline) and generate_chain
(one prompt: checks, then one of the two). A call's results, callbacks and checks are
minispec.chain.request; the figures, minispec.chain.stats; trees and batches are chapters of their
own, and minispec.decode.generate is the front door that hands a call to the right one.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Sequence

import torch

from minispec import acceptance
from minispec.chain import draft_length as draft_lengths
from minispec.acceptance.base import AcceptancePolicy, VerifyInput
from minispec.checks import check_gamma
from minispec.chain.draft_length import DraftLength
from minispec.chain.drafters import Draft, Drafter, make_drafter
from minispec.chain.request import GenerationResult, StepRecord, StopCondition, TokenCallback, check_request
from minispec.model.transformer import Transformer
from minispec.model.sampling import SamplingParams, logits_to_probs, next_token
from minispec.chain.stats import run_stats


# ---------------------------------------------------------------- the parts of a step


class PhaseTimer:
    """Wall time per phase of a step: `with timer("draft"): ...`; `totals` maps phase -> seconds."""

    def __init__(self, *phases: str) -> None:
        self.totals = {phase: 0.0 for phase in phases}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        self.totals[phase] += time.perf_counter() - start


def prefill(target: Transformer, prompt: list[int], cache) -> torch.Tensor:
    """Feed the prompt into the cache; the logits after its last token: [V].

    Only the last row goes through the LM head: the other rows' logits are never used.
    """
    hidden = target.forward_hidden(torch.tensor([prompt], device=target.device), cache)  # [1, P, d]
    return target.head(hidden[0, -1])


def first_token(target: Transformer, prompt: list[int], cache, params: SamplingParams, generator: torch.Generator,
                eos: set[int], max_new_tokens: int, stop_when: StopCondition | None,
                on_tokens: TokenCallback | None) -> tuple[list[int], str | None, float]:
    """Prefill, then the first new token from the prompt's last row, exactly as plain decoding
    picks it (and streams it): (tokens so far, the finish reason or None, the prefill's seconds)."""
    start = time.perf_counter()
    logits = prefill(target, prompt, cache)  # [V]
    prefill_seconds = time.perf_counter() - start
    tokens = [next_token(logits, params, generator)]
    if on_tokens is not None:
        on_tokens(tokens[:], 0, 0)
    return tokens, finish_reason(tokens, eos, max_new_tokens, stop_when), prefill_seconds


LOW_PRECISION = (torch.float16, torch.bfloat16)


def verify_input(draft: Draft, target_logits: torch.Tensor, hidden: torch.Tensor,
                 head: Callable[[torch.Tensor], torch.Tensor], params: SamplingParams,
                 generator: torch.Generator) -> VerifyInput:
    """What a policy sees after a verify pass of g+1 rows: target_logits [g+1, V] (low precision
    upcast to float32), p_target = post-processed target_logits, and the draft on the same device."""
    target_logits = target_logits.float() if target_logits.dtype in LOW_PRECISION else target_logits
    p_target = logits_to_probs(target_logits, params)  # [g+1, V]
    return VerifyInput(
        draft_tokens=torch.tensor(draft.tokens, dtype=torch.long, device=p_target.device),
        q_draft=draft.q_draft.to(p_target.device, p_target.dtype),  # an n-gram's one-hot rows live on the CPU
        target_logits=target_logits,
        p_target=p_target,
        params=params,
        generator=generator,
        draft_logits=None if draft.logits is None else draft.logits.to(target_logits.device, target_logits.dtype),
        hidden=hidden,
        head=head,
    )


def finish_reason(tokens: list[int], eos: set[int], max_new_tokens: int,
                  stop_when: StopCondition | None) -> str | None:
    """Whether the generation ends after its last token, and why: "eos", "stop", "length" or None."""
    if tokens[-1] in eos:
        return "eos"
    if stop_when is not None and stop_when(tokens):
        return "stop"
    return "length" if len(tokens) >= max_new_tokens else None


def commit(tokens: list[int], emitted: list[int], eos: set[int], max_new_tokens: int,
           stop_when: StopCondition | None) -> tuple[list[int], str | None]:
    """Append a step's tokens one at a time, stopping at the first eos, stop condition or
    max_new_tokens, even in the middle of an accepted run. Returns (what was committed, the
    finish reason or None)."""
    num_before, reason = len(tokens), None
    for token in emitted:
        tokens.append(token)
        reason = finish_reason(tokens, eos, max_new_tokens, stop_when)
        if reason is not None:
            break
    return tokens[num_before:], reason


# ---------------------------------------------------------------- the loops


def speculative_decode(target, drafter, policy, gamma, prompt, max_new_tokens, params, generator, eos,
                       on_tokens=None, on_step=None, stop_when=None, draft_length=None) -> GenerationResult:
    """The draft-then-verify loop. Invariant at the top of every step:

        seq    = prompt + tokens                    everything committed so far
        cache  holds seq[:-1]                       the last token, `last`, is not scored yet

    draft_length: None (gamma every step) or a DraftLength of at most gamma tokens.
    """
    # The cache never holds the last token (nobody scores it), and a step never drafts past
    # max_new_tokens (below), so prompt + max_new_tokens positions are always enough.
    max_len = len(prompt) + max_new_tokens
    cache = target.new_cache(1, max_len)
    drafter.start(max_len, target_cache=cache)  # a drafter that can may draft on the target's cache
    if draft_length is not None:
        draft_length.reset()
    timer = PhaseTimer("draft", "verify", "policy")
    steps = []  # (drafted, accepted, committed, info) per step: minispec.chain.stats counts them

    # Prefill: score the prompt; its last row gives the first new token, exactly as in plain decoding.
    t0 = time.perf_counter()
    tokens, reason, t_prefill = first_token(target, prompt, cache, params, generator, eos, max_new_tokens, stop_when,
                                            on_tokens)

    while reason is None:
        seq = prompt + tokens
        # How many to draft: gamma (or the schedule's choice), never past max_new_tokens: a step
        # emits at most g drafts + 1 token.
        g = min(gamma if draft_length is None else draft_length.next(), max_new_tokens - len(tokens) - 1)

        # 1. Draft: up to g cheap guesses (an n-gram miss proposes none: the step is a plain decode).
        with timer("draft"):
            draft = drafter.propose(seq, g, params, generator) if g > 0 else Draft.empty(target.config.vocab_size)
        g = len(draft.tokens)

        # 2. Verify: feed [last, d_1..d_g] at positions len(seq)-1 .. len(seq)-1+g. Output row i
        # predicts the token after input i: rows 0..g-1 score d_1..d_g, row g is the bonus
        # position after d_g. So one forward pass yields g+1 predictions: why gamma+1 rows.
        with timer("verify"):
            verify_ids = torch.tensor([[seq[-1]] + draft.tokens], device=target.device)  # [1, g+1]
            hidden = target.forward_hidden(verify_ids, cache)[0]  # [g+1, d]: the LM-head input
            target_logits = target.head(hidden)  # [g+1, V]

        # 3. Decide: how many drafts to keep, and the token that follows them.
        with timer("policy"):
            inp = verify_input(draft, target_logits, hidden, target.head, params, generator)
            decision = policy(inp)
        n = decision.num_accepted

        # 4. Roll back: the target cache holds seq[:-1] + [last, d_1..d_g]; keep through d_n.
        verified_length = cache.length
        cache.truncate(len(seq) + n)
        drafter.rollback(len(seq) + n)

        # 5. Commit the accepted prefix and the correction/bonus, one token at a time up to the first end.
        emitted, reason = commit(tokens, draft.tokens[:n] + [decision.next_token], eos, max_new_tokens, stop_when)
        steps.append((g, n, len(emitted), decision.info))
        if draft_length is not None:
            draft_length.update(g, n)  # an adaptive schedule learns from what was accepted
        if on_tokens is not None:
            on_tokens(emitted, min(n, len(emitted)), g)
        if on_step is not None:
            on_step(StepRecord(len(steps) - 1, inp, decision, emitted, (verified_length, cache.length),
                               drafter.cache_length))

    # Stats: tau, acceptance and the time split (minispec.chain.stats defines each figure).
    stats = run_stats(len(prompt), len(tokens), t_prefill, time.perf_counter() - t0, reason, steps,
                      positions=max(1, min(gamma, max_new_tokens - 1)),  # no step drafts more than that
                      phase_seconds=timer.totals,
                      target_forwards=1 + len(steps),  # prefill + one verify pass per step
                      draft_forwards=drafter.forwards, drafter=drafter.name,
                      draft_shares_target_cache=drafter.shares_target_cache, policy=policy.name,
                      gamma=gamma,  # the most drafted per step
                      draft_length="fixed" if draft_length is None else draft_length.name)
    return GenerationResult(tokens=tokens, stats=stats)


def plain_decode(target, prompt, max_new_tokens, params, generator, eos, on_tokens,
                 stop_when=None) -> GenerationResult:
    """Plain autoregressive decoding: one target forward per token."""
    cache = target.new_cache(1, len(prompt) + max_new_tokens)
    t0 = time.perf_counter()
    logits = prefill(target, prompt, cache)  # [V]
    t_prefill = time.perf_counter() - t0
    tokens: list[int] = []
    while True:
        token = next_token(logits, params, generator)
        tokens.append(token)
        if on_tokens is not None:
            on_tokens([token], 0, 0)
        reason = finish_reason(tokens, eos, max_new_tokens, stop_when)
        if reason is not None:
            break
        logits = target(torch.tensor([[token]], device=target.device), cache)[0, -1]  # [V]
    stats = run_stats(len(prompt), len(tokens), t_prefill, time.perf_counter() - t0, reason,
                      target_forwards=len(tokens), draft_forwards=0)  # prefill + one per later token
    return GenerationResult(tokens=tokens, stats=stats)


@torch.inference_mode()
def generate_chain(
    target: Transformer,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    draft: Transformer | Drafter | str | None = None,
    policy: str | AcceptancePolicy = "exact",
    gamma: int = 5,
    draft_length: str | DraftLength = "fixed",
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    on_tokens: TokenCallback | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    stop_when: StopCondition | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` (one prompt: a list of ints).

    draft: None = plain decoding; a Transformer (a separate draft model with the same
      vocabulary); a Drafter; or a spec string ("ngram", "early-exit:N", "self:bf16", a path).
    policy: an acceptance policy name ("exact", "sampling", "typical", "dropmatch", ...) or object
      (`minispec.acceptance.get("dropmatch", p=0.3, paths=5)`).
    gamma: the most tokens drafted per step; draft_length: how many of them to draft each step,
      "fixed" (gamma), "heuristic" (adapts to what was accepted) or a DraftLength (minispec.chain.draft_length).
    eos_token_ids: None = the checkpoint's own (config.json), [] = never stop early.
    on_tokens: streaming callback (TokenCallback); on_step: called with each verify step's StepRecord.
    stop_when: StopCondition, checked after every new token (also inside an accepted run).
    stats["finish_reason"]: "eos", "length" or "stop".
    Randomness comes only from torch.Generators seeded from `seed`: the loop's (draws and the
    policy's coins) and a policy's own (DropMatch's masks, through policy.reset(seed)): same seed,
    same tokens. Trees and several prompts: minispec.decode.generate, the front door.
    """
    prompt, params, generator, eos = check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                                   seed, eos_token_ids)
    drafter = make_drafter(draft, target)
    if drafter is None:
        return plain_decode(target, prompt, max_new_tokens, params, generator, eos, on_tokens, stop_when)
    gamma = check_gamma(gamma)
    policy = acceptance.get(policy)
    # A policy with its own randomness (DropMatch's masks) derives it from the run's seed; the most
    # drafts a step holds: the prefill gives the first token, and a step adds one of its own.
    policy.reset(seed, gamma=max(0, min(gamma, max_new_tokens - 2)))
    schedule = None if draft_length == "fixed" else draft_lengths.get(draft_length, gamma)  # None: gamma every step
    return speculative_decode(target, drafter, policy, gamma, prompt, max_new_tokens, params, generator, eos,
                              on_tokens, on_step, stop_when, schedule)
