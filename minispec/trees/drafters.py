"""Tree drafters: a chain drafter's guesses, branched, and the shape a run asks of them.

A tree drafter proposes a minispec.trees.tree.DraftTree of up to `budget` nodes, at most `depth` deep,
after the committed context (whose last token is the root):

    propose_tree(context, budget, depth, vocab_size, params, generator) -> DraftTree

Kinds:
  NgramTreeDrafter   every earlier occurrence of the context's suffix proposes what followed it,
                     merged into a trie (prompt lookup with several candidates)
  ModelTreeDrafter   a draft model (or the target's first N layers) expands nodes level by
                     level, each level in one pass; static (Medusa-like) or dynamic (EAGLE-2)

TreeSpec is the shape a run asks for (budget, branching, width), and make_tree_drafter builds the
tree form of a chain drafter spec ("ngram", "early-exit:N", "self:bf16|int8", a model).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch

from minispec.checks import is_int, positive_int
from minispec.chain.drafters import ModelDrafter, NgramDrafter, make_drafter, ngram_order, suffix_matches
from minispec.errors import MinispecError
from minispec.model.transformer import Transformer
from minispec.model.sampling import SamplingParams, logits_to_probs, sample_token
from minispec.trees.tree import DraftTree, tree_mask, tree_positions


DEFAULT_BRANCHING = (4, 2, 1)  # a model-draft tree's children per node at depth 1, 2, 3


def check_branching(branching, name: str) -> tuple[int, ...]:
    """Children per node by depth: a non-empty list or tuple of integers >= 1."""
    values = tuple(branching) if isinstance(branching, (list, tuple)) else ()
    if not values or not all(is_int(k) and k >= 1 for k in values):
        raise MinispecError(f"{name} = {branching!r}; expected integers >= 1, one per depth")
    return tuple(int(k) for k in values)


class TreeDrafter(ABC):
    """The interface of everything that proposes draft trees to the tree loop."""

    name = "tree-drafter"  # how stats name it
    model: Transformer | None = None  # the model it drafts with, if any (minispec.kernels.apply_drafter)
    forwards = 0  # model forward passes made so far (for stats)

    def start(self, max_seq_len: int) -> None:
        """Prepare for a new sequence of at most max_seq_len tokens (allocate or clear caches)."""

    def max_nodes(self, depth: int, max_context: int, vocab_size: int) -> int | None:
        """The most nodes one of its trees can hold at `depth` after a context of at most
        `max_context` tokens (a budget above it can never be used), or None if unbounded."""
        return None

    @abstractmethod
    def propose_tree(self, context: list[int], budget: int, depth: int, vocab_size: int,
                     params: SamplingParams | None = None, generator: torch.Generator | None = None) -> DraftTree:
        """A tree of at most `budget` nodes, at most `depth` deep, after `context` (its last token is the root)."""


class NgramTreeDrafter(TreeDrafter):
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

    def max_nodes(self, depth: int, max_context: int, vocab_size: int) -> int:
        """Every candidate is one earlier match (at most max_context per suffix length) of at most `depth` tokens."""
        return (self.max_ngram - self.min_ngram + 1) * max_context * depth

    def candidates(self, context: list[int], depth: int) -> list[list[int]]:
        """The continuations after every earlier match of the context's suffix, most recent first."""
        ends = ngram_order(suffix_matches(context, self.max_ngram), self.max_ngram, self.min_ngram)
        return [context[end + 1:end + 1 + depth] for end in ends] if depth > 0 else []

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


class ModelTreeDrafter(TreeDrafter):
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
    (minispec.trees.walks.sampling_walk). Ranking uses the draft's softmax at T = 1.

    Sampling constrains the shape: which nodes get children, and how many, is decided before the
    children are drawn (the most probable frontier nodes first, until the budget), and the
    children are never re-ranked or cut afterwards. A sibling kept or dropped by its own drawn
    value would no longer be a draw from its q_draft row, and the walk would not be lossless.
    At T = 0 (no distribution to keep) the children are re-ranked by path probability and cut.
    """

    def __init__(self, model: Transformer, *, num_layers: int | None = None, branching: Sequence[int] = DEFAULT_BRANCHING,
                 width: int | None = None, name: str | None = None) -> None:
        branching = check_branching(branching, "branching")
        if width is not None:
            positive_int(width, "width", "None: a static tree")
        self.model, self.num_layers, self.branching, self.width = model, num_layers, branching, width
        self.name = name or f"model-tree:{'x'.join(map(str, branching))}" + (f",w{width}" if width else "")
        self.cache = None
        self.forwards = 0

    def start(self, max_seq_len: int) -> None:
        self.cache = self.model.new_cache(1, max_seq_len, num_layers=self.num_layers)
        self.forwards = 0

    def max_nodes(self, depth: int, max_context: int, vocab_size: int) -> int:
        """static: sum over levels d <= min(depth, len(branching)) of prod_{i<=d} min(k_i, V);
        dynamic: k = min(branching[0], V) at level 1, then min(width, the level before) * k per level."""
        total, level = 0, 1
        if self.width is None:
            for k in self.branching[:depth]:
                level *= min(k, vocab_size)
                total += level
            return total
        k = min(self.branching[0], vocab_size)
        for d in range(depth):
            level = k if d == 0 else min(self.width, level) * k
            total += level
        return total

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
                # no more than `room` children of one node can survive the cut to the budget (at T = 0 they
                # are its top ones): the work is bounded by the budget, whatever k is
                count = min(k, vocab_size, room) if params.greedy else min(k, vocab_size, room - len(candidates))
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
    minispec.trees.walks.dropmatch_walk); the q row is what the sampling walk reads.
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
    branching  model drafts: children per node at depth 1, 2, ... (static, Medusa-like; at most
               one count per depth of the tree), or one count: children per expanded node at
               every depth (dynamic: width set). None: DEFAULT_BRANCHING cut to the tree's depth
               (dynamic: its first count)
    width      None: static; W: expand only the W most probable paths per level (EAGLE-2)
    The deepest path is the run's gamma (the most drafted tokens one step can accept). An n-gram
    tree merges every earlier match of the context's suffix; branching and width are the model
    drafts' only (given with an n-gram draft, or with a tree drafter object that has its own
    shape, they are an error, not ignored).
    """

    budget: int = 8
    branching: tuple[int, ...] | None = None
    width: int | None = None

    def __post_init__(self) -> None:
        positive_int(self.budget, "tree budget", "nodes per verify pass")
        if self.branching is not None:
            object.__setattr__(self, "branching", check_branching(self.branching, "tree branching"))
        if self.width is not None:
            positive_int(self.width, "tree width", "None: a static tree")


def model_branching(tree: TreeSpec, depth: int | None) -> tuple[int, ...]:
    """The branching a model-draft tree of `depth` (None: unknown) uses: tree.branching checked
    against the depth (no count may go unused), or the default cut to it."""
    if tree.branching is None:
        chosen = DEFAULT_BRANCHING if tree.width is None else DEFAULT_BRANCHING[:1]
        return chosen[:depth] if depth else chosen
    if tree.width is not None and len(tree.branching) > 1:
        raise MinispecError(f"branching={','.join(map(str, tree.branching))} with width={tree.width}: a dynamic tree gives every expanded node the same number of "
                            "children, and counts after the first would be ignored; expected one count")
    if depth is not None and len(tree.branching) > depth:
        raise MinispecError(f"branching={','.join(map(str, tree.branching))}: {len(tree.branching)} "
                            f"depths, but the tree is {depth} deep (gamma={depth}), so the counts after the first "
                            f"{depth} would be ignored; expected at most {depth} counts, or a larger gamma")
    return tree.branching


def make_tree_drafter(spec, target: Transformer, tree: TreeSpec, depth: int | None = None) -> TreeDrafter:
    """The tree form of a chain drafter spec (minispec.chain.drafters.make_drafter's spec), or a TreeDrafter as is.

    "ngram[:N]" -> NgramTreeDrafter(max_ngram=N); "early-exit:N", "self:bf16|int8", a Transformer
    or a checkpoint folder -> ModelTreeDrafter with tree.branching (model_branching: checked
    against `depth`, the run's gamma) and tree.width. A shape given where it cannot apply (an
    n-gram tree, a tree drafter object) is an error.
    """
    if isinstance(spec, TreeDrafter) and (tree.branching is not None or tree.width is not None):
        raise MinispecError(f"tree branching/width given with the tree drafter {spec.name}, which has its own shape; "
                            "expected them on the drafter, or a drafter spec")
    if isinstance(spec, TreeDrafter):
        if spec.model is not None and spec.model.config.vocab_size != target.config.vocab_size:
            raise MinispecError(f"draft {spec.name}: vocab_size {spec.model.config.vocab_size} differs from the "
                                f"target's {target.config.vocab_size}; expected the same vocabulary")
        return spec
    chain = make_drafter(spec, target)  # the chain drafter's own checks and one-line errors
    if isinstance(chain, NgramDrafter):
        if tree.branching is not None or tree.width is not None:
            shape = "branching" if tree.branching is not None else "width"
            raise MinispecError(f"{shape}={getattr(tree, shape)!r} with an n-gram tree: it shapes model-draft trees, "
                                "and an n-gram tree takes every earlier match of the context instead; expected no "
                                f"{shape}= with an n-gram draft")
        return NgramTreeDrafter(max_ngram=chain.max_ngram, min_ngram=min(chain.min_ngram, chain.max_ngram))
    if isinstance(chain, ModelDrafter):
        return ModelTreeDrafter(chain.model, num_layers=chain.num_layers, branching=model_branching(tree, depth),
                                width=tree.width, name=f"{chain.name} tree")
    raise MinispecError(f"draft {getattr(chain, 'name', chain)!r}: cannot branch; expected an n-gram or a model "
                        "draft with a tree")
