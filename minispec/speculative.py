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
    stats:    tau = tokens emitted per verify step, counting y (minispec.stats defines each figure)

A target pass over g+1 tokens costs about as much as over 1 when decoding is memory-bound
(the weights are read once either way), so every accepted draft is a token for free.
"""

from __future__ import annotations

import time
from numbers import Integral
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from minispec import acceptance, draft_length as draft_lengths
from minispec.acceptance.base import AcceptancePolicy, Decision, VerifyInput
from minispec.draft_length import DraftLength
from minispec.drafters import Draft, Drafter, make_drafter
from minispec.errors import CacheOverflowError, MinispecError
from minispec.model import Transformer
from minispec.sampling import SamplingParams, logits_to_probs, next_token
from minispec.stats import PhaseTimer, StepStats, timing_stats

if TYPE_CHECKING:
    from minispec.batch import BatchResult
    from minispec.tree_speculative import TreeSpec

# Called with each batch of newly emitted tokens, as soon as they are known (for streaming):
# on_tokens(tokens, num_accepted, num_proposed). The first num_accepted tokens are accepted
# drafts; a token after them is the target's own (a correction if num_accepted < num_proposed,
# a bonus if all num_proposed drafts were accepted). Plain decoding reports (token, 0, 0).
TokenCallback = Callable[[list[int], int, int], None]

# Called with all tokens generated so far, after each new token: True ends the generation there
# (finish_reason "stop"), e.g. when the decoded text contains a stop string.
StopCondition = Callable[[list[int]], bool]


@dataclass
class StepRecord:
    """One verify step as the loop saw it, handed to `on_step` (minispec.trace prints these)."""

    index: int  # 0-based verify step
    inp: VerifyInput  # what the policy saw: drafts, q_draft, target logits, p_target
    decision: Decision  # what it decided
    emitted: list[int]  # the tokens committed by this step (cut at eos / max_new_tokens)
    target_cache: tuple[int, int]  # the target cache's length after the verify pass, after the rollback
    draft_cache: int | None  # the drafter's cache length after its rollback; None if it keeps none


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids (an eos token, if one ended the run, is included)
    stats: dict = field(default_factory=dict)

    @property
    def finish_reason(self) -> str:
        """Why it ended: "eos" (an end token), "length" (max_new_tokens) or "stop" (stop_when said so)."""
        return self.stats["finish_reason"]


@torch.inference_mode()
def generate(
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
    tree: TreeSpec | int | None = None,
) -> GenerationResult | BatchResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` (a list of ints, batch size 1).

    Several prompts (a list of lists of ints, or a 2-D tensor) are decoded together by
    minispec.batch.generate_batch, which returns a BatchResult (one GenerationResult per prompt)
    and calls on_tokens(prompt_index, tokens, num_accepted, num_proposed).

    draft: None = plain decoding; a Transformer (a separate draft model with the same
      vocabulary); a Drafter; or a spec string ("ngram", "early-exit:N", "self:bf16", a path).
    policy: an acceptance policy name ("exact", "sampling", "typical", "dropmatch", ...) or object
      (`minispec.acceptance.get("dropmatch", p=0.3, paths=5)`).
    gamma: the most tokens drafted per step; draft_length: how many of them to draft each step,
      "fixed" (gamma), "heuristic" (adapts to what was accepted) or a DraftLength (minispec.draft_length).
    eos_token_ids: None = the checkpoint's own (config.json), [] = never stop early.
    on_tokens: streaming callback (TokenCallback); on_step: called with each verify step's StepRecord.
    stop_when: StopCondition, checked after every new token (also inside an accepted run).
    stats["finish_reason"]: "eos", "length" or "stop".
    tree: None = chains; a TreeSpec (or an int: its budget) drafts trees instead
      (minispec.tree_speculative): up to tree.budget nodes per verify pass, gamma deep, walked by
      the policy's tree form; the draft must be able to branch (n-gram or a model).
    Randomness comes only from torch.Generators seeded from `seed`: the loop's (draws and the
    policy's coins) and a policy's own (DropMatch's masks, through policy.reset(seed)): same seed,
    same tokens.
    """
    from minispec.batch import generate_batch, is_batch  # here: minispec.batch builds on this module

    if is_batch(prompt_ids):  # several prompts: minispec.batch
        if tree is not None or on_step is not None:
            raise MinispecError(f"{'tree' if tree is not None else 'on_step'}: not available with several prompts; "
                                f"expected one prompt (a list of token ids), or tree=None and on_step=None")
        return generate_batch(target, prompt_ids, max_new_tokens=max_new_tokens, draft=draft, policy=policy,
                              gamma=gamma, draft_length=draft_length, temperature=temperature, top_k=top_k,
                              top_p=top_p, seed=seed, eos_token_ids=eos_token_ids, on_tokens=on_tokens,
                              stop_when=stop_when)
    params = SamplingParams(temperature, top_k, top_p)
    generator = torch.Generator(device="cpu").manual_seed(_check_seed(seed))
    prompt = _check_prompt(target, prompt_ids, max_new_tokens)
    eos = set(target.config.eos_token_ids if eos_token_ids is None else _check_eos(target, eos_token_ids))
    if tree is not None:
        return _generate_tree(target, prompt, max_new_tokens, draft, policy, gamma, draft_length, temperature,
                              top_k, top_p, seed, eos_token_ids, on_tokens, on_step, stop_when, tree)
    drafter = make_drafter(draft, target)
    if drafter is None:
        return plain_decode(target, prompt, max_new_tokens, params, generator, eos, on_tokens, stop_when)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise MinispecError(f"gamma = {gamma!r}; expected an integer >= 1")
    policy = acceptance.get(policy)
    policy.reset(seed)  # a policy with its own randomness (DropMatch's masks) derives it from the run's seed
    return speculative_decode(target, drafter, policy, gamma, prompt, max_new_tokens, params, generator, eos,
                              on_tokens, on_step, stop_when, draft_lengths.get(draft_length, gamma))


def _generate_tree(target, prompt, max_new_tokens, draft, policy, gamma, draft_length, temperature, top_k, top_p,
                   seed, eos_token_ids, on_tokens, on_step, stop_when, tree) -> GenerationResult:
    """generate(..., tree=...): the checks that belong to the chain's arguments, then generate_tree."""
    from minispec.tree_speculative import TreeSpec, generate_tree, make_tree_drafter

    if isinstance(tree, Integral) and not isinstance(tree, bool):
        tree = TreeSpec(budget=int(tree))
    if not isinstance(tree, TreeSpec):
        raise MinispecError(f"tree = {tree!r}; expected None, a TreeSpec or an integer budget >= 1")
    if draft is None:
        raise MinispecError("tree: a tree needs a draft; expected draft='ngram', 'early-exit:N', 'self:int8', "
                            "a draft model or a tree drafter")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise MinispecError(f"gamma = {gamma!r}; expected an integer >= 1")
    if draft_length != "fixed":
        raise MinispecError(f"draft_length = {draft_length!r} with a tree; expected 'fixed' (a tree's depth is gamma)")
    if on_step is not None:
        raise MinispecError("on_step: a chain step's record; expected on_step=None with a tree")
    return generate_tree(target, prompt, max_new_tokens=max_new_tokens, drafter=make_tree_drafter(draft, target, tree),
                         budget=tree.budget, max_depth=gamma, policy=acceptance.get(policy), temperature=temperature,
                         top_k=top_k, top_p=top_p, seed=seed, eos_token_ids=eos_token_ids, on_tokens=on_tokens,
                         stop_when=stop_when)


def prefill(target: Transformer, prompt: list[int], cache) -> torch.Tensor:
    """Feed the prompt into the cache; the logits after its last token: [V].

    Only the last row goes through the LM head: the other rows' logits are never used.
    """
    hidden = target.forward_hidden(torch.tensor([prompt], device=target.device), cache)  # [1, P, d]
    return target.head(hidden[0, -1])


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
    stats = timing_stats(len(prompt), len(tokens), t_prefill, time.perf_counter() - t0)
    stats.update(tau=1.0, target_forwards=len(tokens), draft_forwards=0,  # prefill + one per later token
                 finish_reason=reason)
    return GenerationResult(tokens=tokens, stats=stats)


def finish_reason(tokens: list[int], eos: set[int], max_new_tokens: int,
                  stop_when: StopCondition | None) -> str | None:
    """Whether the generation ends after its last token, and why: "eos", "stop", "length" or None."""
    if tokens[-1] in eos:
        return "eos"
    if stop_when is not None and stop_when(tokens):
        return "stop"
    return "length" if len(tokens) >= max_new_tokens else None


def speculative_decode(target, drafter, policy, gamma, prompt, max_new_tokens, params, generator, eos,
                       on_tokens=None, on_step=None, stop_when=None, draft_length=None) -> GenerationResult:
    """The draft-then-verify loop. Invariant at the top of every step:

        seq    = prompt + tokens                    everything committed so far
        cache  holds seq[:-1]                       the last token, `last`, is not scored yet

    draft_length: a DraftLength of at most gamma tokens (None: Fixed(gamma), gamma every step).
    """
    draft_length = draft_length or draft_lengths.Fixed(gamma)
    # The cache never holds the last token (nobody scores it), and a step never drafts past
    # max_new_tokens (below), so prompt + max_new_tokens positions are always enough.
    max_len = len(prompt) + max_new_tokens
    cache = target.new_cache(1, max_len)
    drafter.start(max_len, target_cache=cache)  # a drafter that can may draft on the target's cache
    draft_length.reset()
    timer = PhaseTimer("draft", "verify", "policy")
    steps = StepStats(max(1, min(gamma, max_new_tokens - 1)))  # no step drafts more than that

    # Prefill: score the prompt; its last row gives the first new token, exactly as in plain decoding.
    t0 = time.perf_counter()
    logits = prefill(target, prompt, cache)  # [V]
    t_prefill = time.perf_counter() - t0
    tokens = [next_token(logits, params, generator)]
    if on_tokens is not None:
        on_tokens(tokens[:], 0, 0)
    reason = finish_reason(tokens, eos, max_new_tokens, stop_when)

    while reason is None:
        seq = prompt + tokens
        # How many to draft: the schedule's choice (gamma unless adaptive), never past max_new_tokens:
        # a step emits at most g drafts + 1 token.
        g = min(draft_length.next(), max_new_tokens - len(tokens) - 1)

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
            target_logits, extra_logits = score(target.head, policy, hidden)  # [g+1, V], [n, V] or None

        # 3. Decide: how many drafts to keep, and the token that follows them.
        with timer("policy"):
            inp = verify_input(draft, target_logits, hidden, extra_logits, target.head, params, generator)
            decision = policy(inp)
        n = decision.num_accepted
        emitted = draft.tokens[:n] + [decision.next_token]  # accepted prefix + correction/bonus
        draft_length.update(g, n)  # an adaptive schedule learns from what was accepted

        # 4. Roll back: the target cache holds seq[:-1] + [last, d_1..d_g]; keep through d_n.
        verified_length = cache.length
        cache.truncate(len(seq) + n)
        drafter.rollback(len(seq) + n)

        # 5. Commit (one token at a time, up to the first end) and count what was committed.
        emitted, reason = commit(tokens, emitted, eos, max_new_tokens, stop_when)
        record_step(steps, g, n, len(emitted), decision.info)
        if on_tokens is not None:
            on_tokens(emitted, min(n, len(emitted)), g)
        if on_step is not None:
            on_step(StepRecord(steps.num_steps - 1, inp, decision, emitted, (verified_length, cache.length),
                               drafter.cache_length))

    # Stats: tau, acceptance and the time split (minispec.stats defines each figure).
    stats = timing_stats(len(prompt), len(tokens), t_prefill, time.perf_counter() - t0)
    stats.update(steps.summary())
    stats.update(
        target_forwards=1 + steps.num_steps,  # prefill + one verify pass per step
        draft_forwards=drafter.forwards,
        **{f"{phase}_seconds": seconds for phase, seconds in timer.totals.items()},
        drafter=drafter.name,
        draft_shares_target_cache=drafter.shares_target_cache,
        policy=policy.name,
        gamma=gamma,  # the most drafted per step
        draft_length=draft_length.name,
        finish_reason=reason,
    )
    return GenerationResult(tokens=tokens, stats=stats)


def verify_input(draft: Draft, target_logits: torch.Tensor, hidden: torch.Tensor, extra_logits: torch.Tensor | None,
                 head: Callable[[torch.Tensor], torch.Tensor], params: SamplingParams,
                 generator: torch.Generator) -> VerifyInput:
    """What a policy sees after a verify pass of g+1 rows: target_logits [g+1, V] (low precision
    upcast to float32), p_target = post-processed target_logits, and the draft on the same device."""
    target_logits = target_logits.float() if target_logits.dtype in _LOW_PRECISION else target_logits
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
        extra_logits=extra_logits,
    )


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


def record_step(steps: StepStats, num_drafted: int, num_accepted: int, num_committed: int, info: dict) -> None:
    """Count a step by what it committed: a step cut short by an eos or stop inside its accepted
    run counts as a draft of the committed length, all accepted (what came after the end was
    never emitted, so it was neither accepted nor rejected)."""
    if num_committed <= num_accepted:
        steps.record(num_committed, num_committed, info, num_emitted=num_committed)
    else:
        steps.record(num_drafted, num_accepted, info)


def score(head: Callable[[torch.Tensor], torch.Tensor], policy: AcceptancePolicy,
          hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head on the verify rows hidden [g+1, d]: target logits [g+1, V], and the logits [n, V]
    of any extra rows the policy asked for (`extra_head_rows`), in ONE head call (None if none)."""
    extra_rows = policy.extra_head_rows(hidden)  # [n, d] or None
    if extra_rows is None:
        return head(hidden), None
    logits = head(torch.cat([hidden, extra_rows.to(hidden.dtype)]))  # [g+1+n, V]
    return logits[: hidden.shape[0]], logits[hidden.shape[0]:]


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _check_prompt(target: Transformer, prompt_ids, max_new_tokens: int) -> list[int]:
    """Validate the prompt and max_new_tokens with one-line errors; return the prompt as a list of ints.

    prompt_ids: a sequence of ints or a 1-D integer tensor (batch size 1), each 0 <= id < vocab_size.
    """
    vocab = target.config.vocab_size
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1 or prompt_ids.dtype.is_floating_point or prompt_ids.dtype.is_complex \
                or prompt_ids.dtype == torch.bool:
            raise MinispecError(f"prompt_ids: a {prompt_ids.dim()}-D {prompt_ids.dtype} tensor; expected a 1-D integer "
                                f"tensor or a list of token ids (several prompts: a list of lists or a 2-D tensor)")
        prompt_ids = prompt_ids.tolist()
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
        raise MinispecError(f"prompt_ids: {type(prompt_ids).__name__}; expected a list of token ids "
                            f"(encode text with the tokenizer first: tokenizer.encode(text))")
    bad = next((t for t in prompt_ids if isinstance(t, bool) or not isinstance(t, Integral)), None)
    if bad is not None:
        raise MinispecError(f"prompt_ids: {bad!r} ({type(bad).__name__}); expected integer token ids")
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise MinispecError("prompt_ids: empty; expected at least one token id")
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise MinispecError(f"prompt_ids: token id {bad} out of range; expected 0 <= id < vocab_size={vocab}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral) or max_new_tokens < 1:
        raise MinispecError(f"max_new_tokens = {max_new_tokens!r}; expected an integer >= 1")
    limit = target.config.max_position_embeddings
    if len(prompt) + max_new_tokens > limit:
        raise CacheOverflowError(
            f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
            f"max_position_embeddings={limit} (config.json)"
        )
    return prompt


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**64:
        raise MinispecError(f"seed = {seed!r}; expected an integer 0 <= seed < 2**64")
    return int(seed)


def _check_eos(target: Transformer, eos_token_ids) -> list[int]:
    vocab = target.config.vocab_size
    ids = list(eos_token_ids) if isinstance(eos_token_ids, (list, tuple, set, frozenset)) else None
    if ids is None or any(isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < vocab for t in ids):
        raise MinispecError(f"eos_token_ids = {eos_token_ids!r}; expected a list of token ids, "
                            f"each 0 <= id < vocab_size={vocab} ([] never stops early)")
    return [int(t) for t in ids]
