"""Drafting for a batch: every row gets its own draft, made for all rows at once where a model drafts.

    start(batch_size, max_seq_len, target_cache)   a new batch; may draft on the target's RaggedKVCache
    propose(contexts, gammas, params, generators) -> [Draft per row]   row r: at most gammas[r] tokens
    rollback(num_valid)                             row r's first num_valid[r] context tokens still hold
    keep_rows(rows)                                 the other rows finished

The batch loop (minispec.batch.speculative) talks to this interface as the chain loop talks to a Drafter,
one list entry per row still running. Two kinds:

  BatchModelDrafter  a model drafter (separate model, early exit, self-draft) run on a
                     RaggedKVCache: each draft step is ONE forward of [R, 1] for the R rows, so a
                     batch of drafts costs about what one draft costs (decoding is memory-bound).
  RowwiseDrafter     any other drafter (the n-gram lookup, your own): one copy per row, each
                     proposing for its row alone. The n-gram lookup costs no model pass anyway.

Row r draws only its own tokens, from its own generator, in the order it would alone: the same
draft as ModelDrafter.propose on that row's context, so a row's draft does not depend on its
batch-mates. Rows ask for different numbers of tokens (gammas: each row's draft length, cut at
its own max_new_tokens) and the p_min cut stops rows at different points; a row that has stopped
still rides along in the remaining draft passes (a pad token at its end, rolled back after the
draft) rather than reshaping the batch for one step.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch

from minispec.chain.drafters import Draft, Drafter, ModelDrafter, confidence, make_drafter
from minispec.model.transformer import Transformer
from minispec.batch.ragged_cache import PAD_ID, RaggedKVCache, feed_ragged
from minispec.model.sampling import SamplingParams, logits_to_probs, next_token


class BatchDrafter(ABC):
    """Interface of the batch loop's drafters (module docstring)."""

    name = "drafter"
    forwards = 0  # model forward passes made so far (one per batched pass)
    shares_target_cache = False

    def start(self, batch_size: int, max_seq_len: int, target_cache: RaggedKVCache | None = None) -> None:
        """Prepare for a new batch of sequences of at most max_seq_len tokens each."""

    @abstractmethod
    def propose(self, contexts: list[list[int]], gammas: list[int], params: SamplingParams,
                generators: list[torch.Generator]) -> list[Draft]:
        """Row r: up to gammas[r] tokens that might follow contexts[r], drawn with generators[r]."""

    def rollback(self, num_valid: list[int]) -> None:
        """Row r: only the first num_valid[r] tokens of its last context (plus accepted drafts) still hold."""

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows (in this order); the others finished."""


class BatchModelDrafter(BatchDrafter):
    """A ModelDrafter's model, num_layers, cache sharing and p_min, drafting for all rows at once.

    Own cache: a RaggedKVCache of the draft model, kept in step with each row's context exactly as
    ModelDrafter keeps its own (catch-up, then drafting). Shared (early exit, self-drafts): drafts
    on the target's RaggedKVCache, which holds context[:-1] of every row at the start of a step,
    and rolls it back afterwards (ModelDrafter's docstring).
    """

    def __init__(self, drafter: ModelDrafter) -> None:
        self.model, self.num_layers, self.share_cache = drafter.model, drafter.num_layers, drafter.share_cache
        self.p_min, self.name = drafter.p_min, drafter.name
        self._fits = drafter._fits  # the layout check is ModelDrafter's
        self.cache: RaggedKVCache | None = None

    def start(self, batch_size: int, max_seq_len: int, target_cache: RaggedKVCache | None = None) -> None:
        self.forwards = 0
        self.shares_target_cache = self.share_cache and target_cache is not None and self._fits(target_cache)
        self.cache = target_cache if self.shares_target_cache else \
            self.model.new_cache(batch_size, max_seq_len, num_layers=self.num_layers, cache_class=RaggedKVCache)

    def _feed(self, chunks: list[list[int]]) -> torch.Tensor:
        self.forwards += 1
        return feed_ragged(self.model, chunks, self.cache, self.num_layers)  # [R, V]

    def propose(self, contexts, gammas, params, generators) -> list[Draft]:
        num_rows = len(contexts)
        start = list(self.cache.lengths)  # shared: the target's cache holds context[:-1] of each row
        # catch up: each row feeds what its cache lacks (its last token; after full acceptance also d_g)
        logits = self._feed([context[n:] for context, n in zip(contexts, start)])  # [R, V]
        tokens: list[list[int]] = [[] for _ in range(num_rows)]
        rows: list[list[torch.Tensor]] = [[] for _ in range(num_rows)]
        drafting = [g > 0 for g in gammas]
        for i in range(max(gammas)):
            for r in range(num_rows):
                if drafting[r] and self.p_min > 0 and confidence(logits[r]) < self.p_min:
                    drafting[r] = False  # unsure here: row r's draft ends before this token
                if drafting[r]:
                    tokens[r].append(next_token(logits[r], params, generators[r]))
                    rows[r].append(logits[r])
                    drafting[r] = i + 1 < gammas[r]
            if not any(drafting):  # no row feeds d_{i+1}: d_g is never fed (the target may reject it)
                break
            logits = self._feed([[toks[-1]] if on else [PAD_ID] for toks, on in zip(tokens, drafting)])
        if self.shares_target_cache:
            self.cache.truncate(start)  # the target's cache as the loop left it
        else:  # keep what ModelDrafter would: the context and every fed draft (not d_g at full length)
            self.cache.truncate([len(c) + max(0, min(len(t), g - 1)) for c, t, g in zip(contexts, tokens, gammas)])
        drafts = []
        for r in range(num_rows):
            draft_logits = torch.stack(rows[r]) if rows[r] else logits.new_zeros(0, logits.shape[-1])  # [g_r, V]
            drafts.append(Draft(tokens[r], logits_to_probs(draft_logits, params), draft_logits))
        return drafts

    def rollback(self, num_valid: list[int]) -> None:
        if not self.shares_target_cache:  # a shared cache is the loop's to roll back
            self.cache.truncate([min(n, valid) for n, valid in zip(self.cache.lengths, num_valid)])

    def keep_rows(self, rows: list[int]) -> None:
        if not self.shares_target_cache:  # the loop compacts the target's cache itself
            self.cache.keep_rows(rows)


class RowwiseDrafter(BatchDrafter):
    """One copy of a single-sequence Drafter per row (copy.copy: a model is shared, not copied;
    `start` gives each copy its own state). For drafters without a model pass to batch."""

    def __init__(self, drafter: Drafter, vocab_size: int) -> None:
        self.drafter, self.name, self.vocab_size = drafter, drafter.name, vocab_size
        self.rows: list[Drafter] = []

    def start(self, batch_size: int, max_seq_len: int, target_cache: RaggedKVCache | None = None) -> None:
        self.rows = [copy.copy(self.drafter) for _ in range(batch_size)]
        for drafter in self.rows:
            drafter.start(max_seq_len)  # each row keeps its own state; none drafts on the ragged cache

    @property
    def forwards(self) -> int:
        return sum(drafter.forwards for drafter in self.rows)

    def propose(self, contexts, gammas, params, generators) -> list[Draft]:
        return [drafter.propose(context, g, params, generator) if g > 0 else Draft.empty(self.vocab_size)
                for drafter, context, g, generator in zip(self.rows, contexts, gammas, generators)]

    def rollback(self, num_valid: list[int]) -> None:
        for drafter, n in zip(self.rows, num_valid):
            drafter.rollback(n)

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]


def make_batch_drafter(spec, target: Transformer, *, p_min: float = 0.0) -> BatchDrafter | None:
    """The batch form of `minispec.chain.drafters.make_drafter(spec, target)`: None for plain decoding."""
    if isinstance(spec, BatchDrafter):
        return spec
    drafter = make_drafter(spec, target, p_min=p_min)
    if drafter is None:
        return None
    if type(drafter) is ModelDrafter:  # a subclass may draft differently: give it the per-row form
        return BatchModelDrafter(drafter)
    return RowwiseDrafter(drafter, target.config.vocab_size)
