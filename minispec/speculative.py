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

A target pass over g+1 tokens costs about as much as over 1 when decoding is memory-bound
(the weights are read once either way), so every accepted draft is a token for free.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from minispec import acceptance
from minispec.acceptance.base import AcceptancePolicy, VerifyInput
from minispec.drafters import Draft, Drafter, make_drafter
from minispec.errors import CacheOverflowError, MinispecError
from minispec.model import Transformer
from minispec.sampling import SamplingParams, logits_to_probs, next_token

# Called with each batch of newly emitted tokens, as soon as they are known (for streaming):
# on_tokens(tokens, num_accepted, num_proposed). The first num_accepted tokens are accepted
# drafts; a token after them is the target's own (a correction if num_accepted < num_proposed,
# a bonus if all num_proposed drafts were accepted). Plain decoding reports (token, 0, 0).
TokenCallback = Callable[[list[int], int, int], None]


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
    draft: Transformer | Drafter | str | None = None,
    policy: str | AcceptancePolicy = "exact",
    gamma: int = 5,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    on_tokens: TokenCallback | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` (a list of ints, batch size 1).

    draft: None = plain decoding; a Transformer (a separate draft model with the same
      vocabulary); a Drafter; or a spec string ("ngram", "early-exit:N", "self:bf16", a path).
    policy: an acceptance policy name ("exact", "sampling", "typical", "dropmatch") or object
      (`minispec.acceptance.get("dropmatch", p=0.3, paths=5)`).
    eos_token_ids: None = the checkpoint's own (config.json), [] = never stop early.
    Randomness comes only from torch.Generators seeded with `seed`: same seed, same tokens.
    """
    params = SamplingParams(temperature, top_k, top_p)
    eos = set(target.config.eos_token_ids if eos_token_ids is None else eos_token_ids)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    drafter = make_drafter(draft, target)
    if drafter is None:
        prompt = _check_prompt(target, prompt_ids, max_new_tokens, extra=0)
        return _plain(target, prompt, max_new_tokens, params, generator, eos, on_tokens)
    if not isinstance(gamma, int) or gamma < 1:
        raise MinispecError(f"gamma = {gamma!r}; expected an integer >= 1")
    prompt = _check_prompt(target, prompt_ids, max_new_tokens, extra=gamma + 1)
    return _speculative(target, drafter, acceptance.get(policy), gamma, prompt, max_new_tokens,
                        params, generator, eos, on_tokens)


def _prefill(target, prompt: list[int], cache) -> torch.Tensor:
    """Feed the prompt into the cache; the logits after its last token: [V].

    Only the last row goes through the LM head: the other rows' logits are never used, and on
    SmolLM2-135M the head is ~21% of the prefill's multiply-adds.
    """
    hidden = target.forward_hidden(torch.tensor([prompt], device=target.device), cache)  # [1, P, d]
    return target.head(hidden[0, -1])


def _plain(target, prompt, max_new_tokens, params, generator, eos, on_tokens) -> GenerationResult:
    """Plain autoregressive decoding: one target forward per token."""
    cache = target.new_cache(1, len(prompt) + max_new_tokens)
    t0 = time.perf_counter()
    logits = _prefill(target, prompt, cache)  # [V]
    t_prefill = time.perf_counter() - t0
    tokens: list[int] = []
    while True:
        token = next_token(logits, params, generator)
        tokens.append(token)
        if on_tokens is not None:
            on_tokens([token], 0, 0)
        if token in eos or len(tokens) == max_new_tokens:
            break
        logits = target(torch.tensor([[token]], device=target.device), cache)[0, -1]
    total = time.perf_counter() - t0
    stats = _base_stats(len(prompt), tokens, t_prefill, total)
    stats.update(tau=1.0, target_forwards=len(tokens), draft_forwards=0)  # prefill + one per later token
    return GenerationResult(tokens=tokens, stats=stats)


def _speculative(target, drafter, policy, gamma, prompt, max_new_tokens, params, generator, eos, on_tokens):
    """The draft-then-verify loop. Invariant at the top of every step:

        seq    = prompt + tokens                    everything committed so far
        cache  holds seq[:-1]                       the last token, `last`, is not scored yet
    """
    max_len = len(prompt) + max_new_tokens + gamma + 1
    cache = target.new_cache(1, max_len)
    drafter.start(max_len)
    if hasattr(drafter, "bind_target_cache"):  # a self-draft may draft on the target's own cache
        drafter.bind_target_cache(cache)
    policy.reset()
    timer = _Timer()

    # Prefill: score the prompt; its last row gives the first new token, exactly as in plain decoding.
    t0 = time.perf_counter()
    logits = _prefill(target, prompt, cache)  # [V]
    t_prefill = time.perf_counter() - t0
    tokens = [next_token(logits, params, generator)]
    if on_tokens is not None:
        on_tokens(tokens[:], 0, 0)
    steps = StepStats(gamma)

    while tokens[-1] not in eos and len(tokens) < max_new_tokens:
        seq = prompt + tokens
        # Never draft past max_new_tokens: a step emits at most g drafts + 1 token.
        g = min(gamma, max_new_tokens - len(tokens) - 1)

        with timer("draft"):
            draft = drafter.propose(seq, g, params, generator) if g > 0 else _empty_draft(target.config.vocab_size)
        g = len(draft.tokens)  # the drafter may propose fewer (an n-gram miss proposes none)

        # Verify: feed [last, d_1..d_g] at positions len(seq)-1 .. len(seq)-1+g. Output row i
        # predicts the token after input i: rows 0..g-1 score d_1..d_g, row g is the bonus
        # position after d_g. So one forward pass yields g+1 predictions: why gamma+1 rows.
        with timer("verify"):
            verify_ids = torch.tensor([[seq[-1]] + draft.tokens], device=target.device)  # [1, g+1]
            hidden = target.forward_hidden(verify_ids, cache)[0]  # [g+1, d]
            target_logits, extras = policy.head_logits(hidden, target.head)  # [g+1, V]
        with timer("policy"):
            target_logits = target_logits.float() if target_logits.dtype in _LOW_PRECISION else target_logits
            p_target = logits_to_probs(target_logits, params)  # [g+1, V]
            inp = VerifyInput(
                draft_tokens=torch.tensor(draft.tokens, dtype=torch.long),
                q_draft=draft.q_draft.to(p_target.dtype),
                target_logits=target_logits,
                p_target=p_target,
                params=params,
                generator=generator,
                draft_logits=None if draft.logits is None else draft.logits.to(target_logits.dtype),
                head_extras=extras,
            )
            decision = policy(inp)

        n = decision.num_accepted
        emitted = draft.tokens[:n] + [decision.next_token]  # accepted prefix + correction/bonus
        steps.record(g, n, decision.info)
        # Roll back: the target cache holds seq[:-1] + [last, d_1..d_g]; keep through d_n.
        cache.truncate(len(seq) + n)
        drafter.rollback(len(seq) + n)

        # Stop at the first eos or at max_new_tokens, even in the middle of an accepted run.
        for i, token in enumerate(emitted):
            if token in eos or len(tokens) + i + 1 == max_new_tokens:
                emitted = emitted[: i + 1]
                break
        tokens.extend(emitted)
        if on_tokens is not None:
            on_tokens(emitted, min(n, len(emitted)), g)
    total = time.perf_counter() - t0

    stats = _base_stats(len(prompt), tokens, t_prefill, total)
    stats.update(steps.summary())
    stats.update(
        target_forwards=1 + steps.num_steps,  # prefill + one verify pass per step
        draft_forwards=drafter.forwards,
        **{f"{k}_seconds": v for k, v in timer.totals.items()},
        drafter=getattr(drafter, "name", type(drafter).__name__),
        draft_shares_target_cache=bool(getattr(drafter, "sharing", False)),
        policy=policy.name,
        gamma=gamma,
    )
    return GenerationResult(tokens=tokens, stats=stats)


class StepStats:
    """Counts per verify step. tau = tokens emitted per verify step INCLUDING the correction or
    bonus token, so 1 <= tau <= gamma+1 (the convention of the DropMatch paper and vLLM)."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma
        self.num_steps = 0
        self.num_drafted = 0
        self.num_accepted = 0
        self.proposed_at = [0] * gamma  # how often position i (0-based) was drafted
        self.accepted_at = [0] * gamma  # ... and accepted
        self.histogram = [0] * (gamma + 1)  # steps by number of accepted drafts
        self.dropmatch_only = 0
        self.agree_positions = 0.0  # DropMatch: positions where all K heads agreed with the clean argmax
        self.scored_positions = 0  # ... out of this many verified positions
        self.dropmatch_steps = 0  # steps whose decision came from DropMatch (its info keys)
        self.path_positions = 0  # lazy DropMatch: positions whose verdict needed their dropout paths
        self.path_head_calls = 0  # ... and the extra LM-head calls they cost

    def record(self, num_drafted: int, num_accepted: int, info: dict) -> None:
        self.num_steps += 1
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.histogram[num_accepted] += 1
        for i in range(num_drafted):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < num_accepted
        if "accepted_by_dropmatch_only" in info:
            self.dropmatch_steps += 1
            self.dropmatch_only += info["accepted_by_dropmatch_only"]
            self.path_positions += info.get("path_positions", 0)
            self.path_head_calls += info.get("path_head_calls", 0)
        if "heads_all_agree" in info:  # a fraction of this step's num_drafted + 1 positions
            self.agree_positions += info["heads_all_agree"] * (num_drafted + 1)
            self.scored_positions += num_drafted + 1

    def summary(self) -> dict:
        out = {
            "verify_steps": self.num_steps,
            # emitted per step = accepted drafts + 1 correction/bonus token
            "tau": (self.num_accepted + self.num_steps) / self.num_steps if self.num_steps else 1.0,
            "acceptance_rate": self.num_accepted / self.num_drafted if self.num_drafted else 0.0,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "per_position_acceptance": [a / p if p else None for a, p in zip(self.accepted_at, self.proposed_at)],
            "accepted_length_histogram": self.histogram,
        }
        if self.dropmatch_steps:
            out["accepted_by_dropmatch_only"] = self.dropmatch_only
            # lazy DropMatch: mean number of positions per step that needed their K dropout paths
            out["path_positions_per_step"] = self.path_positions / self.dropmatch_steps
            out["path_head_calls_per_step"] = self.path_head_calls / self.dropmatch_steps
        if self.scored_positions:
            out["heads_all_agree"] = self.agree_positions / self.scored_positions
        return out


class _Timer:
    """Accumulates wall time per phase: `with timer("draft"): ...`."""

    def __init__(self) -> None:
        self.totals = {"draft": 0.0, "verify": 0.0, "policy": 0.0}

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        yield
        self.totals[phase] += time.perf_counter() - t


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _empty_draft(vocab: int) -> Draft:
    return Draft([], torch.zeros(0, vocab), None)


def _base_stats(num_prompt: int, tokens: list[int], t_prefill: float, total: float) -> dict:
    return {
        "num_prompt_tokens": num_prompt,
        "num_generated_tokens": len(tokens),
        "prefill_seconds": t_prefill,
        "total_seconds": total,
        "prefill_tokens_per_second": num_prompt / t_prefill if t_prefill > 0 else float("inf"),
        # end to end: generated tokens over prefill + decode time
        "tokens_per_second": len(tokens) / total if total > 0 else float("inf"),
        # after the prefill: the tokens after the first (which the prefill itself yields)
        "decode_tokens_per_second": (len(tokens) - 1) / (total - t_prefill) if total > t_prefill else float("inf"),
    }


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
