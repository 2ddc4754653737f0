"""Exact match over a tree: follow the target's argmax while a child carries it.

The walk and its registered tree form (minispec.trees.walks.base says what a walk is)."""

from __future__ import annotations


import torch

from minispec.acceptance.exact import ExactMatch
from minispec.model.sampling import greedy_token
from minispec.trees.tree import DraftTree

from minispec.trees.walks.base import (TreeDecision, TreeInput, check_tree_input, first_accepted_path, register_walk)


def greedy_walk(tree: DraftTree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Exact match over a tree: follow the target's argmax while a child carries it.

        y_u        = argmax_v target_logits[u+1, v]              lowest id on ties (greedy_token)
        accept c   iff tokens[c] == y_parent(c)                  at most one child: siblings differ
        next_token = y at the last accepted node (the root if none): the correction, or the bonus

    The emitted tokens are plain greedy decoding's for any tree. target_logits [N+1, V].
    """
    check_tree_input(tree, target_logits=target_logits)
    choice = greedy_token(target_logits).tolist()  # [N+1]: the target's argmax at every row
    accepted = [token == choice[parent + 1] for token, parent in zip(tree.tokens, tree.parents)]  # [N]
    path = first_accepted_path(tree, accepted)
    return path, choice[path[-1] + 1 if path else 0]


@register_walk(ExactMatch)
def exact_tree(policy: ExactMatch, inp: TreeInput) -> TreeDecision:
    """exact: greedy_walk at any temperature (as the chain rule, which is greedy at any T)."""
    return TreeDecision(*greedy_walk(inp.tree, inp.target_logits))
