"""Speculative sampling over a tree: recursive rejection sampling over each node's children.

The walk and its registered tree form (minispec.trees.walks.base says what a walk is)."""

from __future__ import annotations


import torch

from minispec.acceptance.sampling import SpeculativeSampling, acceptance_probability, residual_distribution
from minispec.model.sampling import sample_token
from minispec.trees.tree import DraftTree

from minispec.trees.walks.base import (TreeDecision, TreeInput, check_tree_input, children_by_row, register_walk)


def sampling_walk(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator) -> tuple[list[int], int]:
    """Lossless speculative sampling over a tree: recursive rejection sampling over siblings.

    p_target [N+1, V], tree.q_draft [N, V]. At node u, with p = p_target[u+1] and children
    c_1..c_k in index order, x_j = tokens[c_j] drawn from q_j = q_draft[c_j]:

        r_1 = p
        for j = 1..k:  accept x_j with probability a_j = min(1, r_j(x_j) / q_j(x_j)): move to c_j
                       else r_{j+1} = norm(max(0, r_j - q_j)) and try the next sibling
        none accepted: next_token y ~ r_{k+1}               (a leaf, k = 0: the bonus, y ~ p)

    (a_j = 1{r_j(x_j) > 0} where q_j(x_j) = 0, the chain's rule: acceptance_probability.)

    Why the token emitted at u is distributed exactly as p. Claim: from sibling j on, given
    everything drawn before it (x_1..x_{j-1} and their rejections), the emitted token is
    distributed as r_j. For j = k+1 it is the draw y ~ r_{k+1}. For j <= k, x_j is a draw from
    q_j given that history, tested with a coin nobody has read, and r_{j+1} depends on r_j and
    q_j only, not on x_j; so the chain's one-position argument applies with (p, q) := (r_j, q_j)
    and the claim for j+1:

        P(y) = q_j(y) a_j(y) + P(reject x_j) r_{j+1}(y)
             = min(r_j(y), q_j(y)) + max(0, r_j(y) - q_j(y)) = r_j(y),

    since P(reject x_j) = 1 - sum_x min(r_j(x), q_j(x)) = sum_z max(0, r_j(z) - q_j(z)) is
    r_{j+1}'s normaliser. At j = 1: the token emitted at u is distributed as r_1 = p. If it is
    x_j, the walk moves to c_j, whose row p_target[c_j+1] is the target's distribution after it
    and whose children were drawn from their q_draft rows after it: the same argument holds
    there, so by induction every emitted token, given the ones before it, is distributed as the
    target's. (A rejected x_j had r_j(x_j) < q_j(x_j), so r_{j+1}(x_j) = 0: the residual never
    offers a token already turned down.)

    q_j must be what x_j was really drawn from: q for i.i.d. siblings; for siblings drawn
    without replacement, q with x_1..x_{j-1} removed and renormalised (the drafter fills q_draft
    that way); one-hot for a drafter without probabilities (an n-gram trie), and then a_j = r_j(x_j)
    and r_{j+1} is r_j with x_j removed. Recording q where q_j was used breaks losslessness.

    Empty residual: if max(0, r_j - q_j) has no mass (r_j <= q_j everywhere, so r_j = q_j),
    a_j = 1 wherever q_j > 0 and x_j was accepted surely; should rounding reject it anyway,
    residual_distribution returns r_j itself, so the draw stays well defined (the chain's rule).

    At temperature 0 (one-hot p) a_j = 1 iff x_j is the argmax and every residual is p again:
    this is greedy_walk whenever q_j(x_j) > 0.

    Randomness, all from `generator`: N float64 uniforms up front, u_i being node i's coin
    (accept iff u_i < a), then one draw for next_token. A node is tested at most once (when its
    parent was accepted, after its elder siblings were rejected), so every coin is fresh when
    read; on a width-1 tree this is exactly SpeculativeSampling's order (gamma uniforms, one draw).
    """
    check_tree_input(tree, p_target=p_target)
    coins = node_coins(tree, generator)  # [N] u_i: node i's coin
    children = children_by_row(tree)
    path, node = [], -1
    while True:
        child, residual = recursive_rejection(tree, children[node + 1], p_target[node + 1], coins)
        if child is None:  # every child rejected (or none: a leaf)
            return path, sample_token(residual, generator)
        path.append(child)
        node = child


def node_coins(tree: DraftTree, generator: torch.Generator) -> list[float]:
    """[N] float64 uniforms, u_i for node i, drawn up front in one call (the chain's gamma uniforms)."""
    return torch.rand(tree.num_nodes, generator=generator, dtype=torch.float64, device=generator.device).tolist()


def recursive_rejection(tree: DraftTree, siblings: list[int], p_row: torch.Tensor,
                        coins: list[float]) -> tuple[int | None, torch.Tensor]:
    """One node's step of sampling_walk: test the siblings c_1..c_k in turn against r_j.

    p_row [V]: the target's distribution at their parent (r_1). Returns the first accepted
    sibling and r at that point, or (None, r_{k+1}): the residual to draw the correction from.
    """
    residual = p_row  # [V] r_1 = p
    for child in siblings:
        q_child = tree.q_draft[child].to(p_row.device)  # [V] q_j, what tokens[child] was drawn from
        token = torch.tensor([tree.tokens[child]], device=p_row.device)  # [1]
        accept_prob = float(acceptance_probability(residual[None], q_child[None], token)[0])  # a_j
        if coins[child] < accept_prob:
            return child, residual
        residual = residual_distribution(residual, q_child)  # [V] r_{j+1} = norm(max(0, r_j - q_j))
    return None, residual


@register_walk(SpeculativeSampling)
def sampling_tree(policy: SpeculativeSampling, inp: TreeInput) -> TreeDecision:
    """sampling: recursive rejection over siblings (lossless at every T)."""
    return TreeDecision(*sampling_walk(inp.tree, inp.p_target, inp.generator))
