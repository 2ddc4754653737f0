"""Acceptance over draft trees: walk down from the root, keep a path, emit the token after it.

A draft tree (minispec.trees.tree.DraftTree) holds N candidate nodes in topological order; the target
scores all of them in one pass of N+1 rows:

    target_logits [N+1, V]   row 0 scores the root's children, row i+1 node i's children
    p_target      [N+1, V]   the same rows post-processed (temperature, top-k, top-p)
    tree.q_draft  [N, V]     row i: the distribution tokens[i] was drawn from

A walk starts at the root (node u = -1, the last committed token) and at node u reads row u+1.
Either it accepts one child c of u and moves to c, or it stops and emits the token after u:

    path        the accepted nodes, the root's child first, each the parent of the next
    next_token  the correction where the walk stopped, or the bonus token after a fully
                accepted leaf (a leaf has no children to test: its row only gives the bonus)

and the loop commits [tokens[a] for a in path] + [next_token]. Children are tried in index
order, c_1..c_k, with x_j = tokens[c_j]:

    walk           at node u, p = row u+1                                        width 1 (DraftTree.chain)
    -------------  ------------------------------------------------------------  -------------------------
    greedy_walk    accept the child carrying argmax p; else emit argmax p          ExactMatch
    sampling_walk  recursive rejection sampling over the siblings; lossless        SpeculativeSampling
    typical_walk   accept the first x_j with p(x_j) > min(eps, delta exp(-H(p)))   TypicalAcceptance
    dropmatch_walk the first child DropMatch (K dropout heads at u's row) or the     DropMatch
                   base (greedy / sampling) accepts
    traversal_walk leaf to root: whole root-to-leaf sequences tested first, a node     TraversalVerification
                   only once its every continuation is rejected; lossless           (= BlockVerification)
    multipath_walk block verification on one path at a time, the residual it leaves   MultiPathBlockVerification
                   passed to the next path from where it stopped; lossless         (= BlockVerification)

On a width-1 tree each walk makes its chain policy's decision draw for draw (the same generator
state gives the same num_accepted = len(path) and next_token, and leaves the same state behind).
The rules themselves are the chain policies' functions, imported, not copied.

A policy's walk is looked up by its class, in a registry any policy can join, as `register`
gives a chain policy its name:

    @register_walk(MyPolicy)
    def my_walk(policy: MyPolicy, inp: TreeInput) -> TreeDecision: ...

`walk_for(policy)` finds it (None: greedy at T = 0, sampling at T > 0). The lookup is by the
exact class, not its bases: a walk is the tree form of one rule, and a subclass that changes
`decide` (dropmatch-lazy's shortcuts) has not shown that its tree form is its parent's.

This file holds what every walk shares: the input and decision, the registry, the input check and
the path helpers; each rule's walk and its tree form is a file of its own beside it (exact.py,
sampling.py, typical.py, dropmatch.py, traversal.py, multipath.py), as in acceptance/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import torch

from minispec.acceptance.base import AcceptancePolicy, PolicyInputError
from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams, logits_to_probs
from minispec.trees.tree import DraftTree


@dataclass
class TreeInput:
    """What a walk sees after the tree's verify pass (N nodes, N+1 rows)."""

    tree: DraftTree  # tokens [N], parents [N], q_draft [N, V], logits [N, V] or None
    target_logits: torch.Tensor  # [N+1, V] the target's raw logits (row 0: the root's children)
    params: SamplingParams  # temperature / top-k / top-p, as for the chain
    generator: torch.Generator  # the walk's coins and draws
    hidden: torch.Tensor | None = None  # [N+1, d] the LM-head input of the pass (DropMatch re-runs the head)
    head: Callable[[torch.Tensor], torch.Tensor] | None = None  # the target's LM head

    @cached_property
    def target_logits64(self) -> torch.Tensor:
        """[N+1, V] target_logits in float64, what the sampling-based walks compute with (once per step)."""
        return self.target_logits.double()

    @cached_property
    def p_target(self) -> torch.Tensor:
        """[N+1, V] the target's post-processed distributions, in float64 (computed on first use)."""
        return logits_to_probs(self.target_logits64, self.params)


@dataclass
class TreeDecision:
    path: list[int]  # the accepted nodes, the root's child first
    next_token: int  # the correction where the walk stopped, or the bonus after an accepted leaf
    info: dict = field(default_factory=dict)  # the policy's diagnostics, summed into stats["policy_info"]


TreeWalk = Callable[[AcceptancePolicy, TreeInput], TreeDecision]
_WALKS: dict[type, TreeWalk] = {}


def register_walk(policy_class: type[AcceptancePolicy]):
    """Function decorator: `walk(policy, inp) -> TreeDecision` is the tree form of `policy_class`."""

    def add(walk: TreeWalk) -> TreeWalk:
        if policy_class in _WALKS and _WALKS[policy_class] is not walk:
            raise ValueError(f"policy class {policy_class.__name__} already has a tree walk: {_WALKS[policy_class]}")
        _WALKS[policy_class] = walk
        return walk

    return add


def walk_for(policy: AcceptancePolicy) -> TreeWalk:
    """The registered tree walk of `policy`'s class, else a one-line error naming the policies that have one."""
    walk = _WALKS.get(type(policy))
    if walk is None:
        raise MinispecError(f"policy {policy.name!r} has no tree form; expected {', '.join(walk_names())} or a "
                            "policy with a walk of its own (minispec.trees.walks.register_walk) with a tree, "
                            "or a chain: no tree")
    return walk


def check_tree_input(tree: DraftTree, **rows: torch.Tensor) -> None:
    """Shapes a walk can index without guarding, else a PolicyInputError.

    Each named row tensor is [N+1, V] with one V for all of them, tree.q_draft is [N, V], and
    every node token lies in [0, V). (The tree's own structure, parents before children and
    distinct siblings, is checked by DraftTree itself.)
    """
    n = tree.num_nodes
    vocab = None
    for name, value in rows.items():
        if value.dim() != 2 or value.shape[0] != n + 1 or (vocab is not None and value.shape[1] != vocab):
            width = "V" if vocab is None else f"V={vocab}"
            raise PolicyInputError(f"{name}: shape {list(value.shape)}; expected [N+1={n + 1}, {width}] "
                                   f"for a tree of N={n} nodes")
        vocab = value.shape[1]
    if tuple(tree.q_draft.shape) != (n, vocab):
        raise PolicyInputError(f"tree.q_draft: shape {list(tree.q_draft.shape)}; expected [N={n}, V={vocab}]")
    outside = [token for token in tree.tokens if not 0 <= token < vocab]
    if outside:
        raise PolicyInputError(f"tree.tokens: ids outside [0, {vocab}): {outside}")


def children_by_row(tree: DraftTree) -> list[list[int]]:
    """[N+1] lists: entry u+1 holds node u's children in index order (entry 0: the root's)."""
    children: list[list[int]] = [[] for _ in range(tree.num_nodes + 1)]
    for node, parent in enumerate(tree.parents):
        children[parent + 1].append(node)
    return children


def first_accepted_path(tree: DraftTree, accepted: list[bool]) -> list[int]:
    """From the root, move to the first accepted child (index order) until a node has none.

    accepted [N]: node i's verdict, judged against its parent's row. A verdict below a rejected
    node is never read (the prefix rule, on a tree).
    """
    children = children_by_row(tree)
    path, node = [], -1
    while True:
        child = next((c for c in children[node + 1] if accepted[c]), None)
        if child is None:
            return path
        path.append(child)
        node = child


def walk_names() -> list[str]:
    """The names of minispec's own policies with a tree walk, sorted (a user's registered walks
    are the error message's "a policy with a walk of its own")."""
    return sorted(cls.name for cls in _WALKS if cls.__module__.startswith("minispec."))
