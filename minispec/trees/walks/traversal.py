"""Traversal verification over a tree: leaf to root, whole sequences first (lossless).

The walk and its registered tree form (minispec.trees.walks.base says what a walk is)."""

from __future__ import annotations

from typing import Callable

import torch

from minispec.acceptance.block import TraversalVerification
from minispec.model.sampling import sample_token
from minispec.trees.tree import DraftTree

from minispec.trees.walks.sampling import node_coins
from minispec.trees.walks.base import (TreeDecision, TreeInput, check_tree_input, children_by_row, register_walk)


def child_weight(w_parent: float, p_x: float, q_x: float) -> float:
    """min(1, w_parent p(x) / q(x)); where q(x) = 0, 1 if p(x) > 0 and w_parent > 0 (block_weights' rule)."""
    return min(1.0, w_parent * p_x / q_x) if q_x > 0 else float(p_x > 0 and w_parent > 0)


def traverse(tree: DraftTree, p_target: torch.Tensor,
             accept: Callable[[int, float], bool]) -> tuple[list[int], torch.Tensor]:
    """traversal_walk with its tests left to `accept(node, weight) -> bool`.

    p_target [N+1, V] (row u+1 scores node u's children; row 0 the root's). Returns the accepted
    path (root's child first) and the distribution [V] float64 the next token is drawn from.
    With accept = (coin[node] < weight) this is traversal_walk; a test enumerates it exactly by
    answering each call both ways with probabilities weight and 1 - weight.
    """
    check_tree_input(tree, p_target=p_target)
    n = tree.num_nodes
    children = children_by_row(tree)  # entry u+1: node u's children, index order
    parents, tokens = tree.parents, tree.tokens
    q_draft = tree.q_draft.to(p_target.device, torch.float64)  # [N, V]
    rows = list(p_target.to(torch.float64).unbind(0))  # [N+1] of [V]: P_u at index u+1
    weight = [1.0] + [0.0] * n  # index u+1: w_u
    alive = [True] * n

    def reweigh(u: int) -> None:  # the weights of u's remaining subtrees, from w_u and P_u
        stack = [u]
        while stack:
            v = stack.pop()
            for c in children[v + 1]:
                if alive[c]:
                    weight[c + 1] = child_weight(weight[v + 1], float(rows[v + 1][tokens[c]]), float(q_draft[c, tokens[c]]))
                    stack.append(c)

    reweigh(-1)
    while True:
        node, path = -1, []
        while True:  # the first leaf in post-order
            child = next((c for c in children[node + 1] if alive[c]), None)
            if child is None:
                break
            node = child
            path.append(node)
        if node == -1 or accept(node, weight[node + 1]):
            return path, rows[node + 1]
        alive[node] = False
        u = parents[node]
        w_u = weight[u + 1]
        excess = (w_u * rows[u + 1] - q_draft[node]).clamp(min=0)  # [V]
        mass = float(excess.sum())
        if mass > 0:
            rows[u + 1] = excess / mass
        denominator = mass + 1.0 - w_u
        weight[u + 1] = min(1.0, mass / denominator) if denominator > 0 else 0.0
        reweigh(u)


def traversal_walk(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator) -> tuple[list[int], int]:
    """Traversal verification (Weng et al., arXiv 2505.12398): block verification's tree form, lossless.

    Token-level tree verification (sampling_walk) walks down from the root and drops a whole
    subtree as soon as its root is rejected. Traversal verification starts from the leaves: it
    tests whole root-to-node sequences, deepest first, and only when a node's every continuation
    has been turned down does it test the node itself. On a chain it is block verification
    (block.py), draw for draw; on a tree it is lossless and, in exact computations on small trees
    (tests/test_policy_traversal.py), never accepts fewer tokens in expectation than token-level
    verification (the paper reports +2.2-5.7% acceptance length).

    The walk. Node u (the root is u = -1) keeps a weight w_u and a target row P_u (at first
    p_target[u+1]); node c was drawn from Q_c = tree.q_draft[c] (siblings without replacement: q
    with the elder siblings removed, renormalised; one-hot for an n-gram trie). With x_c = tokens[c]:

        weights   w_root = 1,  w_c = min(1, w_u P_u(x_c) / Q_c(x_c)) for c a child of u
                  (1 if P_u(x_c) > 0 and w_u > 0 where Q_c(x_c) = 0: block.py's rule)
        loop      a = the first leaf in post-order (the first remaining child, down to a leaf)
                  a is the root: stop there (every draft rejected)
                  u_a < w_a (node a's coin): accept the path root..a and stop
                  else delete a and, with u = a's parent and m = sum_v max(0, w_u P_u(v) - Q_a(v)):
                       P_u <- norm(max(0, w_u P_u - Q_a))              (kept as it is if m = 0)
                       w_u <- min(1, m / (m + 1 - w_u))                (0 where m + 1 - w_u = 0)
                       and the weights of u's remaining subtrees are recomputed from the new w_u, P_u
        next      y ~ P_a at the node the walk stopped at: the bonus after an untouched leaf, the
                  residual after a node whose children were all rejected

    On a chain the loop tests the leaf gamma with w_gamma, then each node j on the way up with
    m_j / (m_j + 1 - w_j): block verification's stop probabilities h_j, in its order (the largest j
    whose coin passes), with its residual norm(max(0, w_j p_j - q_j)) for the next token. Where the
    paper is silent we took block.py's decisions: the 0/0 value (m + 1 - w = 0 needs P_u = Q_a, and
    then a's subtree is rejected with probability 0), the q = 0 limit, float64 throughout.

    Randomness: N float64 uniforms up front, node i's coin read when node i is tested (each node at
    most once), then one token draw: on a chain, block verification's gamma uniforms and draw.

    Cost: one [V] residual per rejected node, so at most N; the weights are scalar work.
    """
    coins = node_coins(tree, generator)  # [N] u_i: node i's coin
    path, next_row = traverse(tree, p_target, lambda node, w: coins[node] < w)
    return path, sample_token(next_row, generator)


@register_walk(TraversalVerification)
def traversal_tree(policy: TraversalVerification, inp: TreeInput) -> TreeDecision:
    """traversal: leaf to root, whole sequences first (lossless at every T)."""
    return TreeDecision(*traversal_walk(inp.tree, inp.p_target, inp.generator))
