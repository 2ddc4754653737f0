"""Drafters: cheap guessers of the next gamma tokens, behind one small interface.

    start(max_seq_len, target_cache)   a new sequence; may draft on the target's cache (shares_target_cache)
    propose(context, gamma, params, generator) -> Draft(tokens [g], q_draft [g, V], logits [g, V] | None)
    rollback(num_valid)   the first num_valid tokens of the context are still right; forget the rest

`context` is the whole committed sequence (prompt + generated so far); its last token has not
been scored by anyone yet. A drafter may propose fewer than gamma tokens (the n-gram drafter
proposes none when it finds no match; the loop then does an ordinary decode step).

Kinds:
  ModelDrafter      a separate, smaller model with the same tokenizer (its own KV cache)
  ModelDrafter(self_draft(target, "bf16" | "int8"), share_cache=True)
                    the target's own weights at lower precision ("self:bf16", "self:int8")
  ModelDrafter(target, num_layers=N, share_cache=True)
                    early exit: the target's first N layers + final norm + LM head ("early-exit:N")
  NgramDrafter      prompt lookup: copy what followed the last earlier occurrence of the
                    context's final n-gram; no model, so q_draft is one-hot

A model drafter with its own cache keeps it lazily in step with the context: before drafting it
feeds every context token its cache does not hold yet. After a step where the target rejected a
draft, that is just the correction token; after a step where every draft was accepted, it is the
last draft token d_gamma (which the drafter proposed but never fed itself) plus the bonus token.
The self-drafts and early exit draft on the target's own cache instead when its layout and dtype
allow (ModelDrafter's docstring): no prefill and no catch-up for the draft.

A model drafter may also stop early where it is unsure (`p_min`, llama.cpp's --draft-p-min:
ModelDrafter's docstring); how many tokens to ask for in the first place is minispec.chain.draft_length's.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from minispec.errors import MinispecError
from minispec.model.kv_cache import KVCache
from minispec.model.transformer import Transformer
from minispec.model.sampling import SamplingParams, logits_to_probs, next_token


@dataclass
class Draft:
    tokens: list[int]  # d_1..d_g, g <= gamma
    q_draft: torch.Tensor  # [g, V] post-processed distributions the tokens were drawn from
    logits: torch.Tensor | None  # [g, V] raw logits (None for model-free drafters)

    @staticmethod
    def empty(vocab_size: int) -> "Draft":
        """No guesses: the verify step is then an ordinary decode step."""
        return Draft([], torch.zeros(0, vocab_size), None)


class Drafter(ABC):
    """Interface for everything that proposes draft tokens to the speculative loop."""

    name = "drafter"  # how stats and traces name it
    model: Transformer | None = None  # the model it drafts with, if any (minispec.kernels.apply_drafter rewrites it)
    forwards = 0  # model forward passes made so far (for stats)
    shares_target_cache = False  # True while it drafts on the target's own KV cache (see ModelDrafter)

    def start(self, max_seq_len: int, target_cache: KVCache | None = None) -> None:
        """Prepare for a new sequence of at most max_seq_len tokens (allocate/clear caches).

        target_cache is the target's cache for this sequence; a drafter that can draft on it
        (ModelDrafter with share_cache) may use it instead of a cache of its own.
        """

    @property
    def cache_length(self) -> int | None:
        """Positions in the drafter's KV cache (for traces); None for a drafter without one."""
        return None

    @abstractmethod
    def propose(self, context: list[int], gamma: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        """Up to gamma tokens that might follow `context`."""

    def rollback(self, num_valid: int) -> None:
        """Only the first num_valid tokens of the last context (plus accepted drafts) still hold."""


class ModelDrafter(Drafter):
    """Drafts with a causal LM of the target's vocabulary, autoregressively.

    `num_layers` (early exit) runs only the model's first N blocks before the final norm and head.

    Own cache (default): the drafter keeps its own KVCache in step with the context (module
    docstring). Shared cache (`share_cache=True`, for drafts that are the target itself: early
    exit, or its lower-precision copy): the drafter writes into the target's own cache, which
    holds context[:-1] at the start of every step (the loop's invariant), feeds the last token and
    its own drafts after it, and then rolls the cache back to where it was. The verify pass then
    writes positions [L, L+g] again in every layer before any layer reads them, so the target
    still only ever reads its own keys and values. What this saves: the draft's own prefill and
    catch-up forwards. What it changes: the draft attends to the target's keys and values for the
    whole committed context (for early exit those are exactly its own). If the target's cache
    cannot be shared (another layout or dtype), the drafter falls back to its own.

    Confidence cut-off (`p_min`, llama.cpp's --draft-p-min; 0 = off): before adding draft token
    i, the drafter reads its own confidence there, the largest probability of softmax(logits_i),
    the draft model's distribution at temperature 1 before any top-k / top-p; if it is below
    p_min, the draft ends with the i tokens before it (possibly none: the step is then a plain
    decode step). A token the draft itself doubts is likely to be rejected, and every draft after
    a rejection is wasted work, so the cut saves draft forwards and verify rows; what it can lose
    is a doubted token the target would have accepted. The confidence is not q_draft's largest
    entry: at temperature 0 q_draft is one-hot, always 1. llama.cpp drafts greedily and computes
    it over the draft's 10 most likely tokens, renormalised; its older versions kept the doubted
    token and stopped after it. The cut decides only how many tokens are drafted, so a lossless
    policy stays lossless (at temperature 0 with the exact policy: plain greedy's output).
    """

    def __init__(self, model: Transformer, *, num_layers: int | None = None, name: str = "model",
                 share_cache: bool = False, p_min: float = 0.0) -> None:
        self.model, self.num_layers, self.name, self.share_cache = model, num_layers, name, share_cache
        self.p_min = _check_p_min(p_min)
        self.cache: KVCache | None = None

    def start(self, max_seq_len: int, target_cache: KVCache | None = None) -> None:
        self.forwards = 0
        self.shares_target_cache = self.share_cache and target_cache is not None and self._fits(target_cache)
        self.cache = target_cache if self.shares_target_cache else \
            self.model.new_cache(1, max_seq_len, num_layers=self.num_layers)

    def _fits(self, cache: KVCache) -> bool:
        """Whether this drafter's model can write into `cache`: same K/V layout, dtype and device."""
        mine = self.model.new_cache(1, 1, num_layers=self.num_layers)  # a 1-position probe
        return cache.num_layers >= mine.num_layers and cache.k[0].dtype == mine.k[0].dtype \
            and cache.k[0].shape[1] == mine.k[0].shape[1] and cache.k[0].shape[3] == mine.k[0].shape[3] \
            and cache.k[0].device == mine.k[0].device

    @property
    def cache_length(self) -> int | None:
        return None if self.cache is None else self.cache.length

    def _logits(self, tokens: list[int]) -> torch.Tensor:
        """Feed tokens at the cache's end; logits of the last one: [V]."""
        ids = torch.tensor([tokens], device=self.model.device)
        hidden = self.model.forward_hidden(ids, self.cache, num_layers=self.num_layers)  # [1, T, d]
        self.forwards += 1
        return self.model.head(hidden[0, -1])

    def propose(self, context, gamma, params, generator) -> Draft:
        start = self.cache.length  # shared: the target's cache holds context[:-1]
        # catch up: feed what the cache lacks (the last token; after full acceptance also d_g, unless
        # a p_min cut ended the draft after feeding it)
        logits = self._logits(context[self.cache.length:])
        tokens, rows = [], []
        for i in range(gamma):
            if self.p_min > 0 and confidence(logits) < self.p_min:
                break  # unsure here: the draft ends before this token
            token = next_token(logits, params, generator)
            tokens.append(token)
            rows.append(logits)
            if i + 1 < gamma:  # d_gamma is not fed now: the target may reject it anyway
                logits = self._logits([token])
        if self.shares_target_cache:
            self.cache.truncate(start)  # the target's cache as the loop left it
        draft_logits = torch.stack(rows) if rows else logits.new_zeros(0, logits.shape[-1])  # [g, V]
        return Draft(tokens, logits_to_probs(draft_logits, params), draft_logits)

    def rollback(self, num_valid: int) -> None:
        if not self.shares_target_cache:  # a shared cache is the loop's to roll back
            self.cache.truncate(min(self.cache.length, num_valid))


def confidence(logits: torch.Tensor) -> float:
    """The draft model's probability of its most likely next token: max softmax(logits) of one row [V]."""
    return float(logits.float().softmax(dim=-1).max())


class NgramDrafter(Drafter):
    """Prompt lookup decoding: find the most recent earlier occurrence of the context's last n
    tokens (trying n = max_ngram down to min_ngram) and propose the tokens that followed it.

    Works well when the answer copies from the prompt (summaries, RAG, code edits). Costs no
    model forward at all; its q_draft is one-hot (it is certain of its guess).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, vocab_size: int | None = None) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise MinispecError(f"ngram sizes: min_ngram={min_ngram}, max_ngram={max_ngram}; expected 1 <= min <= max")
        self.max_ngram, self.min_ngram, self.vocab_size = max_ngram, min_ngram, vocab_size
        self.name = f"ngram:{max_ngram}" if min_ngram == 1 else f"ngram:{min_ngram}-{max_ngram}"

    def lookup(self, context: list[int], gamma: int) -> list[int]:
        """The gamma tokens after the first match in ngram_order (the longest suffix, most recent)."""
        ends = ngram_order(suffix_matches(context, self.max_ngram), self.max_ngram, self.min_ngram)
        return context[ends[0] + 1:ends[0] + 1 + gamma] if ends else []

    def propose(self, context, gamma, params, generator) -> Draft:
        tokens = self.lookup(context, gamma)
        q_draft = torch.zeros(len(tokens), self.vocab_size)
        q_draft[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0  # one-hot rows
        return Draft(tokens, q_draft, None)


def suffix_matches(context: Sequence[int], cap: int) -> list[tuple[int, int]]:
    """Every earlier occurrence of the context's last token, most recent first, as (end, n).

    The occurrence is context[end] (end <= len - 2: the last token itself does not count), and the
    n tokens ending there equal the context's last n: context[end - i] == context[-1 - i] for i < n,
    with 1 <= n <= cap. What follows it, context[end + 1:], is what that occurrence proposes.
    Prompt lookup (NgramDrafter) and its tree form (NgramTreeDrafter) both search the context this
    way.
    """
    size = len(context)
    if size < 2:
        return []
    found = []
    for end in range(size - 2, -1, -1):
        if context[end] == context[-1]:
            n = 1
            while n < cap and end - n >= 0 and context[end - n] == context[size - 1 - n]:
                n += 1
            found.append((end, n))
    return found


def ngram_order(matches: list[tuple[int, int]], max_ngram: int, min_ngram: int = 1) -> list[int]:
    """The ends of `matches` in prompt lookup's order: suffix length n = max_ngram down to min_ngram,
    most recent first within each n; an end is listed once for each n its match reaches."""
    return [end for n in range(max_ngram, min_ngram - 1, -1) for end, reach in matches if reach >= n]


def self_draft(target: Transformer, precision: str) -> Transformer:
    """A copy of the target at lower precision ("bf16" or "int8"), the 'quantized self-draft'.

    int8: weight-only, symmetric per output row (minispec.kernels.int8), bf16 activations.
    Needs the target as loaded (a reference model): build the self-draft first, then apply
    minispec.kernels to both.
    """
    from minispec import kernels

    if kernels.kind_of(target) != "reference":
        raise MinispecError(f"self-draft: the target was already rewritten by minispec.kernels "
                            f"({kernels.kind_of(target)}); build the self-draft first, then apply the kernels to both")
    if precision in ("bf16", "bfloat16"):
        if target.dtype == torch.bfloat16:  # the copy would be the target itself: every draft accepted, twice the work
            raise MinispecError("draft='self:bf16': the target is already bfloat16, so its bfloat16 copy would be the "
                                "target itself; expected a float32 or float64 target (dtype=float32), or "
                                "draft='self:int8'")
        return copy.deepcopy(target).to(torch.bfloat16)
    if precision == "int8":
        if target.device.type != "cpu":  # the int8 kernel (torch._weight_int8pack_mm) is CPU-only
            raise MinispecError(f"draft='self:int8': the target is on {target.device}; the int8 self-draft runs "
                                f"on the CPU only; expected draft='self:bf16' (or device=cpu)")
        return kernels.apply(copy.deepcopy(target).to(torch.bfloat16), "int8")
    raise MinispecError(f"draft='self:{precision}': unknown precision; expected self:bf16 or self:int8")


def make_drafter(spec: str | Transformer | Drafter | None, target: Transformer, *, dtype=None,
                 p_min: float = 0.0) -> Drafter | None:
    """Build a drafter from a CLI-style spec, a model, or pass a drafter through.

    spec: None (plain decoding) | a Transformer | a Drafter | "ngram" | "ngram:N" | "early-exit:N" |
          "self:bf16" | "self:int8" | a checkpoint folder path.
    p_min: a model drafter's confidence cut-off (ModelDrafter; 0 = off). The n-gram drafter has
          no confidence to cut on, and a drafter object takes it in its own constructor.
    """
    vocab = target.config.vocab_size
    _check_p_min(p_min)
    if spec is None or isinstance(spec, Drafter):
        if isinstance(spec, NgramDrafter):
            _no_p_min_for_ngram(p_min)
            if spec.vocab_size is None:  # the target's vocabulary, for this run only: the object stays reusable
                spec = copy.copy(spec)
                spec.vocab_size = vocab
                return spec
            _check_vocab(spec.vocab_size, vocab, f"NgramDrafter(vocab_size={spec.vocab_size})")
        elif spec is not None and p_min > 0:
            raise MinispecError(f"p_min={p_min} given with a drafter object; expected it in the drafter's own "
                                f"constructor (ModelDrafter's p_min)")
        if isinstance(spec, ModelDrafter):
            _check_vocab(spec.model.config.vocab_size, vocab, f"ModelDrafter({spec.name})")
        return spec
    if isinstance(spec, Transformer):
        _check_vocab(spec.config.vocab_size, vocab, "draft model")
        return ModelDrafter(spec, p_min=p_min)
    text = str(spec)
    if not text.strip():  # Path("") would be the current folder
        raise MinispecError(f"draft={text!r}: empty; expected a checkpoint folder, 'ngram[:N]', 'early-exit:N', "
                            "'self:bf16' or 'self:int8'")
    kind, _, arg = text.partition(":")
    if kind == "ngram":
        _no_p_min_for_ngram(p_min)
        size = _int_arg(text, arg or "3", lo=1)
        return NgramDrafter(max_ngram=size, vocab_size=vocab)
    if kind == "early-exit":
        n = _int_arg(text, arg, lo=1, hi=target.config.num_layers - 1)
        return ModelDrafter(target, num_layers=n, name=text, share_cache=True, p_min=p_min)
    if kind == "self":
        return ModelDrafter(self_draft(target, arg), name=text, share_cache=True, p_min=p_min)
    path = Path(text)
    if path.is_dir():
        from minispec.checkpoints.load import load_model

        draft = load_model(path, dtype=dtype or target.dtype, device=target.device)
        _check_vocab(draft.config.vocab_size, vocab, f"draft={str(path)!r}")
        return ModelDrafter(draft, name=path.name, p_min=p_min)
    raise MinispecError(
        f"draft={text!r}: unknown drafter; expected a checkpoint folder, 'ngram[:N]', 'early-exit:N', 'self:bf16' or 'self:int8'"
    )


def _check_p_min(p_min: float) -> float:
    if isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or not 0 <= p_min <= 1:  # `not <=` catches nan
        raise MinispecError(f"p_min={p_min!r}; expected a number in [0, 1] (0 = off)")
    return float(p_min)


def _no_p_min_for_ngram(p_min: float) -> None:
    if p_min > 0:
        raise MinispecError(f"p_min={p_min}: the n-gram drafter has no probabilities to cut on (its "
                            f"q_draft is one-hot, always sure); expected p_min=0 with an n-gram draft")


def _check_vocab(draft_vocab: int, target_vocab: int, what: str) -> None:
    if draft_vocab != target_vocab:
        raise MinispecError(
            f"{what}: vocabulary of {draft_vocab} tokens != the target's {target_vocab}; "
            "draft and target must share a tokenizer"
        )


def _int_arg(spec: str, arg: str, lo: int, hi: int | None = None) -> int:
    try:
        value = int(arg)
    except ValueError:
        value = None
    if value is None or value < lo or (hi is not None and value > hi):
        rng = f"{lo} <= N" + (f" <= {hi}" if hi is not None else "")
        raise MinispecError(f"draft={spec!r}: expected an integer N with {rng}")
    return value
