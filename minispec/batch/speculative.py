"""Batched decoding: several prompts at once, plain or speculative, each row exactly as if alone.

Plain decoding of B prompts reads the weights once per step for all B rows instead of once per
row, which is where a memory-bound decoder's batch speed-up comes from. Speculative decoding adds
the ragged part: every row accepts its own number of drafts, so after each step every row has its
own length. The loop below keeps that simple:

    prefill:  one pass over the right-padded prompts      RaggedKVCache: each row at its own positions
    repeat (rows still running, R <= B):
      draft:    drafts[r] = drafter.propose(...)            one batched draft pass per draft token
      verify:   target([last_r, d_r1..d_rg_r, pad..])      ONE pass of [R, G+1], G = max_r g_r
      decide:   n_r, y_r = policy_r(row r's g_r+1 rows)    per row, through the chain's own policies
      rollback: cache row r truncated to its own accepted prefix (pads and rejected drafts dropped)
      finish:   rows that hit eos / max_new_tokens / stop leave the batch (keep_rows): no more work

What makes a row independent of its batch-mates:
- positions and masks: row r's tokens sit at its own positions, and attend only to its own past
  (minispec.batch.ragged_cache); a pad only ever follows a row's real tokens and is rolled back.
- randomness: every row has its own torch.Generator (seeded from its own seed) and its own copy
  of the policy (reset with that seed) and of the draft-length schedule. Row r's draws happen in
  the order they would alone, so generate_batch(prompts, seed=s)[r] is generate(prompts[r], seed=s)
  token for token, at any temperature, up to floating-point rounding in the batched matmuls.
- its draft length: g_r comes from row r's own schedule and its own max_new_tokens, never from
  the other rows; shorter drafts are padded to G in the verify pass.

Stats: each row's GenerationResult has the chain loop's per-row figures (tau, acceptance, ...);
BatchResult.stats pools them (minispec.chain.stats; the pooled tau is all committed tokens over all
row-steps) and adds the batch's own: aggregate tokens per second, batched passes, rows per pass.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from minispec import acceptance
from minispec.chain import draft_length as draft_lengths
from minispec.acceptance.base import AcceptancePolicy
from minispec.batch.drafters import BatchDrafter, make_batch_drafter
from minispec.checks import check_gamma, is_int, positive_int
from minispec.chain.draft_length import DraftLength
from minispec.chain.drafters import Draft
from minispec.errors import MinispecError
from minispec.chain.request import GenerationResult, StopCondition, check_eos, check_prompt, check_seed
from minispec.chain.speculative import PhaseTimer, commit, finish_reason, verify_input
from minispec.model.transformer import Transformer
from minispec.batch.ragged_cache import PAD_ID, RaggedKVCache, feed_ragged
from minispec.model.sampling import SamplingParams, next_token
from minispec.chain.stats import PooledStats, run_stats

# Called with each row's newly emitted tokens: on_tokens(prompt_index, tokens, num_accepted, num_proposed)
# (the chain's TokenCallback with the prompt's index in front).
BatchTokenCallback = Callable[[int, list[int], int, int], None]

# Called once per prompt, as soon as its row has finished: on_finish(prompt_index, result), with the
# GenerationResult that the BatchResult will hold for it (its finish_reason among its stats).
FinishCallback = Callable[[int, GenerationResult], None]


@dataclass
class BatchResult:
    """One GenerationResult per prompt, in the prompts' order, and the batch's pooled stats.

    Behaves as the list of results: len(result), result[i], for r in result.
    """

    results: list[GenerationResult]
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, index: int) -> GenerationResult:
        return self.results[index]

    def __iter__(self):
        return iter(self.results)


@dataclass
class _Row:
    """One prompt's state in a batch."""

    index: int  # the prompt's place in the caller's list
    prompt: list[int]
    generator: torch.Generator  # this row's draws and coins, and nobody else's
    policy: AcceptancePolicy | None = None  # this row's copy (its own mask generator, for DropMatch)
    draft_length: DraftLength | None = None  # this row's copy of the schedule
    steps: list | None = None  # (drafted, accepted, committed, info) per step: minispec.chain.stats counts them
    positions: int = 1  # the most a step of this row drafts
    tokens: list[int] = field(default_factory=list)
    reason: str | None = None
    seconds: float = 0.0  # from the batch's start to this row's last token
    result: GenerationResult | None = None  # set once the row has finished

    @property
    def seq(self) -> list[int]:
        return self.prompt + self.tokens


@torch.inference_mode()
def generate_batch(
    target: Transformer,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    draft=None,
    policy: str | AcceptancePolicy = "exact",
    gamma: int = 5,
    draft_length: str | DraftLength = "fixed",
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | Sequence[int] = 0,
    eos_token_ids: Sequence[int] | None = None,
    on_tokens: BatchTokenCallback | None = None,
    stop_when: StopCondition | None = None,
    batch_size: int | None = None,
    on_finish: FinishCallback | None = None,
) -> BatchResult:
    """Generate after each of `prompts` (lists of token ids, any lengths); one result per prompt.

    The arguments are the chain's (minispec.chain.speculative.generate_chain) but on_step, applied to
    every row, plus:
    seed: one int (every row uses it: row r gives what generate(prompts[r], seed=seed) gives) or
      one seed per prompt.
    batch_size: the most rows decoded together; the prompts run in consecutive groups of that
      size (None: all at once).
    on_tokens(prompt_index, tokens, num_accepted, num_proposed): streaming, per row.
    on_finish(prompt_index, result): called once per prompt, when its row finishes.
    stop_when(tokens): checked for each row after each of its new tokens.
    draft: None, a spec string, a model, a Drafter (copied per row unless it is a plain model
      drafter, which is batched) or a BatchDrafter.
    A mistake in one prompt raises a MinispecError whose prompt_index says which (from 0).
    """
    prompts = check_prompts(target, prompts, max_new_tokens)
    seeds = check_seeds(seed, len(prompts))
    batch_size = len(prompts) if batch_size is None else positive_int(batch_size, "batch_size")
    params = SamplingParams(temperature, top_k, top_p)
    eos = check_eos(target, eos_token_ids)
    drafter = make_batch_drafter(draft, target)
    if drafter is not None:
        gamma = check_gamma(gamma)
        policy = acceptance.get(policy)
        policy.reset(gamma=max(0, min(gamma, max_new_tokens - 2)))  # refuses here what no row could run
        schedule = draft_lengths.get(draft_length, gamma)

    results: list[GenerationResult] = []
    pooled = PooledStats(max(1, min(gamma, max_new_tokens - 1)) if drafter is not None else 1)

    def finished(row: _Row) -> None:
        """Row `row` is done: its result, then the caller's on_finish."""
        row.result = _row_result(row, pooled.last_prefill_seconds, drafter, policy if drafter else None, gamma)
        if on_finish is not None:
            on_finish(row.index, row.result)

    for first in range(0, len(prompts), batch_size):
        rows = [_Row(i, prompts[i], torch.Generator(device="cpu").manual_seed(seeds[i]))
                for i in range(first, min(first + batch_size, len(prompts)))]
        if drafter is None:
            plain_decode_batch(target, rows, max_new_tokens, params, eos, on_tokens, stop_when, pooled, finished)
        else:
            for row in rows:
                row.policy = copy.deepcopy(policy)  # own state, own mask generator
                row.policy.reset(seeds[row.index], gamma=max(0, min(gamma, max_new_tokens - 2)))
                row.draft_length = copy.deepcopy(schedule)
                row.draft_length.reset()
                row.steps, row.positions = [], max(1, min(gamma, max_new_tokens - 1))
            speculative_decode_batch(target, drafter, rows, gamma, max_new_tokens, params, eos, on_tokens,
                                     stop_when, pooled, finished)
        results += [row.result for row in rows]
    return BatchResult(results, pooled.summary(batch_size, drafter, policy if drafter else None, gamma, results))


def plain_decode_batch(target: Transformer, rows: list[_Row], max_new_tokens: int, params: SamplingParams,
                       eos: set[int], on_tokens, stop_when, pooled: "PooledStats",
                       finished: Callable[[_Row], None]) -> None:
    """Plain decoding of every row: one target pass of [R, 1] per step for the R rows still running."""
    cache = target.new_cache(len(rows), max(len(r.prompt) for r in rows) + max_new_tokens, cache_class=RaggedKVCache)
    t0 = time.perf_counter()
    logits = feed_ragged(target, [row.prompt for row in rows], cache)  # [B, V]: each row's last prompt token
    pooled.add_prefill(time.perf_counter() - t0)
    running = rows
    while True:
        next_tokens(running, logits, params, eos, max_new_tokens, stop_when, on_tokens, t0)
        running = _drop_finished(running, cache, finished)
        if not running:
            break
        ids = torch.tensor([[row.tokens[-1]] for row in running], device=target.device)  # [R, 1]
        logits = target(ids, cache)[:, -1]  # [R, V]
        pooled.add_pass(len(running))
    pooled.add_seconds(time.perf_counter() - t0)


def next_tokens(rows: list[_Row], logits: torch.Tensor, params: SamplingParams, eos: set[int], max_new_tokens: int,
                stop_when, on_tokens, t0: float) -> None:
    """Each row's next token from its logits [R, V] (a prefill's first token, or a plain step's), as
    the chain picks it (next_token with the row's own generator), committed, checked and streamed."""
    for row, row_logits in zip(rows, logits):
        token = next_token(row_logits, params, row.generator)
        row.tokens.append(token)
        row.reason = finish_reason(row.tokens, eos, max_new_tokens, stop_when)
        row.seconds = time.perf_counter() - t0
        if on_tokens is not None:
            on_tokens(row.index, [token], 0, 0)


def speculative_decode_batch(target: Transformer, drafter: BatchDrafter, rows: list[_Row], gamma: int,
                             max_new_tokens: int, params: SamplingParams, eos: set[int], on_tokens, stop_when,
                             pooled: "PooledStats", finished: Callable[[_Row], None]) -> None:
    """The draft-then-verify loop over a batch (module docstring). Per row, at the top of every step:

        seq_r   = prompt_r + tokens_r         everything row r committed so far
        cache   row r holds seq_r[:-1]         (the chain loop's invariant, row by row)
    """
    vocab = target.config.vocab_size
    # A row's verify pass is padded to the longest draft of the step: up to gamma more positions
    # than the chain loop's prompt + max_new_tokens, and no draft is longer than max_new_tokens - 1,
    # so a gamma beyond max_new_tokens allocates nothing more.
    max_len = max(len(r.prompt) for r in rows) + max_new_tokens + min(gamma, max_new_tokens)
    cache = target.new_cache(len(rows), max_len, cache_class=RaggedKVCache)
    drafter.start(len(rows), max_len, target_cache=cache)
    timer = PhaseTimer("draft", "verify", "policy")

    t0 = time.perf_counter()
    logits = feed_ragged(target, [row.prompt for row in rows], cache)  # [B, V]
    pooled.add_prefill(time.perf_counter() - t0)
    next_tokens(rows, logits, params, eos, max_new_tokens, stop_when, on_tokens, t0)  # the first token, as plainly
    running = _drop_finished(rows, cache, finished, drafter)

    while running:
        seqs = [row.seq for row in running]
        # Each row's own draft length: its schedule's choice, never past its own max_new_tokens.
        gammas = [min(row.draft_length.next(), max_new_tokens - len(row.tokens) - 1) for row in running]

        # 1. Draft: every row's guesses, batched where the drafter is a model.
        with timer("draft"):
            if max(gammas) > 0:
                drafts = drafter.propose(seqs, gammas, params, [row.generator for row in running])
            else:
                drafts = [Draft.empty(vocab) for _ in running]
        longest = max(len(d.tokens) for d in drafts)

        # 2. Verify: ONE pass of [R, G+1]; row r's rows 0..g_r score its drafts and its bonus, the rest are pads.
        with timer("verify"):
            ids = torch.tensor([[seq[-1]] + d.tokens + [PAD_ID] * (longest - len(d.tokens))
                                for seq, d in zip(seqs, drafts)], device=target.device)  # [R, G+1]
            hidden = target.forward_hidden(ids, cache)  # [R, G+1, d]
            hidden_rows = [hidden[r, :len(d.tokens) + 1] for r, d in enumerate(drafts)]  # row r: [g_r+1, d]
            logits_rows = target.head(torch.cat(hidden_rows)).split([h.shape[0] for h in hidden_rows])  # [g_r+1, V]

        # 3. Decide, row by row, with the row's own policy and generator.
        with timer("policy"):
            decisions = []
            for row, draft, h, target_logits in zip(running, drafts, hidden_rows, logits_rows):
                inp = verify_input(draft, target_logits, h, target.head, params, row.generator)
                decisions.append(row.policy(inp))

        # 4. Roll back each row to its own accepted prefix.
        cache.truncate([len(seq) + d.num_accepted for seq, d in zip(seqs, decisions)])
        drafter.rollback([len(seq) + d.num_accepted for seq, d in zip(seqs, decisions)])

        # 5. Commit and count, per row and pooled.
        for row, draft, decision in zip(running, drafts, decisions):
            n, g = decision.num_accepted, len(draft.tokens)
            row.draft_length.update(g, n)
            emitted, row.reason = commit(row.tokens, draft.tokens[:n] + [decision.next_token], eos,
                                         max_new_tokens, stop_when)
            row.steps.append((g, n, len(emitted), decision.info))
            pooled.steps.append((g, n, len(emitted), decision.info))
            row.seconds = time.perf_counter() - t0
            if on_tokens is not None:
                on_tokens(row.index, emitted, min(n, len(emitted)), g)
        pooled.add_pass(len(running))
        running = _drop_finished(running, cache, finished, drafter)

    pooled.add_seconds(time.perf_counter() - t0)
    pooled.add_phases(timer.totals, drafter.forwards)


def _drop_finished(running: list[_Row], cache, finished: Callable[[_Row], None],
                   drafter: BatchDrafter | None = None) -> list[_Row]:
    """The rows still going; the finished ones are reported (`finished`) and leave the cache (and
    the drafter's) for good."""
    keep = [i for i, row in enumerate(running) if row.reason is None]
    for row in running:
        if row.reason is not None:
            finished(row)
    if len(keep) < len(running) and keep:
        cache.keep_rows(keep)
        if drafter is not None:
            drafter.keep_rows(keep)
    return [running[i] for i in keep]


def _row_result(row: _Row, prefill_seconds: float, drafter, policy, gamma: int) -> GenerationResult:
    """Row r's GenerationResult: its own counts, timed from its batch's start to its last token."""
    named = {} if drafter is None else dict(drafter=drafter.name, policy=policy.name, gamma=gamma,
                                            draft_length=row.draft_length.name)
    stats = run_stats(len(row.prompt), len(row.tokens), prefill_seconds, row.seconds, row.reason, row.steps,
                      positions=row.positions, **named)
    return GenerationResult(tokens=row.tokens, stats=stats)


def check_prompts(target: Transformer, prompts, max_new_tokens: int) -> list[list[int]]:
    """A non-empty list of prompts, each checked as generate checks one (one-line errors naming the prompt)."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2:
            raise MinispecError(f"prompts: a {prompts.dim()}-D tensor; expected a list of prompts (lists of token "
                                f"ids) or a 2-D tensor of equal-length prompts")
        prompts = list(prompts)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise MinispecError(f"prompts: {type(prompts).__name__ if prompts is not None else None}"
                            f"{' (empty)' if isinstance(prompts, Sequence) and not prompts else ''}; "
                            f"expected a non-empty list of prompts, each a list of token ids")
    checked = []
    for i, prompt in enumerate(prompts):
        try:
            checked.append(check_prompt(target, prompt, max_new_tokens))
        except MinispecError as err:
            raise err.for_prompt(i) from None
    return checked


def check_seeds(seed, num_prompts: int) -> list[int]:
    """One seed per prompt: `seed` for every prompt, or a list of num_prompts seeds."""
    if is_int(seed):
        return [check_seed(seed)] * num_prompts
    if not isinstance(seed, Sequence) or isinstance(seed, (str, bytes)) or len(seed) != num_prompts:
        raise MinispecError(f"seed = {seed!r}; expected an integer, or a list of {num_prompts} integers (one per prompt)")
    checked = []
    for i, s in enumerate(seed):
        try:
            checked.append(check_seed(s))
        except MinispecError:
            raise MinispecError(f"seed[{i}] = {s!r} (prompt {i}'s seed); expected an integer 0 <= seed < 2**64") from None
    return checked


def is_batch(prompt_ids) -> bool:
    """Whether generate's `prompt_ids` is several prompts: a list of lists, or a 2-D tensor."""
    if isinstance(prompt_ids, torch.Tensor):
        return prompt_ids.dim() == 2
    return isinstance(prompt_ids, Sequence) and not isinstance(prompt_ids, (str, bytes)) and len(prompt_ids) > 0 \
        and all(isinstance(p, (Sequence, torch.Tensor)) and not isinstance(p, (str, bytes)) for p in prompt_ids)
