"""Greedy multi-path block verification over a tree: block verification path by path.

The walk and its registered tree form (minispec.trees.walks.base says what a walk is)."""

from __future__ import annotations

from typing import Callable

import torch

from minispec.acceptance.block import block_weights, next_distribution, stop_probabilities
from minispec.acceptance.multipath import MultiPathBlockVerification
from minispec.model.sampling import sample_token
from minispec.trees.tree import DraftTree

from minispec.trees.walks.sampling import node_coins
from minispec.trees.walks.base import (TreeDecision, TreeInput, check_tree_input, children_by_row, register_walk)


def multipath_block(tree: DraftTree, p_target: torch.Tensor,
                    accept: Callable[[int, float], bool]) -> tuple[list[int], torch.Tensor]:
    """multipath_walk with its tests left to `accept(node, stop probability) -> bool`.

    p_target [N+1, V]. Returns the accepted path (root's child first) and the distribution [V]
    float64 the next token is drawn from. Block verification on a path x_1..x_L asks, from the
    deepest depth j = L up, whether to stop at j (node x_j, probability h_j); the first yes
    gives tau = j, none gives tau = 0: its "largest j with u_j < h_j", one node's coin per test.
    """
    check_tree_input(tree, p_target=p_target)
    untried = [list(kids) for kids in children_by_row(tree)]  # entry u+1: node u's children not yet tried
    q_draft = tree.q_draft.to(p_target.device, torch.float64)  # [N, V]
    p_rows = p_target.to(torch.float64)  # [N+1, V]
    node, row, path = -1, p_rows[0], []  # u, T (the target row at u), the accepted nodes
    while untried[node + 1]:
        chain = [untried[node + 1][0]]
        while untried[chain[-1] + 1]:  # down the first children to a leaf (nothing below u was tried)
            chain.append(untried[chain[-1] + 1][0])
        targets = torch.stack([row] + [p_rows[c + 1] for c in chain])  # [L+1, V]: T, then p below
        drafts = q_draft[chain]  # [L, V]
        weights = block_weights(targets, drafts, torch.tensor([tree.tokens[c] for c in chain]))  # [L+1]
        stop = stop_probabilities(targets, drafts, weights)  # [L]
        tau = next((j for j in range(len(chain), 0, -1) if accept(chain[j - 1], float(stop[j - 1]))), 0)
        path += chain[:tau]
        if tau == len(chain):
            return path, targets[tau]  # the bonus after the leaf
        residual = next_distribution(targets, drafts, weights, tau)  # [V] norm(max(0, w_tau T_tau - Q))
        node = chain[tau - 1] if tau else node
        untried[node + 1].remove(chain[tau])
        mass = float(residual.sum())
        row = residual / mass if mass > 0 else row  # mass 0: a stop of probability 0 (block.py's note)
    return path, row


def multipath_walk(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator) -> tuple[list[int], int]:
    """Greedy multi-path block verification (minispec/acceptance/multipath.py): lossless.

    Randomness: N float64 uniforms up front, node i's coin read when a path's block verification
    asks about the depth where node i sits (each node at most once: a path is tested once, and a
    rejected node's subtree is never tried again), then one token draw; on a chain, block
    verification's gamma uniforms and draw.
    """
    coins = node_coins(tree, generator)  # [N] u_i: node i's coin
    path, next_row = multipath_block(tree, p_target, lambda node, h: coins[node] < h)
    return path, sample_token(next_row, generator)


@register_walk(MultiPathBlockVerification)
def multipath_tree(policy: MultiPathBlockVerification, inp: TreeInput) -> TreeDecision:
    """multipath: block verification path by path, the residual passed on (lossless at every T)."""
    return TreeDecision(*multipath_walk(inp.tree, inp.p_target, inp.generator))
