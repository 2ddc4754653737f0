"""The draft-then-verify loop over trees: the second chapter, after speculative.py's chain.

The chain loop drafts d_1..d_g and keeps a prefix. Here a drafter proposes a tree of candidates
(minispec.tree.DraftTree), the target scores every node in ONE pass (each node sees only its
ancestors), and the policy walks down from the root:

    draft:    tree      = drafter.propose_tree(seq, budget, depth)   N nodes, at most `depth` deep
    verify:   logits    = target([last, node 0..N-1])                N+1 rows, tree positions and mask
    decide:   path, y   = walk(tree, logits)                         the accepted nodes, then y
    rollback: keep_path(cache, path)                                 the accepted rows move into place
    stats:    tau = tokens emitted per verify step; nodes verified per step; accepted depth

Greedy walk (temperature 0): at the root, y = argmax of row 0; if a child of the root carries y,
accept it and look at that child's row next; else y is the correction. A fully accepted leaf
ends with its row's argmax as the bonus token. So the output equals plain greedy decoding for
any tree, exactly as the chain's exact match does, and a width-1 tree IS the chain.

Sampling walk (T > 0): multi-draft speculative sampling over siblings (SpecInfer's recursive
rejection, minispec.acceptance.trees.sampling_walk): each sibling is tested against what the
target would still emit after the siblings before it were rejected, so the output is distributed
exactly as sampling from the target, whatever the tree.

Other policies walk the tree in their own way (decide_tree, minispec.acceptance.trees): typical
acceptance moves to the first typical child; DropMatch judges each node with K dropout heads at
its parent's row, OR-ed with the greedy or sampling base.

Budget: a tree of N nodes costs one verify pass of N+1 rows (a chain of gamma costs gamma+1), so
trees and chains compare at equal N+1. `generate(..., tree=TreeSpec(budget, branching, width))`
and the CLI's --tree / --branching / --tree-width build the tree form of a chain drafter
(make_tree_drafter) and run generate_tree with the run's gamma as the depth.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from minispec.acceptance import AcceptancePolicy, DropMatch, ExactMatch, SpeculativeSampling, TypicalAcceptance
from minispec.acceptance.trees import dropmatch_walk, greedy_walk, sampling_walk, typical_walk
from minispec.errors import MinispecError
from minispec.model import Transformer
from minispec.sampling import SamplingParams, logits_to_probs, next_token, sample_token
from minispec.speculative import (GenerationResult, StopCondition, TokenCallback, _check_eos, _check_prompt,
                                  _check_seed, commit, finish_reason, prefill, record_step)
from minispec.stats import PhaseTimer, StepStats, timing_stats
from minispec.tree import DraftTree, keep_path, tree_mask, tree_positions


class NgramTreeDrafter:
    """Prompt lookup with several candidates: EVERY earlier occurrence of the context's last n
    tokens (n = max_ngram down to min_ngram, most recent first) proposes what followed it; the
    continuations are merged into one tree (a trie: shared prefixes are one node) until the node
    budget is spent. q_draft rows are one-hot (the drafter is certain of each candidate)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise MinispecError(f"ngram sizes: min_ngram={min_ngram}, max_ngram={max_ngram}; expected 1 <= min <= max")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.name = f"ngram-tree:{max_ngram}"

    def start(self, max_seq_len: int) -> None:
        """Nothing to prepare: the lookup needs no cache."""

    def candidates(self, context: list[int], depth: int) -> list[list[int]]:
        """The continuations after every earlier match of the context's suffix, most recent first."""
        found = []
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # not the suffix itself
                if context[start:start + n] == suffix:
                    found.append(context[start + n:start + n + depth])
        return [c for c in found if c]

    def propose_tree(self, context: list[int], budget: int, depth: int, vocab_size: int,
                     params: SamplingParams | None = None, generator: torch.Generator | None = None) -> DraftTree:
        tokens: list[int] = []
        parents: list[int] = []
        child_of: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for candidate in self.candidates(context, depth):
            parent = -1
            for token in candidate:
                node = child_of.get((parent, token))
                if node is None:
                    if len(tokens) == budget:
                        break
                    node = child_of[(parent, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                parent = node
            if len(tokens) == budget:
                break
        q_draft = torch.zeros(len(tokens), vocab_size)
        q_draft[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0  # one-hot rows
        return DraftTree(tokens, parents, q_draft)


class ModelTreeDrafter:
    """Trees from a draft model (a separate model, or the target's first N layers: early exit).

    Level by level: the new nodes of a level are fed to the draft model in ONE pass over its own
    cache, with the tree's positions and mask (each node sees the context and its ancestors), and
    each expanded node's children are the draft's top-k tokens there. Two shapes:

        static  (width=None)   every node at depth d gets branching[d-1] children (Medusa-like)
        dynamic (width=W)      only the W nodes with the highest path probability prod q(d_i)
                               are expanded per level, each by branching[0] children (EAGLE-2's
                               confidence-ranked expansion)

    both cut at `budget` nodes (the best-scoring first). Children: at temperature 0 the draft's
    top-k; at T > 0 k draws WITHOUT replacement from q = the draft's post-processed distribution,
    and q_draft of the j-th child is the distribution it was drawn from (q with the earlier
    siblings' tokens removed, renormalised), which is what a lossless walk over siblings needs
    (minispec.acceptance.trees.sampling_walk). Ranking uses the draft's softmax at T = 1.

    Sampling constrains the shape: which nodes get children, and how many, is decided before the
    children are drawn (the most probable frontier nodes first, until the budget), and the
    children are never re-ranked or cut afterwards. A sibling kept or dropped by its own drawn
    value would no longer be a draw from its q_draft row, and the walk would not be lossless.
    At T = 0 (no distribution to keep) the children are re-ranked by path probability and cut.
    """

    def __init__(self, model: Transformer, *, num_layers: int | None = None, branching: Sequence[int] = (4, 2, 1),
                 width: int | None = None, name: str | None = None) -> None:
        if not branching or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in branching):
            raise MinispecError(f"branching = {list(branching)!r}; expected integers >= 1, one per depth")
        if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
            raise MinispecError(f"width = {width!r}; expected None (static tree) or an integer >= 1")
        self.model, self.num_layers, self.branching, self.width = model, num_layers, tuple(branching), width
        self.name = name or f"model-tree:{'x'.join(map(str, branching))}" + (f",w{width}" if width else "")
        self.cache = None
        self.forwards = 0

    def start(self, max_seq_len: int) -> None:
        self.cache = self.model.new_cache(1, max_seq_len, num_layers=self.num_layers)
        self.forwards = 0

    def _hidden(self, ids: list[int], **tree) -> torch.Tensor:
        self.forwards += 1
        ids_t = torch.tensor([ids], device=self.model.device)
        return self.model.forward_hidden(ids_t, self.cache, num_layers=self.num_layers, **tree)[0]  # [T, d]

    def propose_tree(self, context: list[int], budget: int, depth: int, vocab_size: int,
                     params: SamplingParams | None = None, generator: torch.Generator | None = None) -> DraftTree:
        params = params or SamplingParams()
        self.cache.truncate(min(self.cache.length, len(context) - 1))
        root_logits = self.model.head(self._hidden(context[self.cache.length:])[-1])  # [V], after `last`
        base = self.cache.length  # == len(context): the root is at position base - 1
        tokens, parents, rows, logit_rows, scores = [], [], [], [], []
        frontier = [(-1, root_logits.float(), 0.0)]  # (node, draft logits there, log prod q on its path)
        for level in range(min(depth, len(self.branching) if self.width is None else depth)):
            k = self.branching[min(level, len(self.branching) - 1)] if self.width is None else self.branching[0]
            if self.width is not None:
                frontier = sorted(frontier, key=lambda f: -f[2])[: self.width]
            candidates = []  # (score, parent, token, q row, logits row)
            room = budget - len(tokens)
            if not params.greedy:  # sampling: how many children each node gets is fixed BEFORE drawing them
                frontier = sorted(frontier, key=lambda f: -f[2])
            for node, logits, score in frontier:
                confidence = torch.softmax(logits, dim=-1)  # [V], for the ranking
                count = min(k, vocab_size) if params.greedy else min(k, vocab_size, room - len(candidates))
                if count <= 0:
                    break
                for token, q_row, logits_row in children(logits, count, params, generator):
                    candidates.append((score + math.log(max(float(confidence[token]), 1e-300)), node, token, q_row,
                                       logits_row))
            if params.greedy:  # top-k children: keep the most probable paths (EAGLE-2's re-ranking)
                candidates.sort(key=lambda c: -c[0])
            candidates = candidates[:room]
            if not candidates:
                break
            first_new = len(tokens)
            for score, parent, token, q_row, logits_row in candidates:
                tokens.append(token)
                parents.append(parent)
                rows.append(q_row)
                logit_rows.append(logits_row)
                scores.append(score)
            if len(tokens) == budget or level + 1 == depth:
                break
            logits = self.feed_level(DraftTree(tokens, parents, torch.stack(rows)), first_new, base)  # [m, V]
            frontier = [(first_new + j, logits[j].float(), scores[first_new + j]) for j in range(len(logits))]
        self.cache.truncate(base)  # the context only: the tree's rows are the verify's business
        if not rows:
            return DraftTree([], [], torch.zeros(0, vocab_size))
        return DraftTree(tokens, parents, torch.stack(rows), torch.stack(logit_rows))  # [N, V] each


    def feed_level(self, tree: DraftTree, first_new: int, base: int) -> torch.Tensor:
        """Feed the level of nodes first_new.. of `tree` in ONE pass over the draft cache: their draft logits [m, V].

        The context fills the cache up to `base` (the root, `last`, at position base - 1); the nodes
        fed before this level stay in it. Positions by depth; each node sees the context and its
        ancestors (tree_mask), never a sibling or a cousin.
        """
        mask = tree_mask(tree, base - 1, self.model.device)[1 + first_new:, : base + tree.num_nodes]
        positions = tree_positions(tree, base - 1, self.model.device)[1 + first_new:]
        self.cache.truncate(base + first_new)  # the rows of the nodes fed so far stay
        return self.model.head(self._hidden(tree.tokens[first_new:], positions=positions, mask=mask))  # [m, V]


def children(logits: torch.Tensor, k: int, params: SamplingParams,
             generator: torch.Generator | None) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """k children of a node whose draft logits are `logits` [V]: (token, q row, logits row).

    The j-th child is picked from the draft with the first j-1 children's tokens removed:

        logits row  logits with tokens x_1..x_{j-1} set to -inf      [V]
        T = 0       x_j = argmax of that row (so the k children are the top-k), q row = its softmax
        T > 0       x_j ~ q row = logits_to_probs(logits) with x_1..x_{j-1} removed, renormalised:
                    k draws without replacement, each row the distribution it was drawn from

    The logits row is what DropMatch's JS test reads (the draft's distribution at this child,
    minispec.acceptance.trees.dropmatch_walk); the q row is what the sampling walk reads.
    """
    masked = logits.clone()  # [V] the logits row of the next child
    remaining = None if params.greedy else logits_to_probs(logits, params).double()  # [V]
    drawn = []
    for _ in range(k):
        if params.greedy:
            q_row = torch.softmax(masked, dim=-1)  # [V]
            token = int(torch.argmax(masked))
        else:
            mass = float(remaining.sum())
            if mass <= 0:
                break  # fewer than k tokens have mass (top-k / top-p)
            q_row = remaining / mass
            token = sample_token(q_row, generator)
            remaining = remaining.clone()
            remaining[token] = 0.0
        drawn.append((token, q_row, masked))
        masked = masked.clone()
        masked[token] = float("-inf")
    return drawn


@dataclass(frozen=True)
class TreeSpec:
    """The shape of the trees a run drafts: `generate(..., tree=TreeSpec(budget=16))`.

    budget     the most nodes per tree: one verify pass of budget + 1 rows (a chain of gamma
               drafts costs gamma + 1: trees and chains compare at equal budget + 1)
    branching  model drafts: children per node at depth 1, 2, ... (static, Medusa-like), or per
               expanded node at every depth (dynamic: width set)
    width      None: static; W: expand only the W most probable paths per level (EAGLE-2)
    The deepest path is the run's gamma (the most drafted tokens one step can accept). An n-gram
    tree merges every earlier match of the context's suffix; branching and width are the model
    drafts' only.
    """

    budget: int = 8
    branching: tuple[int, ...] = (4, 2, 1)
    width: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1:
            raise MinispecError(f"tree budget = {self.budget!r}; expected an integer >= 1 (nodes per verify pass)")
        branching = tuple(self.branching) if isinstance(self.branching, (list, tuple)) else None
        if not branching or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in branching):
            raise MinispecError(f"tree branching = {self.branching!r}; expected integers >= 1, one per depth")
        object.__setattr__(self, "branching", branching)
        if self.width is not None and (isinstance(self.width, bool) or not isinstance(self.width, int)
                                       or self.width < 1):
            raise MinispecError(f"tree width = {self.width!r}; expected None (static tree) or an integer >= 1")


def make_tree_drafter(spec, target: Transformer, tree: TreeSpec) -> NgramTreeDrafter | ModelTreeDrafter:
    """The tree form of a chain drafter spec (minispec.drafters.make_drafter's spec), or a tree drafter as is.

    "ngram[:N]" -> NgramTreeDrafter(max_ngram=N); "early-exit:N", "self:bf16|int8", a Transformer
    or a checkpoint folder -> ModelTreeDrafter with tree.branching and tree.width.
    """
    from minispec.drafters import ModelDrafter, NgramDrafter, make_drafter

    if isinstance(spec, (NgramTreeDrafter, ModelTreeDrafter)):
        if isinstance(spec, ModelTreeDrafter) and spec.model.config.vocab_size != target.config.vocab_size:
            raise MinispecError(f"draft {spec.name}: vocab_size {spec.model.config.vocab_size} differs from the "
                                f"target's {target.config.vocab_size}; expected the same vocabulary")
        return spec
    chain = make_drafter(spec, target)  # the chain drafter's own checks and one-line errors
    if isinstance(chain, NgramDrafter):
        return NgramTreeDrafter(max_ngram=chain.max_ngram, min_ngram=min(chain.min_ngram, chain.max_ngram))
    if isinstance(chain, ModelDrafter):
        return ModelTreeDrafter(chain.model, num_layers=chain.num_layers, branching=tree.branching, width=tree.width,
                                name=f"{chain.name} tree")
    raise MinispecError(f"draft {getattr(chain, 'name', chain)!r}: cannot branch; expected an n-gram or a model "
                        "draft with a tree")


def decide_tree(policy: AcceptancePolicy | None, tree: DraftTree, target_logits: torch.Tensor, hidden: torch.Tensor,
                head, params: SamplingParams, generator: torch.Generator) -> tuple[list[int], int, dict]:
    """The policy's tree walk (minispec.acceptance.trees): (path, next_token, info).

    None: greedy_walk at T = 0, sampling_walk at T > 0. A chain policy maps to its tree form:
    exact -> greedy_walk (greedy at any T, as the chain rule), sampling -> sampling_walk,
    typical -> typical_walk, dropmatch -> dropmatch_walk.
    """
    check_tree_policy(policy)
    kind = type(policy) if policy is not None else ExactMatch if params.greedy else SpeculativeSampling
    if kind is ExactMatch:
        return (*greedy_walk(tree, target_logits), {})
    target_logits = target_logits.double()  # [N+1, V]
    p_target = logits_to_probs(target_logits, params)  # [N+1, V]
    if kind is SpeculativeSampling:
        return (*sampling_walk(tree, p_target, generator), {})
    if kind is TypicalAcceptance:
        return (*typical_walk(tree, target_logits, p_target, params, generator, policy.eps, policy.delta,
                              policy.greedy_criterion_temperature), {})
    return dropmatch_walk(tree, target_logits, p_target, hidden, head, params, generator, policy)


TREE_POLICIES = (ExactMatch, SpeculativeSampling, TypicalAcceptance, DropMatch)


def check_tree_policy(policy: AcceptancePolicy | None) -> None:
    """A one-line error unless decide_tree has a walk for `policy` (LazyDropMatch's shortcuts are
    the chain's: on a tree use DropMatch, whose decisions they equal)."""
    if policy is None or type(policy) in TREE_POLICIES:
        return
    raise MinispecError(f"policy {policy.name!r} has no tree form; expected exact, sampling, typical or dropmatch "
                        "with a tree (or a chain: no tree)")


@torch.inference_mode()
def generate_tree(
    target: Transformer,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    drafter: NgramTreeDrafter | ModelTreeDrafter,
    budget: int = 8,
    max_depth: int = 5,
    policy: AcceptancePolicy | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    on_tokens: TokenCallback | None = None,
    stop_when: StopCondition | None = None,
) -> GenerationResult:
    """Tree-speculative decoding: draft a tree, verify it in one pass, walk it with the policy.

    budget: the most nodes per tree (one verify pass of budget+1 rows); max_depth: how deep.
    policy: an AcceptancePolicy with a tree form (decide_tree), or None: the greedy walk at
    T = 0 (output = plain greedy decoding), multi-draft speculative sampling at T > 0 (output
    distributed as sampling from the target: minispec.acceptance.trees.sampling_walk).
    Randomness: one torch.Generator seeded with `seed` (the draft's draws and the walk's coins)
    and the policy's own (DropMatch's masks, reset(seed)). on_tokens / stop_when: as `generate`.
    Stats: the chain loop's (StepStats: a step's "drafted" is its tree's depth, the most it
    could accept), and nodes_per_step, accepted_depth_histogram (over all steps).
    """
    for name, value in (("budget", budget), ("max_depth", max_depth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MinispecError(f"{name} = {value!r}; expected an integer >= 1")
    params = SamplingParams(temperature, top_k, top_p)
    generator = torch.Generator(device="cpu").manual_seed(_check_seed(seed))
    prompt = _check_prompt(target, prompt_ids, max_new_tokens)
    eos = set(target.config.eos_token_ids if eos_token_ids is None else _check_eos(target, eos_token_ids))
    check_tree_policy(policy)
    if policy is not None:
        policy.reset(seed)
    vocab = target.config.vocab_size
    cache = target.new_cache(1, len(prompt) + max_new_tokens + budget)  # rejected branches sit there for one pass
    drafter.start(len(prompt) + max_new_tokens + budget)
    timer = PhaseTimer("draft", "verify", "policy")
    steps = StepStats(max(1, min(max_depth, max_new_tokens - 1)))
    t0 = time.perf_counter()
    logits = prefill(target, prompt, cache)  # [V]
    t_prefill = time.perf_counter() - t0
    tokens = [next_token(logits, params, generator)]
    if on_tokens is not None:
        on_tokens(tokens[:], 0, 0)
    reason = finish_reason(tokens, eos, max_new_tokens, stop_when)
    nodes_verified = 0
    depth_histogram = [0] * (max_depth + 1)

    while reason is None:
        seq = prompt + tokens
        # 1. Draft a tree no deeper than the tokens still to emit (a path of d nodes emits d + 1).
        depth = min(max_depth, max_new_tokens - len(tokens) - 1)
        with timer("draft"):
            tree = (drafter.propose_tree(seq, budget, depth, vocab, params, generator) if depth > 0
                    else DraftTree([], [], torch.zeros(0, vocab)))

        # 2. Verify every node in one pass: positions by depth, each node sees its ancestors only.
        with timer("verify"):
            start = cache.length  # == len(seq) - 1: the cache holds everything but `last`
            ids = torch.tensor([[seq[-1]] + tree.tokens], device=target.device)  # [1, N+1]
            hidden = target.forward_hidden(ids, cache, positions=tree_positions(tree, start, target.device),
                                           mask=tree_mask(tree, start, target.device))[0]  # [N+1, d]
            target_logits = target.head(hidden)  # [N+1, V]

        # 3. Decide, 4. keep the accepted path's rows.
        with timer("policy"):
            path, following, info = decide_tree(policy, tree, target_logits, hidden, target.head, params, generator)
        keep_path(cache, start, path)

        # 5. Commit and count, as the chain loop does (a step's g is the tree's depth, n the path's length).
        emitted, reason = commit(tokens, [tree.tokens[node] for node in path] + [following], eos, max_new_tokens,
                                 stop_when)
        tree_depth = max(tree.depths, default=0)  # the most this step could accept
        record_step(steps, tree_depth, len(path), len(emitted), info)
        nodes_verified += tree.num_nodes
        depth_histogram[min(len(path), len(emitted))] += 1
        if on_tokens is not None:
            on_tokens(emitted, min(len(path), len(emitted)), tree_depth)

    stats = timing_stats(len(prompt), len(tokens), t_prefill, time.perf_counter() - t0)
    stats.update(steps.summary())
    stats.update(nodes_per_step=nodes_verified / steps.num_steps if steps.num_steps else 0.0,
                 accepted_depth_histogram=depth_histogram, target_forwards=1 + steps.num_steps,
                 draft_forwards=getattr(drafter, "forwards", 0),
                 **{f"{phase}_seconds": seconds for phase, seconds in timer.totals.items()},
                 drafter=drafter.name, policy=policy.name if policy is not None else
                 ("exact" if params.greedy else "sampling"),
                 gamma=max_depth, budget=budget, max_depth=max_depth, tree=True, finish_reason=reason)
    return GenerationResult(tokens=tokens, stats=stats)
